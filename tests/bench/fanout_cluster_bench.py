#!/usr/bin/env python3
"""`make bench-fanout-cluster`: fan-out Transfers through the operator on the local cluster.

The cluster's real nodes (kubelet, containerd, the release images) with the node service on every
node, and every node's link capped with tc tbf at RATE each way (tests/cluster/shape.sh), as a
node's NIC would be. The source is node-e; the destinations node-a to node-d. Per round, each
scenario on a dataset of its own (MIB MiB in FILES files, fresh random content, so no store holds
any of it):

  fan-out to 1, 2 and 4 nodes   one Transfer, `destination.hostPath.nodes`
  2 and 4 separate Transfers    the naive baseline: one Transfer per destination node, at once
  fan-out to 4 again            the last fan-out's dataset to fresh directories on the same nodes
                                (their stores hold it)

Reported per scenario: the median apply-to-Succeeded time over ROUNDS, its ratio to the fan-out to
1, the bytes that left the source node (its eth0 counters) and the most bytes any node's link
carried (in plus out), both as multiples of the dataset; for fan-outs also the attempts their
destinations took beyond the first (all rounds) and, per round, when each destination succeeded,
so an outlier round can be told from a retry.

Knobs (environment): ROUNDS=3 RATE=200mbit MIB=1024 FILES=8, ONLY=fan1,fan4 (a comma-separated
subset of fan1 fan2 fan4 separate2 separate4; the repeat runs after fan4). The cluster is started fresh with the
release build (FERRY_PROFILE=release) and stopped afterwards. Python 3 stdlib.
"""
from __future__ import annotations

import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import operator_bench as ob  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS") or 3)
RATE = os.environ.get("RATE") or "200mbit"
MIB = int(os.environ.get("MIB") or 1024)
FILES = int(os.environ.get("FILES") or 8)
SOURCE = "node-e"
DESTINATIONS = ["node-a", "node-b", "node-c", "node-d"]
LINKS = [SOURCE, *DESTINATIONS]
NS = "fanout"


def link_bytes(node: str) -> tuple[int, int]:
    """(left the node, reached the node) on its eth0 so far."""
    def read(c: str) -> int:
        return int(ob.sh("ip", "netns", "exec", ob.node_netns(node), "cat",
                         f"/sys/class/net/eth0/statistics/{c}").strip())
    return read("tx_bytes"), read("rx_bytes")


def write_dataset(name: str) -> str:
    """MIB MiB of fresh random content in FILES files on the source node; its path there."""
    path = f"{ob.ROOT}/{name}/src"
    root = ob.owned_dir(ob.node_path(SOURCE, path))
    per_file = (MIB << 20) // FILES
    for i in range(FILES):
        with open(root / f"part-{i}.bin", "wb") as f:
            left = per_file
            while left:
                n = min(left, 4 << 20)
                f.write(os.urandom(n))
                left -= n
        os.chown(root / f"part-{i}.bin", ob.UID, ob.UID)
    return path


def transfer(name: str, src: str, dst: str, destination: str) -> str:
    return f"""apiVersion: ferry.dev/v1alpha1
kind: Transfer
metadata: {{name: {name}, namespace: {NS}}}
spec:
  source: {{hostPath: {{node: {SOURCE}, path: {src}}}}}
  destination: {{hostPath: {{{destination}, path: {dst}}}}}
"""


def run(kind: str, n: int, name: str, src: str) -> dict:
    """Scenario `kind` ("fan" or "separate") to the first `n` destinations; its time and bytes."""
    dst = f"{ob.ROOT}/{name}/dst"
    nodes = DESTINATIONS[:n]
    for node in nodes:
        ob.owned_dir(ob.node_path(node, dst))
    if kind == "fan":
        docs = [transfer(name, src, dst, f"nodes: [{', '.join(nodes)}]")]
        names = [name]
    else:
        names = [f"{name}-{i}" for i in range(n)]
        docs = [transfer(t, src, dst, f"node: {node}") for t, node in zip(names, nodes)]
    before = {node: link_bytes(node) for node in LINKS}
    start = time.monotonic()
    ob.apply("---\n".join(docs))
    for t in names:
        ob.wait_succeeded(NS, t, timeout=1800)
    seconds = time.monotonic() - start
    after = {node: link_bytes(node) for node in LINKS}
    destinations = destination_times(names[0]) if kind == "fan" else []
    moved = {node: (after[node][0] - before[node][0], after[node][1] - before[node][1]) for node in LINKS}
    ob.kubectl("delete", "transfer", "-n", NS, *names, "--wait=true")
    for node in nodes:
        subprocess.run(["rm", "-rf", str(ob.node_path(node, dst))], check=True)
    return {"seconds": seconds, "source_out": moved[SOURCE][0],
            "most_on_a_link": max(tx + rx for tx, rx in moved.values()),
            "destinations": destinations}


def destination_times(name: str) -> list[dict]:
    """Per destination of fan-out `name`: its node, attempts, and seconds from the fan-out's
    creation to its child's completion (the API's one-second resolution)."""
    def when(t: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(t.replace("Z", "+00:00"))

    fan = json.loads(ob.kubectl("get", "transfer", "-n", NS, name, "-o", "json"))
    created = when(fan["metadata"]["creationTimestamp"])
    rows = []
    for d in fan.get("status", {}).get("destinations", []):
        child = json.loads(ob.kubectl("get", "transfer", "-n", NS, d["transfer"], "-o", "json"))
        done = child.get("status", {}).get("completionTime")
        rows.append({"node": d["node"], "attempts": d.get("attempts", 0),
                     "seconds": (when(done) - created).total_seconds() if done else None})
    return rows


def node_service(registry: str, tag: str) -> None:
    helm = ob.KUBECTL.parent / "helm"
    manifest = ob.sh(str(helm), "template", "ferry", str(ob.REPO / "charts/ferry"),
                     "--namespace", "ferry-system", "--show-only", "templates/node-service.yaml",
                     "--set-string", f"imageRegistry={registry}",
                     "--set-string", f"moverImage.tag={tag}", "--set-string", f"image.tag={tag}", "--set", "nodeService.capacity=3Gi")
    r = subprocess.run([str(ob.KUBECTL), "apply", "--server-side", "-f", "-"], input=manifest,
                       capture_output=True, text=True, env={**os.environ, "KUBECONFIG": str(ob.KUBECONFIG)})
    if r.returncode != 0:
        raise SystemExit(f"applying the node service failed: {r.stderr}")
    ob.kubectl("-n", "ferry-system", "rollout", "status", "daemonset/ferry-node", "--timeout=300s")


class Supervised:
    """The operator as its Deployment runs it: started again when it exits. It steps down and
    exits when it cannot renew its leader Lease within 10 s, which the fan-out to 4 can make it do
    on this 2-core machine (every node, the control plane and the operator share the cores)."""

    def __init__(self, start) -> None:
        self.start = start
        self.proc = start("w")
        self.restarts = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self.watch, daemon=True)
        self.thread.start()

    def watch(self) -> None:
        while not self.stopping.wait(1):
            if self.proc.poll() is not None:
                self.restarts += 1
                print(f"the operator exited ({self.proc.returncode}); started again", file=sys.stderr)
                self.proc = self.start("a")

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join()
        self.proc.terminate()
        self.proc.wait(timeout=30)


def main() -> None:
    os.environ["FERRY_PROFILE"] = "release"
    ob.TARGET = Path(os.environ.get("CARGO_TARGET_DIR") or ob.REPO / "target") / "release"
    ob.KUBECTL = Path(ob.sh(str(ob.REPO / "tests/k8s/build.sh")).strip()) / "kubectl"
    ob.sh(str(ob.REPO / "tests/cluster/up.sh"))
    op = None
    results: dict[str, list[dict]] = {}
    try:
        image = ob.mover_image(ob.CLUSTER)
        repo, tag = image.rsplit(":", 1)
        op = Supervised(lambda mode: ob.start_operator(
            ob.CLUSTER, "fanout", tuple(LINKS), block_service="ferry-node.ferry-system.svc:7443",
            log_mode=mode)[0])
        node_service(repo.removesuffix("/ferry-mover"), tag)
        ob.kubectl("create", "namespace", NS)
        for node in LINKS:
            ob.sh(str(ob.REPO / "tests/cluster/shape.sh"), node, RATE)
        scenarios = [("fan", 1), ("fan", 2), ("fan", 4), ("separate", 2), ("separate", 4)]
        only = [x for x in (os.environ.get("ONLY") or "").split(",") if x]
        scenarios = [(k, n) for k, n in scenarios if not only or f"{k}{n}" in only]
        for r in range(ROUNDS):
            # A different order each round, so no scenario always runs first or last.
            order = scenarios[r % len(scenarios):] + scenarios[:r % len(scenarios)]
            for kind, n in order:
                name = f"{kind}{n}-r{r}"
                src = write_dataset(name)
                results.setdefault(f"{kind}{n}", []).append(run(kind, n, name, src))
                if (kind, n) == ("fan", 4):
                    results.setdefault("again4", []).append(run("fan", 4, f"again4-r{r}", src))
                subprocess.run(["rm", "-rf", str(ob.node_path(SOURCE, f"{ob.ROOT}/{name}"))], check=True)
                print(f"round {r + 1}: {kind} {n}: {results[f'{kind}{n}'][-1]}", file=sys.stderr)
    finally:
        if op is not None:
            op.stop()
        ob.sh(str(ob.REPO / "tests/cluster/down.sh"), check=False)
    report(results, op.restarts if op is not None else 0)


def report(results: dict[str, list[dict]], operator_restarts: int) -> None:
    dataset = MIB << 20
    one = statistics.median(x["seconds"] for x in results["fan1"])
    labels = {"fan1": "fan-out to 1", "fan2": "fan-out to 2", "fan4": "fan-out to 4",
              "separate2": "2 separate Transfers", "separate4": "4 separate Transfers",
              "again4": "fan-out to 4 again (stores hold it)"}
    print(f"{MIB} MiB in {FILES} files from {SOURCE}, every link capped at {RATE} each way, "
          f"median of {ROUNDS}, apply to Succeeded; the operator was started again "
          f"{operator_restarts} times:")
    print("| scenario | median time | vs fan-out to 1 | left the source node | busiest link, in + out "
          "| retries |")
    print("|---|---|---|---|---|---|")
    for key, label in labels.items():
        xs = results.get(key)
        if not xs:
            continue
        t = statistics.median(x["seconds"] for x in xs)
        out = statistics.median(x["source_out"] for x in xs) / dataset
        most = statistics.median(x["most_on_a_link"] for x in xs)
        retries = sum(max(d["attempts"] - 1, 0) for x in xs for d in x["destinations"])
        extra = f"{retries}" if key.startswith(("fan", "again")) else "-"
        print(f"| {label} | {t:.1f} s | {t / one:.2f}x | {out:.2f}x the dataset | {most / dataset:.3f}x "
              f"| {extra} |")
    print()
    print("Per round, seconds from a fan-out's creation to each destination's success (attempts):")
    for key, label in labels.items():
        for r, x in enumerate(results.get(key) or []):
            if x["destinations"]:
                each = ", ".join(f"{d['node']} {d['seconds']:.0f} s ({d['attempts']})"
                                 if d["seconds"] is not None else f"{d['node']} ? ({d['attempts']})"
                                 for d in x["destinations"])
                print(f"- {label}, round {r + 1}: {x['seconds']:.1f} s; {each}")


if __name__ == "__main__":
    main()
