#!/usr/bin/env python3
"""Puts kiln's benchmark beside PyTorch and libtorch, and ranks only what passed its check.

What it is for
    Reads the JSON of bench/kiln_bench, bench/torch_baseline.py and bench/libtorch_baseline.cc
    (one row per "<workload>/<mode>", each figure a list over interleaved repetitions) and
    writes:
    * the headline: per workload and per figure (device time, latency of one step,
      throughput), kiln's best mode against PyTorch's best mode (the minimum over every
      PyTorch row: eager, CUDA graph, torch.compile, frozen, SDPA and its backends) and
      against libtorch's best, with the mode behind each number and the ratio kiln / other
      (below 1: kiln is faster);
    * every row: median over repetitions with the spread (min-max), host time, measured
      kernels per step (memsets apart) beside the plan's own count for kiln's compiled rows,
      the GEMM kernels each row ran, and its correctness check;
    * the GPU's clocks, power and temperature over the run (gpu-run's gpu_state.csv).

    The correctness gate: a kiln row is ranked only when torch_baseline.py checked its output
    against PyTorch's on the same inputs and it passed (bf16 relative L2 < 2e-2, fp32 < 1e-5);
    a failed or missing check is marked and the row is left out of "best". A PyTorch or
    libtorch row whose own check against its eager row failed is left out too. A workload with
    no ranked kiln row gets no ratio.

How to run
    python3 bench/compare.py kiln.json torch.json [libtorch.json] [--gpu-state gpu_state.csv]
        [--markdown bench.md]
"""

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

SIDES = {"kiln": "kiln", "pytorch": "PyTorch", "libtorch": "libtorch"}
FIGURES = [("device_us", "device µs"), ("latency_us", "latency µs"),
           ("throughput_us", "throughput µs")]
MODES = ("Modes: kiln `compiled` folds weights as constants (and merges GEMMs sharing an input), "
         "`compiled_winputs` takes them as inputs (no folding, no merge), `+graph` replays a CUDA "
         "graph; PyTorch `compiled` is torch.compile with weights as arguments, `frozen` "
         "torch.compile of an nn.Module with inductor freezing, `sdpa*` "
         "F.scaled_dot_product_attention (default pick or one backend), `+graph` a "
         "torch.cuda.CUDAGraph captured by the script (not mode=\"reduce-overhead\").")


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc.get("results"), dict):
        raise ValueError(f"{path}: no 'results' object")
    return doc


def side_of(doc):
    return doc.get("source", "?")


def rows_of(doc):
    """[(workload, mode, row)] in file order (workload/mode from the row, else from its key)."""
    out = []
    for key, row in doc["results"].items():
        workload, _, mode = key.partition("/")
        out.append((row.get("workload", workload), row.get("mode", mode or "eager"), row))
    return out


def check_of(side, workload, mode, row, kiln_checks):
    """(status, rel_l2): status "ok", "FAIL", "missing" (kiln rows without a check), "ref" (a
    baseline's eager row, the reference of its own checks) or "-" (a baseline row not checked)."""
    if side == "kiln":
        c = kiln_checks.get(f"{workload}/{mode}")
        if c is None:
            return "missing", None
        return ("ok" if c.get("ok") else "FAIL"), c.get("rel_l2")
    c = row.get("check")
    if c is None:
        return ("ref" if mode == "eager" else "-"), None
    return ("ok" if c.get("ok") else "FAIL"), c.get("rel_l2")


def rankable(side, status, row):
    if "error" in row:
        return False
    if side == "kiln":
        return status == "ok"
    return status != "FAIL"


class Entry:
    """One row of one side, with its check and its figures summarised."""

    def __init__(self, side, workload, mode, row, kiln_checks):
        self.side, self.workload, self.mode, self.row = side, workload, mode, row
        self.status, self.rel_l2 = check_of(side, workload, mode, row, kiln_checks)
        self.ranked = rankable(side, self.status, row)
        self.fig = {k: bench_common.summary(row.get(k)) for k, _ in FIGURES + [("host_us", "")]}


def collect(docs):
    """{workload: [Entry]} in order of first appearance (kiln's order first)."""
    kiln_checks = {}
    for doc in docs:
        kiln_checks.update(doc.get("checks") or {})
    by_workload = {}
    for doc in docs:
        side = side_of(doc)
        for workload, mode, row in rows_of(doc):
            by_workload.setdefault(workload, []).append(
                Entry(side, workload, mode, row, kiln_checks))
    return by_workload


def best(entries, side, figure):
    """(median, mode) of the side's fastest ranked row by `figure`, or (None, None)."""
    cand = [(e.fig[figure][0], e.mode) for e in entries
            if e.side == side and e.ranked and e.fig[figure][0] is not None]
    return min(cand) if cand else (None, None)


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}"


def num(v, spec=".1f"):
    return "-" if v is None else format(v, spec)


def spread(s):
    med, lo, hi = s
    if med is None:
        return "-"
    if lo == hi:
        return num(med, ".2f")
    return f"{med:.2f} [{lo:.2f}–{hi:.2f}]"


def check_cell(e):
    if e.rel_l2 is None:
        return e.status
    return f"{e.status} {e.rel_l2:.1e}"


def kiln_gate(entries):
    """Why a workload is not ranked, or "" when some kiln row passed its check."""
    kiln = [e for e in entries if e.side == "kiln"]
    if not kiln:
        return "no kiln row"
    if any(e.ranked for e in kiln):
        return ""
    statuses = sorted({e.status for e in kiln if "error" not in e.row})
    return "not ranked: kiln check " + ("/".join(statuses) if statuses else "errors")


# What addresses kiln's gap on each workload (the published claims name it where kiln is behind).
ISSUES = [
    ("attention", "#30, a Hopper flash kernel (wgmma/TMA, as cuDNN's): kiln's is mma.sync, "
     "sm_80's instructions"),
    ("block_", "#30 (a Hopper flash kernel for its attention) and #29 (a Hopper GEMM with the "
     "gelu·mul epilogue)"),
    ("decode_", "#28, fewer and fuller kernels per decode step (the norms are in the GEMVs now)"),
    ("mlp_1tok", "#28, a GEMV with the gelu·mul fused, for M = 1"),
    ("mlp", "#29, a GEMM with the gelu·mul epilogue (and #27, its unfused rows kernel)"),
    ("elementwise", "#27, the generated kernel's memory throughput"),
    ("softmax", "#27, the row kernel's memory throughput"),
    ("linear", "the GEMM itself (cuBLASLt on both sides; #29 for kiln's own)"),
    ("tiny_add", "#27, the launch of one tiny kernel; host cost is the dispatcher's"),
]
PAR = 0.03  # within ±3 %: on par


def issue_for(workload):
    for prefix, issue in ISSUES:
        if workload == prefix or (prefix.endswith("_") and workload.startswith(prefix)):
            return issue
    return "no issue named yet"


def standings(by_workload, other="pytorch"):
    """One sentence per workload: where kiln's best stands against the other side's best, by
    device time and by latency, naming the issue that addresses a gap."""
    out = []
    for workload, entries in by_workload.items():
        if not any(e.side == other for e in entries):
            continue
        gate = kiln_gate(entries)
        if gate:
            out.append(f"- `{workload}`: {gate}; no claim.")
            continue
        parts, behind = [], False
        for fig, label in FIGURES[:2]:
            k, kmode = best(entries, "kiln", fig)
            o, omode = best(entries, other, fig)
            if k is None or o is None:
                continue
            r = k / o
            word = "on par" if abs(r - 1) <= PAR else ("faster" if r < 1 else "behind")
            behind = behind or word == "behind"
            parts.append(f"{label.split()[0]} {word} ({r:.2f}×: kiln {kmode} {k:.1f} µs, "
                         f"{SIDES[other]} {omode} {o:.1f} µs)")
        if parts:
            tail = f"; addressed by {issue_for(workload)}" if behind else ""
            out.append(f"- `{workload}`: " + "; ".join(parts) + tail + ".")
    return out


def headline(by_workload, other):
    """Rows of [workload, gate, then per figure: kiln (mode), other (mode), ratio]."""
    out = []
    for workload, entries in by_workload.items():
        if not any(e.side == other for e in entries):
            continue
        gate = kiln_gate(entries)
        line = [workload, gate or "ok"]
        for fig, _ in FIGURES:
            k, kmode = best(entries, "kiln", fig)
            o, omode = best(entries, other, fig)
            line += [f"{num(k)} ({kmode})" if k is not None else "-",
                     f"{num(o)} ({omode})" if o is not None else "-",
                     "-" if gate else ratio(k, o)]
        out.append(line)
    return out


def gemm_cell(e):
    names = bench_common.gemm_kernels(e.row.get("kernel_names"))
    return ", ".join(n[:60] for n in names[:3]) + (" …" if len(names) > 3 else "")


def kernels_cell(e):
    r = e.row
    if r.get("kernels") is None:
        return "-" if not r.get("kernels_error") else "n/a"
    cell = f"{r['kernels']:g}"
    if r.get("memsets"):
        cell += f" +{r['memsets']:g} memset"
    if r.get("plan_kernels") is not None:
        plan = r["plan_kernels"] + (r.get("plan_memsets") or 0)
        measured = r["kernels"] + (r.get("memsets") or 0)
        cell += f" (plan {r['plan_kernels']}" + ("" if plan == measured else " ≠") + ")"
    return cell


def every_row(by_workload):
    out = []
    for workload, entries in by_workload.items():
        for e in entries:
            if "error" in e.row:
                first = (e.row["error"] or "").splitlines()[0][:100] if e.row["error"] else ""
                out.append([workload, SIDES.get(e.side, e.side), e.mode, "error", first] +
                           [""] * 6)
                continue
            out.append([workload, SIDES.get(e.side, e.side), e.mode,
                        check_cell(e) + ("" if e.ranked else " (not ranked)"),
                        spread(e.fig["device_us"]), spread(e.fig["latency_us"]),
                        spread(e.fig["throughput_us"]), num(e.fig["host_us"][0], ".2f"),
                        kernels_cell(e), metric_cell(e), gemm_cell(e)])
    return out


def metric_cell(e):
    r, dev = e.row, e.fig["device_us"][0]
    if not r.get("metric") or not r.get("amount") or not dev:
        return "-"
    value = r["amount"] / (dev * 1e-6) / 1e12
    return f"{value:.2f} {'TB/s' if r['metric'] == 'tbps' else 'TFLOP/s'}"


def read_gpu_state(path):
    """Summary lines of gpu-run's gpu_state.csv (clocks, power, pstate, temperature) over the
    samples taken around the repetitions (not the idle ones at the start and end)."""
    if not path or not os.path.exists(path):
        return []
    values = {"clocks.sm": [], "clocks.mem": [], "power.draw": [], "temperature.gpu": []}
    pstates, n = set(), 0
    with open(path, encoding="utf-8") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader, [])]
        for rec in reader:
            cells = dict(zip(header, (c.strip() for c in rec)))
            if " rep " not in f" {cells.get('label', '')} ":
                continue
            n += 1
            for k in values:
                try:
                    values[k].append(float(cells.get(k, "").split()[0]))
                except (ValueError, IndexError):
                    pass
            if cells.get("pstate"):
                pstates.add(cells["pstate"])
    if n == 0:
        return []

    def rng(k, unit):
        v = values[k]
        return f"{min(v):g}–{max(v):g} {unit}" if v else "n/a"
    return [f"{n} samples (before and after each side's repetition): SM clock "
            f"{rng('clocks.sm', 'MHz')}, memory clock {rng('clocks.mem', 'MHz')}, power "
            f"{rng('power.draw', 'W')}, pstate {', '.join(sorted(pstates)) or 'n/a'}, "
            f"temperature {rng('temperature.gpu', '°C')}"]


def md_table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return out


def describe_docs(docs):
    lines = []
    for doc in docs:
        extra = [x for x in (f"torch {doc['torch_version']}" if doc.get("torch_version") else "",
                             f"CUDA {doc.get('cuda_version')}" if doc.get("cuda_version") else "",
                             f"{doc.get('repetitions', '?')} repetitions",
                             "quick" if doc.get("quick") else "") if x]
        lines.append(f"- **{SIDES.get(side_of(doc), side_of(doc))}**: {doc.get('gpu', '-')}, "
                     f"{doc.get('date', '-')} ({', '.join(extra)})")
    gpus = {doc.get("gpu") for doc in docs}
    if len(gpus) > 1:
        lines.append(f"- **warning**: the files come from different GPUs: "
                     f"{', '.join(map(str, gpus))}")
    return lines


def markdown(docs, by_workload, gpu_lines):
    head_fig = []
    for _, label in FIGURES:
        head_fig += [f"kiln {label} (mode)", "{other} (mode)", "ratio"]
    out = ["## Best mode against best mode", ""] + describe_docs(docs) + [""]
    if gpu_lines:
        out += ["GPU state: " + gpu_lines[0], ""]
    out += ["Medians over the interleaved repetitions. For each figure, each side's fastest row "
            "among those that passed their correctness check; *ratio* = kiln / other (below 1: "
            "kiln is faster). PyTorch's best is the minimum over all its modes, SDPA and "
            "torch.compile with freezing included. *check*: whether any kiln row of the "
            "workload passed the gate (kiln's output against PyTorch's on the same inputs).", "",
            MODES, ""]
    for other in ("pytorch", "libtorch"):
        rows = headline(by_workload, other)
        if not rows:
            continue
        out += [f"### kiln against {SIDES[other]}", ""]
        head = ["workload", "check"] + [h.replace("{other}", SIDES[other]) for h in head_fig]
        out += md_table(head, rows) + [""]
    stand = standings(by_workload)
    if stand:
        out += ["### Where kiln stands against PyTorch's best", "",
                "Generated from the table above (ratio kiln / PyTorch, within ±3 % counted as on "
                "par); where kiln is behind, the work that addresses it.", ""] + stand + [""]
    out += ["## Every row", "",
            "Median [min–max] over repetitions, µs. *kernels*: launches per step measured with "
            "CUPTI (kiln's profiler, torch.profiler, Kineto), memsets apart; for kiln's compiled "
            "rows the plan's own count follows (≠ when it disagrees). *check*: relative L2 error "
            "against PyTorch eager on the same inputs (kiln rows: kiln's inputs; baseline rows: "
            "their eager row); rows marked not ranked are left out of the headline.", ""]
    head = ["workload", "side", "mode", "check", "device µs", "latency µs", "throughput µs",
            "host µs", "kernels", "metric", "GEMM kernels"]
    out += md_table(head, every_row(by_workload)) + [""]
    return "\n".join(out)


def print_text(docs, by_workload, gpu_lines):
    for line in describe_docs(docs) + gpu_lines:
        print(line)
    for other in ("pytorch", "libtorch"):
        rows = headline(by_workload, other)
        if not rows:
            continue
        print(f"\nkiln against {SIDES[other]} (best ranked mode each; ratio kiln / other)")
        for r in rows:
            figs = "; ".join(f"{label}: {r[2 + 3 * i]} vs {r[3 + 3 * i]} = {r[4 + 3 * i]}"
                             for i, (_, label) in enumerate(FIGURES))
            print(f"  {r[0]:<20} [{r[1]}] {figs}")
    print("\nevery row (median [min–max] µs)")
    for r in every_row(by_workload):
        print("  " + " | ".join(str(c) for c in r))


def main():
    ap = argparse.ArgumentParser(description="compare kiln's benchmark with its baselines")
    ap.add_argument("kiln", help="JSON written by kiln_bench --json")
    ap.add_argument("torch", help="JSON written by torch_baseline.py --json")
    ap.add_argument("libtorch", nargs="?", help="JSON written by libtorch_baseline --json")
    ap.add_argument("--gpu-state", metavar="CSV", help="gpu-run's gpu_state.csv")
    ap.add_argument("--markdown", metavar="PATH", help="also write Markdown tables to PATH")
    args = ap.parse_args()

    docs = []
    for path in (args.kiln, args.torch, args.libtorch):
        if path is None:
            continue
        try:
            docs.append(load(path))
        except (OSError, ValueError) as e:
            print(f"compare.py: cannot read {path}: {e}", file=sys.stderr)
            if path != args.kiln:
                continue
            return 2
    by_workload = collect(docs)
    gpu_lines = read_gpu_state(args.gpu_state)
    print_text(docs, by_workload, gpu_lines)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(docs, by_workload, gpu_lines))
        print(f"\nwrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
