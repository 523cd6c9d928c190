"""Finding the `ferry-mover` binary and probing which of its subcommands work.

The harness calls ferry only through its CLI. Before timing anything it runs each subcommand once on a
tiny tree: a subcommand that is absent or still a stub makes ferry's rows read
"ferry: n/a (subcommand missing)"; one that exists but fails makes them read "ferry: FAILED (...)".
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DEFAULT_BIN = REPO / "target" / "release" / "ferry-mover"
TRANSFER_ID = "bench"


@dataclass(frozen=True)
class Availability:
    ok: bool
    reason: str = ""   # why ferry's rows are n/a or failed

    def label(self) -> str:
        return "ok" if self.ok else self.reason


def binary() -> Path:
    return Path(os.environ.get("FERRY_BIN") or DEFAULT_BIN)


def _help(bin_path: Path, sub: str) -> str:
    try:
        r = subprocess.run([str(bin_path), sub, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"<error {e}>"
    return r.stdout + r.stderr


def _missing(stderr: str) -> bool:
    s = stderr.lower()
    return "not implemented" in s or "unrecognized subcommand" in s or "unexpected argument" in s


def last_json(stdout: str) -> dict | None:
    """The last line of stdout that parses as a JSON object (the `--json` summary)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def _probe_tree(base: Path) -> Path:
    src = base / "probe-src"
    (src / "sub").mkdir(parents=True, exist_ok=True)
    (src / "sub" / "hello.txt").write_bytes(b"hello ferry\n")
    (src / "data.bin").write_bytes(bytes(range(256)) * 64)
    return src


def probe_copy(bin_path: Path, scratch: Path) -> Availability:
    if not bin_path.is_file():
        return Availability(False, f"n/a (binary missing: {bin_path}; run make bench)")
    if "--json" not in _help(bin_path, "copy"):
        return Availability(False, "n/a (subcommand missing)")
    src = _probe_tree(scratch)
    dst = scratch / "probe-copy-dst"
    r = subprocess.run([str(bin_path), "copy", str(src), str(dst), "--json"],
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        if _missing(r.stderr):
            return Availability(False, "n/a (subcommand missing)")
        return Availability(False, f"FAILED (probe copy exit {r.returncode}: {r.stderr.strip()[-160:]})")
    summary = last_json(r.stdout)
    if summary is None or summary.get("files") != 2:
        return Availability(False, f"FAILED (probe copy printed no summary with files=2: {r.stdout.strip()[-160:]!r})")
    if (dst / "sub" / "hello.txt").read_bytes() != b"hello ferry\n":
        return Availability(False, "FAILED (probe copy wrote wrong content)")
    return Availability(True)


@dataclass(frozen=True)
class Certs:
    ca: Path
    sender_cert: Path
    sender_key: Path
    receiver_cert: Path
    receiver_key: Path

    def sender_args(self) -> list[str]:
        return ["--ca", str(self.ca), "--cert", str(self.sender_cert), "--key", str(self.sender_key)]

    def receiver_args(self) -> list[str]:
        return ["--ca", str(self.ca), "--cert", str(self.receiver_cert), "--key", str(self.receiver_key)]


def make_certs(bin_path: Path, out: Path) -> Certs:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(bin_path), "certs", "--out", str(out), "--transfer", TRANSFER_ID],
                   check=True, capture_output=True, timeout=60)
    return Certs(out / "ca.crt", out / "sender.crt", out / "sender.key", out / "receiver.crt", out / "receiver.key")


def probe_net(bin_path: Path, scratch: Path) -> Availability:
    if not bin_path.is_file():
        return Availability(False, f"n/a (binary missing: {bin_path}; run make bench)")
    if ("--transfer" not in _help(bin_path, "certs") or "--streams" not in _help(bin_path, "send")
            or "--listen" not in _help(bin_path, "receive")):
        return Availability(False, "n/a (subcommand missing)")
    try:
        make_certs(bin_path, scratch / "certs")
    except subprocess.CalledProcessError as e:
        err = (e.stderr or b"").decode(errors="replace")
        if _missing(err):
            return Availability(False, "n/a (subcommand missing)")
        return Availability(False, f"FAILED (certs exit {e.returncode}: {err.strip()[-160:]})")
    return Availability(True)
