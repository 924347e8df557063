#!/usr/bin/env python3
"""Compares the generated ids of 06_llama runs with different settings (gpu-run's llamaab part).

    ids_compare.py WORK BATCH plain SIDE [SIDE ...]

reads WORK/llamaab_b{BATCH}_{tag}.json (tag: the side's text with every character that is not a
letter or digit as '_'), the ids of the 'graph' mode, and prints one check line per side against
the first: OK, or MISMATCH with (row, first differing step) pairs. Exit status 1 on a mismatch.
"""
import json
import re
import sys


def load(work, batch, side):
    tag = re.sub("[^A-Za-z0-9]", "_", side)
    with open(f"{work}/llamaab_b{batch}_{tag}.json") as f:
        return json.load(f)["modes"]["graph"]


def first_differences(ids, base):
    """(row, first step that differs) for each row whose ids differ; a length change counts."""
    out = []
    for row, (a, b) in enumerate(zip(ids, base)):
        if a != b:
            step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            out.append((row, step))
    if len(ids) != len(base):
        out.append(("rows", f"{len(ids)} vs {len(base)}"))
    return out


def main():
    work, batch, sides = sys.argv[1], sys.argv[2], sys.argv[3:]
    base, ok = load(work, batch, sides[0]), True
    for side in sides[1:]:
        try:
            bad = first_differences(load(work, batch, side), base)
        except (OSError, KeyError, ValueError) as e:
            bad = [("unreadable", str(e))]
        ok &= not bad
        verdict = "OK" if not bad else f"MISMATCH (row, step): {bad[:4]}"
        print(f"check: batch {batch} ids of '{side}' vs {sides[0]} {verdict}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
