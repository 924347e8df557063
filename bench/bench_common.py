"""Pure-Python pieces of the kiln benchmark, shared by torch_baseline.py, compare.py and the tests.

What it is for
    Nothing here imports torch or numpy, so the tests run on any machine with python3:
    * the correctness-file format kiln_bench writes (--check-dir) and torch_baseline.py reads,
    * the tolerance of the correctness gate and the relative L2 error, and the numerics policy's
      bound for half-precision logits,
    * kernel counts from a Chrome trace (torch.profiler's export), the PyTorch side of the
      kernel count,
    * the summary of per-repetition values (median and spread).

Correctness files (written by bench/bench_harness.cc CheckWriter)
    DIR/<workload>/manifest.txt, one line per tensor:
        input <index> <name> <dtype> <dims> <file>
        output <mode> <index> <dtype> <dims> <file>
    dtype: bfloat16 | float16 | float32 | bool; dims: comma-separated sizes ("-" for a scalar);
    each file holds the tensor's elements in C order, little-endian (bfloat16 as its 16 bits,
    bool as one byte each). Inputs are the activations then the weights, in the order of the
    workload's step function (the same on every side).

Usage
    from bench_common import read_manifest, rel_l2, tolerance
    inputs, outputs = read_manifest("/tmp/kiln-check/mlp")
"""

import math
import os
import statistics
import struct

# The correctness gate: relative L2 error of kiln's output against PyTorch's on the same inputs.
TOLERANCE = {"bfloat16": 2e-2, "float16": 2e-2, "float32": 1e-5, "bool": 0.0}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "bool": 1}


class TensorFile:
    """One manifest line: where a tensor's bytes are and what they mean."""

    def __init__(self, kind, key, index, name, dtype, shape, path):
        self.kind = kind  # "input" | "output"
        self.key = key  # inputs: the index; outputs: the mode
        self.index = index
        self.name = name
        self.dtype = dtype
        self.shape = shape
        self.path = path

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def nbytes(self):
        return self.numel() * DTYPE_BYTES[self.dtype]


def _dims(text):
    return [] if text == "-" else [int(d) for d in text.split(",")]


def read_manifest(folder):
    """(inputs: [TensorFile] by index, outputs: {mode: [TensorFile] by index}) of one workload.

    Raises ValueError on a malformed line or an unknown dtype."""
    inputs, outputs = [], {}
    with open(os.path.join(folder, "manifest.txt"), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6 or parts[0] not in ("input", "output"):
                raise ValueError(f"{folder}/manifest.txt:{number}: bad line {line.strip()!r}")
            kind, key, index, dtype, dims, file = parts
            if kind == "input":
                key, name = int(key), index
                index = key
            else:
                index, name = int(index), key
            if dtype not in DTYPE_BYTES:
                raise ValueError(f"{folder}/manifest.txt:{number}: unknown dtype {dtype}")
            t = TensorFile(kind, key, index, name, dtype, _dims(dims), os.path.join(folder, file))
            if kind == "input":
                inputs.append(t)
            else:
                outputs.setdefault(key, []).append(t)
    inputs.sort(key=lambda t: t.index)
    for files in outputs.values():
        files.sort(key=lambda t: t.index)
    return inputs, outputs


def check_workloads(check_dir):
    """Workload folders of a check directory that have a manifest."""
    if not check_dir or not os.path.isdir(check_dir):
        return []
    return sorted(d for d in os.listdir(check_dir)
                  if os.path.isfile(os.path.join(check_dir, d, "manifest.txt")))


def decode(data, dtype):
    """The values of a tensor file as Python floats (slow: for tests and small tensors)."""
    if dtype == "bfloat16":
        n = len(data) // 2
        bits = struct.unpack(f"<{n}H", data)
        return [struct.unpack("<f", struct.pack("<I", b << 16))[0] for b in bits]
    if dtype == "float16":
        return list(struct.unpack(f"<{len(data) // 2}e", data))
    if dtype == "float32":
        return list(struct.unpack(f"<{len(data) // 4}f", data))
    if dtype == "bool":
        return [float(b != 0) for b in data]
    raise ValueError(f"unknown dtype {dtype}")


def tolerance(dtype):
    return TOLERANCE.get(dtype, 2e-2)


def policy_bound(torch_error, reference_rms):
    """The numerics policy for half-precision logits against a float32 reference: kiln's
    root-mean-square error may be at most twice PyTorch's in the same dtype plus 8e-3 of the
    reference's root mean square (llama_twin.py, llama_decode.py)."""
    return 2 * torch_error + 8e-3 * reference_rms


def rel_l2(got, want):
    """||got - want|| / ||want|| over two equal-length sequences of floats (inf when either has a
    NaN or inf, or the lengths differ; the absolute error when want is all zeros)."""
    if len(got) != len(want):
        return math.inf
    num = den = 0.0
    for g, w in zip(got, want):
        if not (math.isfinite(g) and math.isfinite(w)):
            return math.inf
        num += (g - w) ** 2
        den += w * w
    return math.sqrt(num) / math.sqrt(den) if den > 0 else math.sqrt(num)


def check_entry(errors, dtype, error=None):
    """The JSON record of one correctness check: the worst output's relative L2 error."""
    if error is not None:
        return {"ok": False, "rel_l2": None, "tol": tolerance(dtype), "dtype": dtype,
                "error": str(error)[:500]}
    worst = max(errors) if errors else math.inf
    finite = math.isfinite(worst)
    return {"ok": finite and worst < tolerance(dtype), "rel_l2": worst if finite else None,
            "tol": tolerance(dtype), "dtype": dtype}


def kernel_counts(trace_events, steps):
    """Kernels, memsets and memcpys per step, and launches per step by kernel name, from the
    traceEvents of a Chrome trace (torch.profiler's export_chrome_trace) of `steps` steps."""
    kernels = memsets = memcpys = 0
    names = {}
    for e in trace_events:
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        if cat == "kernel":
            kernels += 1
            name = str(e.get("name", "?"))[:300]
            names[name] = names.get(name, 0) + 1
        elif cat == "gpu_memset":
            memsets += 1
        elif cat == "gpu_memcpy":
            memcpys += 1
    return {"kernels": kernels / steps, "memsets": memsets / steps, "memcpys": memcpys / steps,
            "kernel_names": {k: v / steps for k, v in sorted(names.items())}}


def summary(values):
    """(median, min, max) of the numbers in `values` (a list over repetitions, or one number;
    None entries skipped), or (None, None, None)."""
    if values is None:
        return None, None, None
    if isinstance(values, (int, float)):
        values = [values]
    xs = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not xs:
        return None, None, None
    return statistics.median(xs), min(xs), max(xs)


GEMM_MARKERS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "triton_tem", "_mm_")


def gemm_kernels(kernel_names):
    """The names of a row's kernel_names that look like GEMM kernels (cuBLAS/cuBLASLt, CUTLASS,
    Triton mm templates), for the report of which GEMM each side ran."""
    return sorted(n for n in (kernel_names or {}) if any(m in n.lower() for m in GEMM_MARKERS))
