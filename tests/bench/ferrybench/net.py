"""bench-net contenders over loopback: ferry send/receive (1, 2, 4 streams), `rsync -a` over ssh,
`scp -r`, rsync daemon behind stunnel (VolSync), and plaintext references through a TCP socket.

Each run's clock starts when the sending side is launched (the receiving side is already listening,
like the peers' sshd and stunnel) and stops when both sides have exited.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import ferry, peers, proc
from .suite import RunResult

DATASETS = ["big", "small", "medium", "text"]
BANDWIDTH_LIMIT = 50_000_000
SOCAT_BUF = "262144"
TAR_BLOCKING = "2048"   # 2048 x 512 B = 1 MiB records
_ADDR = re.compile(r"(\d{1,3}(?:\.\d{1,3}){3}:\d+)")


def _pair(receiver_argv: list[str], sender_argv, scratch: proc.Scratch, slug: str,
          timeout: float, ready) -> tuple[proc.Timed, proc.Timed, float] | str:
    """Starts the receiver, waits until `ready(started)` (returns an error string or None), then times
    the sender, whose argv `sender_argv()` is built only then (it may need the receiver's address);
    returns (sender, receiver, seconds until both exited) or an error string."""
    r = proc.start(receiver_argv, scratch, f"{slug}-recv", stdout_pipe=True)
    try:
        err = ready(r)
    except proc.ProcError as e:
        err = str(e)
    if err:
        proc.kill_group(r.proc)
        r.proc.wait()
        rt = proc.collect(r, 0.0, False)
        return f"receiver not ready: {err}; stderr: {rt.stderr.strip()[-200:]}"
    s = proc.start(sender_argv(), scratch, f"{slug}-send")
    deadline = s.t0 + timeout
    st = proc.finish(s, deadline)
    if st.rc != 0 or st.timed_out:
        # A failed sender must not leave the receiver waiting for the full timeout.
        deadline = min(deadline, time.perf_counter() + 10)
    rt = proc.finish(r, deadline)
    seconds = max(s.t0 + st.seconds, r.t0 + rt.seconds) - s.t0
    return st, rt, seconds


@dataclass
class FerryNet:
    bin: Path
    availability: ferry.Availability
    certs: ferry.Certs | None
    scratch: proc.Scratch
    streams: int
    compress: str = "auto"
    bandwidth_limit: int | None = None
    name: str = ""
    slug: str = ""
    is_ferry: bool = True
    only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name:
            self.name = f"ferry --streams {self.streams}"
            if self.compress != "auto":
                self.name += f" --compress {self.compress}"
        if not self.slug:
            self.slug = f"ferry-bw-{self.compress}" if self.bandwidth_limit else f"ferry-s{self.streams}"

    def unavailable(self, dataset: str) -> str | None:
        if not self.availability.ok:
            return self.availability.reason
        if self.only and dataset not in self.only:
            return f"n/a (only {', '.join(self.only)})"
        return None

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        assert self.certs is not None
        dst.mkdir(parents=True)
        recv = [str(self.bin), "receive", "--listen", "127.0.0.1:0", "--root", str(dst),
                *self.certs.receiver_args(), "--transfer", ferry.TRANSFER_ID, "--once", "--json"]
        addr: list[str] = []

        def ready(r: proc.Started) -> str | None:
            line = proc.read_first_line(r, 30)
            m = _ADDR.search(line)
            if not m:
                return f"first stdout line has no address: {line!r}"
            addr.append(m.group(1))
            return None

        def send_argv() -> list[str]:
            argv = [str(self.bin), "send", "--connect", addr[0], "--root", str(src), *self.certs.sender_args(),
                    "--transfer", ferry.TRANSFER_ID, "--streams", str(self.streams), "--compress", self.compress,
                    "--json"]
            if self.bandwidth_limit:
                argv += ["--bandwidth-limit", str(self.bandwidth_limit)]
            return argv

        out = _pair(recv, send_argv, self.scratch, self.slug, timeout, ready)
        if isinstance(out, str):
            return RunResult(None, out)
        st, rt, seconds = out
        err = st.failure() or (rt.failure() and f"receiver {rt.failure()}")
        if st.failure() and rt.stderr.strip():
            # The cause of a sender's reset is usually on the receiving side: show both.
            err = f"{err}; receiver: {rt.stderr.strip().splitlines()[-1][:200]}"
        summary = ferry.last_json(st.stdout) or {}
        if err is None and not summary:
            err = "sender printed no --json summary"
        rsum = ferry.last_json(rt.stdout)
        if rsum is not None:
            summary = {**summary, "receiver": rsum}
        rss = {k: v for k, v in (("send", st.rss_kib), ("recv", rt.rss_kib)) if v}
        return RunResult(seconds, err, rss, summary, dst)


@dataclass
class CommandPeer:
    """A peer whose client is one command and whose server is already running (sshd, stunnel)."""

    name: str
    slug: str
    argv_for: object       # callable (src, dst) -> argv
    scratch: proc.Scratch
    is_ferry: bool = False
    # False skips the untimed warm-up round (scp: ~80 s per run on `small`, and the source cache and
    # the sshd it uses are already warmed by the other contenders).
    warmup: bool = True

    def unavailable(self, dataset: str) -> str | None:
        return None

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        t = proc.run(self.argv_for(src, dst), self.scratch, self.slug, timeout)
        return RunResult(t.seconds, t.failure(), {}, {}, dst)


@dataclass
class SocketRef:
    """Plaintext reference: bytes through one loopback TCP socket with socat's large buffers, either
    the dataset's single file or a tar stream of the whole tree."""

    scratch: proc.Scratch
    tar: bool
    is_ferry: bool = False
    name: str = field(init=False)
    slug: str = field(init=False)
    single_file_datasets: tuple[str, ...] = ("big", "text")

    def __post_init__(self) -> None:
        self.name = "tar over socat (plain TCP)" if self.tar else "file over socat (plain TCP)"
        self.slug = "sock-tar" if self.tar else "sock-file"

    def unavailable(self, dataset: str) -> str | None:
        if not self.tar and dataset not in self.single_file_datasets:
            return "n/a (not a single file)"
        return None

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        dst.mkdir(parents=True)
        port = proc.free_port()
        listen = f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr"
        connect = f"TCP:127.0.0.1:{port}"
        if self.tar:
            recv = ["bash", "-c", f"set -o pipefail; socat -b {SOCAT_BUF} -u {listen} STDOUT | "
                    f"tar -x -B -b {TAR_BLOCKING} -C '{dst}' -f -"]
            send = ["bash", "-c", f"set -o pipefail; tar -c -b {TAR_BLOCKING} -C '{src}' -f - . | "
                    f"socat -b {SOCAT_BUF} -u STDIN {connect}"]
        else:
            files = [p for p in src.iterdir() if p.is_file()]
            if len(files) != 1:
                return RunResult(None, f"expected one file in {src}, found {len(files)}")
            recv = ["socat", "-b", SOCAT_BUF, "-u", listen, f"CREATE:{dst / files[0].name}"]
            send = ["socat", "-b", SOCAT_BUF, "-u", f"OPEN:{files[0]},rdonly", connect]

        def ready(r: proc.Started) -> str | None:
            proc.wait_listening(port, r.proc, "socat receiver")
            return None

        out = _pair(recv, lambda: send, self.scratch, self.slug, timeout, ready)
        if isinstance(out, str):
            return RunResult(None, out)
        st, rt, seconds = out
        err = st.failure() or (rt.failure() and f"receiver {rt.failure()}")
        return RunResult(seconds, err, {}, {}, dst)


def ferry_contenders(bin_path: Path, availability: ferry.Availability, certs: ferry.Certs | None,
                     scratch: proc.Scratch) -> list:
    return [FerryNet(bin_path, availability, certs, scratch, n) for n in (1, 2, 4)]


def baseline_contenders(bin_path: Path, availability: ferry.Availability, certs: ferry.Certs | None,
                        scratch: proc.Scratch) -> list:
    """An older ferry-mover build (FERRY_BASELINE) beside this one, on the same data in the same run."""
    return [FerryNet(bin_path, availability, certs, scratch, n, name=f"ferry (baseline) --streams {n}",
                     slug=f"base-s{n}") for n in (1, 2, 4)]


def peer_contenders(ssh: peers.Ssh | None, tls: peers.RsyncTls | None, scratch: proc.Scratch,
                    setup_errors: dict[str, str]) -> list:
    out: list = []
    if ssh is not None:
        out.append(CommandPeer("rsync -a over ssh", "rsync-ssh",
                               lambda s, d: ["rsync", "-a", "-e", ssh.ssh_cmd(), f"{s}/", f"{peers.SSH_HOST}:{d}/"],
                               scratch))
        out.append(CommandPeer("scp -r", "scp",
                               lambda s, d: ["scp", "-F", str(ssh.config), "-r", "-q", str(s), f"{peers.SSH_HOST}:{d}"],
                               scratch, warmup=False))
    else:
        out.append(Broken("rsync -a over ssh", "rsync-ssh", setup_errors.get("ssh", "sshd not started")))
        out.append(Broken("scp -r", "scp", setup_errors.get("ssh", "sshd not started")))
    if tls is not None:
        out.append(CommandPeer("rsync daemon + stunnel (VolSync)", "rsync-tls",
                               lambda s, d: ["rsync", "-a", f"{s}/", tls.url(d.name)], scratch))
    else:
        out.append(Broken("rsync daemon + stunnel (VolSync)", "rsync-tls",
                          setup_errors.get("stunnel", "stunnel not started")))
    out.append(SocketRef(scratch, tar=False))
    out.append(SocketRef(scratch, tar=True))
    return out


@dataclass
class Broken:
    """A peer whose server could not be set up: its rows say why instead of stopping the harness."""

    name: str
    slug: str
    reason: str
    is_ferry: bool = False

    def unavailable(self, dataset: str) -> str | None:
        return f"FAILED (setup: {self.reason})"

    def run(self, src: Path, dst: Path, timeout: float) -> RunResult:
        return RunResult(None, self.reason)


def bandwidth_contenders(bin_path: Path, availability: ferry.Availability, certs: ferry.Certs | None,
                         scratch: proc.Scratch, streams: int = 2) -> list:
    return [
        FerryNet(bin_path, availability, certs, scratch, streams, compress=c, bandwidth_limit=BANDWIDTH_LIMIT,
                 name=f"ferry --streams {streams} --compress {c}")
        for c in ("zstd", "none")
    ]
