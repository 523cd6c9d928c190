"""Running and timing processes: wall time, peak RSS (`/usr/bin/time -f %M`), timeouts, cleanup.

Every process is started in its own session so a timeout can end it and its children (for example
`bash -c "tar | socat"`) by process group, and every long-lived helper (sshd, stunnel) is registered
so it is stopped by pid when the harness exits.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

TIME_BIN = "/usr/bin/time"

# Measured processes currently running, so an interrupted harness can end them (see `kill_live`).
_live: set[subprocess.Popen] = set()


class ProcError(Exception):
    """A helper process failed to start or to become ready; the message names it."""


@dataclass
class Timed:
    """One measured process: exit code, wall seconds, peak RSS in KiB, captured output."""

    argv: list[str]
    rc: int
    seconds: float
    rss_kib: int | None
    stdout: str
    stderr: str
    timed_out: bool = False

    def failure(self) -> str | None:
        if self.timed_out:
            return f"timed out after {self.seconds:.0f}s"
        if self.rc != 0:
            tail = self.stderr.strip().splitlines()[-1:] or ["(no stderr)"]
            return f"exit {self.rc}: {tail[0][:200]}"
        return None


@dataclass
class Started:
    """A process started with `start`, to be finished with `finish`."""

    argv: list[str]
    proc: subprocess.Popen
    time_file: Path
    out_file: Path
    err_file: Path
    t0: float
    # Stdout already read past the first line by `read_first_line`.
    pending_stdout: str = ""


@dataclass
class Scratch:
    """Where per-run logs and `time` outputs go (small files, overwritten per run)."""

    dir: Path
    counter: int = 0

    def paths(self, tag: str) -> tuple[Path, Path, Path]:
        self.counter += 1
        base = self.dir / f"{self.counter:05d}-{tag}"
        return base.with_suffix(".time"), base.with_suffix(".out"), base.with_suffix(".err")


def start(argv: list[str], scratch: Scratch, tag: str, env: dict[str, str] | None = None,
          stdout_pipe: bool = False) -> Started:
    """Starts `argv` under `/usr/bin/time` in a new session; stdout goes to a file unless piped."""
    time_file, out_file, err_file = scratch.paths(tag)
    full = [TIME_BIN, "-f", "%M", "-o", str(time_file), *argv]
    out = subprocess.PIPE if stdout_pipe else open(out_file, "wb")
    err = open(err_file, "wb")
    try:
        t0 = time.perf_counter()
        proc = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    except OSError as e:
        raise ProcError(f"failed to start {argv[0]}: {e}") from e
    finally:
        if not stdout_pipe:
            out.close()
        err.close()
    _live.add(proc)
    return Started(argv, proc, time_file, out_file, err_file, t0)


def kill_live() -> None:
    """Kills the process group of every measured process still running (harness interrupted)."""
    for p in list(_live):
        if p.poll() is None:
            kill_group(p)
            p.wait()
    _live.clear()


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def finish(s: Started, deadline: float, extra_stdout: str = "") -> Timed:
    """Waits for a started process until `deadline` (perf_counter time), then kills its group."""
    timed_out = False
    try:
        remaining = max(0.1, deadline - time.perf_counter())
        s.proc.wait(timeout=remaining)
    except subprocess.TimeoutExpired:
        timed_out = True
        kill_group(s.proc)
        s.proc.wait()
    seconds = time.perf_counter() - s.t0
    return collect(s, seconds, timed_out, extra_stdout)


def collect(s: Started, seconds: float, timed_out: bool, extra_stdout: str = "") -> Timed:
    _live.discard(s.proc)
    rss = None
    try:
        lines = s.time_file.read_text().strip().splitlines()
        # `time` prints "Command exited with non-zero status N" before the format line.
        if lines and lines[-1].strip().isdigit():
            rss = int(lines[-1].strip())
    except OSError:
        pass
    stdout = extra_stdout + s.pending_stdout
    if s.proc.stdout is not None:
        stdout += s.proc.stdout.read().decode(errors="replace")
        s.proc.stdout.close()
    elif s.out_file.exists():
        stdout += s.out_file.read_text(errors="replace")
    stderr = s.err_file.read_text(errors="replace") if s.err_file.exists() else ""
    return Timed(s.argv, s.proc.returncode, seconds, rss, stdout, stderr, timed_out)


def run(argv: list[str], scratch: Scratch, tag: str, timeout: float,
        env: dict[str, str] | None = None) -> Timed:
    s = start(argv, scratch, tag, env=env)
    return finish(s, s.t0 + timeout)


def read_first_line(s: Started, timeout: float) -> str:
    """Reads the first stdout line of a piped process (for a receiver's bound address)."""
    assert s.proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(s.proc.stdout, selectors.EVENT_READ)
    buf = b""
    end = time.monotonic() + timeout
    fd = s.proc.stdout.fileno()
    try:
        while b"\n" not in buf:
            left = end - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise ProcError(f"{s.argv[0]} printed no line within {timeout:.0f}s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise ProcError(f"{s.argv[0]} exited before printing its first line")
            buf += chunk
    finally:
        sel.close()
    line, _, rest = buf.partition(b"\n")
    s.pending_stdout = rest.decode(errors="replace")
    return line.decode(errors="replace").strip()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    """True when some socket listens on TCP `port` (read from /proc, so no connection is consumed)."""
    want = f":{port:04X}"
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    cols = line.split()
                    if cols[1].endswith(want) and cols[3] == "0A":
                        return True
        except OSError:
            continue
    return False


def wait_listening(port: int, proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if listening(port):
            return
        if proc.poll() is not None:
            raise ProcError(f"{what} exited (status {proc.returncode}) before listening on port {port}")
        time.sleep(0.005)
    raise ProcError(f"{what} did not listen on port {port} within {timeout:.0f}s")


@dataclass
class Daemons:
    """Long-lived helpers (sshd, stunnel) that must be stopped, by pid, when the harness ends."""

    procs: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def spawn(self, what: str, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "wb") as out:
            try:
                proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as e:
                raise ProcError(f"failed to start {what} ({argv[0]}): {e}") from e
        self.procs.append((what, proc))
        return proc

    def stop_all(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for _, proc in reversed(self.procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()
