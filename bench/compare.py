#!/usr/bin/env python3
"""Puts kiln's benchmark next to its PyTorch and libtorch baselines.

What it is for
    Reads the JSON files written by bench/kiln_bench (kiln eager),
    bench/torch_baseline.py and bench/libtorch_baseline.cc, and prints one
    table per workload: device_us / host_us / wall_us, metric and peak memory
    of kiln and of each baseline row, with the ratios kiln time / baseline
    time for device and host time (< 1 means kiln is faster). The baselines'
    extra rows (torch.compile, libtorch + CUDA graph, SDPA) are shown under
    the workload they belong to, for reference. Missing values print as "-".

How to run
    python3 bench/compare.py kiln.json torch.json [libtorch.json]
    python3 bench/compare.py kiln.json torch.json libtorch.json --markdown bench.md

    --markdown PATH writes the same as one Markdown table, headed by the GPU
    and date of each file, ready to paste into docs/BENCHMARKS.md.
"""

import argparse
import json
import sys

# Baseline rows named <workload>_<suffix> are variants of <workload>.
VARIANTS = {"compiled": "compiled", "compiledgraph": "compiled + CUDA graph",
            "cudagraph": "CUDA graph", "sdpa": "SDPA"}
SOURCE_LABEL = {"kiln": "kiln", "pytorch": "PyTorch", "libtorch": "libtorch"}
COLUMNS = ["impl", "device_us", "host_us", "wall_us", "metric", "peak_mib", "kernels",
           "dev ratio", "host ratio"]


def load(path):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc.get("results"), dict):
        raise ValueError(f"{path}: no 'results' object")
    return doc


def split_key(key, known):
    """(workload, variant label or None) for a result key."""
    base, _, suffix = key.rpartition("_")
    if base and suffix in VARIANTS and base in known:
        return base, VARIANTS[suffix]
    return key, None


def num(v, spec):
    return "-" if v is None else format(v, spec)


def ratio(kiln_v, base_v):
    if kiln_v is None or not base_v:
        return "-"
    return f"{kiln_v / base_v:.2f}"


def metric(row):
    if row.get("tbps") is not None:
        return f"{row['tbps']:.3f} TB/s"
    if row.get("tflops") is not None:
        return f"{row['tflops']:.2f} TFLOP/s"
    return "-"


def cells(label, row, kiln_row, own=False):
    """One table line: label, times, metric, peak, kernels, ratios against kiln eager (none on
    kiln's own rows)."""
    if row is None:
        return [label] + ["-"] * (len(COLUMNS) - 1)
    if "error" in row:
        lines = (row["error"] or "").splitlines()
        first = lines[0][:80] if lines else ""
        return [label, f"error: {first}"] + [""] * (len(COLUMNS) - 2)
    is_kiln = own or row is kiln_row
    k = kiln_row if kiln_row is not None and "error" not in kiln_row else {}
    return [
        label,
        num(row.get("device_us"), ".2f"),
        num(row.get("host_us"), ".2f"),
        num(row.get("wall_us"), ".2f"),
        metric(row),
        num(row.get("peak_mib"), ".1f"),
        num(row.get("kernels"), "d"),
        "" if is_kiln else ratio(k.get("device_us"), row.get("device_us")),
        "" if is_kiln else ratio(k.get("host_us"), row.get("host_us")),
    ]


def build_groups(docs):
    """[(workload, [line cells, ...])] in kiln's order, then the baselines' extra workloads."""
    known = []
    for doc in docs:
        for key in doc["results"]:
            base, variant = split_key(key, set(known) | set(doc["results"]))
            if variant is None and base not in known:
                known.append(base)
    kiln = docs[0]["results"]
    groups = []
    for workload in known:
        kiln_row = kiln.get(workload)
        lines = [cells("kiln eager", kiln_row, kiln_row)]
        for doc in docs[1:]:
            label = SOURCE_LABEL.get(doc.get("source"), doc.get("source", "?"))
            lines.append(cells(f"{label} eager", doc["results"].get(workload), kiln_row))
        for doc in docs:
            label = SOURCE_LABEL.get(doc.get("source"), doc.get("source", "?"))
            for key, row in doc["results"].items():
                base, variant = split_key(key, set(known))
                if variant is not None and base == workload:
                    ref = "" if doc is docs[0] else " (ref)"
                    lines.append(cells(f"{label} {variant}{ref}", row, kiln_row,
                                       own=doc is docs[0]))
        groups.append((workload, lines))
    return groups


def best_rows(doc, workload, known):
    """The rows of one file for a workload (eager and its variants), without errors."""
    rows = []
    for key, row in doc["results"].items():
        base, variant = split_key(key, known)
        if base == workload and "error" not in row and variant != "SDPA":
            rows.append((variant or "eager", row))
    return rows


def headline(docs):
    """Per workload: kiln's best mode against PyTorch's (and libtorch's) best, by wall time and
    by device time. SDPA rows are left out: they are another algorithm, not the same graph."""
    known = set()
    for doc in docs:
        for key in doc["results"]:
            known.add(split_key(key, set(doc["results"]))[0])
    out = []
    for workload in [w for w, _ in build_groups(docs)]:
        line = [workload]
        best = []
        for doc in docs:
            rows = best_rows(doc, workload, known)
            pick = {}
            for metric in ("wall_us", "device_us"):
                cand = [(r[metric], mode) for mode, r in rows if r.get(metric) is not None]
                pick[metric] = min(cand) if cand else (None, "-")
            best.append(pick)
        k = best[0]
        for i, doc in enumerate(docs):
            label = SOURCE_LABEL.get(doc.get("source"), doc.get("source", "?"))
            wall, mode = best[i]["wall_us"]
            line.append(f"{label}: {num(wall, '.1f')} ({mode})")
        for i in range(1, len(docs)):
            line.append(ratio(k["wall_us"][0], best[i]["wall_us"][0]))
            line.append(ratio(k["device_us"][0], best[i]["device_us"][0]))
        out.append(line)
    return out


def headline_markdown(docs):
    labels = [SOURCE_LABEL.get(d.get("source"), d.get("source", "?")) for d in docs]
    head = ["workload"] + [f"best {l} wall µs (mode)" for l in labels]
    for l in labels[1:]:
        head += [f"wall ratio vs {l}", f"device ratio vs {l}"]
    out = ["## Best mode against best mode", "",
           "Each implementation's fastest mode (eager, compiled, CUDA graph; SDPA excluded) by "
           "wall time per step; ratios are kiln's best time / the baseline's best time (below 1: "
           "kiln is faster), by wall time and by device time.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for line in headline(docs):
        out.append("| " + " | ".join([f"`{line[0]}`"] + line[1:]) + " |")
    return "\n".join(out) + "\n\n"


def print_text(groups, docs):
    for doc in docs:
        label = SOURCE_LABEL.get(doc.get("source"), doc.get("source", "?"))
        print(f"{label:<9} {doc.get('gpu', '-')}, {doc.get('date', '-')}"
              f"{', quick run' if doc.get('quick') else ''}")
    gpus = {doc.get("gpu") for doc in docs}
    if len(gpus) > 1:
        print(f"warning: the files come from different GPUs: {', '.join(map(str, gpus))}")
    print("dev ratio / host ratio: kiln time / that row's time (< 1: kiln is faster)")
    widths = [26, 11, 10, 11, 16, 9, 8, 9, 10]
    for workload, lines in groups:
        print(f"\n{workload}")
        head = "  " + " ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                               for i, (c, w) in enumerate(zip(COLUMNS, widths)))
        print(head)
        print("  " + "-" * (len(head) - 2))
        for line in lines:
            if line[1].startswith("error:"):
                print(f"  {line[0]:<{widths[0]}} {line[1]}")
                continue
            print(("  " + " ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}"
                                   for i, (c, w) in enumerate(zip(line, widths)))).rstrip())


def markdown(groups, docs):
    out = ["## Every row", ""]
    for doc in docs:
        label = SOURCE_LABEL.get(doc.get("source"), doc.get("source", "?"))
        extra = []
        if doc.get("torch_version"):
            extra.append(f"torch {doc['torch_version']}")
        if doc.get("cuda_version"):
            extra.append(f"CUDA {doc['cuda_version']}")
        if doc.get("quick"):
            extra.append("quick run")
        out.append(f"- **{label}**: {doc.get('gpu', '-')}, {doc.get('date', '-')}"
                   f"{' (' + ', '.join(extra) + ')' if extra else ''}")
    gpus = {doc.get("gpu") for doc in docs}
    if len(gpus) > 1:
        out.append(f"- **warning**: the files come from different GPUs: {', '.join(map(str, gpus))}")
    out += ["",
            "Times in µs (medians). *dev ratio* and *host ratio* are kiln's time divided by that "
            "row's time: below 1 kiln is faster. Rows marked (ref) are not eager; they show "
            "what compiling or CUDA graphs reach.",
            "",
            "| workload | " + " | ".join(COLUMNS) + " |",
            "|---|---|" + "---:|" * (len(COLUMNS) - 1)]
    for workload, lines in groups:
        for i, line in enumerate(lines):
            name = f"`{workload}`" if i == 0 else ""
            body = [c.replace("|", "\\|") for c in line]
            out.append(f"| {name} | " + " | ".join(body) + " |")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description="compare kiln's benchmark with its baselines")
    ap.add_argument("kiln", help="JSON written by kiln_bench --json")
    ap.add_argument("torch", help="JSON written by torch_baseline.py --json")
    ap.add_argument("libtorch", nargs="?", help="JSON written by libtorch_baseline --json")
    ap.add_argument("--markdown", metavar="PATH", help="also write a Markdown table to PATH")
    args = ap.parse_args()

    docs = []
    for path in (args.kiln, args.torch, args.libtorch):
        if path is None:
            continue
        try:
            docs.append(load(path))
        except (OSError, ValueError) as e:
            print(f"compare.py: cannot read {path}: {e}", file=sys.stderr)
            return 2
    groups = build_groups(docs)
    print_text(groups, docs)
    print("\nbest mode against best mode (wall ratio, device ratio: kiln / baseline)")
    for line in headline(docs):
        print("  " + "  ".join(line))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(headline_markdown(docs) + markdown(groups, docs))
        print(f"\nwrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
