"""Tests of scripts/bench-tables.py: the rules by which BENCHMARKS.md's tables say "met" or
"missed", and which run a figure is credited to. Standard library only:

    python3 -m unittest discover -s scripts/tests
"""
import importlib.util
import json
import os
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("bench_tables", os.path.join(HERE, "..", "bench-tables.py"))
bt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bt)

COPY = 4000.0  # GB/s of every synthetic run's copy


def row(fmt, m, h, *, pct=None, us=1.0, op="fp8", layout="row-major", group=None, scale="f32",
        same=None, check="ok", dtype="bf16"):
    """A bench JSON row whose % of COPY is `pct` (or whatever `us` gives)."""
    nbytes = 1_000_000
    gbps = COPY * pct / 100 if pct is not None else nbytes / us / 1e3
    graph_us = nbytes / gbps / 1e3
    return dict(m=m, h=h, dtype=dtype, format=fmt, layout=layout, op=op, group=group, scale_format=scale,
                residual=True, y_out=False, bytes_moved=nbytes, median_us=graph_us, graph_us=graph_us,
                graph_gb_per_s=gbps, gb_per_s=gbps, check=check, rows_checked=m,
                copy_same_bytes_gb_per_s=None if same is None else gbps / (same / 100))


def run(rows, desc="test card"):
    return dict(device_description=desc, copy=dict(gb_per_s=COPY), launch_floor_us=0.85, eps=1e-6,
                global_scale=1.0, rows=rows, all_ok=True)


def fp8_page(*runs, commit="c1"):
    return bt.Fp8Page([bt.Run(r, f"run{i}.json", "fp8", commit) for i, r in enumerate(runs)], commit)


class Fp8Targets(unittest.TestCase):
    def test_a_percentage_meets_the_target_when_it_reads_95_0(self):
        page = fp8_page(run([row("fp8-g128-f32-row-major", 4096, 8192, pct=94.96, group=128),
                             row("fp8-g128-f32-row-major", 16384, 8192, pct=94.94, group=128),
                             row("fp8-g128-f32-row-major", 1, 4096, us=1.5, group=128)]))
        pcts, decode, status = page.targets("fp8-g128-f32-row-major")
        self.assertEqual(status, "missed at 16384 × 8192 (94.9 %)")

    def test_decode_meets_the_target_when_it_reads_2_00_or_less(self):
        page = fp8_page(run([row("fp8-token", 4096, 8192, pct=99.0, group=8192),
                             row("fp8-token", 1, 4096, us=2.004, group=4096),
                             row("fp8-token", 16, 8192, us=2.006, group=8192),
                             row("fp8-token", 128, 8192, us=9.0, group=8192)]))  # (not a decode target)
        self.assertEqual(page.targets("fp8-token")[2], "missed at 16 × 8192 (2.01 µs)")

    def test_a_half_not_measured_is_not_met(self):
        page = fp8_page(run([row("fp8-tensor", 1, 4096, us=1.6, scale="static", layout="none")]))
        self.assertEqual(page.targets("fp8-tensor")[2], "% not measured")

    def test_cells_take_the_best_of_the_runs(self):
        a = run([row("mxfp8", 4096, 8192, pct=93.0, layout="swizzled", group=32, scale="ue8m0"),
                 row("mxfp8", 1, 4096, us=1.9, layout="swizzled", group=32, scale="ue8m0")])
        b = run([row("mxfp8", 4096, 8192, pct=95.5, layout="swizzled", group=32, scale="ue8m0"),
                 row("mxfp8", 1, 4096, us=1.7, layout="swizzled", group=32, scale="ue8m0")])
        page = fp8_page(a, b)
        self.assertAlmostEqual(page.pct("mxfp8", 4096, 8192), 95.5)
        self.assertAlmostEqual(page.us("mxfp8", 1, 4096), 1.7)
        self.assertEqual(page.targets("mxfp8")[2], "met")

    def test_runs_name_their_card(self):
        page = fp8_page(run([row("fp8-tensor", 1, 4096, us=1.6, scale="static", layout="none")],
                            desc="NVIDIA H100 80GB HBM3 (cuda:0, sm_90, 132 SMs; built-in launch table)"),
                        run([row("fp8-tensor", 1, 4096, us=1.5, scale="static", layout="none")],
                            desc="NVIDIA H200 (cuda:0, sm_90, 132 SMs)"))
        lines = page.block_runs()
        self.assertEqual(lines[0], "| run | card | commit | copy GB/s | launch floor µs | rows | byte check |")
        self.assertEqual(lines[2], "| `run0.json` | NVIDIA H100 80GB HBM3 | c1 | 4000.0 | 0.85 | 1 | every row matched |")
        self.assertIn("| NVIDIA H200 |", lines[3])

    def test_runs_show_the_launch_floor_before_and_after_the_rows(self):
        rows = [row("fp8-tensor", 1, 4096, us=1.6, scale="static", layout="none")]
        both = dict(run(rows), launch_floor_us=1.02, launch_floor_end_us=0.85)
        cpu = dict(run(rows), launch_floor_us=None)
        lines = fp8_page(both, cpu).block_runs()
        self.assertIn("| 1.02 / 0.85 |", lines[2])
        self.assertIn("| 4000.0 | - |", lines[3])

    def test_families_come_from_the_rows_scaling(self):
        cases = [(dict(fmt="mxfp8-e5m2", layout="swizzled", group=32, scale="ue8m0"), "MXFP8"),
                 (dict(fmt="fp8-group128-e5m2", layout="column-major", group=128), "column-major groups"),
                 (dict(fmt="fp8-g32-ue8m0-row-major", group=32, scale="ue8m0"), "row-major groups"),
                 (dict(fmt="fp8-token-ue8m0-row-major", group=4096, scale="ue8m0"), "per-token"),
                 (dict(fmt="fp8-tensor-e5m2", layout="none", scale="static"), "per-tensor"),
                 (dict(fmt="nvfp4", layout="swizzled", op="fp4", group=16, scale="e4m3"), None)]
        for kw, family in cases:
            fmt = kw.pop("fmt")
            self.assertEqual(bt.fp8_family(row(fmt, 1, 4096, **kw)), family, fmt)

    def test_fp4_rows_of_two_layouts_stay_apart(self):
        page = fp8_page(run([row("nvfp4", 1, 4096, us=1.8, op="fp4", layout="swizzled"),
                             row("nvfp4", 1, 4096, us=1.7, op="fp4", layout="row-major")]))
        self.assertEqual(page.formats, ["nvfp4:swizzled", "nvfp4:row-major"])
        self.assertAlmostEqual(page.us("nvfp4:swizzled", 1, 4096), 1.8)
        self.assertNotIn("nvfp4", "".join(page.block_targets()))  # FP4 rows have no FP8 target

    def test_peers_below_1_3x_are_named_and_not_bold(self):
        page = fp8_page(run([row("fp8-tensor", 1, 4096, us=1.6, scale="static", layout="none")]))
        peers = dict(rows=[dict(fmt="tensor", M=1, H=4096, fp4norm_us=2.0, inductor_us=2.5, speedup=1.25),
                           dict(fmt="token", M=1, H=4096, fp4norm_us=2.0, inductor_us=3.0, speedup=1.5)])
        out = page.block_peers(peers)
        self.assertIn("2.00 / 2.50 (1.25×)", out[2])
        self.assertIn("(**1.50×**)", out[2])
        self.assertIn("missed at tensor 1 × 4096 (1.25×)", out[-1])
        self.assertEqual(page.block_peers(dict(rows=[])), ["(no Inductor run)"])


class Fp4Page(unittest.TestCase):
    """Rows of an extra run of another commit fill only cells the report lacks, marked †."""

    def page(self):
        tmp = tempfile.mkdtemp()
        main = run([row(f, 4096, 8192, pct=95.0, op="fp4", group=16) for f in bt.FORMATS]
                   + [row(f, 1, 4096, us=1.8, op="fp4", group=16) for f in bt.FORMATS])
        with open(os.path.join(tmp, "main.json"), "w") as f:
            json.dump(main, f)
        extra = run([row(f, 4096, 8192, pct=50.0, op="fp4", group=16) for f in bt.FORMATS]
                    + [row(f, 8192, 8192, pct=93.0, op="fp4", group=16) for f in bt.FORMATS])
        rep = bt.Report(tmp, "new")
        return bt.Page(rep, [bt.Run(extra, "extra.json", "extra", "old")], "new")

    def test_the_reports_row_wins_and_the_other_commits_row_is_marked(self):
        page = self.page()
        grid = "\n".join(page.block_bandwidth_bf16())
        self.assertIn("| 4096 | 95.0 / 95.0 |", grid)      # the report's, not the extra's 50.0
        self.assertIn("| 8192 | 93.0 / 93.0† |", grid)     # filled from the extra, marked
        self.assertEqual(page.marked, {"old"})

    def test_nothing_marked_means_no_header_line(self):
        page = self.page()
        page.block_latency()                               # only the report's rows
        self.assertEqual(page.marked, set())


class CpuBlock(unittest.TestCase):
    """The CPU block: FP4 formats in the first table, every FP8 format in the second."""

    def block(self):
        rows = [dict(row(f, 1024, 4096, us=2000.0, op="fp4", layout="swizzled"), vs_copy=0.6)
                for f in bt.FORMATS]
        rows += [dict(row("fp8-tensor", 1024, 4096, us=2500.0, layout="none"), vs_copy=0.5),
                 dict(row("mxfp8", 1024, 4096, us=3000.0, layout="swizzled"), vs_copy=0.4)]
        return bt.cpu_block(bt.Run(run(rows), "cpu.json", "cpu", "c1"))

    def test_fp8_rows_stay_out_of_the_fp4_table(self):
        out = self.block()
        fp4 = out[:out.index("")]
        self.assertEqual(len(fp4), 3)                      # header, rule, one row
        self.assertIn("| 1024 × 4096 | bf16 | swizzled | 2000 (0.5, 60 %) | 2000 (0.5, 60 %) |", fp4)

    def test_each_fp8_format_is_a_column_in_the_runs_order(self):
        out = self.block()
        fp8 = out[out.index("") + 1:]
        self.assertTrue(fp8[0].startswith("| M × H | dtype | fp8-tensor (none)"))
        self.assertIn("mxfp8 (swizzled)", fp8[0])
        self.assertEqual(fp8[2], "| 1024 × 4096 | bf16 | 2500 (50 %) | 3000 (40 %) |")


class CpuMedian(unittest.TestCase):
    """Several CPU runs of one command: each cell the median of its runs."""

    def test_each_cell_is_the_median_of_the_runs(self):
        runs = []
        for us, frac, copy in ((100.0, 0.5, 20.0), (300.0, 0.2, 10.0), (200.0, 0.3, 30.0)):
            r = run([dict(row("fp8-tensor", 8, 64, us=us, layout="none"), vs_copy=frac)])
            r["copy"] = dict(gb_per_s=copy)
            runs.append(r)
        runs[1]["rows"].append(dict(row("mxfp8", 8, 64, us=1.0), vs_copy=1.0))  # in one run only
        m = bt.median_run(runs)
        self.assertEqual(len(m["rows"]), 1)
        self.assertEqual(m["rows"][0]["median_us"], 200.0)
        self.assertEqual(m["rows"][0]["vs_copy"], 0.3)
        self.assertEqual(m["copy"]["gb_per_s"], 20.0)
        self.assertEqual(m["runs"], 3)


if __name__ == "__main__":
    unittest.main()
