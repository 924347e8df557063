#!/usr/bin/env python3
"""A before/after pair of kiln_bench runs (scripts/gpu-run's `pair` part), as one table.

  pair_compare.py DIR          DIR holds before1.json after1.json before2.json ...: per row, the
                               mean device µs of each side, after / before, and the range of host
                               µs over the rounds of each side (markdown)
  pair_compare.py --ncu FILE   ncu --csv output (gpu__time_duration.sum) on FILE or - (stdin):
                               per kernel name, launches and median device µs
"""
import csv
import glob
import json
import os
import re
import statistics
import sys


def load(directory, side):
    runs = []
    for path in sorted(glob.glob(os.path.join(directory, side + "*.json"))):
        if re.fullmatch(side + r"\d+\.json", os.path.basename(path)):
            with open(path) as f:
                runs.append(json.load(f)["results"])
    return runs


def values(runs, row, field):
    """One value per round: the field, or the median of its repetitions when it holds a list."""
    out = []
    for r in runs:
        v = r.get(row, {}).get(field)
        if isinstance(v, list):
            v = statistics.median(v) if v else None
        if v is not None:
            out.append(v)
    return out


def pair_table(directory):
    before, after = load(directory, "before"), load(directory, "after")
    if not before or not after:
        print(f"pair_compare: no beforeN.json / afterN.json in {directory}")
        return 1
    print(f"{len(before)} rounds before, {len(after)} after; device µs: mean over the rounds of "
          "each round's median (spread: min-max of the round medians); host µs: min-max")
    print("| row | device before | device after | after / before | spread before | spread after "
          "| host before | host after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in before[0]:
        db, da = values(before, row, "device_us"), values(after, row, "device_us")
        hb, ha = values(before, row, "host_us"), values(after, row, "host_us")
        if not db or not da:
            print(f"| {row} | {'-' if not db else f'{statistics.mean(db):.2f}'} | "
                  f"{'-' if not da else f'{statistics.mean(da):.2f}'} | - | | | | |")
            continue
        mb, ma = statistics.mean(db), statistics.mean(da)
        host = lambda h: f"{min(h):.2f}-{max(h):.2f}" if h else "-"
        print(f"| {row} | {mb:.2f} | {ma:.2f} | {ma / mb:.3f} | {host(db)} | {host(da)} "
              f"| {host(hb)} | {host(ha)} |")
    return 0


def ncu_table(stream):
    # ncu's CSV starts after its own "==PROF==" lines; keep the lines from the header on.
    lines = [l for l in stream if not l.startswith("==")]
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("  (no ncu rows)")
        return 1
    times = {}
    for rec in csv.DictReader(lines[start:]):
        if rec.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(rec["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                 "msecond": 1e3}.get(rec.get("Metric Unit"), 1.0)
        times.setdefault(rec["Kernel Name"][:90], []).append(value * scale)
    for name, t in times.items():
        print(f"  {len(t):3d} x {statistics.median(t):9.2f} us  {name}")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "--ncu":
        return ncu_table(sys.stdin if argv[2] == "-" else open(argv[2]))
    if len(argv) == 2:
        return pair_table(argv[1])
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
