#!/usr/bin/env python3
"""Fan-out over capped links, at the mover level (`make bench-fanout`).

One source node and four destination nodes, each a network namespace this script creates, joined
by a bridge in a sixth namespace (addresses in 10.231.7.0/24, no route out of the machine). Every
node's link is capped with tc tbf in both directions at RATE, as a node's NIC would be. Each
destination runs a node service (`ferry-mover node serve`) and a receiver using it; the source
runs one sender per destination. Scenarios, each on fresh destinations and stores:

  fan-out to 1, 2 and 4 nodes   receivers given --swarm-peers (every block leaves the source once)
  4 separate transfers          the naive baseline: the same pairs without --swarm-peers
  fan-out to 4, one sender      as fan-out to 4, from one sender process (`--connect` repeated),
                                which reads and hashes each block of the source once
  fan-out to 4 again            fresh destination directories, the stores kept from the fan-out

Reported per scenario: the median wall time over ROUNDS, its ratio to fan-out to 1, the bytes
that left the source node (its interface's counters) as a multiple of the dataset, the most bytes
any destination node sent or received, the highest peak RSS of any receiver and of any node
service, and the CPU time of the senders and of the destinations (receivers and node services).

Knobs (environment): ROUNDS=3 RATE_MBIT=400 MIB=1024 FILES=8 FERRY_BIN=target/release/ferry-mover
WORK=/var/tmp/ferry-fanout (a tmpfs is mounted there for the run), ONLY=1,3 (run only these of the
scenarios, numbered as listed above; ratios are to the first one run).
"""
from __future__ import annotations

import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROUNDS = int(os.environ.get("ROUNDS", "3"))
RATE_MBIT = int(os.environ.get("RATE_MBIT", "400"))
MIB = int(os.environ.get("MIB", "1024"))
FILES = int(os.environ.get("FILES", "8"))
BIN = Path(os.environ.get("FERRY_BIN", "target/release/ferry-mover")).resolve()
WORK = Path(os.environ.get("WORK", "/var/tmp/ferry-fanout"))
PREFIX = "ferry-fo-"
HUB = PREFIX + "hub"
NODES = ["src", "d1", "d2", "d3", "d4"]
SERVICE_PORT = 7443


def ip_of(node: str) -> str:
    return f"10.231.7.{10 + NODES.index(node)}"


def ns(node: str) -> str:
    return PREFIX + node


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True)


def in_ns(node: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns(node), *args]


def teardown() -> None:
    for n in [*NODES, "hub"]:
        run("ip", "netns", "del", PREFIX + n, check=False)


def setup_network() -> None:
    teardown()
    run("ip", "netns", "add", HUB)
    run("ip", "netns", "exec", HUB, "ip", "link", "add", "br0", "type", "bridge")
    run("ip", "netns", "exec", HUB, "ip", "link", "set", "br0", "up")
    rate = f"{RATE_MBIT}mbit"
    for n in NODES:
        run("ip", "netns", "add", ns(n))
        hub_end, node_end = f"fo-{n}-h", f"fo-{n}-n"
        run("ip", "link", "add", hub_end, "type", "veth", "peer", "name", node_end)
        run("ip", "link", "set", hub_end, "netns", HUB)
        run("ip", "link", "set", node_end, "netns", ns(n))
        run("ip", "netns", "exec", HUB, "ip", "link", "set", hub_end, "master", "br0", "up")
        run(*in_ns(n, "ip", "link", "set", node_end, "name", "eth0"))
        run(*in_ns(n, "ip", "addr", "add", f"{ip_of(n)}/24", "dev", "eth0"))
        run(*in_ns(n, "ip", "link", "set", "eth0", "up"))
        run(*in_ns(n, "ip", "link", "set", "lo", "up"))
        # Out of the node, and into it (the hub's end sends toward the node).
        tbf = ["root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms"]
        run(*in_ns(n, "tc", "qdisc", "add", "dev", "eth0", *tbf))
        run("ip", "netns", "exec", HUB, "tc", "qdisc", "add", "dev", hub_end, *tbf)


def counters(node: str) -> tuple[int, int]:
    out = run(*in_ns(node, "cat", "/sys/class/net/eth0/statistics/tx_bytes",
                     "/sys/class/net/eth0/statistics/rx_bytes")).stdout.split()
    return int(out[0]), int(out[1])


def make_dataset(root: Path) -> int:
    root.mkdir(parents=True)
    per_file = MIB * 1024 * 1024 // FILES
    chunk = 4 * 1024 * 1024
    for i in range(FILES):
        with open(root / f"part-{i:02}.bin", "wb") as f:
            left = per_file
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
    return per_file * FILES


def reap(p: subprocess.Popen, timeout: float) -> tuple[str, str, os.struct_rusage]:
    """Waits for `p` (started with pipes) like `communicate`, and also returns its resource
    usage: peak RSS in KiB, CPU seconds (`ip netns exec` execs the command, so the child is the
    mover itself)."""
    err: list[str] = []
    drain = threading.Thread(target=lambda: err.append(p.stderr.read() if p.stderr else ""))
    drain.start()
    out = p.stdout.read() if p.stdout else ""
    drain.join(timeout)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    return out, "".join(err), usage


def wait_port(node: str, port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    probe = f"import socket; socket.create_connection(('{ip_of(node)}', {port}), 1).close()"
    while time.monotonic() < deadline:
        if run(*in_ns(node, sys.executable, "-c", probe), check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise SystemExit(f"the node service on {node} did not listen within {timeout} s")


class Nodes:
    """Node services on the destinations in use, their stores under WORK/<node>/cas."""

    def __init__(self, dests: list[str], certs: Path):
        self.procs = []
        self.peak_rss_kib = 0
        self.cpu = 0.0
        for d in dests:
            store = WORK / d / "cas"
            store.mkdir(parents=True, exist_ok=True)
            self.procs.append(subprocess.Popen(
                in_ns(d, str(BIN), "node", "serve", "--store", str(store), "--cap", str(8 << 30),
                      "--listen", f"{ip_of(d)}:{SERVICE_PORT}", "--node", d,
                      "--ca", str(certs / "ca.crt"), "--cert", str(certs / "node.crt"),
                      "--key", str(certs / "node.key")),
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for d in dests:
            wait_port(d, SERVICE_PORT)

    def stop(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            usage = reap(p, 30)[2]
            self.peak_rss_kib = max(self.peak_rss_kib, usage.ru_maxrss)
            self.cpu += usage.ru_utime + usage.ru_stime


def transfer(dests: list[str], certs: Path, swarm: bool, one_sender: bool) -> dict:
    """One sender per destination, all at once (or one sender for all of them, `--connect`
    repeated); returns time and link byte counts."""
    peers = ",".join(f"{ip_of(d)}:{SERVICE_PORT}" for d in dests)
    receivers = []
    for i, d in enumerate(dests):
        data = WORK / d / "data"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        args = [str(BIN), "receive", "--listen", f"{ip_of(d)}:0", "--root", str(data), "--once",
                "--json", "--no-progress", "--ca", str(certs / "ca.crt"),
                "--cert", str(certs / "receiver.crt"), "--key", str(certs / "receiver.key"),
                "--block-service", f"{ip_of(d)}:{SERVICE_PORT}"]
        if swarm:
            args += ["--swarm-peers", peers, "--swarm-self", str(i)]
        p = subprocess.Popen(in_ns(d, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        addr = p.stdout.readline().strip()
        if not addr:
            raise SystemExit(f"receiver on {d} did not start: {p.stderr.read()[-2000:]}")
        receivers.append((d, p, addr))
    before = {n: counters(n) for n in ["src", *dests]}
    started = time.monotonic()
    # The source's transmit counter over time: when it stopped sending says how much of the time
    # went to destinations passing blocks on after the source was done.
    samples: list[tuple[float, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.25):
            samples.append((time.monotonic() - started, counters("src")[0]))

    sampler = threading.Thread(target=sample)
    sampler.start()
    def sender(addrs: list[str]) -> subprocess.Popen:
        connects = [a for addr in addrs for a in ("--connect", addr)]
        return subprocess.Popen(
            in_ns("src", str(BIN), "send", *connects, "--root", str(WORK / "src"),
                  "--streams", "4", "--compress", "none", "--json", "--no-progress",
                  "--ca", str(certs / "ca.crt"), "--cert", str(certs / "sender.crt"),
                  "--key", str(certs / "sender.key")),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    addrs = [addr for _, _, addr in receivers]
    senders = [sender(addrs)] if one_sender else [sender([a]) for a in addrs]
    # CPU the source node spent: every sender reads and hashes the whole source (its proofs of
    # possession are keyed for its own receiver); one sender for all reads and hashes it once.
    source_cpu = 0.0
    for s in senders:
        out, err, usage = reap(s, 3600)
        source_cpu += usage.ru_utime + usage.ru_stime
        if s.returncode != 0:
            raise SystemExit(f"sender failed ({s.returncode}): {err[-2000:]}")
    receiver_rss = 0
    receiver_cpu = 0.0
    for d, p, _ in receivers:
        out, err, usage = reap(p, 600)
        receiver_rss = max(receiver_rss, usage.ru_maxrss)
        receiver_cpu += usage.ru_utime + usage.ru_stime
        if p.returncode != 0:
            raise SystemExit(f"receiver on {d} failed ({p.returncode}): {err[-2000:]}")
    seconds = time.monotonic() - started
    sampling.set()
    sampler.join()
    after = {n: counters(n) for n in ["src", *dests]}
    moved = {n: (after[n][0] - before[n][0], after[n][1] - before[n][1]) for n in after}
    source_done = next((t for t, tx in samples
                        if tx - before["src"][0] >= 0.99 * moved["src"][0]), seconds)
    for d in dests:
        same = run("diff", "-rq", str(WORK / "src"), str(WORK / d / "data"), check=False)
        if same.returncode != 0:
            raise SystemExit(f"{d} differs from the source: {same.stdout[-2000:]}")
    return {"seconds": seconds, "source_tx": moved["src"][0], "source_done": source_done,
            "dest_max": max(max(moved[d]) for d in dests), "receiver_rss": receiver_rss,
            "source_cpu": source_cpu, "receiver_cpu": receiver_cpu}


def fresh_stores(dests: list[str]) -> None:
    for d in dests:
        shutil.rmtree(WORK / d / "cas", ignore_errors=True)


def scenario(name: str, dests: list[str], certs: Path, swarm: bool, keep_stores: bool = False,
             one_sender: bool = False) -> dict:
    if not keep_stores:
        fresh_stores(dests)
    nodes = Nodes(dests, certs)
    try:
        res = transfer(dests, certs, swarm, one_sender)
    finally:
        nodes.stop()
    res["service_rss"] = nodes.peak_rss_kib
    # What the destination nodes spent: their receivers and node services.
    res["dest_cpu"] = res["receiver_cpu"] + nodes.cpu
    return res


def main() -> int:
    if os.geteuid() != 0:
        print("bench-fanout needs root (network namespaces, tc)", file=sys.stderr)
        return 2
    if not BIN.is_file():
        print(f"{BIN} missing: run `make release` first", file=sys.stderr)
        return 2
    WORK.mkdir(parents=True, exist_ok=True)
    run("mount", "-t", "tmpfs", "-o", f"size={MIB * 12 + 2048}m", "tmpfs", str(WORK))
    try:
        setup_network()
        certs = WORK / "certs"
        run(str(BIN), "certs", "--out", str(certs), "--transfer", "fanout-bench",
            "--cluster", "bench")
        size = make_dataset(WORK / "src")
        plan = [
            ("fan-out to 1", NODES[1:2], True, False),
            ("fan-out to 2", NODES[1:3], True, False),
            ("fan-out to 4", NODES[1:5], True, False),
            ("fan-out to 4 again (stores hold it)", NODES[1:5], True, True),
            ("4 separate transfers", NODES[1:5], False, False),
            ("fan-out to 4, one sender", NODES[1:5], True, False, True),
        ]
        only = os.environ.get("ONLY")
        if only:
            plan = [p for i, p in enumerate(plan, 1) if str(i) in only.split(",")]
        results: dict[str, list[dict]] = {name: [] for name, *_ in plan}
        for r in range(ROUNDS):
            for name, dests, swarm, keep, *one in plan:
                res = scenario(name, dests, certs, swarm, keep, *one)
                results[name].append(res)
                print(f"round {r + 1}: {name}: {res['seconds']:.1f} s (source done at "
                      f"{res['source_done']:.1f} s), source sent "
                      f"{res['source_tx'] / size:.2f}x the dataset, busiest destination link "
                      f"{res['dest_max'] / size:.3f}x, peak RSS receiver "
                      f"{res['receiver_rss'] >> 10} MiB, node service {res['service_rss'] >> 10} MiB, "
                      f"senders' CPU {res['source_cpu']:.1f} s, destinations' CPU "
                      f"{res['dest_cpu']:.1f} s",
                      flush=True)
        base = statistics.median(x["seconds"] for x in results[plan[0][0]])
        print(f"\n{MIB} MiB in {FILES} files, every link capped at {RATE_MBIT} Mbit/s each way, "
              f"{ROUNDS} rounds (medians)\n")
        print(f"| scenario | time | vs {plan[0][0]} | bytes out of the source node | source done sending | busiest destination link | peak RSS receiver / node service | senders' CPU | destinations' CPU |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, *_ in plan:
            xs = results[name]
            t = statistics.median(x["seconds"] for x in xs)
            src = statistics.median(x["source_tx"] for x in xs) / size
            dmax = statistics.median(x["dest_max"] for x in xs) / size
            done = statistics.median(x["source_done"] for x in xs)
            rss = max(x["receiver_rss"] for x in xs) >> 10
            srss = max(x["service_rss"] for x in xs) >> 10
            cpu = statistics.median(x["source_cpu"] for x in xs)
            dcpu = statistics.median(x["dest_cpu"] for x in xs)
            print(f"| {name} | {t:.1f} s | {t / base:.2f}x | {src:.2f}x the dataset | {done:.1f} s "
                  f"| {dmax:.3f}x | {rss} / {srss} MiB | {cpu:.1f} s | {dcpu:.1f} s |")
        return 0
    finally:
        teardown()
        run("umount", str(WORK), check=False)


if __name__ == "__main__":
    sys.exit(main())
