"""Self-tests of the benchmark harness: `make bench-selftest` (no root, no namespace, ~20 s).

They check that the datasets are deterministic and have the promised shape, that the verifier rejects
broken copies, that rounds rotate and a failing contender gets no median, that ferry's CLI plumbing
(probe, --json, receiver address, both ends' RSS) works against a stand-in, and that the docs block is
rewritten in place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from ferrybench import datasets, ferry, local, net, proc, report, suite, verify  # noqa: E402

STAND_IN = HERE / "testdata" / "stand_in_ferry.py"


def tree_facts(root: Path) -> dict:
    facts = {}
    for rel, e in verify.scan(root).items():
        digest = verify.content_digest(root / rel, e.size) if e.kind == "f" else e.target
        facts[rel] = (e.kind, e.size, e.mode, e.mtime_ns, e.nlink, digest)
    return facts


class Tmp(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="ferry-bench-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)


class DatasetTests(Tmp):
    def test_generation_is_deterministic(self) -> None:
        for name, scale in (("small", 0.02), ("medium", 0.01), ("mixed", 1.0), ("text", 1 / 256), ("big", 1 / 512)):
            a = datasets.generate(name, self.tmp / "a", scale)
            b = datasets.generate(name, self.tmp / "b", scale)
            self.assertEqual(tree_facts(a), tree_facts(b), name)

    def test_shapes(self) -> None:
        small = verify.SourceIndex.build(datasets.generate("small", self.tmp, 0.02))
        self.assertEqual(small.file_count, 1000)
        self.assertEqual(small.payload_bytes, 1000 * 4096)
        self.assertEqual(sum(1 for e in small.entries.values() if e.kind == "d"), 100)
        big = datasets.generate("big", self.tmp, 1 / 256)
        self.assertEqual((big / "big.bin").stat().st_size, 4 * datasets.MIB)
        mixed = verify.scan(datasets.generate("mixed", self.tmp, 1.0))
        self.assertEqual(mixed["a/hard-1.bin"].inode, mixed["a/b/hard-3.bin"].inode)
        self.assertEqual(mixed["dangling-link"].kind, "l")
        sparse = mixed["sparse.img"]
        self.assertEqual(sparse.size, 64 * datasets.MIB)
        self.assertLess(sparse.blocks * 512, 8 * datasets.MIB)
        self.assertEqual(mixed["empty-dir"].kind, "d")

    def test_text_compresses_like_logs(self) -> None:
        text = datasets.generate("text", self.tmp, 8 / 256) / "app.log"
        block = text.read_bytes()[: 4 * datasets.MIB]
        out = subprocess.run(["zstd", "-3", "-c"], input=block, capture_output=True, check=True).stdout
        ratio = len(out) / len(block)
        self.assertTrue(0.25 <= ratio <= 0.35, f"zstd-3 ratio {ratio:.3f}")


class VerifyTests(Tmp):
    def setUp(self) -> None:
        super().setUp()
        self.src = datasets.generate("mixed", self.tmp / "data", 1.0)
        self.index = verify.SourceIndex.build(self.src)

    def copy(self, *argv: str) -> Path:
        dst = self.tmp / "copy"
        subprocess.run([*argv, str(self.src), str(dst)], check=True)
        return dst

    def test_faithful_copy_passes_and_reports_fidelity(self) -> None:
        v = verify.compare(self.index, self.copy("cp", "-a"))
        self.assertTrue(v.ok, v.problems)
        self.assertEqual(v.kept, {"mode": True, "mtime": True, "hardlinks": True, "sparse": True, "symlinks": True})

    def test_lost_hardlinks_and_holes_are_reported_not_failed(self) -> None:
        dst = self.tmp / "copy"
        subprocess.run(["rsync", "-a", f"{self.src}/", f"{dst}/"], check=True)
        v = verify.compare(self.index, dst)
        self.assertTrue(v.ok, v.problems)
        self.assertFalse(v.kept["hardlinks"])
        self.assertFalse(v.kept["sparse"])

    def test_corrupt_missing_extra_and_followed_links_fail(self) -> None:
        dst = self.copy("cp", "-a")
        victim = dst / "a" / "size-65536.bin"
        self.assertIn("a/size-65536.bin", self.index.sample)
        data = bytearray(victim.read_bytes())
        data[100] ^= 1
        victim.write_bytes(bytes(data))
        v = verify.compare(self.index, dst)
        self.assertFalse(v.ok)
        self.assertIn("wrong content", " ".join(v.problems))
        shutil.rmtree(dst)
        dst = self.copy("cp", "-a")
        (dst / "names" / "with space.txt").unlink()
        (dst / "stray").write_text("x")
        v = verify.compare(self.index, dst)
        self.assertFalse(v.ok)
        self.assertTrue(any("missing" in p for p in v.problems) and any("unexpected" in p for p in v.problems))
        shutil.rmtree(dst)
        dst = self.tmp / "followed"
        subprocess.run(["cp", "-rL", str(self.src / "a"), str(dst)], check=True)
        v = verify.compare(verify.SourceIndex.build(self.src / "a"), dst)
        self.assertFalse(v.ok)   # the symlink became a file

    def test_large_file_windows_catch_a_change(self) -> None:
        big = self.tmp / "bigsrc"
        big.mkdir()
        (big / "f").write_bytes(os.urandom(verify.LARGE_FILE + verify.MIB))
        idx = verify.SourceIndex.build(big)
        dst = self.tmp / "bigdst"
        shutil.copytree(big, dst)
        with open(dst / "f", "r+b") as f:
            f.seek(10)
            f.write(b"\xff\xfe")
        self.assertFalse(verify.compare(idx, dst).ok)


class FlakyCopy:
    """A contender that writes a wrong copy in round 2 only."""

    name, slug, is_ferry = "flaky", "flaky", False

    def __init__(self) -> None:
        self.calls = 0

    def unavailable(self, dataset: str) -> str | None:
        return None

    def run(self, src: Path, dst: Path, timeout: float) -> suite.RunResult:
        self.calls += 1
        shutil.copytree(src, dst, symlinks=True)
        if self.calls == 3:
            next(p for p in dst.rglob("*") if p.is_file()).unlink()
        return suite.RunResult(0.01, None, {}, {}, dst)


class SuiteTests(Tmp):
    def test_rounds_rotate_verify_and_fail_broken_contenders(self) -> None:
        src = datasets.generate("medium", self.tmp / "data", 0.01)
        out = self.tmp / "out"
        out.mkdir()
        scratch = proc.Scratch(self.tmp)
        cs = local.contenders(Path("/nonexistent/ferry-mover"), ferry.Availability(False, "n/a (test)"), scratch)
        flaky = FlakyCopy()
        group = suite.Group("medium", "medium", [*cs[1:3], flaky, cs[0]])
        g = suite.run_group(group, src, verify.SourceIndex.build(src), 3, suite.Space(out, tmpfs=False), 60, False)
        self.assertEqual(g.skipped, {"ferry copy": "n/a (test)"})
        order = [s.contender for s in g.samples]
        self.assertEqual(len(order), 3 * 4 - 1)   # warm-up + 3 rounds of 3; flaky stops after round 2
        firsts = [order[0], order[3], order[6]]
        self.assertEqual(len(set(firsts)), 3, f"starting contender must rotate: {order}")
        self.assertIsNone(g.median("flaky"))
        self.assertIn("FAILED", report.table([g], net=False))
        self.assertIsNotNone(g.median("cp -a"))
        self.assertEqual(list(out.iterdir()), [], "outputs are deleted after the rounds")


class StandInTests(Tmp):
    def setUp(self) -> None:
        super().setUp()
        self.bin = self.tmp / "ferry-mover"
        self.bin.write_text(f"#!/bin/sh\nexec {sys.executable} {STAND_IN} \"$@\"\n")
        self.bin.chmod(0o755)
        self.scratch = proc.Scratch(self.tmp)
        os.environ["STAND_IN_MODE"] = "ok"
        self.addCleanup(os.environ.pop, "STAND_IN_MODE", None)

    def test_probe_says_missing_for_stubs_and_absent_binary(self) -> None:
        self.assertEqual(ferry.probe_copy(self.tmp / "absent", self.tmp).ok, False)
        os.environ["STAND_IN_MODE"] = "stub"
        a = ferry.probe_copy(self.bin, self.tmp / "p1")
        self.assertEqual(a.reason, "n/a (subcommand missing)")
        a = ferry.probe_net(self.bin, self.tmp / "p2")
        self.assertEqual(a.reason, "n/a (subcommand missing)")
        os.environ["STAND_IN_MODE"] = "wrong"
        a = ferry.probe_copy(self.bin, self.tmp / "p3")
        self.assertTrue(a.reason.startswith("FAILED"), a.reason)
        os.environ["STAND_IN_MODE"] = "ok"
        self.assertTrue(ferry.probe_copy(self.bin, self.tmp / "p4").ok)

    def test_copy_json_and_rss_reach_the_table(self) -> None:
        src = datasets.generate("small", self.tmp / "data", 0.02)
        c = local.FerryCopy(self.bin, ferry.Availability(True), self.scratch)
        res = c.run(src, self.tmp / "dst", 60)
        self.assertIsNone(res.error)
        self.assertEqual(res.extra["files"], 1000)
        self.assertGreater(res.rss_kib["ferry"], 1000)

    def test_net_pair_reads_address_and_both_summaries(self) -> None:
        src = datasets.generate("medium", self.tmp / "data", 0.01)
        probe = self.tmp / "probe"
        self.assertTrue(ferry.probe_net(self.bin, probe).ok)
        certs = ferry.Certs(*(probe / "certs" / f for f in
                              ("ca.crt", "sender.crt", "sender.key", "receiver.crt", "receiver.key")))
        c = net.FerryNet(self.bin, ferry.Availability(True), certs, self.scratch, 2)
        res = c.run(src, self.tmp / "dst", 60)
        self.assertIsNone(res.error, res.error)
        self.assertEqual(set(res.rss_kib), {"send", "recv"})
        self.assertEqual(res.extra["streams"], 2)
        self.assertEqual(res.extra["receiver"]["files"], 30)
        self.assertTrue(verify.compare(verify.SourceIndex.build(src), self.tmp / "dst").ok)
        os.environ["STAND_IN_MODE"] = "wrong"
        res = c.run(src, self.tmp / "dst2", 60)
        self.assertIsNone(res.error)   # the process succeeded ...
        self.assertFalse(verify.compare(verify.SourceIndex.build(src), self.tmp / "dst2").ok)  # ... the copy did not


def synthetic(label: str, medians: dict[str, float], ferry_names: set[str]) -> suite.GroupResult:
    samples = [suite.Sample(label, name, rnd, m * (1 + 0.1 * rnd), None, {"main": 1024}, {})
               for name, m in medians.items() for rnd in (-1, 0, 1, 2)]
    return suite.GroupResult(label, label.split()[0], 10**9, 1, samples, {}, list(medians), ferry_names)


class ReportTests(unittest.TestCase):
    def test_medians_and_target_ratios_point_the_right_way(self) -> None:
        # medians of rounds 0..2 are m * 1.1 (the warm-up, 0.9 m, is ignored)
        small = synthetic("small", {"ferry copy": 1.0, "cp -r --preserve=x": 1.5, "cp -a": 3.0, "rsync -a": 2.0},
                          {"ferry copy"})
        big = synthetic("big", {"ferry copy": 1.2, "cp -r --preserve=x": 1.0, "cp -a": 1.1}, {"ferry copy"})
        self.assertAlmostEqual(small.median("ferry copy"), 1.1)
        targets = report.local_targets([small, big])

        def find(prefix: str) -> report.Target:
            return next(x for x in targets if x.text.startswith(prefix))

        self.assertEqual(find("small: >= 1.3x").verdict, "met")      # 1.5 / 1.0
        self.assertEqual(find("small: >= 1.3x").value, "1.50x")
        self.assertEqual(find("big: no slower").verdict, "MISSED")   # 1.2 / 1.0 > 1.10
        self.assertEqual(find("big: no slower").value, "1.20")
        net_small = synthetic("small", {"ferry --streams 1": 2.0, "ferry --streams 2": 1.0, "rsync -a over ssh": 2.0,
                                        "tar over socat (plain TCP)": 0.9}, {"ferry --streams 1", "ferry --streams 2"})
        t = report.net_targets([net_small])
        self.assertEqual([x.verdict for x in t[:2]], ["MISSED", "MISSED"])   # 2.0x < 2.5x; tar faster than ferry
        self.assertIn("(ferry --streams 2)", t[0].text)
        self.assertIn("| small | rsync -a over ssh | 2.200 |", report.table([net_small], net=True))

    def test_a_baseline_build_is_compared_not_counted_as_ferry(self) -> None:
        names = {"ferry --streams 4": 1.02, "ferry (baseline) --streams 4": 1.0,
                 "ferry --streams 2": 1.1, "ferry (baseline) --streams 2": 0.5}
        g = synthetic("small", {**names, "tar over socat (plain TCP)": 2.0}, set(names))
        # The best ferry is this build's, never the baseline's (which is faster here).
        self.assertEqual(report.best_ferry(g)[0], "ferry --streams 4")
        t = {x.text: x for x in report.baseline_targets([g])}
        self.assertEqual(t["small --streams 4: this build / baseline <= 1.03"].verdict, "met")      # 1.02
        self.assertEqual(t["small --streams 2: this build / baseline <= 1.03"].verdict, "MISSED")   # 2.2
        self.assertEqual(t["small --streams 2: this build / baseline <= 1.03"].value, "2.200")
        self.assertEqual(len(t), 2)   # no baseline for --streams 1: no target

    def test_block_is_replaced_in_place_or_appended(self) -> None:
        doc = "# B\n\nintro\n"
        once = report.replace_block(doc, "k", "table 1")
        self.assertIn("<!-- k:begin -->\ntable 1\n<!-- k:end -->", once)
        twice = report.replace_block(once + "\ntail\n", "k", "table 2")
        self.assertNotIn("table 1", twice)
        self.assertTrue(twice.endswith("tail\n"))
        self.assertEqual(twice.count("k:begin"), 1)


if __name__ == "__main__":
    unittest.main()
