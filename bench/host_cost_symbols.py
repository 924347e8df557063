#!/usr/bin/env python3
"""Self and inclusive host time per function from bench/host_cost's --samples file.

Frames in the host_cost executable are named with addr2line on the unstripped binary (the
bundle's copy is stripped; build-gpu/bench/host_cost has the same addresses); frames in shared libraries (libcuda, libc) are named by their module.

    bench/host_cost_symbols.py SAMPLES build-gpu/bench/host_cost [--top 40]
"""
import argparse
import collections
import subprocess


def symbolize(binary, offsets):
    """offset -> the function that holds it (the symbol table's; Release builds carry no inline
    information, so an inlined callee counts as its caller)."""
    offsets = sorted(offsets)
    if not offsets:
        return {}
    out = subprocess.run(["addr2line", "-f", "-C", "-e", binary] + ["0x%x" % o for o in offsets],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return {o: out[2 * i] for i, o in enumerate(offsets)}


def short(name, width=110):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("binary")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    exe = args.binary.rsplit("/", 1)[-1]
    stacks = []
    with open(args.samples) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            frames = []
            for fr in line.strip().split("|"):
                module, off = fr.rsplit(" ", 1)
                frames.append((module, int(off, 16)))
            stacks.append(frames)
    # A return address points after the call: look up the call instruction (offset - 1), except
    # for the leaf, which is the interrupted instruction itself.
    wanted = set()
    for frames in stacks:
        for i, (module, off) in enumerate(frames):
            if module == exe:
                wanted.add(off if i == 0 else off - 1)
    names = symbolize(args.binary, wanted)
    self_t, incl_t = collections.Counter(), collections.Counter()
    for frames in stacks:
        chain = []
        for i, (module, off) in enumerate(frames):
            if module == exe:
                chain.append(names.get(off if i == 0 else off - 1, "??"))
            else:
                chain.append("[" + module + "]")
        if not chain:
            continue
        self_t[chain[0]] += 1
        for fn in set(chain):
            incl_t[fn] += 1
    n = len(stacks)
    print("%d samples" % n)
    for title, counter in (("self", self_t), ("inclusive", incl_t)):
        print("\n%s time (%% of samples):" % title)
        for fn, c in counter.most_common(args.top):
            print("  %5.1f%%  %s" % (100.0 * c / n, short(fn)))


if __name__ == "__main__":
    main()
