#!/usr/bin/env python3
"""Tests of the benchmark's pure-Python parts (compare.py, bench_common.py); plain unittest, no
torch, no numpy, so ctest runs them on any machine.

    python3 bench/compare_test.py                       # the synthetic cases
    python3 bench/compare_test.py --kiln-bench BINARY   # also reads kiln_bench's own sample files

What is checked: compare.py ranks a kiln row only when its correctness check passed (a failed or
missing check is marked and never ranked, and a workload without a passing kiln row gets no
ratio); PyTorch's best includes SDPA rows and names the mode; baseline rows that fail their own
check are not ranked; the markdown and text reports run end to end on synthetic files; the
correctness-file reader decodes what kiln_bench --write-check-sample writes; kernel counts from a
Chrome trace; the median / min / max summary.
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_common  # noqa: E402
import compare  # noqa: E402
import ids_compare  # noqa: E402

KILN_BENCH = os.environ.get("KILN_BENCH")  # or --kiln-bench BINARY (taken out of argv here)
if "--kiln-bench" in sys.argv:
    _i = sys.argv.index("--kiln-bench")
    KILN_BENCH = sys.argv[_i + 1]
    del sys.argv[_i:_i + 2]


def row(workload, mode, device, latency=None, throughput=None, **extra):
    r = {"workload": workload, "mode": mode, "metric": None, "amount": 0,
         "device_us": device, "latency_us": latency or [d + 5 for d in device],
         "throughput_us": throughput or list(device), "host_us": [3.0] * len(device)}
    r.update(extra)
    return r


def doc(source, rows, checks=None):
    d = {"source": source, "gpu": "NVIDIA H200", "date": "2026-12-01", "repetitions": 3,
         "results": {f"{r['workload']}/{r['mode']}": r for r in rows}}
    if checks is not None:
        d["checks"] = checks
    return d


def ok(rel=1e-3):
    return {"ok": True, "rel_l2": rel, "tol": 2e-2}


def failed(rel=0.5):
    return {"ok": False, "rel_l2": rel, "tol": 2e-2}


class PolicyBoundTest(unittest.TestCase):
    def test_twice_torchs_error_plus_a_floor(self):
        self.assertAlmostEqual(bench_common.policy_bound(0.01, 2.0), 0.036)
        self.assertAlmostEqual(bench_common.policy_bound(0.0, 1.0), 8e-3)


class GateTest(unittest.TestCase):
    def docs(self, kiln_checks):
        kiln = doc("kiln", [row("mlp", "eager", [300, 310, 305]),
                            row("mlp", "compiled+graph", [100, 101, 99]),
                            row("mlp", "compiled", [200, 190, 210])])
        torch = doc("pytorch", [row("mlp", "eager", [250, 251, 249]),
                                row("mlp", "frozen+graph", [150, 149, 151],
                                    check=ok())], kiln_checks)
        return [kiln, torch]

    def test_failed_check_is_not_ranked(self):
        # The fastest kiln row fails its check: the headline must use the next passing one.
        by = compare.collect(self.docs({"mlp/eager": ok(), "mlp/compiled": ok(),
                                        "mlp/compiled+graph": failed()}))
        entries = by["mlp"]
        graph = [e for e in entries if e.side == "kiln" and e.mode == "compiled+graph"][0]
        self.assertEqual(graph.status, "FAIL")
        self.assertFalse(graph.ranked)
        self.assertEqual(compare.best(entries, "kiln", "device_us"), (200, "compiled"))
        line = compare.headline(by, "pytorch")[0]
        self.assertEqual(line[0], "mlp")
        self.assertEqual(line[1], "ok")
        self.assertEqual(line[2], "200.0 (compiled)")
        self.assertEqual(line[3], "150.0 (frozen+graph)")
        self.assertEqual(line[4], f"{200 / 150:.2f}")
        cells = [r for r in compare.every_row(by) if r[2] == "compiled+graph"][0]
        self.assertIn("FAIL", cells[3])
        self.assertIn("not ranked", cells[3])

    def test_missing_check_is_not_ranked(self):
        by = compare.collect(self.docs({"mlp/eager": ok()}))  # compiled rows never checked
        kiln = {e.mode: e for e in by["mlp"] if e.side == "kiln"}
        self.assertEqual(kiln["compiled"].status, "missing")
        self.assertFalse(kiln["compiled"].ranked)
        self.assertEqual(compare.best(by["mlp"], "kiln", "device_us"), (305, "eager"))

    def test_workload_without_a_passing_kiln_row_gets_no_ratio(self):
        by = compare.collect(self.docs({"mlp/eager": failed(), "mlp/compiled": failed(),
                                        "mlp/compiled+graph": failed()}))
        line = compare.headline(by, "pytorch")[0]
        self.assertTrue(line[1].startswith("not ranked"), line[1])
        self.assertEqual([line[4], line[7], line[10]], ["-", "-", "-"])

    def test_standings_name_the_issue_where_kiln_is_behind(self):
        by = compare.collect(self.docs({"mlp/eager": ok(), "mlp/compiled": ok(),
                                        "mlp/compiled+graph": failed()}))
        line = compare.standings(by)[0]
        self.assertIn("device behind (1.33×: kiln compiled 200.0 µs, PyTorch frozen+graph", line)
        self.assertIn("gelu·mul epilogue", line)
        by = compare.collect(self.docs({}))
        self.assertIn("not ranked", compare.standings(by)[0])

    def test_no_checks_at_all_ranks_nothing(self):
        by = compare.collect(self.docs(None))
        self.assertEqual(compare.best(by["mlp"], "kiln", "device_us"), (None, None))

    def test_error_row_is_not_ranked(self):
        docs = self.docs({"mlp/eager": ok(), "mlp/compiled": ok(), "mlp/compiled+graph": ok()})
        docs[0]["results"]["mlp/compiled+graph"]["error"] = "boom"
        by = compare.collect(docs)
        self.assertEqual(compare.best(by["mlp"], "kiln", "device_us"), (200, "compiled"))


class BaselineTest(unittest.TestCase):
    def test_best_pytorch_includes_sdpa_and_names_the_mode(self):
        kiln = doc("kiln", [row("attention", "compiled+graph", [400, 405, 410])])
        torch = doc("pytorch", [row("attention", "eager", [1000, 1001, 999]),
                                row("attention", "sdpa_flash", [60, 61, 59], check=ok(2e-3)),
                                row("attention", "compiled", [300, 300, 300], check=ok())],
                    {"attention/compiled+graph": ok()})
        by = compare.collect([kiln, torch])
        self.assertEqual(compare.best(by["attention"], "pytorch", "device_us"), (60, "sdpa_flash"))
        line = compare.headline(by, "pytorch")[0]
        self.assertEqual(line[3], "60.0 (sdpa_flash)")
        self.assertEqual(line[4], f"{405 / 60:.2f}")

    def test_baseline_row_failing_its_own_check_is_not_ranked(self):
        kiln = doc("kiln", [row("mlp", "eager", [300])])
        torch = doc("pytorch", [row("mlp", "eager", [250]),
                                row("mlp", "eager+graph", [10], check=failed())],
                    {"mlp/eager": ok()})
        by = compare.collect([kiln, torch])
        self.assertEqual(compare.best(by["mlp"], "pytorch", "device_us"), (250, "eager"))

    def test_reports_run_end_to_end(self):
        kiln = doc("kiln", [row("mlp", "compiled", [200, 201, 202], kernels=3, memsets=1,
                                plan_kernels=3, plan_memsets=0,
                                kernel_names={"nvjet_tst_128x256_gemm": 2, "kiln_fused_0": 1})])
        torch = doc("pytorch", [row("mlp", "eager", [250, 250, 250])], {"mlp/compiled": ok()})
        lt = doc("libtorch", [row("mlp", "eager", [240, 241, 242])])
        with tempfile.TemporaryDirectory() as d:
            paths = []
            for name, content in (("kiln", kiln), ("torch", torch), ("libtorch", lt)):
                paths.append(os.path.join(d, name + ".json"))
                with open(paths[-1], "w", encoding="utf-8") as f:
                    json.dump(content, f)
            state = os.path.join(d, "gpu_state.csv")
            with open(state, "w", encoding="utf-8") as f:
                f.write("time, label, clocks.sm, clocks.mem, power.draw, pstate, temperature.gpu\n"
                        "1.0, kiln rep 0 before, 1980 MHz, 3201 MHz, 120.5 W, P0, 40\n"
                        "2.0, kiln rep 0 after, 1755 MHz, 3201 MHz, 600.1 W, P0, 52\n")
            md = os.path.join(d, "bench.md")
            out = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), *paths,
                                  "--gpu-state", state, "--markdown", md],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn("kiln against PyTorch", out)
            with open(md, encoding="utf-8") as f:
                text = f.read()
        self.assertIn("| mlp | ok | 201.0 (compiled) | 250.0 (eager) | 0.80 |", text)
        self.assertIn("### kiln against libtorch", text)
        self.assertIn("SM clock 1755–1980 MHz", text)
        self.assertIn("3 +1 memset (plan 3 ≠)", text)  # 3 kernels + 1 memset measured, plan 3 + 0
        self.assertIn("nvjet_tst_128x256_gemm", text)


class CommonTest(unittest.TestCase):
    def test_summary(self):
        self.assertEqual(bench_common.summary([3.0, 1.0, 2.0]), (2.0, 1.0, 3.0))
        self.assertEqual(bench_common.summary([]), (None, None, None))
        self.assertEqual(bench_common.summary(None), (None, None, None))
        self.assertEqual(bench_common.summary([None, 4.0]), (4.0, 4.0, 4.0))

    def test_kernel_counts_from_a_trace(self):
        events = [{"ph": "X", "cat": "kernel", "name": "gemm_a"},
                  {"ph": "X", "cat": "kernel", "name": "gemm_a"},
                  {"ph": "X", "cat": "kernel", "name": "softmax"},
                  {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)"},
                  {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD"},
                  {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel"},
                  {"ph": "f", "cat": "ac2g", "name": "flow"}]
        c = bench_common.kernel_counts(events, 2)
        self.assertEqual((c["kernels"], c["memsets"], c["memcpys"]), (1.5, 0.5, 0.5))
        self.assertEqual(c["kernel_names"], {"gemm_a": 1.0, "softmax": 0.5})

    def test_rel_l2_and_check_entry(self):
        self.assertAlmostEqual(bench_common.rel_l2([1.0, 2.0], [1.0, 2.0]), 0.0)
        self.assertAlmostEqual(bench_common.rel_l2([3.0, 4.0], [0.0, 0.0]), 5.0)
        self.assertEqual(bench_common.rel_l2([float("nan")], [1.0]), float("inf"))
        self.assertTrue(bench_common.check_entry([1e-3, 5e-3], "bfloat16")["ok"])
        self.assertFalse(bench_common.check_entry([1e-3, 3e-2], "bfloat16")["ok"])
        self.assertFalse(bench_common.check_entry([2e-5], "float32")["ok"])
        self.assertFalse(bench_common.check_entry([float("inf")], "bfloat16")["ok"])
        self.assertFalse(bench_common.check_entry([], "bfloat16", error="no file")["ok"])

    def test_manifest_written_by_python(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "in0.bin"), "wb") as f:
                f.write(struct.pack("<2f", 1.5, -2.0))
            with open(os.path.join(d, "manifest.txt"), "w", encoding="utf-8") as f:
                f.write("input 0 x float32 2 in0.bin\noutput eager 0 float32 2 in0.bin\n")
            inputs, outputs = bench_common.read_manifest(d)
            self.assertEqual([t.name for t in inputs], ["x"])
            self.assertEqual(list(outputs), ["eager"])
            with open(inputs[0].path, "rb") as f:
                self.assertEqual(bench_common.decode(f.read(), "float32"), [1.5, -2.0])
            with open(os.path.join(d, "manifest.txt"), "a", encoding="utf-8") as f:
                f.write("input 1 y int8 2 in0.bin\n")
            with self.assertRaises(ValueError):
                bench_common.read_manifest(d)

    @unittest.skipIf(KILN_BENCH is None, "no kiln_bench binary given (--kiln-bench or KILN_BENCH)")
    def test_reads_what_kiln_bench_writes(self):
        binary = KILN_BENCH
        with tempfile.TemporaryDirectory() as d:
            subprocess.run([binary, "--write-check-sample", d], check=True,
                           capture_output=True)
            self.assertEqual(bench_common.check_workloads(d), ["sample"])
            inputs, outputs = bench_common.read_manifest(os.path.join(d, "sample"))
            self.assertEqual([(t.name, t.dtype, t.shape) for t in inputs],
                             [("x", "bfloat16", [2, 3]), ("mask", "bool", [2, 2]),
                              ("w", "float32", [3])])
            values = []
            for t in inputs:
                with open(t.path, "rb") as f:
                    data = f.read()
                self.assertEqual(len(data), t.nbytes())
                values.append(bench_common.decode(data, t.dtype))
            self.assertEqual(values, [[0.5, -1.25, 2.0, 3.5, -4.0, 1024.0], [0.0, 1.0, 0.0, 0.0],
                                      [1.0, 2.0, 3.0]])
            self.assertEqual(sorted(outputs), ["compiled+graph", "eager"])
            eager = outputs["eager"]
            with open(eager[1].path, "rb") as f:
                self.assertEqual(bench_common.decode(f.read(), "float32"), [2.0, 4.0, 6.0])
            with open(outputs["compiled+graph"][0].path, "rb") as f:
                self.assertEqual(bench_common.decode(f.read(), "bfloat16"),
                                 [0.5, -1.25, 2.0, 3.5, -4.0, 1024.0])


class IdsCompareTest(unittest.TestCase):
    """gpu-run llamaab's check: each side's ids against the plain side's."""

    def test_first_differences(self):
        base = [[1, 2, 3], [4, 5, 6]]
        self.assertEqual(ids_compare.first_differences([[1, 2, 3], [4, 5, 6]], base), [])
        self.assertEqual(ids_compare.first_differences([[1, 2, 3], [4, 9, 6]], base), [(1, 1)])
        self.assertEqual(ids_compare.first_differences([[1, 2], [4, 5, 6]], base), [(0, 2)])
        self.assertEqual(ids_compare.first_differences([[1, 2, 3]], base), [("rows", "1 vs 2")])

    def test_main_reads_the_runs_and_fails_on_a_mismatch(self):
        with tempfile.TemporaryDirectory() as work:
            for tag, ids in [("plain", [[1, 2]]), ("A_on", [[1, 2]]), ("B_on", [[1, 3]])]:
                with open(f"{work}/llamaab_b8_{tag}.json", "w") as f:
                    json.dump({"modes": {"graph": ids}}, f)
            run = [sys.executable, os.path.join(HERE, "ids_compare.py"), work, "8", "plain"]
            ok = subprocess.run(run + ["A=on"], capture_output=True, text=True)
            self.assertEqual(ok.returncode, 0)
            self.assertIn("ids of 'A=on' vs plain OK", ok.stdout)
            bad = subprocess.run(run + ["A=on", "B=on"], capture_output=True, text=True)
            self.assertEqual(bad.returncode, 1)
            self.assertIn("ids of 'B=on' vs plain MISMATCH (row, step): [(0, 1)]", bad.stdout)


if __name__ == "__main__":
    unittest.main()
