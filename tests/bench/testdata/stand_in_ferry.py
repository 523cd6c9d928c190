#!/usr/bin/env python3
"""A stand-in for `ferry-mover` used ONLY by the harness's self-tests (test_harness.py), to exercise the
harness's CLI plumbing (address line, --json summaries, RSS of both ends, failure detection) before the
real subcommands exist. It never appears in a benchmark table: the harness measures the binary in
target/release or FERRY_BIN. Modes, chosen by the env STAND_IN_MODE:
  ok     copy with shutil, send/receive a tar stream over one plain TCP socket
  stub   every subcommand fails like the skeleton's stubs ("... is not implemented yet")
  wrong  copy/receive drop the last file of the tree (the harness must reject the copy)
"""

import argparse
import io
import json
import os
import shutil
import socket
import sys
import tarfile
import time

MODE = os.environ.get("STAND_IN_MODE", "ok")


def stub(name: str) -> None:
    print(f"ferry-mover: error: {name} is not implemented yet", file=sys.stderr)
    sys.exit(2)


def count(root: str) -> tuple[int, int]:
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = os.path.join(dirpath, n)
            if os.path.isfile(p) and not os.path.islink(p):
                files += 1
                size += os.path.getsize(p)
    return files, size


def drop_one(root: str) -> None:
    for dirpath, _, names in sorted(os.walk(root)):
        if names:
            os.unlink(os.path.join(dirpath, sorted(names)[-1]))
            return


def main() -> None:
    p = argparse.ArgumentParser(prog="ferry-mover")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("copy")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--jobs")
    c.add_argument("--json", action="store_true")
    c = sub.add_parser("certs")
    c.add_argument("--out", required=True)
    c.add_argument("--transfer", required=True)
    for name in ("send", "receive"):
        c = sub.add_parser(name)
        c.add_argument("--connect" if name == "send" else "--listen", required=True)
        c.add_argument("--root", required=True)
        for f in ("--ca", "--cert", "--key", "--transfer"):
            c.add_argument(f, required=True)
        c.add_argument("--json", action="store_true")
        if name == "send":
            c.add_argument("--streams", type=int, default=1)
            c.add_argument("--compress", default="auto")
            c.add_argument("--bandwidth-limit", type=int)
        else:
            c.add_argument("--once", action="store_true")
    a = p.parse_args()
    if MODE == "stub":
        stub(a.cmd)
    t0 = time.monotonic()
    if a.cmd == "copy":
        shutil.copytree(a.src, a.dst, symlinks=True)
        if MODE == "wrong":
            drop_one(a.dst)
        files, size = count(a.dst)
        print(json.dumps({"files": files, "bytes": size, "skipped": 0, "failed": 0,
                          "seconds": time.monotonic() - t0}))
    elif a.cmd == "certs":
        os.makedirs(a.out, exist_ok=True)
        for n in ("ca.crt", "sender.crt", "sender.key", "receiver.crt", "receiver.key"):
            with open(os.path.join(a.out, n), "w") as f:
                f.write(f"stand-in {n} for {a.transfer}\n")
    elif a.cmd == "receive":
        host, port = a.listen.rsplit(":", 1)
        srv = socket.create_server((host, int(port)))
        print(f"{srv.getsockname()[0]}:{srv.getsockname()[1]}", flush=True)
        conn, _ = srv.accept()
        data = io.BytesIO()
        while chunk := conn.recv(1 << 20):
            data.write(chunk)
        data.seek(0)
        with tarfile.open(fileobj=data) as tar:
            tar.extractall(a.root, filter="tar")
        if MODE == "wrong":
            drop_one(a.root)
        files, size = count(a.root)
        print(json.dumps({"files": files, "bytes": size, "wire_bytes": len(data.getvalue()),
                          "seconds": time.monotonic() - t0, "streams": 1, "skipped": 0, "resumed_bytes": 0}))
    elif a.cmd == "send":
        host, port = a.connect.rsplit(":", 1)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(a.root, arcname=".")
        with socket.create_connection((host, int(port))) as s:
            s.sendall(buf.getvalue())
        files, size = count(a.root)
        print(json.dumps({"files": files, "bytes": size, "wire_bytes": len(buf.getvalue()),
                          "seconds": time.monotonic() - t0, "streams": a.streams, "skipped": 0,
                          "resumed_bytes": 0, "dedup_blocks": 0, "dedup_bytes": 0}))


if __name__ == "__main__":
    main()
