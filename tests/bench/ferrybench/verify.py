"""Cheap correctness checks of a copy, so a broken contender cannot "win" a round.

A copy fails when entries are missing or extra, a type, size or symlink target differs, or a sampled
content hash differs. Metadata fidelity (mode, mtime to the nanosecond, hard links, sparse holes) is
reported per contender but does not fail the copy: the peers differ there by design (`rsync -a`
drops hard links and holes, `scp -r` drops mtimes) and the table says so.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
SAMPLE_FILES = 48          # regular files whose content is hashed per verification
LARGE_FILE = 32 * MIB      # above this, hash windows instead of the whole file
WINDOWS = 16               # 1 MiB windows hashed in a large file (plus the tail)


@dataclass(frozen=True)
class Entry:
    kind: str          # "f" file, "d" directory, "l" symlink, "o" other
    size: int
    mode: int          # permission bits
    mtime_ns: int
    inode: tuple[int, int]
    nlink: int
    blocks: int        # 512-byte blocks allocated
    target: str = ""   # symlink target


def scan(root: Path) -> dict[str, Entry]:
    """Maps each path relative to `root` (root itself excluded) to its lstat facts."""
    out: dict[str, Entry] = {}
    root_s = str(root)
    for dirpath, dirnames, filenames in os.walk(root_s):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode):
                kind, target = "f", ""
            elif stat.S_ISDIR(st.st_mode):
                kind, target = "d", ""
            elif stat.S_ISLNK(st.st_mode):
                kind, target = "l", os.readlink(full)
            else:
                kind, target = "o", ""
            rel = os.path.relpath(full, root_s)
            out[rel] = Entry(
                kind, st.st_size if kind != "d" else 0, stat.S_IMODE(st.st_mode), st.st_mtime_ns,
                (st.st_dev, st.st_ino), st.st_nlink, st.st_blocks, target,
            )
    return out


def content_digest(path: Path, size: int) -> str:
    """Whole-file BLAKE2b for small files; for large ones, spread 1 MiB windows plus the tail."""
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        if size <= LARGE_FILE:
            while chunk := f.read(4 * MIB):
                h.update(chunk)
        else:
            step = size // WINDOWS
            for i in range(WINDOWS):
                f.seek(i * step)
                h.update(f.read(MIB))
            f.seek(max(0, size - MIB))
            h.update(f.read(MIB))
    return h.hexdigest()


@dataclass
class SourceIndex:
    """The source tree's scan plus the content digests of a deterministic sample of its files."""

    root: Path
    entries: dict[str, Entry]
    sample: dict[str, str] = field(default_factory=dict)

    @classmethod
    def build(cls, root: Path) -> "SourceIndex":
        entries = scan(root)
        files = sorted(p for p, e in entries.items() if e.kind == "f")
        step = max(1, len(files) // SAMPLE_FILES)
        picked = files[::step][:SAMPLE_FILES]
        if files and files[-1] not in picked:
            picked.append(files[-1])
        sample = {p: content_digest(root / p, entries[p].size) for p in picked}
        return cls(root, entries, sample)

    @property
    def file_count(self) -> int:
        return sum(1 for e in self.entries.values() if e.kind == "f")

    @property
    def payload_bytes(self) -> int:
        """Bytes of regular-file data, each hard-linked inode counted once and a sparse file's holes not
        at all (so MB/s is data moved, not apparent size)."""
        seen: set[tuple[int, int]] = set()
        total = 0
        for e in self.entries.values():
            if e.kind == "f" and e.inode not in seen:
                seen.add(e.inode)
                total += min(e.size, e.blocks * 512)
        return total


@dataclass
class Verdict:
    ok: bool
    problems: list[str]
    # Fidelity flags: True kept, False lost, absent when the dataset has nothing to check.
    kept: dict[str, bool]
    notes: list[str]

    def kept_summary(self) -> str:
        if not self.kept:
            return ""
        return " ".join(("" if v else "-") + k for k, v in self.kept.items())


# Names a mover may legitimately leave at the top of its destination (none today); anything else extra
# fails the copy.
ALLOWED_EXTRA_PREFIXES: tuple[str, ...] = ()


def compare(src: SourceIndex, dst_root: Path) -> Verdict:
    problems: list[str] = []
    notes: list[str] = []
    if not dst_root.is_dir():
        return Verdict(False, [f"destination {dst_root} does not exist"], {}, [])
    dst = scan(dst_root)
    missing = [p for p in src.entries if p not in dst]
    extra = [p for p in dst if p not in src.entries and not p.startswith(ALLOWED_EXTRA_PREFIXES)]
    if missing:
        problems.append(f"{len(missing)} entries missing (e.g. {missing[0]})")
    if extra:
        problems.append(f"{len(extra)} unexpected entries (e.g. {extra[0]})")
    kind_diff = size_diff = link_diff = mode_diff = mtime_diff = mtime_s_diff = 0
    for p, s in src.entries.items():
        d = dst.get(p)
        if d is None:
            continue
        if d.kind != s.kind:
            kind_diff += 1
            continue
        if s.kind == "f" and d.size != s.size:
            size_diff += 1
        if s.kind == "l" and d.target != s.target:
            link_diff += 1
        if s.kind != "l" and d.mode != s.mode:
            mode_diff += 1
        if s.kind == "f" and d.mtime_ns != s.mtime_ns:
            mtime_diff += 1
            if d.mtime_ns // 10**9 != s.mtime_ns // 10**9:
                mtime_s_diff += 1
    for what, n in (("type", kind_diff), ("size", size_diff), ("symlink target", link_diff)):
        if n:
            problems.append(f"{n} entries differ in {what}")
    bad_content = []
    for p, digest in src.sample.items():
        d = dst.get(p)
        if d is None or d.kind != "f" or d.size != src.entries[p].size:
            continue  # already counted above
        try:
            if content_digest(dst_root / p, d.size) != digest:
                bad_content.append(p)
        except OSError as err:
            bad_content.append(f"{p} ({err.strerror})")
    if bad_content:
        problems.append(f"{len(bad_content)}/{len(src.sample)} sampled files have wrong content (e.g. {bad_content[0]})")

    kept: dict[str, bool] = {"mode": mode_diff == 0}
    if mtime_diff and not mtime_s_diff:
        kept["mtime-s"] = True      # whole seconds kept, nanoseconds lost (e.g. tar's gnu format)
        kept["mtime-ns"] = False
    else:
        kept["mtime"] = mtime_diff == 0
    if mtime_diff:
        notes.append(f"{mtime_diff} file mtimes differ ({mtime_s_diff} by a second or more)")
    # Hard links: every group of source names sharing an inode must share one in the copy.
    groups: dict[tuple[int, int], list[str]] = {}
    for p, s in src.entries.items():
        if s.kind == "f" and s.nlink > 1:
            groups.setdefault(s.inode, []).append(p)
    groups = {k: v for k, v in groups.items() if len(v) > 1}
    if groups:
        kept["hardlinks"] = all(
            all(p in dst for p in names) and len({dst[p].inode for p in names}) == 1
            for names in groups.values()
        )
    # Sparse files: a copy that allocates more than twice the source's blocks filled the holes.
    sparse = [p for p, s in src.entries.items() if s.kind == "f" and s.blocks * 512 < s.size // 2]
    if sparse:
        kept["sparse"] = all(p in dst and dst[p].blocks <= 2 * src.entries[p].blocks + 16 for p in sparse)
    if any(s.kind == "l" for s in src.entries.values()):
        kept["symlinks"] = link_diff == 0 and all(
            p in dst and dst[p].kind == "l" for p, s in src.entries.items() if s.kind == "l"
        )
    return Verdict(not problems, problems, kept, notes)
