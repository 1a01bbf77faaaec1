#!/usr/bin/env python3
"""BENCHMARKS.md's tables and the raw-data CSV from the files of one measurement run, so
that the published figures are the measured ones, not retyped. Standard library only
(it runs on the GPU machine too).

Page mode: after `bash scripts/gpu-check.sh report` (which writes report.tgz):

    python3 scripts/bench-tables.py --report report.tgz --commit 88ab7b4 \
        [--date 2026-12-01] [--driver 580.159.04] [--cuda "13.0"] \
        [--extra RUN.json[@COMMIT] ...] [--cpu CPU.json@COMMIT --cpu-machine TEXT] \
        [--csv benchmarks/h200.csv] [--cpu-csv benchmarks/cpu.csv] [--update BENCHMARKS.md]

--report: the report.tgz (or its unpacked report/ folder): main, layouts, y_out, H = 32768
and f16 bench JSONs, the Triton peer's JSON, the PDL log, the GPU test log.
--extra: more `fp4norm bench --json` runs of the same card (e.g. a section the report
skipped at its deadline); `@COMMIT` when they ran on another commit than --commit. Rows of
the same commit fill the report's tables where the report has no such row; rows of
another commit fill them too, marked † (the header names their run), and are compared with
the report's own rows in the `later` block where the page has one.
--cpu: an `fp4norm bench --device cpu --json` run for the CPU table, or several runs of
one command (repeat it; each cell is their median time and median % of copy) (alone, without
--report: `--cpu CPU.json@COMMIT --cpu-machine TEXT --cpu-csv benchmarks/cpu.csv --update
BENCHMARKS.md` rewrites the CPU table only).
--update: replaces every block between `<!-- BEGIN bench-tables: NAME -->` and
`<!-- END bench-tables: NAME -->` in the page with the block NAME generated here (the text
around them is left alone); without --update the blocks are printed.
--csv / --cpu-csv: every row of the run (fp4norm, the Triton peer, the PDL chain), one per
line, with the card, commit, date and the copy bandwidth of the run it came from.

FP8 mode: the FP8 table and its status from the runs of `bash scripts/gpu-check.sh fp8report`
(`fp4norm bench --format nvfp4,fp8-...` JSONs; % cells the best of the runs, µs cells the
lowest):

    python3 scripts/bench-tables.py --fp8 fp8-decode.json --fp8 fp8-big-1.json \
        --fp8 fp8-big-2.json --commit e604840 [--date D] [--gpu-txt gpu.txt] \
        [--fp8-peers fp8_peers.json] [--fp8-csv benchmarks/h200-fp8.csv] [--update BENCHMARKS.md]

Report mode (what `gpu-check.sh report` calls to write report.md):

    python3 scripts/bench-tables.py --main main.json [--peers peer_bench.json]
        [--layouts layouts.json] [--yout yout.json] [--extra run.json ...]
"""
import argparse
import csv
import datetime
import json
import os
import re
import statistics
import sys
import tarfile

SMALL = 4 * 1024 * 1024  # elements: below, µs per call; above, % of copy
FORMATS = ("nvfp4", "mxfp4")
HS = (2048, 4096, 5120, 7168, 8192, 16384, 32768)
TARGET_PCT = 94.0  # % of copy at M·H >= 2^25
BIG = 1 << 25


def load(path, every_op=False):
    """A bench JSON file with its FP4 rows only (a run may mix in FP8 formats, whose rows
    carry "op": "fp8"; the GPU tables are the FP4 op's), or with every row (the CPU
    block, whose second table is the FP8 formats')."""
    with open(path) as f:
        run = json.load(f)
    if not every_op:
        run["rows"] = [r for r in run["rows"] if r.get("op", "fp4") == "fp4"]
    return run


def index(run):
    """(m, h, dtype, format, layout, y_out) -> row."""
    return {(r["m"], r["h"], r["dtype"], r["format"], r["layout"], r["y_out"]): r for r in run["rows"]}


def pct(run, row):
    return 100.0 * row["graph_gb_per_s"] / run["copy"]["gb_per_s"]


def vs_same(row):
    same = row.get("copy_same_bytes_gb_per_s")
    return 100.0 * row["graph_gb_per_s"] / same if same else None


def header(run, what):
    return (f"{what}: {run['device_description']}, copy {run['copy']['gb_per_s']:.1f} GB/s, "
            f"launch floor {run['launch_floor_us']:.2f} µs, eps {run['eps']:g}, global scale {run['global_scale']:g}")


def m_by_h(ms, hs, cell, skip_empty_rows=False):
    """An M x H markdown table; cell(m, h) gives the text, '-' for none."""
    out = ["| M \\ H | " + " | ".join(map(str, hs)) + " |", "|---" * (len(hs) + 1) + "|"]
    for m in ms:
        cells = [cell(m, h) for h in hs]
        if not (skip_empty_rows and all(c == "-" for c in cells)):
            out.append(f"| {m} | " + " | ".join(cells) + " |")
    return out


# ---------------------------------------------------------------------------------------
# Report mode: report.md of one `gpu-check.sh report` run.

def grid(run, dtype="bf16", layout="row-major"):
    rows = index(run)
    ms = sorted({k[0] for k in rows if k[2] == dtype and k[4] == layout})
    hs = sorted({k[1] for k in rows if k[2] == dtype and k[4] == layout})
    pair = lambda m, h: [rows.get((m, h, dtype, f, layout, False)) for f in FORMATS]

    def speed(m, h):
        rs = pair(m, h)
        if any(r is None for r in rs):
            return "-"
        if m * h < SMALL:
            return " / ".join(f"{r['graph_us']:.2f}" for r in rs) + " µs"
        return " / ".join(f"{pct(run, r):.1f}%" for r in rs)

    def same(m, h):
        rs = pair(m, h)
        if any(r is None or vs_same(r) is None for r in rs):
            return "-"
        return " / ".join(f"{vs_same(r):.0f}%" for r in rs)

    out = [header(run, "main table") + f"; {dtype}, {layout}; cells NVFP4 / MXFP4", ""]
    out += m_by_h(ms, hs, speed)
    out += ["", "against a copy of each call's own size (\"vs same\"):", ""]
    out += m_by_h(ms, hs, same, skip_empty_rows=True)
    return out


def speedup_text(s):
    mark = "**" if s >= 1.2 else ""
    # Three decimals where two would round across the 1.2x target (1.1989 is not 1.20).
    shown = f"{s:.3f}" if s < 1.2 <= round(s, 2) else f"{s:.2f}"
    return f"{mark}{shown}×{mark}"


def ours_for_peers(runs):
    """fp4norm's graph µs per (m, h, format): bf16, row-major, no y_out, first run first."""
    ours = {}
    for r in runs:
        for row in r["rows"]:
            if row["dtype"] == "bf16" and row["layout"] == "row-major" and not row["y_out"]:
                ours.setdefault((row["m"], row["h"], row["format"]), row["graph_us"])
    return ours


def peers(run, peer, extra_runs):
    ours = ours_for_peers([run] + extra_runs)
    by = {(p["M"], p["H"], p["fmt"], p["impl"]): p["us"] for p in peer["rows"]}
    out = [f"Triton peer (its copy {peer['copy_gbps']:.0f} GB/s)", "",
           "| M × H | fmt | fp4norm µs | Triton µs | speed-up | torch.compile µs |",
           "|---|---|---|---|---|---|"]
    for f in FORMATS:
        for (m, h, fmt, impl), t in sorted(by.items()):
            if fmt != f or impl != "triton":
                continue
            o = ours.get((m, h, fmt))
            comp = by.get((m, h, fmt, "compile"))
            if o is None:
                out.append(f"| {m} × {h} | {fmt} | (not in our runs) | {t:.2f} | - | {comp:.1f} |")
                continue
            out.append(f"| {m} × {h} | {fmt} | {o:.2f} | {t:.2f} | {speedup_text(t / o)} | {comp:.1f} |")
    return out


def layouts(run):
    rows = index(run)
    shapes = sorted({(k[0], k[1], k[2]) for k in rows})
    out = [header(run, "layouts"), "",
           "| M × H | dtype | fmt | row-major µs | swizzled µs (extra) | both µs (extra) |",
           "|---|---|---|---|---|---|"]
    for m, h, dt in shapes:
        for f in FORMATS:
            rm = rows.get((m, h, dt, f, "row-major", False))
            sw = rows.get((m, h, dt, f, "swizzled", False))
            bo = rows.get((m, h, dt, f, "both", False))
            if rm is None:
                continue
            cell = lambda r: "-" if r is None else f"{r['graph_us']:.2f} ({100 * (r['graph_us'] / rm['graph_us'] - 1):+.1f} %)"
            out.append(f"| {m} × {h} | {dt} | {f} | {rm['graph_us']:.2f} | {cell(sw)} | {cell(bo)} |")
    return out


def percent_list(run, what):
    out = [header(run, what), "", "| M × H | dtype | layout | y_out | NVFP4 | MXFP4 |", "|---|---|---|---|---|---|"]
    rows = index(run)
    for (m, h, dt, lay, yo) in sorted({(k[0], k[1], k[2], k[4], k[5]) for k in rows}):
        rs = [rows.get((m, h, dt, f, lay, yo)) for f in FORMATS]
        cells = ["-" if r is None else f"{r['graph_us']:.2f} µs, {pct(run, r):.1f}%" for r in rs]
        out.append(f"| {m} × {h} | {dt} | {lay} | {yo} | " + " | ".join(cells) + " |")
    return out


def report_md(a):
    run = load(a.main)
    if not run.get("all_ok", True):
        print("WARNING: the main run has MISMATCH rows", file=sys.stderr)
    out = grid(run)
    extra_runs = [load(p.split("@")[0]) for p in a.extra]
    extra = [load(p) for p in (a.layouts, a.yout) if p] + extra_runs
    if a.peers:
        out += [""] + peers(run, load(a.peers), extra)
    if a.layouts:
        out += [""] + layouts(load(a.layouts))
    if a.yout:
        out += [""] + percent_list(load(a.yout), "y_out")
    for path, r in zip(a.extra, extra_runs):
        out += [""] + percent_list(r, path)
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Page mode: BENCHMARKS.md's blocks and the CSV.

class Run:
    """One `fp4norm bench --json` file: its rows, copy figure, and where it came from."""

    def __init__(self, data, source, section, commit):
        self.data, self.source, self.section, self.commit = data, source, section, commit
        self.copy = data["copy"]["gb_per_s"]
        self.floor = data.get("launch_floor_us")
        for r in data["rows"]:
            r["_run"] = self

    def pct(self, row):
        return pct(self.data, row)


def key(r):
    return (r["m"], r["h"], r["dtype"], r["format"], r["layout"], r["y_out"])


class Report:
    """The files of one `gpu-check.sh report` run (a report.tgz or its report/ folder)."""

    SECTIONS = ("main", "layouts", "yout", "h32768", "f16")

    def __init__(self, path, commit):
        self.files, self.mtime = {}, None
        if os.path.isdir(path):
            for name in os.listdir(path):
                p = os.path.join(path, name)
                with open(p, "rb") as f:
                    self.files[name] = f.read()
                self.mtime = max(self.mtime or 0, os.path.getmtime(p))
            self.where = path
        else:
            with tarfile.open(path) as t:
                for m in t.getmembers():
                    if m.isfile():
                        self.files[os.path.basename(m.name)] = t.extractfile(m).read()
                        self.mtime = max(self.mtime or 0, m.mtime)
            self.where = os.path.dirname(os.path.abspath(path))
        self.runs = {}
        for s in self.SECTIONS:
            if f"{s}.json" in self.files:
                self.runs[s] = Run(json.loads(self.files[f"{s}.json"]), f"report/{s}.json", s, commit)
        if "main" not in self.runs:
            sys.exit(f"{path}: no main.json (the report's main table)")
        pb = self.files.get("peer_bench.json")
        self.peer = json.loads(pb) if pb else None
        self.pdl = parse_pdl(self.text("pdl.log"))
        tests = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed.*finished in ([\d.]+)s",
                           self.text("gpu-tests.log"))
        self.tests = f"{tests[-1][0]} passed, {tests[-1][1]} failed ({float(tests[-1][2]):.0f} s)" if tests else None
        # "[report] f16 skipped: deadline" -> "f16 (deadline)"
        self.skipped = [re.sub(r"^\[report\] (.*) skipped: (.*)$", r"\1 (\2)", l.strip())
                        for l in self.text("skipped.txt").splitlines() if l.strip()]

    def text(self, name):
        return self.files.get(name, b"").decode("utf-8", "replace")


def parse_pdl(text):
    rows = []
    for line in text.splitlines():
        f = line.split()
        if len(f) == 6 and f[0].isdigit() and f[2] in FORMATS:
            rows.append(dict(m=int(f[0]), h=int(f[1]), format=f[2], no_pdl_us=float(f[3]),
                             pdl_us=float(f[4]), gain=f[5]))
    return rows


class Page:
    """Every row of the report and of the extra runs, and the tables built from them."""

    def __init__(self, rep, extras, commit):
        self.rep, self.commit = rep, commit
        self.main = rep.runs["main"]
        self.all_runs = list(rep.runs.values()) + extras
        # The rows of the report's commit, by key: report first, then same-commit extras.
        self.own = {}
        for run in self.all_runs:
            if run.commit == commit:
                for r in run.data["rows"]:
                    self.own.setdefault(key(r), r)
        # Extras of another commit fill only cells the report's commit has no row for, and
        # such cells are marked (`mark`); block_later compares them where it has one.
        self.later = [run for run in extras if run.commit != commit]
        self.rows = dict(self.own)
        for run in self.later:
            for r in run.data["rows"]:
                self.rows.setdefault(key(r), r)
        self.marked = set()  # commits of the rows of cells shown marked (see mark)

    def get(self, m, h, dt, f, layout="row-major", y_out=False):
        return self.rows.get((m, h, dt, f, layout, y_out))

    def pair(self, m, h, dt="bf16", layout="row-major", y_out=False):
        rs = [self.get(m, h, dt, f, layout, y_out) for f in FORMATS]
        return None if any(r is None for r in rs) else rs

    def pct(self, r):
        return r["_run"].pct(r)

    def mark(self, rs):
        """"†" where a cell's rows ran on another commit than the report; the header names
        the runs of every cell marked (so build it after the other blocks)."""
        other = {r["_run"].commit for r in rs if r["_run"].commit != self.commit}
        self.marked |= other
        return "†" if other else ""

    # -- blocks ----------------------------------------------------------------------

    def block_header(self, a):
        m = self.main.data
        copies = ", ".join(f"{run.section} {run.copy:.1f}" for run in self.rep.runs.values())
        ok = all(run.data.get("all_ok", True) for run in self.all_runs)
        rows = [r for run in self.all_runs for r in run.data["rows"]]
        checked = sum(r.get("check") != "skipped" for r in rows)
        if not ok:
            check = "MISMATCH in some row: see the JSON"
        elif checked == len(rows):
            check = "every row matched the CPU reference"
        elif checked == 0:
            check = "not in these runs (`--no-check`)"
        else:
            check = f"{checked} of {len(rows)} rows checked, all matched; the others ran with `--no-check`"
        lines = [
            "| | |", "|---|---|",
            f"| card | {m['device_description']} |",
            f"| driver / CUDA | {a.driver or 'not recorded'} / {a.cuda or 'not recorded'} |",
            f"| commit | {self.commit} |",
            f"| date | {a.date} |",
            f"| copy (same run, GB/s) | {copies} |",
            f"| launch floor | {self.main.floor:.2f} µs (graph replay of a one-CTA kernel moving 16 bytes) |",
            f"| GPU tests in the run | {self.rep.tests or 'not run'} |",
            f"| byte check | {check} |",
        ]
        if self.rep.skipped:
            lines.append(f"| sections skipped | {'; '.join(self.rep.skipped)} |")
        others = [f"`{run.source}` ({run.commit}, copy {run.copy:.1f})" for run in self.all_runs
                  if not run.source.startswith("report/")]
        if others:
            lines.append(f"| other runs, same card (GB/s) | {', '.join(others)} |")
        if self.marked:
            lines.append(f"| cells marked † | rows this run did not measure, from the run of "
                         f"{', '.join(sorted(self.marked))} (other runs, above) |")
        return lines

    def block_latency(self):
        floor = self.main.floor
        hs = [h for h in HS if self.pair(1, h)]

        def cell(m, h):
            rs = self.pair(m, h)
            return "-" if rs is None else " / ".join(f"{r['graph_us']:.2f}" for r in rs) + self.mark(rs)

        out = m_by_h([m for m in (1, 16, 128, 1024) if any(self.pair(m, h) for h in hs)], hs, cell)
        small = [r for m in (1, 16) for h in hs if h <= 8192 for r in (self.pair(m, h) or [])]
        if small:
            lo, hi = min(r["graph_us"] for r in small), max(r["graph_us"] for r in small)
            out += ["", f"M = 1 and 16, H ≤ 8192: {lo:.2f}–{hi:.2f} µs{self.mark(small)}, {lo - floor:.2f}–"
                        f"{hi - floor:.2f} µs above the launch floor of {floor:.2f} µs."]
        return out

    def bandwidth_grid(self, dt):
        ms = [m for m in (1024, 2048, 4096, 8192, 16384) if any(self.pair(m, h, dt) for h in HS)]
        hs = [h for h in HS if any(self.pair(m, h, dt) for m in ms)]

        def cell(m, h):
            rs = self.pair(m, h, dt)
            return "-" if rs is None else " / ".join(f"{self.pct(r):.1f}" for r in rs) + self.mark(rs)

        return m_by_h(ms, hs, cell)

    def block_bandwidth_bf16(self):
        return self.bandwidth_grid("bf16")

    def block_bandwidth_f16(self):
        return self.bandwidth_grid("f16")

    def block_layouts(self):
        run = self.rep.runs.get("layouts")
        if run is None:
            return ["(no layouts section in this run)"]
        rows = index(run.data)
        out = ["| M × H | dtype | row-major µs (% of copy) | swizzled µs (extra) | both µs (extra) |",
               "|---|---|---|---|---|"]
        for m, h, dt in sorted({(k[0], k[1], k[2]) for k in rows}):
            rm = [rows.get((m, h, dt, f, "row-major", False)) for f in FORMATS]
            if None in rm:
                continue

            def extra(lay):
                rs = [rows.get((m, h, dt, f, lay, False)) for f in FORMATS]
                if None in rs:
                    return "-"
                return (" / ".join(f"{r['graph_us']:.2f}" for r in rs) + " (" +
                        " / ".join(f"{100 * (r['graph_us'] / b['graph_us'] - 1):+.1f}" for r, b in zip(rs, rm)) + " %)")

            out.append(f"| {m} × {h} | {dt} | " + " / ".join(f"{r['graph_us']:.2f}" for r in rm) + " (" +
                       " / ".join(f"{run.pct(r):.1f}" for r in rm) + f" %) | {extra('swizzled')} | {extra('both')} |")
        return out

    def layout_extras(self):
        """(m, h, format, extra swizzled, extra both) of the layouts run."""
        run = self.rep.runs.get("layouts")
        if run is None:
            return []
        rows, out = index(run.data), []
        for (m, h, dt, f, lay, yo), rm in rows.items():
            if lay != "row-major" or yo:
                continue
            for other in ("swizzled", "both"):
                r = rows.get((m, h, dt, f, other, False))
                if r is not None:
                    out.append((m, h, f, other, 100 * (r["graph_us"] / rm["graph_us"] - 1)))
        return out

    def block_peers(self):
        if self.rep.peer is None:
            return ["(no Triton peer in this run)"]
        ours = ours_for_peers([run.data for run in self.all_runs if run.commit == self.commit])
        by = {(p["M"], p["H"], p["fmt"], p["impl"]): p for p in self.rep.peer["rows"]}
        out = ["| M × H | fp4norm µs | Triton µs (% of its copy) | speed-up | torch.compile µs |",
               "|---|---|---|---|---|"]
        shapes = sorted({(m, h) for (m, h, _, impl) in by if impl == "triton"})
        for m, h in shapes:
            cells = [[], [], [], []]
            for f in FORMATS:
                p, c, o = by.get((m, h, f, "triton")), by.get((m, h, f, "compile")), ours.get((m, h, f))
                cells[0].append("-" if o is None else f"{o:.2f}")
                # (its share of the copy only where the call is large enough to mean something)
                cells[1].append("-" if p is None else f"{p['us']:.2f}" + (f" ({p['pct_copy']:.0f} %)" if m * h >= SMALL else ""))
                cells[2].append("-" if None in (o, p) else speedup_text(p["us"] / o))
                cells[3].append("-" if c is None else f"{c['us']:.1f}")
            out.append(f"| {m} × {h} | " + " | ".join(" / ".join(c) for c in cells) + " |")
        return out

    def speedups(self):
        if self.rep.peer is None:
            return []
        ours = ours_for_peers([run.data for run in self.all_runs if run.commit == self.commit])
        return [p["us"] / ours[(p["M"], p["H"], p["fmt"])] for p in self.rep.peer["rows"]
                if p["impl"] == "triton" and (p["M"], p["H"], p["fmt"]) in ours]

    def yout_pairs(self):
        run = self.rep.runs.get("yout")
        if run is None:
            return []
        out = []
        for r in run.data["rows"]:
            base = self.get(r["m"], r["h"], r["dtype"], r["format"], r["layout"], False)
            if base is not None:
                out.append((base, r))
        return sorted(out, key=lambda p: (p[0]["m"], p[0]["h"], FORMATS.index(p[0]["format"])))

    def block_yout(self):
        pairs = self.yout_pairs()
        if not pairs:
            return ["(no y_out section in this run)"]
        by = {}
        for base, r in pairs:
            by.setdefault((r["m"], r["h"]), []).append((base, r))
        out = ["| M × H | without y_out µs (% of copy) | with y_out µs (% of copy) | time × | bytes × |",
               "|---|---|---|---|---|"]
        for (m, h), ps in sorted(by.items()):
            without = " / ".join(f"{b['graph_us']:.2f}" for b, _ in ps)
            without_pct = " / ".join(f"{self.pct(b):.1f}" for b, _ in ps)
            with_ = " / ".join(f"{r['graph_us']:.2f}" for _, r in ps)
            with_pct = " / ".join(f"{self.pct(r):.1f}" for _, r in ps)
            time = " / ".join(f"{r['graph_us'] / b['graph_us']:.3f}" for b, r in ps)
            nbytes = " / ".join(f"{r['bytes_moved'] / b['bytes_moved']:.3f}" for b, r in ps)
            mark = self.mark([x for pair in ps for x in pair])
            out.append(f"| {m} × {h} | {without} ({without_pct} %){mark} | {with_} ({with_pct} %) | {time} | {nbytes} |")
        return out

    def block_pdl(self):
        if not self.rep.pdl:
            return ["(no PDL section in this run)"]
        by = {}
        for p in self.rep.pdl:
            by.setdefault((p["m"], p["h"]), {})[p["format"]] = p
        out = ["| M × H | no PDL µs per pair | PDL µs per pair | gain |", "|---|---|---|---|"]
        for (m, h), ps in sorted(by.items()):
            ps = [ps[f] for f in FORMATS if f in ps]
            out.append(f"| {m} × {h} | " + " / ".join(f"{p['no_pdl_us']:.2f}" for p in ps) + " | " +
                       " / ".join(f"{p['pdl_us']:.2f}" for p in ps) + " | " + " / ".join(p["gain"] for p in ps) + " |")
        return out

    def big_cells(self):
        """Every (row, dtype) at M·H >= 2^25, row-major: the report's commit's, and other
        runs' where it has none (marked)."""
        return sorted((r for k, r in self.rows.items()
                       if k[0] * k[1] >= BIG and k[4] == "row-major" and not k[5]),
                      key=lambda r: (r["dtype"], r["m"], r["h"], FORMATS.index(r["format"])))

    def below_target(self, r):
        # As shown: a figure counts as met when it reads 94.0 or more at one decimal.
        return round(self.pct(r), 1) < TARGET_PCT

    def block_misses(self):
        """Shapes with a figure under the target: % of copy (and of a copy of the call's own
        size) per dtype, NVFP4 / MXFP4."""
        miss = {(r["m"], r["h"]) for r in self.big_cells() if self.below_target(r)}
        if not miss:
            return [f"(every cell of 2^25 elements or more at {TARGET_PCT:g} % of copy or above)"]
        out = ["| M × H | bf16: % of copy (of own size) | f16: % of copy (of own size) |", "|---|---|---|"]
        for m, h in sorted(miss):
            cells = []
            for dt in ("bf16", "f16"):
                rs = self.pair(m, h, dt)
                if rs is None:
                    cells.append("-")
                    continue
                shown = []
                for r in rs:
                    t = f"{self.pct(r):.1f}"
                    shown.append(f"**{t}**" if self.below_target(r) else t)
                same = [vs_same(r) for r in rs]
                cells.append(" / ".join(shown) + ("" if None in same else " (" + " / ".join(f"{v:.0f}" for v in same) + ")")
                             + self.mark(rs))
            out.append(f"| {m} × {h} | " + " | ".join(cells) + " |")
        return out

    def block_later(self):
        if not self.later:
            return ["(no run on a later commit)"]
        out = ["| M × H | dtype | report µs (% of copy) | other run µs (% of its copy) | commit |",
               "|---|---|---|---|---|"]
        for run in self.later:
            rows = index(run.data)
            for (m, h, dt, lay, yo) in sorted({(k[0], k[1], k[2], k[4], k[5]) for k in rows},
                                              key=lambda k: (k[2], k[0], k[1], k[3], k[4])):
                later = [rows.get((m, h, dt, f, lay, yo)) for f in FORMATS]
                base = [self.own.get((m, h, dt, f, lay, yo)) for f in FORMATS]
                if None in later or None in base:
                    continue  # (in the CSV: rows the report has no twin of)
                fmt = lambda rs, pc: (" / ".join(f"{r['graph_us']:.2f}" for r in rs) + " (" +
                                      " / ".join(f"{pc(r):.1f}" for r in rs) + " %)")
                lay_note = "" if lay == "row-major" else f", {lay}"
                out.append(f"| {m} × {h} | {dt}{lay_note} | {fmt(base, self.pct)} | {fmt(later, run.pct)} | {run.commit} |")
        return out

    def block_targets(self):
        def rng(vals, fmt="{:.2f}"):
            return "-" if not vals else f"{fmt.format(min(vals))}–{fmt.format(max(vals))}"

        out = ["| target | measured | status |", "|---|---|---|"]
        for dt in ("bf16", "f16"):
            cells = [r for r in self.big_cells() if r["dtype"] == dt]
            if cells:
                p = [self.pct(r) for r in cells]
                miss = sum(self.below_target(r) for r in cells)
                marked = sum(r["_run"].commit != self.commit for r in cells)
                self.mark(cells)
                out.append(f"| {dt}, M·H ≥ 2^25, row-major: ≥ {TARGET_PCT:g} % of copy | {rng(p, '{:.1f}')} % "
                           f"({len(cells)} figures{f', {marked} †' if marked else ''}) | "
                           f"{'met' if not miss else f'missed in {miss} of {len(cells)}'} |")
        small = [r for m in (1, 16) for h in HS if h <= 8192 for r in (self.pair(m, h) or [])]
        if small:
            t = [r["graph_us"] for r in small]
            miss = sum(round(v, 2) > 2.0 for v in t)
            out.append(f"| M = 1 … 16, H ≤ 8192: ≤ 2.0 µs | {rng(t)} µs{self.mark(small)} ({len(t)} figures) | "
                       f"{'met' if not miss else f'missed in {miss} of {len(t)}'} |")
        for (m, h, limit) in ((128, 8192, 3.0), (1024, 4096, 8.5)):
            rs = self.pair(m, h)
            if rs:
                t = [r["graph_us"] for r in rs]
                out.append(f"| {m} × {h}: ≤ {limit:.1f} µs | {' / '.join(f'{v:.2f}' for v in t)} µs{self.mark(rs)} | "
                           f"{'met' if round(max(t), 2) <= limit else 'missed'} |")
        s = self.speedups()
        if s:
            miss = sum(round(v, 3) < 1.2 for v in s)
            out.append(f"| ≥ 1.2× the Triton peer at every shape | {min(s):.2f}–{max(s):.2f}× ({len(s)} shapes) | "
                       f"{'met' if not miss else f'missed in {miss} of {len(s)}'} |")
        ex = self.layout_extras()
        for label, sel in (("M ≥ 8192", lambda m: m >= 8192), ("M < 8192", lambda m: m < 8192)):
            v = [e for (m, _, _, _, e) in ex if sel(m)]
            if v:
                within = sum(e <= 3.0 for e in v)
                out.append(f"| swizzled / both within 3 % of row-major, {label} | +{min(v):.1f} … +{max(v):.1f} % | "
                           f"{within} of {len(v)} within |")
        pairs = self.yout_pairs()
        if pairs:
            d = [(r["graph_us"] / b["graph_us"]) / (r["bytes_moved"] / b["bytes_moved"]) for b, r in pairs
                 if b["m"] * b["h"] >= BIG // 2]
            if d:
                out.append(f"| `y_out` costs its bytes, no more: time ratio within 2 % of the byte ratio "
                           f"(M·H ≥ 2^24) | time ratio / byte ratio {min(d):.3f}–{max(d):.3f} | "
                           f"{'met' if max(d) <= 1.02 else 'missed'} |")
        if self.rep.pdl:
            g = [float(p["gain"].rstrip("%")) for p in self.rep.pdl]
            out.append(f"| PDL on a \"previous kernel → fp4norm\" chain | {min(g):.1f}–{max(g):.1f} % per pair | shown |")
        return out

    # -- CSV -------------------------------------------------------------------------

    def csv_rows(self, card, driver, date):
        base = dict(card=card, driver=driver or "", date=date)
        for run in self.all_runs:
            for r in run.data["rows"]:
                yield bench_csv_row(base, run, run.section, r, run.pct(r))
        if self.rep.peer:
            for p in self.rep.peer["rows"]:
                block = 16 if p["fmt"] == "nvfp4" else 32
                yield dict(base, commit=self.commit, section="peers", source="report/peer_bench.json",
                           impl=p["impl"], m=p["M"], h=p["H"], dtype="bf16", format=p["fmt"], layout="row-major",
                           residual=True, y_out=False,
                           bytes_moved=p["M"] * p["H"] * 6 + p["H"] * 2 + p["M"] * p["H"] // 2 + p["M"] * p["H"] // block,
                           eager_us="", graph_us=f"{p['us']:.3f}", graph_gb_per_s=f"{p['gbps']:.1f}",
                           pct_of_copy=f"{p['pct_copy']:.2f}", copy_gb_per_s=f"{self.rep.peer['copy_gbps']:.1f}",
                           pct_of_same_size_copy="", check="", rows_checked="",
                           note="triton_peer.py: do_bench_cudagraph median, its own copy")
        for p in self.rep.pdl:
            for impl, us in (("fp4norm, no PDL", p["no_pdl_us"]), ("fp4norm, PDL", p["pdl_us"])):
                yield dict(base, commit=self.commit, section="pdl", source="report/pdl.log", impl=impl,
                           m=p["m"], h=p["h"], dtype="bf16", format=p["format"], layout="row-major",
                           residual=True, y_out=False, bytes_moved="", eager_us="", graph_us=f"{us:.2f}",
                           graph_gb_per_s="", pct_of_copy="", copy_gb_per_s="", pct_of_same_size_copy="",
                           check="", rows_checked="", note="µs per pair (1 MiB copy -> fp4norm) in a CUDA graph")


def bench_csv_row(base, run, section, r, pct):
    """One `fp4norm bench` row as a CSV line (`base`: card, driver, date); `pct`: its % of
    the run's copy. A CPU row has no graph-replay figures: those columns stay empty."""
    return dict(base, commit=run.commit, section=section, source=run.source, impl="fp4norm",
                m=r["m"], h=r["h"], dtype=r["dtype"], format=r["format"], layout=r["layout"],
                residual=r["residual"], y_out=r["y_out"], bytes_moved=r["bytes_moved"],
                eager_us=f"{r['median_us']:.3f}",
                graph_us="" if r.get("graph_us") is None else f"{r['graph_us']:.3f}",
                graph_gb_per_s="" if r.get("graph_gb_per_s") is None else f"{r['graph_gb_per_s']:.1f}",
                pct_of_copy=f"{pct:.2f}", copy_gb_per_s=f"{run.copy:.1f}",
                pct_of_same_size_copy="" if vs_same(r) is None else f"{vs_same(r):.1f}",
                check=r["check"], rows_checked=r["rows_checked"], note="")


CSV_FIELDS = ["card", "driver", "commit", "date", "section", "source", "impl", "m", "h", "dtype", "format",
              "layout", "residual", "y_out", "bytes_moved", "eager_us", "graph_us", "graph_gb_per_s",
              "pct_of_copy", "copy_gb_per_s", "pct_of_same_size_copy", "check", "rows_checked", "note"]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def cpu_block(run):
    """The FP4 table (a column per FP4 format) and, where the run has FP8 rows, the FP8
    table (a column per FP8 format, in the run's order, each naming its scale layout)."""
    rows = index(run.data)
    out = ["| M × H | dtype | layout | NVFP4 µs (GB/s, % of copy) | MXFP4 µs (GB/s, % of copy) |",
           "|---|---|---|---|---|"]
    for (m, h, dt, lay, yo) in sorted({(k[0], k[1], k[2], k[4], k[5]) for k in rows if k[3] in FORMATS}):
        cells = []
        for f in FORMATS:
            r = rows.get((m, h, dt, f, lay, yo))
            cells.append("-" if r is None else f"{r['median_us']:.0f} ({r['gb_per_s']:.1f}, {100 * r['vs_copy']:.0f} %)")
        out.append(f"| {m} × {h} | {dt} | {lay}{', y_out' if yo else ''} | " + " | ".join(cells) + " |")
    fp8 = []
    for r in run.data["rows"]:
        if r["format"] not in FORMATS and (r["format"], r["layout"]) not in fp8:
            fp8.append((r["format"], r["layout"]))
    if fp8:
        out += ["", "| M × H | dtype | " + " | ".join(f"{f} ({lay}) µs (% of copy)" for f, lay in fp8) + " |",
                "|---|---|" + "---|" * len(fp8)]
        for (m, h, dt, yo) in sorted({(k[0], k[1], k[2], k[5]) for k in rows if k[3] not in FORMATS}):
            cells = []
            for f, lay in fp8:
                r = rows.get((m, h, dt, f, lay, yo))
                cells.append("-" if r is None else f"{r['median_us']:.0f} ({100 * r['vs_copy']:.0f} %)")
            out.append(f"| {m} × {h} | {dt}{', y_out' if yo else ''} | " + " | ".join(cells) + " |")
    return out


def cpu_csv_rows(run, machine, date):
    for r in run.data["rows"]:
        yield dict(card=machine, driver="", date=date, commit=run.commit, section="cpu", source=run.source,
                   impl="fp4norm", m=r["m"], h=r["h"], dtype=r["dtype"], format=r["format"], layout=r["layout"],
                   residual=r["residual"], y_out=r["y_out"], bytes_moved=r["bytes_moved"],
                   eager_us=f"{r['median_us']:.3f}", graph_us="", graph_gb_per_s="",
                   pct_of_copy=f"{100 * r['vs_copy']:.2f}", copy_gb_per_s=f"{run.copy:.1f}",
                   pct_of_same_size_copy="", check=r["check"], rows_checked=r["rows_checked"],
                   note="wall clock, median of the timed calls" + runs_note(run))


def split_commit(arg, default):
    path, _, commit = arg.partition("@")
    return path, commit or default


def update(page_path, blocks):
    text = open(page_path).read()
    for name, lines in blocks.items():
        pat = re.compile(rf"(<!-- BEGIN bench-tables: {re.escape(name)} -->\n).*?(<!-- END bench-tables: {re.escape(name)} -->)",
                         re.S)
        if not pat.search(text):
            print(f"{page_path}: no block named {name}; left out", file=sys.stderr)
            continue
        text = pat.sub(lambda m: m.group(1) + "\n".join(lines) + "\n" + m.group(2), text)
    with open(page_path, "w") as f:
        f.write(text)


def page_mode(a):
    if not a.commit:
        sys.exit("--report needs --commit (the commit the run measured)")
    rep = Report(a.report, a.commit)
    if not a.date:
        a.date = datetime.datetime.fromtimestamp(rep.mtime, datetime.timezone.utc).strftime("%Y-%m-%d")
    if not a.driver:
        gpu_txt = a.gpu_txt or os.path.join(rep.where, "gpu.txt")
        if os.path.exists(gpu_txt):
            lines = open(gpu_txt).read().splitlines()
            if len(lines) > 1:
                a.driver = lines[1].split(",")[1].strip()
    extras = []
    for arg in a.extra:
        path, commit = split_commit(arg, a.commit)
        extras.append(Run(load(path), os.path.basename(path), "extra", commit))
    page = Page(rep, extras, a.commit)
    blocks = {
        "header": None,  # built last: it names the runs of the cells the others marked
        "latency": page.block_latency(),
        "bandwidth-bf16": page.block_bandwidth_bf16(),
        "bandwidth-f16": page.block_bandwidth_f16(),
        "layouts": page.block_layouts(),
        "peers": page.block_peers(),
        "yout": page.block_yout(),
        "pdl": page.block_pdl(),
        "targets": page.block_targets(),
        "misses": page.block_misses(),
        "later": page.block_later(),
    }
    blocks["header"] = page.block_header(a)
    card = page.main.data["device_description"]
    if a.csv:
        write_csv(a.csv, page.csv_rows(card, a.driver, a.date))
    if a.cpu:
        cpu, commit = cpu_run(a)
        blocks["cpu"] = ([f"{a.cpu_machine or cpu.data['device_description']}, commit {commit}, "
                          f"copy {cpu.copy:.1f} GB/s ({cpu.data['clock']}){runs_note(cpu)}", ""] + cpu_block(cpu))
        if a.cpu_csv:
            write_csv(a.cpu_csv, cpu_csv_rows(cpu, a.cpu_machine or cpu.data["device_description"],
                                              a.cpu_date or a.date))
    if a.update:
        update(a.update, blocks)
    else:
        for name, lines in blocks.items():
            print(f"<!-- BEGIN bench-tables: {name} -->\n" + "\n".join(lines) + f"\n<!-- END bench-tables: {name} -->\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", help="report.tgz (or its report/ folder): page mode")
    ap.add_argument("--commit", help="the commit the report run measured")
    ap.add_argument("--date", help="the run's date (default: the files' modification date, UTC)")
    ap.add_argument("--driver", help="NVIDIA driver version (default: gpu.txt next to the report, if any)")
    ap.add_argument("--gpu-txt", help="nvidia-smi CSV of the run (gpu-check.sh writes gpu.txt)")
    ap.add_argument("--cuda", help="CUDA / NVRTC versions of the run")
    ap.add_argument("--csv", help="write every row of the run to this CSV")
    ap.add_argument("--cpu", action="append", help="fp4norm bench --device cpu --json file [@COMMIT]; "
                    "repeated: runs of one command, each cell their median")
    ap.add_argument("--cpu-machine", help="the CPU machine, in words")
    ap.add_argument("--cpu-date", help="the CPU run's date (default: --date)")
    ap.add_argument("--cpu-csv", help="write the CPU run's rows to this CSV")
    ap.add_argument("--layouts-run", help="fp4norm bench --layout row-major,swizzled,both --json file [@COMMIT]: "
                    "the layouts-by-size table alone")
    ap.add_argument("--update", help="the page whose bench-tables blocks are replaced")
    ap.add_argument("--main", help="report mode: the main table run")
    ap.add_argument("--peers")
    ap.add_argument("--layouts")
    ap.add_argument("--yout")
    ap.add_argument("--extra", action="append", default=[])
    ap.add_argument("--fp8", action="append", default=[],
                    help="FP8 mode: an `fp4norm bench --format ...` JSON [@COMMIT], one per run (rounds)")
    ap.add_argument("--fp8-csv", help="FP8 mode: write every row of the runs to this CSV")
    ap.add_argument("--fp8-peers", help="FP8 mode: scripts/fp8-peers.py's JSON, for the Inductor table")
    a = ap.parse_args()
    if a.fp8:
        fp8_mode(a)
    elif a.report:
        page_mode(a)
    elif a.main:
        print(report_md(a))
    elif a.cpu:
        cpu_mode(a)
    elif a.layouts_run:
        layouts_mode(a)
    else:
        ap.error("give --report (page mode), --main (report mode), --cpu (the CPU table alone), "
                 "--layouts-run (the layouts-by-size table alone) or --fp8 (the FP8 tables)")



# FP8 mode: BENCHMARKS.md's FP8 table from `fp4norm bench --format F` runs (SPEC.md §8).

# (format as the CLI names it, label) in the table's order; other formats follow as named.
# An FP4 format's key carries its layout (`nvfp4:swizzled`): FP8 names include theirs.
FP8_LABELS = (
    ("nvfp4:swizzled", "nvfp4 (swizzled)"),
    ("fp8-tensor", "per-tensor"),
    ("fp8-tensor-e5m2", "per-tensor E5M2"),
    ("fp8-token", "per-token"),
    ("fp8-token-e5m2", "per-token E5M2"),
    ("fp8-token-ue8m0-row-major", "per-token UE8M0"),
    ("fp8-g32-f32-row-major", "g32 f32 row-major"),
    ("fp8-group32", "g32 f32 column-major"),
    ("fp8-g64-f32-row-major", "g64 f32 row-major"),
    ("fp8-group64", "g64 f32 column-major"),
    ("fp8-g128-f32-row-major", "g128 f32 row-major"),
    ("fp8-group128", "g128 f32 column-major"),
    ("fp8-g128-ue8m0-row-major", "g128 UE8M0 row-major"),
    ("fp8-g128-ue8m0-column-major", "g128 UE8M0 column-major"),
    ("fp8-g32-ue8m0-row-major", "g32 UE8M0 row-major (MXFP8 row-major)"),
    ("mxfp8", "MXFP8 (g32 UE8M0 swizzled)"),
    ("fp8-g32-ue8m0-column-major-packed", "g32 UE8M0 packed (DeepGEMM)"),
    ("fp8-g128-ue8m0-column-major-packed", "g128 UE8M0 packed (DeepGEMM)"),
)
FP8_TARGET_PCT = 95.0   # % of copy at M·H >= 2^25 (a figure meets it when it reads 95.0 or more)
FP8_DECODE_US = 2.0     # µs at M = 1 and 16, H <= 8192 (met when it reads 2.00 or less)
FP8_PEER_SPEEDUP = 1.3  # times torch.compile (Inductor) of the plain formula, in every cell


def fp8_key(r):
    """A row of the FP8 table: the format's name, and an FP4 format's layout."""
    return r["format"] if r.get("op") == "fp8" else f"{r['format']}:{r['layout']}"


def fp8_family(r):
    """The FP8 family of a bench row (None for FP4 rows), from its scaling fields."""
    if r.get("op") != "fp8":
        return None
    if r.get("scale_format") == "static" or r["format"].startswith("fp8-tensor"):
        return "per-tensor"
    if r.get("group") == r["h"] or "token" in r["format"]:
        return "per-token"
    return {
        "swizzled": "MXFP8",
        "column-major": "column-major groups",
        "column-major-packed": "column-major groups",
    }.get(r["layout"], "row-major groups")


class Fp8Page:
    """The FP8 table from one or more runs of the same formats: a % cell (M·H of 2^22 or
    more) is the best of the runs' % of their own copy, a µs cell the lowest of their
    graph-replay times (bf16, residual add, no y_out)."""

    def __init__(self, runs, commit):
        self.runs, self.commit = runs, commit
        self.cells = {}  # (fp8_key, m, h) -> [row, ...]
        self.first = {}  # fp8_key -> its first row (name, family)
        order = []
        for run in runs:
            for r in run.data["rows"]:
                if r["dtype"] != "bf16" or not r["residual"] or r["y_out"]:
                    continue
                k = fp8_key(r)
                self.cells.setdefault((k, r["m"], r["h"]), []).append(r)
                if k not in order:
                    order.append(k)
                    self.first[k] = r
        known = [f for f, _ in FP8_LABELS]
        self.labels = dict(FP8_LABELS)
        self.formats = [f for f in known if f in order] + [f for f in order if f not in known]
        shapes = sorted({(m, h) for (_, m, h) in self.cells})
        self.big = [s for s in shapes if s[0] * s[1] >= SMALL]
        self.small = [s for s in shapes if s[0] * s[1] < SMALL]

    # Graph-replay figures where the run has them (CUDA), else the timed calls' (CPU).
    @staticmethod
    def _us(r):
        return r["graph_us"] if r.get("graph_us") is not None else r["median_us"]

    @staticmethod
    def _pct(r):
        gbps = r["graph_gb_per_s"] if r.get("graph_gb_per_s") is not None else r["gb_per_s"]
        return 100.0 * gbps / r["_run"].copy

    def pct(self, f, m, h):
        rs = self.cells.get((f, m, h))
        return None if not rs else max(self._pct(r) for r in rs)

    def us(self, f, m, h):
        rs = self.cells.get((f, m, h))
        return None if not rs else min(self._us(r) for r in rs)

    def own(self, f, m, h):
        """Every run's % of a copy of the call's own byte count."""
        return [vs_same(r) for r in self.cells.get((f, m, h), []) if vs_same(r) is not None]

    def block_runs(self):
        # The card by name (the description's part before its details): the section's
        # figures are that card's, whatever card the page's other sections name.
        # The launch floor beside the copy (before / after the rows where the run measured
        # both): decode cells move with it between runs.
        out = ["| run | card | commit | copy GB/s | launch floor µs | rows | byte check |",
               "|---|---|---|---|---|---|---|"]
        for run in self.runs:
            card = run.data.get("device_description", "?").split(" (")[0]
            rows = run.data["rows"]
            checked = sum(r.get("check") != "skipped" for r in rows)
            ok = run.data.get("all_ok", True)
            check = ("MISMATCH: see the JSON" if not ok else "every row matched" if checked == len(rows)
                     else "`--no-check`" if checked == 0 else f"{checked} of {len(rows)} rows, all matched")
            first, last = run.data.get("launch_floor_us"), run.data.get("launch_floor_end_us")
            floor = "-" if first is None else f"{first:.2f}"
            if first is not None and last is not None:
                floor += f" / {last:.2f}"
            out.append(f"| `{run.source}` | {card} | {run.commit} | {run.copy:.1f} | {floor} | {len(rows)} | {check} |")
        return out

    def block_table(self):
        fmt_shape = lambda s: f"{s[0]} × {s[1]}"
        head = ["format"] + [f"{fmt_shape(s)} %" for s in self.big] + [f"{fmt_shape(s)} µs" for s in self.small]
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for f in self.formats:
            r0 = self.first[f]
            label = self.labels.get(f, r0["format"] if fp8_family(r0) else f"{r0['format']} ({r0['layout']})")
            cells = [f"`{r0['format']}` {label}"]
            cells += ["-" if self.pct(f, *s) is None else f"{self.pct(f, *s):.1f}" for s in self.big]
            cells += ["-" if self.us(f, *s) is None else f"{self.us(f, *s):.2f}" for s in self.small]
            out.append("| " + " | ".join(cells) + " |")
        return out

    def targets(self, f):
        """(% figures from 2^25 elements, decode µs figures, status) of format f."""
        pcts = [(s, self.pct(f, *s)) for s in self.big if s[0] * s[1] >= BIG and self.pct(f, *s) is not None]
        decode = [(s, self.us(f, *s)) for s in self.small if s[0] in (1, 16) and s[1] <= 8192
                  and self.us(f, *s) is not None]
        miss = [f"{s[0]} × {s[1]} ({v:.1f} %)" for s, v in pcts if round(v, 1) < FP8_TARGET_PCT]
        miss += [f"{s[0]} × {s[1]} ({v:.2f} µs)" for s, v in decode if round(v, 2) > FP8_DECODE_US]
        status = [f"missed at {', '.join(miss)}"] if miss else []
        status += [f"{what} not measured" for what, vals in (("%", pcts), ("decode", decode)) if not vals]
        return [v for _, v in pcts], [v for _, v in decode], "; ".join(status) or "met"

    def block_targets(self):
        out = ["| format | % of copy from 2^25 elements | decode µs (M = 1, 16; H ≤ 8192) | status |",
               "|---|---|---|---|"]
        rng = lambda vals, f: "-" if not vals else f"{f.format(min(vals))}–{f.format(max(vals))}"
        for f in self.formats:
            if fp8_family(self.first[f]) is None:
                continue  # (an FP4 row is there to compare; its targets are the FP4 op's)
            pcts, decode, status = self.targets(f)
            out.append(f"| `{f}` | {rng(pcts, '{:.1f}')} | {rng(decode, '{:.2f}')} | {status} |")
        return out

    def block_own_size(self):
        by_family = {}
        shape = (4096, 8192)
        for f in self.formats:
            fam = fp8_family(self.first[f])
            if fam is not None:
                by_family.setdefault(fam, []).extend(self.own(f, *shape))
        by_family = {fam: v for fam, v in by_family.items() if v}
        if not by_family:
            return ["(no row of 4096 × 8192 with a same-size copy)"]
        parts = [f"{fam} {min(v):.1f}–{max(v):.1f}" if len(v) > 1 else f"{fam} {v[0]:.1f}"
                 for fam, v in by_family.items()]
        return [f"At {shape[0]} × {shape[1]} against a copy of each call's own byte count (same run; the range "
                f"over the formats and runs), %: " + "; ".join(parts) + "."]

    def block_peers(self, peers):
        """fp4norm against torch.compile (Inductor), from `scripts/fp8-peers.py --json`."""
        if not peers or not peers.get("rows"):
            return ["(no Inductor run)"]
        cols = [("tensor", "per-tensor"), ("token", "per-token"), ("group128", "group 128"), ("mxfp8", "MXFP8")]
        cell = {(r["fmt"], r["M"], r["H"]): r for r in peers["rows"]}
        cols = [c for c in cols if any(k[0] == c[0] for k in cell)]
        out = ["| M × H | " + " | ".join(name for _, name in cols) + " |", "|---|" + "---|" * len(cols)]
        for m, h in sorted({(k[1], k[2]) for k in cell}):
            cells = []
            for fmt, _ in cols:
                r = cell.get((fmt, m, h))
                bold = "**" if r is not None and round(r["speedup"], 2) >= FP8_PEER_SPEEDUP else ""
                cells.append("-" if r is None else
                             f"{r['fp4norm_us']:.2f} / {r['inductor_us']:.2f} ({bold}{r['speedup']:.2f}×{bold})")
            out.append(f"| {m} × {h} | " + " | ".join(cells) + " |")
        s = [r["speedup"] for r in peers["rows"]]
        low = [r for r in peers["rows"] if round(r["speedup"], 2) < FP8_PEER_SPEEDUP]
        out += ["", f"Speed-up {min(s):.2f}–{max(s):.2f}× over {len(s)} cells: "
                    + ("met (≥ 1.3× in every cell)." if not low else
                       "missed at " + ", ".join(f"{r['fmt']} {r['M']} × {r['H']} ({r['speedup']:.2f}×)"
                                                 for r in low) + ".")]
        return out

    def csv_rows(self, driver, date):
        for run in self.runs:
            section = os.path.splitext(run.source)[0]
            base = dict(card=run.data["device_description"], driver=driver or "", date=date)
            for r in run.data["rows"]:
                yield bench_csv_row(base, run, section, r, self._pct(r))


def fp8_mode(a):
    """BENCHMARKS.md's FP8 blocks (and their CSV) from `fp4norm bench --format ...` runs."""
    runs = []
    for arg in a.fp8:
        path, commit = split_commit(arg, a.commit)
        if not commit:
            sys.exit(f"{path}: give its commit (FILE@COMMIT or --commit)")
        with open(path) as f:
            runs.append(Run(json.load(f), os.path.basename(path), "fp8", commit))
    page = Fp8Page(runs, a.commit)
    if not a.driver and a.gpu_txt and os.path.exists(a.gpu_txt):
        lines = open(a.gpu_txt).read().splitlines()
        if len(lines) > 1:
            a.driver = lines[1].split(",")[1].strip()
    # (default: the runs' files' modification date, UTC, as in page mode)
    mtime = max(os.path.getmtime(split_commit(arg, None)[0]) for arg in a.fp8)
    date = a.date or datetime.datetime.fromtimestamp(mtime, datetime.timezone.utc).strftime("%Y-%m-%d")
    blocks = {"fp8-runs": page.block_runs(), "fp8-table": page.block_table(),
              "fp8-targets": page.block_targets(), "fp8-own-size": page.block_own_size()}
    if a.fp8_peers:
        with open(a.fp8_peers) as f:
            blocks["fp8-peers"] = page.block_peers(json.load(f))
    if a.fp8_csv:
        write_csv(a.fp8_csv, page.csv_rows(a.driver, date))
    if a.update:
        update(a.update, blocks)
    else:
        for name, lines in blocks.items():
            print(f"<!-- BEGIN bench-tables: {name} -->\n" + "\n".join(lines) + f"\n<!-- END bench-tables: {name} -->\n")


def median_run(datas):
    """Repeated `bench --device cpu --json` runs of one command as one run: per row the
    median time, GB/s from it, and the median of the runs' own % of copy; the median copy.
    A row is kept when every run has it."""
    med = lambda v: statistics.median(v)
    by_key = [index(d) for d in datas]
    rows = []
    for k, r in by_key[0].items():
        if not all(k in b for b in by_key):
            continue
        us = med([b[k]["median_us"] for b in by_key])
        rows.append(dict(r, median_us=us, gb_per_s=r["bytes_moved"] / us / 1e3,
                         vs_copy=med([b[k]["vs_copy"] for b in by_key]),
                         check="ok" if all(b[k]["check"] == "ok" for b in by_key) else "MISMATCH"))
    copy = dict(datas[0]["copy"], gb_per_s=med([d["copy"]["gb_per_s"] for d in datas]))
    return dict(datas[0], rows=rows, copy=copy, runs=len(datas))


def runs_note(run):
    n = run.data.get("runs")
    return f"; the median of {n} runs, per cell" if n else ""


def cpu_run(a):
    """The CPU table's run: one --cpu file, or the median of several (same command)."""
    paths, commits = zip(*(split_commit(c, a.commit) for c in a.cpu))
    if len(set(commits)) != 1:
        sys.exit("--cpu runs of different commits")
    datas = [load(p, every_op=True) for p in paths]
    data = datas[0] if len(datas) == 1 else median_run(datas)
    name = os.path.basename(paths[0]) if len(paths) == 1 else f"median of {len(paths)} runs"
    return Run(data, name, "cpu", commits[0]), commits[0]


def cpu_mode(a):
    """The CPU table (and CSV) alone, from one `fp4norm bench --device cpu --json` run."""
    cpu, commit = cpu_run(a)
    if not commit:
        sys.exit("--cpu needs a commit: --cpu FILE@COMMIT or --commit")
    date = a.cpu_date or a.date or datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    machine = a.cpu_machine or cpu.data["device_description"]
    blocks = {"cpu": [f"{machine}, commit {commit}, copy {cpu.copy:.1f} GB/s ({cpu.data['clock']}){runs_note(cpu)}", ""]
              + cpu_block(cpu)}
    if a.cpu_csv:
        write_csv(a.cpu_csv, cpu_csv_rows(cpu, machine, date))
    if a.update:
        update(a.update, blocks)
    else:
        print("\n".join(blocks["cpu"]))


def layouts_block(run, commit):
    """Every M x H of one bench run by layout: % of the same-run copy, NVFP4 / MXFP4, and the
    swizzled and both layouts' time against row-major's."""
    rows = index(run)
    out = [f"{run['device_description']}, commit {commit}, copy {run['copy']['gb_per_s']:.1f} GB/s (same run). "
           "Cells NVFP4 / MXFP4: % of copy; in brackets the time against row-major's.", "",
           "| M × H | dtype | row-major | swizzled | both |", "|---|---|---|---|---|"]
    for m, h, dt in sorted({(k[0], k[1], k[2]) for k in rows}):
        rm = [rows.get((m, h, dt, f, "row-major", False)) for f in FORMATS]

        def cell(lay):
            rs = [rows.get((m, h, dt, f, lay, False)) for f in FORMATS]
            if None in rs:
                return "-"
            text = " / ".join(f"{pct(run, r):.1f}" for r in rs)
            if lay != "row-major" and None not in rm:
                text += " (" + " / ".join(f"{100 * (r['graph_us'] / b['graph_us'] - 1):+.1f} %" for r, b in zip(rs, rm)) + ")"
            return text

        out.append(f"| {m} × {h} | {dt} | {cell('row-major')} | {cell('swizzled')} | {cell('both')} |")
    checks = {r["check"] for r in run["rows"]}
    out += ["", "Every row checked against the reference: " + ("yes" if checks == {"ok"} else f"no ({sorted(checks)})")]
    return out


def layouts_mode(a):
    path, commit = split_commit(a.layouts_run, a.commit)
    if not commit:
        sys.exit("--layouts-run needs a commit: --layouts-run FILE@COMMIT or --commit")
    blocks = {"layouts-by-size": layouts_block(load(path), commit)}
    if a.update:
        update(a.update, blocks)
    else:
        print("\n".join(blocks["layouts-by-size"]))


if __name__ == "__main__":
    main()
