#!/usr/bin/env python3
"""ferry's benchmark harness: `bench.py local` (issue 2) and `bench.py net` (issue 4).

Runs itself inside a private mount namespace (`unshare -m --propagation private`) with its work
directory on a fresh tmpfs, so every copy, and every server's write (sshd, rsync daemon, stunnel),
lands in memory and disappears with the namespace. `--on-disk DIR` measures on the real disk instead
(labelled as such). See docs/benchmarks.md for the method; `--help` for the knobs. Python 3 stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ferrybench import datasets, ferry, local, net, peers, proc, report, suite, verify  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "benchmarks.md"
IN_NS = "FERRY_BENCH_IN_NAMESPACE"
ON_DISK_SETTLE = int(os.environ.get("ON_DISK_SETTLE") or 75)


def parse_args(argv: list[str]) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="bench.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("suite", choices=["local", "net"])
    p.add_argument("--rounds", type=int, default=int(env("ROUNDS") or 3),
                   help="timed rounds after the warm-up round (env ROUNDS, default 3)")
    p.add_argument("--datasets", default=env("DATASETS") or "",
                   help="comma list (env DATASETS); local default big,small,medium,mixed; net big,small,medium,text")
    p.add_argument("--contenders", default=env("CONTENDERS") or "",
                   help="comma list of contender keys or key prefixes (env CONTENDERS), e.g. ferry,cp-r,rsync; "
                        "local: ferry cp-r cp-a rsync; net: ferry-s1 ferry-s2 ferry-s4 rsync-ssh scp rsync-tls "
                        "sock-file sock-tar ferry-bw")
    p.add_argument("--on-disk", default=env("ON_DISK") or "",
                   help="measure in this directory on the real disk instead of a tmpfs (env ON_DISK)")
    p.add_argument("--tmpfs-size", default=env("TMPFS_SIZE") or "14g")
    p.add_argument("--scale", type=float, default=float(env("SCALE") or 1.0),
                   help="dataset size factor, for quick trials only (env SCALE)")
    p.add_argument("--timeout", type=float, default=float(env("RUN_TIMEOUT") or 600), help="seconds per run")
    p.add_argument("--write-docs", action="store_true", default=env("WRITE_DOCS") in ("1", "yes", "true"),
                   help="rewrite this suite's table block in docs/benchmarks.md (env WRITE_DOCS=1)")
    p.add_argument("--command", default=env("BENCH_COMMAND") or "",
                   help="the command line to record in the docs (the Makefile passes it)")
    p.add_argument("--workdir", default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def reexec_in_namespace(argv: list[str], args: argparse.Namespace) -> int:
    """Re-runs this script under `unshare -m --propagation private`; the child mounts the tmpfs."""
    if os.geteuid() != 0:
        print("bench: needs root (a private mount namespace and a tmpfs mount)", file=sys.stderr)
        return 2
    if args.on_disk:
        workdir = Path(args.on_disk).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        if any(workdir.iterdir()):
            print(f"bench: --on-disk directory {workdir} is not empty; give an empty or new one", file=sys.stderr)
            return 2
    else:
        workdir = Path(tempfile.mkdtemp(prefix="ferry-bench-", dir="/tmp"))
    cmd = ["unshare", "-m", "--propagation", "private", "--", sys.executable, str(Path(__file__).resolve()),
           *argv, "--workdir", str(workdir)]
    env = dict(os.environ, **{IN_NS: "1"})
    child = subprocess.Popen(cmd, env=env)
    # Pass a termination on to the namespace's process so it stops its servers and unmounts.
    signal.signal(signal.SIGTERM, lambda *_: child.send_signal(signal.SIGTERM))
    try:
        while True:
            try:
                return child.wait()
            except KeyboardInterrupt:
                continue   # the child got the same SIGINT from the terminal; wait for its cleanup
    finally:
        if args.on_disk:
            subprocess.run(["rm", "-rf", "--", str(workdir)], check=False)
        else:
            try:
                workdir.rmdir()   # the tmpfs was only mounted inside the namespace: this is the empty mount point
            except OSError as e:
                print(f"bench: could not remove mount point {workdir}: {e}", file=sys.stderr)


def selected(keys: str, slug: str) -> bool:
    if not keys:
        return True
    return any(slug == k or slug.startswith(k + "-") for k in keys.split(",") if k)


def tool_versions() -> str:
    def first(cmd: list[str]) -> str:
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
        except OSError:
            return "missing"
        return (r.stdout + r.stderr).strip().splitlines()[0] if (r.stdout + r.stderr).strip() else "?"
    return "; ".join([
        first(["rsync", "--version"]).replace("  ", " "),
        first(["ssh", "-V"]),
        _stunnel_version(),
        _socat_version(),
        first(["cp", "--version"]),
    ])


def _stunnel_version() -> str:
    r = subprocess.run(["stunnel", "-version"], capture_output=True, text=True)
    for line in (r.stdout + r.stderr).splitlines():
        if line.startswith("stunnel "):
            return line.split(" on ")[0]
    return "stunnel ?"


def _socat_version() -> str:
    r = subprocess.run(["socat", "-V"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        if line.startswith("socat version"):
            return " ".join(line.split()[:3])
    return "socat ?"


def git_rev() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("+dirty" if dirty else "")


def ferry_label(bin_path: Path) -> str:
    """Which ferry was measured: FERRY_REV if given (e.g. the merged branches a FERRY_BIN was built
    from), else this checkout's revision when the default binary is used."""
    rev = os.environ.get("FERRY_REV")
    if rev:
        return f"{bin_path.name} built from {rev}"
    if bin_path == ferry.DEFAULT_BIN:
        return f"target/release/ferry-mover at git {git_rev()}"
    return f"{bin_path} (set FERRY_REV to record its source)"


def fs_label(path: Path, tmpfs: bool, size: str) -> str:
    r = subprocess.run(["findmnt", "-no", "SOURCE,FSTYPE,OPTIONS", "-T", str(path)], capture_output=True, text=True)
    desc = " ".join(r.stdout.split("\n")[0].split()) if r.returncode == 0 else "?"
    if tmpfs:
        return f"tmpfs (size={size}) in a private mount namespace"
    return f"ON-DISK {path} ({desc})"


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if os.environ.get(IN_NS) != "1":
        return reexec_in_namespace(argv, args)
    workdir = Path(args.workdir)
    tmpfs = not args.on_disk
    if tmpfs:
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.tmpfs_size},mode=0755", "ferry-bench",
                        str(workdir)], check=True)
    daemons = proc.Daemons()
    # SIGTERM ends the run like Ctrl-C, so the servers started below are stopped by pid.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        return run_suite(args, workdir, tmpfs, daemons)
    finally:
        proc.kill_live()
        daemons.stop_all()


def run_suite(args: argparse.Namespace, workdir: Path, tmpfs: bool, daemons: proc.Daemons) -> int:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_start = os.getloadavg()[0]
    data_dir, out_dir, logs = workdir / "data", workdir / "out", workdir / "logs"
    for d in (data_dir, out_dir, logs):
        d.mkdir(parents=True, exist_ok=True)
    scratch = proc.Scratch(logs)
    default = local.DATASETS if args.suite == "local" else net.DATASETS
    names = [n for n in (args.datasets.split(",") if args.datasets else default) if n]
    for n in names:
        if n not in datasets.SPECS:
            print(f"bench: unknown dataset {n!r}; known: {', '.join(datasets.SPECS)}", file=sys.stderr)
            return 2
    where = fs_label(workdir, tmpfs, args.tmpfs_size)
    suite.log(f"{args.suite}: work dir {workdir}: {where}; rounds {args.rounds} + 1 warm-up; datasets {','.join(names)}")

    bin_path = ferry.binary()
    probe_dir = workdir / "probe"
    probe_dir.mkdir()
    if args.suite == "local":
        avail = ferry.probe_copy(bin_path, probe_dir)
    else:
        avail = ferry.probe_net(bin_path, probe_dir)
    suite.log(f"ferry ({bin_path}): {avail.label()}")

    sources: dict[str, tuple[Path, verify.SourceIndex]] = {}
    for n in names:
        t0 = time.perf_counter()
        src = datasets.ensure(n, data_dir, args.scale)
        idx = verify.SourceIndex.build(src)
        sources[n] = (src, idx)
        suite.log(f"dataset {n}: {idx.file_count} files, {idx.payload_bytes / 2**20:.1f} MiB, "
                  f"generated and indexed in {time.perf_counter() - t0:.1f}s")

    groups: list[suite.Group] = []
    if args.suite == "local":
        cs = [c for c in local.contenders(bin_path, avail, scratch) if selected(args.contenders, c.slug)]
        groups = [suite.Group(n, n, cs) for n in names]
    else:
        certs = None
        if avail.ok:
            certs = ferry.Certs(*(probe_dir / "certs" / f for f in
                                  ("ca.crt", "sender.crt", "sender.key", "receiver.crt", "receiver.key")))
            avail = net_probe_transfer(bin_path, avail, certs, scratch, probe_dir)
            suite.log(f"ferry send/receive probe: {avail.label()}")
        ferry_cs = net.ferry_contenders(bin_path, avail, certs, scratch)
        baseline = os.environ.get("FERRY_BASELINE")
        if baseline:
            base_avail = ferry.probe_net(Path(baseline), probe_dir / "baseline")
            suite.log(f"baseline ferry ({baseline}): {base_avail.label()}")
            ferry_cs += net.baseline_contenders(Path(baseline), base_avail, certs, scratch)
        setup_errors: dict[str, str] = {}
        ssh = tls = None
        peer_keys = ("rsync-ssh", "scp", "rsync-tls")
        if any(selected(args.contenders, k) for k in peer_keys[:2]):
            try:
                ssh = peers.start_sshd(workdir, daemons)
            except (proc.ProcError, subprocess.SubprocessError, OSError) as e:
                setup_errors["ssh"] = str(e)
                suite.log(f"sshd setup failed: {e}")
        if selected(args.contenders, "rsync-tls"):
            try:
                tls = peers.start_rsync_tls(workdir, out_dir, daemons)
            except (proc.ProcError, subprocess.SubprocessError, OSError) as e:
                setup_errors["stunnel"] = str(e)
                suite.log(f"stunnel/rsync daemon setup failed: {e}")
        cs = [c for c in ferry_cs + net.peer_contenders(ssh, tls, scratch, setup_errors)
              if selected(args.contenders, c.slug)]
        groups = [suite.Group(n, n, cs) for n in names]
        bw = [c for c in net.bandwidth_contenders(bin_path, avail, certs, scratch)
              if selected(args.contenders, c.slug)]
        if "text" in names and bw:
            groups.append(suite.Group(f"text --bandwidth-limit {net.BANDWIDTH_LIMIT}", "text", bw))

    space = suite.Space(out_dir, tmpfs)
    results: list[suite.GroupResult] = []
    for i, g in enumerate(groups):
        src, idx = sources[g.dataset]
        results.append(suite.run_group(g, src, idx, args.rounds, space, args.timeout, defer_delete=not tmpfs))
        if not tmpfs and idx.file_count > 1000 and i + 1 < len(groups):
            # ext4 without a journal skips inodes freed in the last minute or so: creating files right
            # after this group's mass delete would measure that, not the tools.
            suite.log(f"on-disk: waiting {ON_DISK_SETTLE}s after deleting {g.label}'s copies (inode trap)")
            time.sleep(ON_DISK_SETTLE)

    is_net = args.suite == "net"
    targets = report.net_targets(results) if is_net else report.local_targets(results)
    meta = (f"Measured {started} on `nproc`={os.cpu_count()}, kernel {platform.release()}, work dir: {where}; "
            f"ferry {'n/a' if not avail.ok else ferry_label(bin_path)}; {args.rounds} timed round(s) + 1 warm-up, "
            f"interleaved, medians. Machine load (1-min load average, other jobs included) "
            f"{load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end."
            + (f" DATASETS SCALED BY {args.scale} (not the standard sizes)." if args.scale != 1.0 else "")
            + f"\n\nCommand: `{args.command or 'tests/bench/bench.py ' + shlex.join(sys.argv[1:-2])}`"
            f"\n\nTools: {tool_versions()}.")
    body = "\n\n".join([
        meta,
        ("ferry: " + avail.reason) if not avail.ok else "",
        report.table(results, net=is_net),
        "\n".join(report.summary_lines(results)),
        ("Targets (from the issues):\n\n" + report.targets_table(targets)) if targets else "",
    ])
    body = "\n\n".join(part for part in body.split("\n\n") if part.strip())
    print(body)
    save_raw(args, results, meta, tmpfs)
    if args.write_docs:
        key = f"bench-{args.suite}-{'tmpfs' if tmpfs else 'on-disk'}"
        report.write_docs(DOCS, key, body)
        suite.log(f"rewrote the {key} block of {DOCS}")
    return 0


def net_probe_transfer(bin_path: Path, avail: ferry.Availability, certs: ferry.Certs, scratch: proc.Scratch,
                       probe_dir: Path) -> ferry.Availability:
    """One tiny send/receive before timing anything: a stub or broken pair makes ferry's rows n/a/FAILED."""
    src = probe_dir / "probe-src"
    if not src.exists():
        ferry._probe_tree(probe_dir)
    c = net.FerryNet(bin_path, avail, certs, scratch, 1)
    res = c.run(src, probe_dir / "probe-net-dst", 60)
    if res.error:
        if "not implemented" in res.error.lower():
            return ferry.Availability(False, "n/a (subcommand missing)")
        return ferry.Availability(False, f"FAILED (probe transfer: {res.error[:200]})")
    v = verify.compare(verify.SourceIndex.build(src), probe_dir / "probe-net-dst")
    if not v.ok:
        return ferry.Availability(False, f"FAILED (probe transfer wrote a wrong copy: {'; '.join(v.problems)})")
    return avail


def save_raw(args: argparse.Namespace, results: list[suite.GroupResult], meta: str, tmpfs: bool) -> None:
    out = REPO / "bench-out"
    out.mkdir(exist_ok=True)
    path = out / f"{args.suite}-{'tmpfs' if tmpfs else 'on-disk'}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    data = {
        "meta": meta,
        "groups": [
            {"label": g.label, "dataset": g.dataset, "payload_bytes": g.payload_bytes, "files": g.files,
             "skipped": g.skipped,
             "samples": [{"contender": s.contender, "round": s.round, "seconds": s.seconds, "error": s.error,
                          "rss_kib": s.rss_kib, "extra": s.extra, "kept": s.kept} for s in g.samples]}
            for g in results
        ],
    }
    path.write_text(json.dumps(data, indent=1))
    suite.log(f"raw samples: {path}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
