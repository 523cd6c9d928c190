"""bench-local contenders: `ferry-mover copy`, `cp -a`, `cp -r --preserve=...`, `rsync -a`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import ferry, proc
from .suite import RunResult

DATASETS = ["big", "small", "medium", "mixed"]


@dataclass
class CommandContender:
    """A peer that copies SRC to DST with one command."""

    name: str
    slug: str
    argv_for: object          # callable (src, dst) -> argv
    scratch: proc.Scratch
    is_ferry: bool = False

    def unavailable(self, dataset: str) -> str | None:
        return None

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        t = proc.run(self.argv_for(src, dst), self.scratch, self.slug, timeout)
        return RunResult(t.seconds, t.failure(), {"main": t.rss_kib} if t.rss_kib else {}, {}, dst)


@dataclass
class FerryCopy:
    bin: Path
    availability: ferry.Availability
    scratch: proc.Scratch
    jobs: str | None = None
    name: str = "ferry copy"
    slug: str = "ferry"
    is_ferry: bool = True

    def unavailable(self, dataset: str) -> str | None:
        return None if self.availability.ok else self.availability.reason

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        argv = [str(self.bin), "copy", str(src), str(dst), "--json"]
        if self.jobs:
            argv += ["--jobs", self.jobs]
        t = proc.run(argv, self.scratch, self.slug, timeout)
        summary = ferry.last_json(t.stdout) or {}
        err = t.failure()
        if err is None and not summary:
            err = "no --json summary on stdout"
        if err is None and summary.get("failed"):
            err = f"ferry reported {summary['failed']} failed files"
        return RunResult(t.seconds, err, {"ferry": t.rss_kib} if t.rss_kib else {}, summary, dst)


def contenders(bin_path: Path, availability: ferry.Availability, scratch: proc.Scratch) -> list:
    return [
        FerryCopy(bin_path, availability, scratch, os.environ.get("FERRY_JOBS") or None),
        CommandContender("cp -r --preserve=mode,ownership,timestamps", "cp-r",
                         lambda s, d: ["cp", "-r", "--preserve=mode,ownership,timestamps", str(s), str(d)], scratch),
        CommandContender("cp -a", "cp-a", lambda s, d: ["cp", "-a", str(s), str(d)], scratch),
        CommandContender("rsync -a", "rsync", lambda s, d: ["rsync", "-a", f"{s}/", f"{d}/"], scratch),
    ]
