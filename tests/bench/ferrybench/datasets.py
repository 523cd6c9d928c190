"""Deterministic benchmark datasets.

Every byte, name, mode and mtime depends only on the dataset name and the scale, so two runs of the
harness (or two machines) measure the same input. Bulk bytes come from an AES-128-CTR keystream
(`openssl enc` over /dev/zero: keyed, standard, ~1 GB/s) so generating 1 GiB takes about a second;
the text set comes from a seeded `random.Random`. Generation time is never measured.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

# A fixed base mtime (2026-01-01T00:00:00Z) plus a per-entry nanosecond offset, so copies that drop
# sub-second precision or timestamps at all are visible to the verifier.
BASE_MTIME_NS = 1_767_225_600 * 1_000_000_000


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    description: str
    # Approximate payload bytes at scale 1.0, used to budget tmpfs space for copies.
    approx_bytes: int
    # True when the dataset is one regular file (the plaintext "file through a socket" reference
    # applies only to those).
    single_file: bool = False


SPECS: dict[str, DatasetSpec] = {
    "big": DatasetSpec("big", "1 GiB random file", 1 * GIB, single_file=True),
    "small": DatasetSpec("small", "50 000 x 4 KiB random files in 100 directories", 50_000 * 4 * KIB),
    "medium": DatasetSpec("medium", "3 000 x 100 KiB random files in 30 directories", 3_000 * 100 * KIB),
    "mixed": DatasetSpec(
        "mixed",
        "small tree: symlinks, hard links, a sparse file, modes, empty dir, odd names",
        8 * MIB,
    ),
    "text": DatasetSpec("text", "256 MiB of log-like text (zstd-3 ratio ~0.3)", 256 * MIB, single_file=True),
}


class DatasetError(Exception):
    """A dataset could not be generated; the message names the dataset and the path."""


class KeyStream:
    """Reads an AES-128-CTR keystream for one key from `openssl enc`: fast, deterministic bytes."""

    def __init__(self, label: str) -> None:
        key = hashlib.blake2b(label.encode(), digest_size=16).hexdigest()
        self._proc = subprocess.Popen(
            [
                "openssl", "enc", "-aes-128-ctr", "-nosalt", "-K", key, "-iv", "0" * 32,
                "-in", "/dev/zero",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdout is not None
        self._out = self._proc.stdout

    def read(self, n: int) -> bytes:
        data = self._out.read(n)
        if data is None or len(data) != n:
            raise DatasetError(f"openssl keystream ended early (wanted {n} bytes)")
        return data

    def close(self) -> None:
        self._out.close()
        self._proc.kill()
        self._proc.wait()

    def __enter__(self) -> "KeyStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _set_mtime(path: Path, index: int) -> None:
    ns = BASE_MTIME_NS + index * 1_000_003  # odd step: nanosecond digits differ between entries
    os.utime(path, ns=(ns, ns), follow_symlinks=False)


def _write(path: Path, data: bytes, mode: int, index: int) -> None:
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)
    _set_mtime(path, index)


def _gen_big(root: Path, scale: float) -> None:
    size = max(MIB, int(GIB * scale)) // MIB * MIB
    path = root / "big.bin"
    with KeyStream("ferry-bench-big") as ks, open(path, "wb") as f:
        left = size
        while left:
            n = min(left, 8 * MIB)
            f.write(ks.read(n))
            left -= n
    os.chmod(path, 0o644)
    _set_mtime(path, 1)


def _gen_many(root: Path, label: str, files: int, dirs: int, size: int) -> None:
    per_dir = files // dirs
    index = 0
    with KeyStream(label) as ks:
        for d in range(dirs):
            sub = root / f"d{d:03d}"
            sub.mkdir()
            chunk = ks.read(per_dir * size)
            for i in range(per_dir):
                _write(sub / f"f{i:05d}.bin", chunk[i * size:(i + 1) * size], 0o644, index)
                index += 1
            _set_mtime(sub, 100_000 + d)


def _gen_small(root: Path, scale: float) -> None:
    dirs = 100 if scale >= 0.02 else 10
    files = max(dirs, int(50_000 * scale)) // dirs * dirs
    _gen_many(root, "ferry-bench-small", files, dirs, 4 * KIB)


def _gen_medium(root: Path, scale: float) -> None:
    dirs = 30 if scale >= 0.01 else 3
    files = max(dirs, int(3_000 * scale)) // dirs * dirs
    _gen_many(root, "ferry-bench-medium", files, dirs, 100 * KIB)


def _gen_mixed(root: Path, scale: float) -> None:
    del scale  # always small
    with KeyStream("ferry-bench-mixed") as ks:
        (root / "a" / "b" / "c").mkdir(parents=True)
        (root / "empty-dir").mkdir()
        (root / "names").mkdir()
        sizes = [0, 1, 4095, 4096, 4097, 65_536, MIB + 7]
        for i, size in enumerate(sizes):
            _write(root / "a" / f"size-{size}.bin", ks.read(size), 0o644, i)
        _write(root / "a" / "b" / "exec.sh", b"#!/bin/sh\necho ferry\n", 0o755, 20)
        _write(root / "a" / "b" / "c" / "readonly.txt", b"read only\n", 0o444, 21)
        _write(root / "a" / "b" / "c" / "private.txt", b"private\n", 0o600, 22)
        for i, name in enumerate(["with space.txt", "ünïcødé-名前.txt", "semi;colon.txt", "-dash.txt"]):
            _write(root / "names" / name, ks.read(100 + i), 0o644, 30 + i)
        # Hard links: two names in one directory and one in another, all one inode.
        _write(root / "a" / "hard-1.bin", ks.read(200 * KIB), 0o644, 40)
        os.link(root / "a" / "hard-1.bin", root / "a" / "hard-2.bin")
        os.link(root / "a" / "hard-1.bin", root / "a" / "b" / "hard-3.bin")
        # Symlinks: to a file, to a directory, dangling; copied as links, never followed.
        os.symlink("../size-4096.bin", root / "a" / "b" / "link-to-file")
        os.symlink("a/b", root / "link-to-dir")
        os.symlink("does/not/exist", root / "dangling-link")
        for i, link in enumerate([root / "a" / "b" / "link-to-file", root / "link-to-dir", root / "dangling-link"]):
            _set_mtime(link, 50 + i)
        # A 64 MiB sparse file with three 1 MiB data extents: copies that fill holes use 64 MiB.
        sparse = root / "sparse.img"
        with open(sparse, "wb") as f:
            for offset in (0, 31 * MIB, 63 * MIB):
                f.seek(offset)
                f.write(ks.read(MIB))
            f.truncate(64 * MIB)
        os.chmod(sparse, 0o640)
        _set_mtime(sparse, 60)
    for i, d in enumerate(["a/b/c", "a/b", "a", "empty-dir", "names"]):
        _set_mtime(root / d, 70 + i)


# Log-line vocabulary; word choice and numbers are random, the line structure repeats, which gives
# zstd (level 3, per 4 MiB block) a compressed size of roughly 0.3 of the input, like real logs.
_LEVELS = ["INFO", "INFO", "INFO", "DEBUG", "DEBUG", "WARN", "ERROR"]
_COMPONENTS = ["mover", "session", "net", "tree", "copy", "reconcile", "scheduler", "api", "cas", "tls"]


def _text_pool(rng: random.Random, lines: int) -> list[str]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choices(letters, k=rng.randint(2, 10))) for _ in range(3000)]
    pool = []
    for _ in range(lines):
        msg = " ".join(rng.choices(words, k=rng.randint(4, 12)))
        pool.append(
            f"{rng.choice(_LEVELS)} [{rng.choice(_COMPONENTS)}] {msg} "
            f"id={rng.getrandbits(32):08x} took={rng.randint(0, 5000)}ms"
        )
    return pool


def _gen_text(root: Path, scale: float) -> None:
    size = max(MIB, int(256 * MIB * scale))
    rng = random.Random(0xFE44)
    pool = _text_pool(rng, 200_000)
    path = root / "app.log"
    written = 0
    second = 0
    with open(path, "wb") as f:
        while written < size:
            picks = rng.choices(pool, k=20_000)
            lines = []
            for i, line in enumerate(picks):
                ts = second + i // 40
                lines.append(
                    f"2026-11-21T{ts // 3600 % 24:02d}:{ts // 60 % 60:02d}:{ts % 60:02d}."
                    f"{(i * 7919) % 1_000_000:06d}Z {line}\n"
                )
            second += len(picks) // 40
            data = "".join(lines).encode()[: size - written]
            f.write(data)
            written += len(data)
    os.chmod(path, 0o644)
    _set_mtime(path, 1)


_GENERATORS = {
    "big": _gen_big,
    "small": _gen_small,
    "medium": _gen_medium,
    "mixed": _gen_mixed,
    "text": _gen_text,
}


def generate(name: str, parent: Path, scale: float = 1.0) -> Path:
    """Creates dataset `name` as the directory `parent/name` (which must not exist) and returns it."""
    if name not in _GENERATORS:
        raise DatasetError(f"unknown dataset {name!r}; known: {', '.join(SPECS)}")
    root = parent / name
    tmp = parent / f".{name}.partial"
    try:
        tmp.mkdir(parents=True)
        _GENERATORS[name](tmp, scale)
        _set_mtime(tmp, 0)
        tmp.rename(root)
    except OSError as err:
        raise DatasetError(f"failed to generate dataset {name} under {tmp}: {err}") from err
    return root


def ensure(name: str, parent: Path, scale: float = 1.0) -> Path:
    """Returns the cached dataset directory, generating it on first use (a partial one is redone)."""
    root = parent / name
    if root.is_dir():
        return root
    partial = parent / f".{name}.partial"
    if partial.exists():
        subprocess.run(["rm", "-rf", "--", str(partial)], check=True)
    return generate(name, parent, scale)
