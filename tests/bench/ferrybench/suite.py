"""Interleaved measurement rounds over contenders, with verification and bounded scratch space.

Per group (a dataset and the contenders that copy it): one untimed warm-up round, then N timed rounds.
Each round runs every contender once, the starting contender rotating from round to round so no tool
always sits in the same slot. Every run gets a fresh destination. Outputs are verified after the round
(untimed) and deleted after the round, never right before a timed run -- except when the work
directory would otherwise run out of space, in which case pending outputs are deleted and the harness
pauses before the next run (logged).
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from . import verify

GIB = 1024 ** 3


@dataclass
class RunResult:
    seconds: float | None
    error: str | None = None
    rss_kib: dict[str, int] = field(default_factory=dict)   # process role -> peak RSS
    extra: dict = field(default_factory=dict)                # e.g. ferry's --json summary
    dst_root: Path | None = None                             # where the copy landed, to verify


class Contender(Protocol):
    name: str
    slug: str
    is_ferry: bool

    def unavailable(self, dataset: str) -> str | None: ...

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult: ...


@dataclass
class Sample:
    group: str
    contender: str
    round: int                 # -1 is the warm-up
    seconds: float | None
    error: str | None
    rss_kib: dict[str, int]
    extra: dict
    kept: str = ""


@dataclass
class Group:
    label: str                 # table heading, e.g. "small" or "text @ 50 MB/s"
    dataset: str
    contenders: list           # list[Contender]


@dataclass
class GroupResult:
    label: str
    dataset: str
    payload_bytes: int
    files: int
    samples: list[Sample]
    skipped: dict[str, str]    # contender name -> reason it has no rows (n/a, failed warm-up)
    order: list[str]           # contender names in table order
    ferry: set[str]

    def timed(self, name: str) -> list[float]:
        return [s.seconds for s in self.samples
                if s.contender == name and s.round >= 0 and s.error is None and s.seconds is not None]

    def failures(self, name: str) -> list[str]:
        return [s.error for s in self.samples if s.contender == name and s.error]

    def median(self, name: str) -> float | None:
        t = self.timed(name)
        # A contender with any failed timed run gets no median: a broken copy cannot win.
        if not t or any(s.error for s in self.samples if s.contender == name and s.round >= 0):
            return None
        return statistics.median(t)

    def peak_rss(self, name: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.samples:
            if s.contender == name:
                for role, v in s.rss_kib.items():
                    out[role] = max(out.get(role, 0), v)
        return out

    def kept(self, name: str) -> str:
        for s in reversed(self.samples):
            if s.contender == name and s.kept:
                return s.kept
        return ""

    def extra(self, name: str) -> dict:
        for s in reversed(self.samples):
            if s.contender == name and s.extra and s.error is None:
                return s.extra
        return {}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def remove_tree(path: Path) -> None:
    if path.exists() or path.is_symlink():
        subprocess.run(["rm", "-rf", "--", str(path)], check=False)


@dataclass
class Space:
    """Keeps copies within the work directory's free space and, on tmpfs, within free memory."""

    out_dir: Path
    tmpfs: bool
    reserve: int = 2 * GIB

    def room(self) -> int:
        st = os.statvfs(self.out_dir)
        free = st.f_bavail * st.f_frsize
        if self.tmpfs:
            free = min(free, _mem_available() - self.reserve)
        return free

    def has_room_for(self, need: int) -> bool:
        return self.room() > need + self.reserve // 2


def _mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def run_group(group: Group, src: Path, index: verify.SourceIndex, rounds: int, space: Space,
              timeout: float, defer_delete: bool) -> GroupResult:
    """Runs one group; `defer_delete` keeps every output until the group ends (on-disk mode, where
    deleting right before the next run would poison inode allocation)."""
    payload = index.payload_bytes
    skipped: dict[str, str] = {}
    active = []
    for c in group.contenders:
        why = c.unavailable(group.dataset)
        if why:
            skipped[c.name] = why
        else:
            active.append(c)
    samples: list[Sample] = []
    pending: list[tuple[Sample, Path, Path | None]] = []   # (sample, run dir, copy root to verify)
    all_dirs: list[Path] = []

    def settle() -> None:
        for sample, run_dir, root in pending:
            if sample.error is None and root is not None:
                v = verify.compare(index, root)
                sample.kept = v.kept_summary()
                if not v.ok:
                    sample.error = "wrong copy: " + "; ".join(v.problems)
        pending.clear()

    def purge(dirs: list[Path]) -> None:
        for d in dirs:
            remove_tree(d)
        dirs.clear()

    for rnd in range(-1, rounds):
        n = len(active)
        order = active[(rnd + 1) % n:] + active[:(rnd + 1) % n] if n else []
        for c in order:
            if c.name in skipped or (rnd < 0 and not getattr(c, "warmup", True)):
                continue
            if not space.has_room_for(payload * 2):
                log(f"{group.label}: low on space ({space.room() // 2**20} MiB free): "
                    "verifying and deleting this round's outputs early, pausing 2 s")
                settle()
                purge(all_dirs)
                time.sleep(2)
            run_dir = space.out_dir / f"{group.dataset}-{c.slug}-r{rnd + 1}"
            all_dirs.append(run_dir)
            res = c.run(src, run_dir, timeout)
            tag = "warm-up" if rnd < 0 else f"round {rnd + 1}/{rounds}"
            shown = f"{res.seconds:.3f}s" if res.seconds is not None else "-"
            log(f"{group.label} {tag}: {c.name}: {shown}" + (f" ERROR {res.error}" if res.error else ""))
            s = Sample(group.label, c.name, rnd, res.seconds, res.error, res.rss_kib, res.extra)
            samples.append(s)
            pending.append((s, run_dir, res.dst_root))
        settle()
        for s in samples:
            if s.round == rnd and s.error and s.contender not in skipped:
                skipped[s.contender] = f"FAILED ({s.error})"
                if rnd < 0:
                    log(f"{group.label}: {s.contender} failed its warm-up; no timed rounds for it")
        if not defer_delete and all_dirs:
            purge(all_dirs)
            # Let the deletes settle before the next round's first timed run.
            if rnd + 1 < rounds:
                time.sleep(1)
    purge(all_dirs)
    # Contenders that failed only in a timed round keep their rows (marked failed) but no median.
    for name in list(skipped):
        if any(s.contender == name and s.round >= 0 for s in samples):
            del skipped[name]
    return GroupResult(
        group.label, group.dataset, payload, index.file_count, samples, skipped,
        [c.name for c in group.contenders], {c.name for c in group.contenders if c.is_ferry},
    )


def prepare_dst_parent(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        shutil.rmtree(path)
