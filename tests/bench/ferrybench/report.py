"""Result tables (markdown), the issues' performance targets, and rewriting docs/benchmarks.md.

Ratios are "contender median / ferry median": above 1 means ferry is faster by that factor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .suite import GroupResult

MB = 1_000_000


def _fmt_s(v: float | None) -> str:
    return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.2f}")


def _ratio(a: float | None, b: float | None) -> str:
    if a is None or b is None or b <= 0:
        return "-"
    return f"{a / b:.2f}x"


def _mib(kib: int | None) -> str:
    return "-" if not kib else f"{kib / 1024:.0f}"


BASELINE = "ferry (baseline)"


def best_ferry(g: GroupResult) -> tuple[str | None, float | None]:
    best: tuple[str | None, float | None] = (None, None)
    for name in g.order:
        if name in g.ferry and not name.startswith(BASELINE):
            m = g.median(name)
            if m is not None and (best[1] is None or m < best[1]):
                best = (name, m)
    return best


def fastest_peer(g: GroupResult, among: list[str] | None = None) -> tuple[str | None, float | None]:
    best: tuple[str | None, float | None] = (None, None)
    for name in g.order:
        if name in g.ferry or (among is not None and name not in among):
            continue
        m = g.median(name)
        if m is not None and (best[1] is None or m < best[1]):
            best = (name, m)
    return best


def _row_status(g: GroupResult, name: str) -> str | None:
    """Why a contender has no median: n/a, failed warm-up or a failed timed round."""
    if name in g.skipped:
        return g.skipped[name]
    fails = g.failures(name)
    if fails:
        return f"FAILED ({fails[-1][:160]})"
    if g.median(name) is None:
        return "no data"
    return None


def table(groups: list[GroupResult], net: bool) -> str:
    ref_label = "x best ferry" if net else "x ferry"
    head = ["dataset", "contender", "median s", "min-max s", "MB/s", ref_label, "peak RSS MiB", "kept"]
    if net:
        head.insert(7, "wire/payload")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in groups:
        _, ref = best_ferry(g)
        for name in g.order:
            status = _row_status(g, name)
            if status is not None:
                cells = [g.label, name, status] + [""] * (len(head) - 3)
                lines.append("| " + " | ".join(cells) + " |")
                continue
            t = g.timed(name)
            med = g.median(name)
            rss = g.peak_rss(name)
            if name in g.ferry and len(rss) > 1:
                rss_s = " / ".join(f"{role} {_mib(v)}" for role, v in rss.items())
            else:
                rss_s = _mib(max(rss.values())) if rss else "-"
            mbps = f"{g.payload_bytes / med / MB:.0f}" if med else "-"
            cells = [g.label, name, _fmt_s(med), f"{_fmt_s(min(t))}-{_fmt_s(max(t))}", mbps,
                     _ratio(med, ref), rss_s, g.kept(name)]
            if net:
                ex = g.extra(name)
                wire, payload = ex.get("wire_bytes"), ex.get("bytes")
                cells.insert(7, f"{wire / payload:.2f}" if isinstance(wire, int) and payload else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass
class Target:
    text: str
    value: str
    verdict: str    # "met", "MISSED" or "n/a (...)"


def _check(text: str, value: float | None, ok: bool | None, fmt: str, why_missing: str) -> Target:
    if value is None or ok is None:
        return Target(text, "-", f"n/a ({why_missing})")
    return Target(text, fmt.format(value), "met" if ok else "MISSED")


def _find(g: GroupResult | None, prefix: str) -> float | None:
    if g is None:
        return None
    for name in g.order:
        if name.startswith(prefix):
            return g.median(name)
    return None


def local_targets(groups: list[GroupResult]) -> list[Target]:
    by = {g.dataset: g for g in groups}
    out: list[Target] = []
    g = by.get("small")
    if g:
        _, f = best_ferry(g)
        pname, p = fastest_peer(g)
        r = p / f if p and f else None
        out.append(_check(f"small: >= 1.3x faster than the fastest of cp and rsync -a{_named(pname)}", r,
                          None if r is None else r >= 1.3, "{:.2f}x", "no ferry or peer median"))
    cps = [n for g in groups for n in g.order if n.startswith("cp ")]
    g = by.get("medium")
    if g:
        _, f = best_ferry(g)
        cpname, cp = fastest_peer(g, among=cps)
        r = cp / f if cp and f else None
        out.append(_check(f"medium: >= 2x faster than the faster cp{_named(cpname)}", r,
                          None if r is None else r >= 2.0, "{:.2f}x", "no ferry or cp median"))
    g = by.get("big")
    if g:
        _, f = best_ferry(g)
        cpname, cp = fastest_peer(g, among=cps)
        r = f / cp if cp and f else None
        out.append(_check(f"big: no slower than the faster cp{_named(cpname)} by more than 10 % (ferry time / cp time)", r,
                          None if r is None else r <= 1.10, "{:.2f}", "no ferry or cp median"))
    for g in groups:
        for name in g.order:
            if name in g.ferry:
                rss = g.peak_rss(name)
                v = max(rss.values()) / 1024 if rss else None
                out.append(_check(f"{g.label}: {name} peak RSS < 64 MiB", v, None if v is None else v < 64,
                                  "{:.0f} MiB", "no ferry run"))
    return out


def _named(name: str | None) -> str:
    return f" ({name})" if name else ""


def net_targets(groups: list[GroupResult]) -> list[Target]:
    by = {g.label: g for g in groups}
    out: list[Target] = []
    g = by.get("big")
    if g:
        fname, f = best_ferry(g)
        rs, sock = _find(g, "rsync -a over ssh"), _find(g, "file over socat")
        r = rs / f if rs and f else None
        out.append(_check(f"big: >= 2x faster than rsync over ssh{_named(fname)}", r, None if r is None else r >= 2,
                          "{:.2f}x", "no ferry or rsync/ssh median"))
        r = sock / f if sock and f else None
        out.append(_check(f"big: >= half the speed of the file through a plain socket{_named(fname)}", r,
                          None if r is None else r >= 0.5, "{:.2f} of socket speed", "no ferry or socket median"))
    g = by.get("small")
    if g:
        fname, f = best_ferry(g)
        rs, tar = _find(g, "rsync -a over ssh"), _find(g, "tar over socat")
        r = rs / f if rs and f else None
        out.append(_check(f"small: >= 2.5x faster than rsync over ssh{_named(fname)}", r, None if r is None else r >= 2.5,
                          "{:.2f}x", "no ferry or rsync/ssh median"))
        r = tar / f if tar and f else None
        out.append(_check(f"small: at least as fast as tar through a plain socket{_named(fname)}", r,
                          None if r is None else r >= 1.0, "{:.2f}x", "no ferry or tar median"))
    for g in groups:
        if "bandwidth" not in g.label:
            continue
        z, n = _find(g, "ferry --streams 2 --compress zstd"), _find(g, "ferry --streams 2 --compress none")
        r = n / z if z and n else None
        out.append(_check(f"{g.label}: zstd >= 2x faster than --compress none", r, None if r is None else r >= 2,
                          "{:.2f}x", "no ferry medians"))
    for g in groups:
        for label, baseline in (("ferry", False), (BASELINE, True)):
            peaks: dict[str, int] = {}
            for name in g.order:
                if name in g.ferry and name.startswith(BASELINE) == baseline:
                    for role, v in g.peak_rss(name).items():
                        peaks[role] = max(peaks.get(role, 0), v)
            if peaks:
                out.append(Target(f"{g.label}: {label} peak RSS, any stream count (send / recv)",
                                  " / ".join(f"{_mib(v)} MiB" for v in peaks.values()), "measured"))
    out += baseline_targets(groups)
    return out


def baseline_targets(groups: list[GroupResult], slack: float = 1.03) -> list[Target]:
    """This build against an older one (FERRY_BASELINE) run beside it: no dataset and stream count
    more than `slack` slower."""
    out: list[Target] = []
    for g in groups:
        for n in (1, 2, 4):
            new, old = _find(g, f"ferry --streams {n}"), _find(g, f"{BASELINE} --streams {n}")
            if old is None:
                continue
            r = new / old if new else None
            out.append(_check(f"{g.label} --streams {n}: this build / baseline <= {slack:.2f}", r,
                              None if r is None else r <= slack, "{:.3f}", "no median for this build"))
    return out


def targets_table(targets: list[Target]) -> str:
    lines = ["| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t.text} | {t.value} | {t.verdict} |" for t in targets]
    return "\n".join(lines)


def is_reference(name: str) -> bool:
    """The plaintext socket references are not peers: they bound what the loopback can do."""
    return "(plain TCP)" in name


def summary_lines(groups: list[GroupResult]) -> list[str]:
    out = []
    for g in groups:
        fname, f = best_ferry(g)
        peers = [n for n in g.order if n not in g.ferry and not is_reference(n)]
        refs = [n for n in g.order if is_reference(n)]
        pname, p = fastest_peer(g, among=peers)
        line = f"- {g.label}: "
        if f and p:
            line += (f"{fname} {_fmt_s(f)} s vs fastest peer {pname} {_fmt_s(p)} s: ferry {p / f:.2f}x "
                     + ("faster" if p >= f else "(slower)"))
        elif p:
            line += f"fastest peer {pname} {_fmt_s(p)} s; ferry has no median"
        elif f:
            line += f"{fname} {_fmt_s(f)} s; no peer median"
        else:
            continue
        for r in refs:
            m = g.median(r)
            if m and f:
                line += f"; {r} {_fmt_s(m)} s (ferry at {m / f:.2f} of its speed)"
        out.append(line)
    return out


def replace_block(doc: str, key: str, body: str) -> str:
    """Replaces the text between `<!-- key:begin -->` and `<!-- key:end -->`, appending the block if absent."""
    begin, end = f"<!-- {key}:begin -->", f"<!-- {key}:end -->"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(doc):
        return pattern.sub(lambda _: block, doc, count=1)
    return doc.rstrip() + "\n\n" + block + "\n"


def write_docs(path: Path, key: str, body: str) -> None:
    doc = path.read_text() if path.exists() else "# Benchmarks\n"
    path.write_text(replace_block(doc, key, body))
