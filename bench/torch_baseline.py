#!/usr/bin/env python3
"""PyTorch baselines for the kiln benchmark.

What it is for
    Times the same workloads as kiln's own benchmark, in eager PyTorch (and
    torch.compile where a row says so), so kiln's numbers have a reference
    measured the same way on the same GPU. The C++ (libtorch) twin of this
    file is bench/libtorch_baseline.cc.

How to run (on the GPU machine; needs torch with CUDA)
    PYTHONUNBUFFERED=1 python3 bench/torch_baseline.py --json /tmp/torch_baseline.json
    python3 bench/torch_baseline.py --quick              # fewer repetitions
    python3 bench/torch_baseline.py --only mlp,mlp_1tok  # a subset of rows
    python3 bench/torch_baseline.py --no-compile         # skip torch.compile rows

Method (the same in the libtorch twin)
    * Everything runs under torch.inference_mode(); TF32 matmul is off.
    * Inputs are torch.randn with a fixed seed per input set (never zeros).
      When one input set is smaller than the L2 cache, the step rotates over
      nsets = clamp(ceil(1.5 * L2 / set_bytes), 2, 8) sets, so that
      consecutive steps do not find their inputs in L2; otherwise nsets = 1.
    * warm-up: >= 10 steps (compilation happens there).
    * host_us: wall time (time.perf_counter) of the call that enqueues one
      step, taken after a synchronize and without synchronizing inside the
      timed region; median over reps. For the tiny ops (tiny_add*), the
      median over reps of (1000 back-to-back calls, then synchronize) / 1000.
    * wall_us: median of (synchronize; t0; one step; synchronize; t1).
    * device_us: median of per-step CUDA-event time, the events recorded
      around each single step. Unless --no-prequeue is given, each chunk of
      steps is preceded by a short GPU spin kernel (torch.cuda._sleep) so the
      host enqueues the chunk while the GPU is busy: the events then measure
      the GPU's own time per step even for host-bound rows (tiny ops,
      1-token MLP) instead of the host's launch rate.
    * peak_mib: torch.cuda.max_memory_allocated() after
      reset_peak_memory_stats(), over one step with one input set alive (its
      inputs, its output, and whatever the process already holds, e.g. cuBLAS
      workspaces); peak_extra_mib is the same minus memory_allocated() just
      before the step.
    * TB/s counts each input read once and each output written once;
      TFLOP/s counts 2*M*N*K per matrix product.

JSON written by --json PATH:
    {"source": "pytorch", "torch_version": str, "gpu": str, "date": ISO-8601,
     "cuda_version": str, "method": {...}, "quick": bool,
     "results": {key: {"device_us", "host_us", "wall_us",
                       "tbps" | "tflops" (rows that have a metric),
                       "peak_mib", "peak_extra_mib", "nsets", "reps",
                       "error" (only when the row failed)}}}
    Missing values are null.
"""

import argparse
import datetime
import gc
import importlib
import json
import math
import statistics
import sys
import time
import traceback

import torch
import torch.nn.functional as F

MIB = float(1 << 20)
CYCLES_PER_US = 2000.0  # spin-kernel cycles per microsecond (H200 boosts to ~1.98 GHz)


def log(*args):
    print(*args, flush=True)


# ---------------------------------------------------------------------------
# Workload definitions. Each build(seed) returns one input set (a tuple of
# tensors); each fn(*set) runs one step and returns its output.
# ---------------------------------------------------------------------------

DEV = "cuda"
BF16 = torch.bfloat16


def randn(*shape, dtype=BF16):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def seeded(seed, make):
    torch.manual_seed(1234 + seed)
    return make()


# tiny_add ------------------------------------------------------------------
def build_tiny(seed):
    return seeded(seed, lambda: (randn(16, dtype=torch.float32), randn(16, dtype=torch.float32)))


def build_tiny_out(seed):
    return seeded(seed, lambda: (randn(16, dtype=torch.float32), randn(16, dtype=torch.float32),
                                 randn(16, dtype=torch.float32)))


def fn_tiny_add(a, b):
    return a + b


def fn_tiny_add_out(a, b, c):
    return torch.add(a, b, out=c)


# elementwise ---------------------------------------------------------------
EW_SHAPE = (8192, 12288)


def build_elementwise(seed):
    return seeded(seed, lambda: (randn(*EW_SHAPE), randn(*EW_SHAPE)))


def fn_elementwise(x, u):
    return F.gelu(x * 1.5 + 0.5, approximate="tanh") * u


EW_BYTES = 3 * EW_SHAPE[0] * EW_SHAPE[1] * 2  # read x, u; write out (bf16)

# softmax -------------------------------------------------------------------
SM_SHAPE = (131072, 1024)


def build_softmax(seed):
    return seeded(seed, lambda: (randn(*SM_SHAPE),))


def fn_softmax(x):
    return torch.softmax(x, dim=-1)


SM_BYTES = 2 * SM_SHAPE[0] * SM_SHAPE[1] * 2

# linear --------------------------------------------------------------------
LIN_M, LIN_N, LIN_K = 8192, 3072, 768


def build_linear(seed):
    return seeded(seed, lambda: (randn(LIN_M, LIN_K), randn(LIN_N, LIN_K), randn(LIN_N)))


def fn_linear(x, w, b):
    return F.linear(x, w, b)


LIN_FLOPS = 2.0 * LIN_M * LIN_N * LIN_K

# mlp (GeGLU) ---------------------------------------------------------------
D_MODEL, D_FF = 768, 3072


def make_build_mlp(tokens):
    def build(seed):
        return seeded(seed, lambda: (randn(tokens, D_MODEL), randn(D_FF, D_MODEL),
                                     randn(D_FF, D_MODEL), randn(D_MODEL, D_FF)))
    return build


def fn_mlp(x, wg, wu, wd):
    gate = x @ wg.t()
    up = x @ wu.t()
    h = F.gelu(gate, approximate="tanh") * up
    return h @ wd.t()


def mlp_flops(tokens):
    return 2.0 * tokens * D_MODEL * D_FF * 3


# attention -----------------------------------------------------------------
ATT_B, ATT_H, ATT_S, ATT_D = 8, 16, 1024, 64
ATT_SCALE = 1.0 / math.sqrt(ATT_D)


def build_attention(seed):
    def make():
        q = randn(ATT_B, ATT_H, ATT_S, ATT_D)
        k = randn(ATT_B, ATT_H, ATT_S, ATT_D)
        v = randn(ATT_B, ATT_H, ATT_S, ATT_D)
        mask = torch.triu(torch.ones(ATT_S, ATT_S, dtype=torch.bool, device=DEV), diagonal=1)
        return (q, k, v, mask)
    return seeded(seed, make)


def fn_attention(q, k, v, mask):
    s = q @ k.transpose(-2, -1) * ATT_SCALE
    s = s.masked_fill(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p @ v


def fn_attention_inplace(q, k, v, mask):
    s = q @ k.transpose(-2, -1) * ATT_SCALE
    s.masked_fill_(mask, float("-inf"))
    p = torch.softmax(s, dim=-1)
    return p @ v


def fn_attention_sdpa(q, k, v, mask):
    # mask is unused: is_causal=True applies the same causal mask.
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Workload:
    def __init__(self, key, build, fn, metric=None, amount=None, tiny=False, compiled=False):
        self.key = key
        self.build = build
        self.fn = fn
        self.metric = metric  # "tbps" | "tflops" | None
        self.amount = amount  # bytes for tbps, flops for tflops
        self.tiny = tiny
        self.compiled = compiled


WORKLOADS = [
    Workload("tiny_add", build_tiny, fn_tiny_add, tiny=True),
    Workload("tiny_add_out", build_tiny_out, fn_tiny_add_out, tiny=True),
    Workload("elementwise", build_elementwise, fn_elementwise, "tbps", EW_BYTES),
    Workload("elementwise_compiled", build_elementwise, fn_elementwise, "tbps", EW_BYTES,
             compiled=True),
    Workload("softmax", build_softmax, fn_softmax, "tbps", SM_BYTES),
    Workload("linear", build_linear, fn_linear, "tflops", LIN_FLOPS),
    Workload("mlp", make_build_mlp(8192), fn_mlp, "tflops", mlp_flops(8192)),
    Workload("mlp_compiled", make_build_mlp(8192), fn_mlp, "tflops", mlp_flops(8192),
             compiled=True),
    Workload("mlp_1tok", make_build_mlp(1), fn_mlp, "tflops", mlp_flops(1)),
    Workload("mlp_1tok_compiled", make_build_mlp(1), fn_mlp, "tflops", mlp_flops(1),
             compiled=True),
    Workload("attention", build_attention, fn_attention),
    Workload("attention_inplace", build_attention, fn_attention_inplace),
    Workload("attention_sdpa", build_attention, fn_attention_sdpa),
    Workload("attention_compiled", build_attention, fn_attention, compiled=True),
]


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------

class Config:
    def __init__(self, quick, prequeue):
        self.quick = quick
        self.prequeue = prequeue
        self.warmup = 10 if quick else 20
        self.reps = 50 if quick else 200          # device and host/wall samples
        self.tiny_loop_reps = 10 if quick else 30  # samples of the 1000-call loop
        self.tiny_loop_n = 1000
        self.chunk = 50                            # steps enqueued behind one spin kernel


def sync():
    torch.cuda.synchronize()


def median(xs):
    return statistics.median(xs) if xs else None


def free_memory():
    gc.collect()
    sync()
    torch.cuda.empty_cache()


def dynamo_reset():
    """Drop torch.compile's caches, so each compiled row compiles afresh."""
    importlib.import_module("torch._dynamo").reset()


def set_bytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def choose_nsets(nbytes, l2_bytes):
    if nbytes >= l2_bytes:
        return 1
    return max(2, min(8, math.ceil(1.5 * l2_bytes / max(nbytes, 1))))


def spin(us):
    """Enqueue a GPU busy-wait of about `us` microseconds on the current stream."""
    cycles = int(min(max(us, 20.0), 100000.0) * CYCLES_PER_US)
    torch.cuda._sleep(cycles)


def time_host_and_wall(step, n, reps):
    """Per-call host enqueue time and wall time of one step, in microseconds."""
    host, wall = [], []
    for r in range(reps):
        sync()
        t0 = time.perf_counter()
        out = step(r % n)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        del out
        host.append((t1 - t0) * 1e6)
        wall.append((t2 - t0) * 1e6)
    return median(host), median(wall)


def time_host_loop(step, n, reps, inner):
    """(inner back-to-back calls, then synchronize) / inner, median over reps."""
    samples = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for i in range(inner):
            step(i % n)
        sync()
        samples.append((time.perf_counter() - t0) * 1e6 / inner)
    return median(samples)


def time_device(step, n, reps, cfg, host_us_est):
    """Median CUDA-event time of single steps, in microseconds."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    sync()
    for c0 in range(0, reps, cfg.chunk):
        c1 = min(reps, c0 + cfg.chunk)
        if cfg.prequeue:
            # long enough for the host to enqueue the whole chunk (events included)
            spin(2.0 * (c1 - c0) * (host_us_est + 10.0))
        for i in range(c0, c1):
            starts[i].record()
            step(i % n)
            ends[i].record()
    sync()
    return median([s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)])


def measure(w, cfg, l2_bytes):
    row = {"device_us": None, "host_us": None, "wall_us": None}
    if w.metric:
        row[w.metric] = None
    row.update({"peak_mib": None, "peak_extra_mib": None, "nsets": None, "reps": cfg.reps})

    free_memory()
    fn = w.fn
    if w.compiled:
        dynamo_reset()
        fn = torch.compile(w.fn, dynamic=False)

    sets = [w.build(0)]
    n = choose_nsets(set_bytes(sets[0]), l2_bytes)
    sets += [w.build(i) for i in range(1, n)]
    row["nsets"] = n

    def step(i):
        return fn(*sets[i])

    # warm-up (torch.compile compiles on the first call)
    t0 = time.perf_counter()
    for i in range(cfg.warmup):
        out = step(i % n)
    del out
    sync()
    if w.compiled:
        log(f"  [{w.key}] compile + warm-up took {time.perf_counter() - t0:.1f} s")

    gc.collect()
    gc.disable()
    try:
        host_us, wall_us = time_host_and_wall(step, n, cfg.reps)
        if w.tiny:
            host_us = time_host_loop(step, n, cfg.tiny_loop_reps, cfg.tiny_loop_n)
        device_us = time_device(step, n, cfg.reps, cfg, host_us)
    finally:
        gc.enable()

    row["device_us"], row["host_us"], row["wall_us"] = device_us, host_us, wall_us
    if w.metric == "tbps":
        row["tbps"] = w.amount / (device_us * 1e-6) / 1e12
    elif w.metric == "tflops":
        row["tflops"] = w.amount / (device_us * 1e-6) / 1e12

    # peak memory of one step with one input set alive
    del sets[1:]
    gc.collect()
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*sets[0])
    sync()
    peak = torch.cuda.max_memory_allocated()
    del out
    row["peak_mib"] = peak / MIB
    row["peak_extra_mib"] = (peak - base) / MIB

    del sets
    if w.compiled:
        del fn
        dynamo_reset()
    free_memory()
    return row


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def print_table(results):
    head = f"{'workload':<22} {'device_us':>11} {'host_us':>10} {'wall_us':>11} {'metric':>16} {'peak_mib':>10}"
    log("")
    log(head)
    log("-" * len(head))
    for key, r in results.items():
        if "error" in r:
            log(f"{key:<22} ERROR: {r['error'].splitlines()[0][:100] if r['error'] else ''}")
            continue
        if r.get("tbps") is not None:
            metric = f"{r['tbps']:.3f} TB/s"
        elif r.get("tflops") is not None:
            metric = f"{r['tflops']:.3f} TFLOP/s"
        else:
            metric = "-"
        log(f"{key:<22} {fmt(r['device_us'], '11.2f')} {fmt(r['host_us'], '10.2f')} "
            f"{fmt(r['wall_us'], '11.2f')} {metric:>16} {fmt(r['peak_mib'], '10.1f')}")


def main():
    ap = argparse.ArgumentParser(description="PyTorch baselines for the kiln benchmark")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON to PATH")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", metavar="KEYS", help="comma-separated workload keys to run")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--no-prequeue", action="store_true",
                    help="do not put a GPU spin kernel ahead of the device-timing loop")
    args = ap.parse_args()

    if not torch.cuda.is_available():
        log("error: CUDA is not available to this torch")
        return 2

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    cfg = Config(args.quick, not args.no_prequeue)
    if cfg.prequeue and not hasattr(torch.cuda, "_sleep"):
        log("warning: torch.cuda._sleep missing; measuring without pre-queue")
        cfg.prequeue = False

    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or 60 * (1 << 20)
    gpu = torch.cuda.get_device_name(0)
    log(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {gpu}, L2 {l2_bytes / MIB:.0f} MiB, "
        f"{'quick' if cfg.quick else 'full'} run, prequeue={'on' if cfg.prequeue else 'off'}")

    selected = WORKLOADS
    if args.only:
        keys = [k.strip() for k in args.only.split(",") if k.strip()]
        unknown = [k for k in keys if k not in {w.key for w in WORKLOADS}]
        if unknown:
            log(f"error: unknown workload(s): {', '.join(unknown)}")
            return 2
        selected = [w for w in WORKLOADS if w.key in keys]
    if args.no_compile:
        selected = [w for w in selected if not w.compiled]

    results = {}
    with torch.inference_mode():
        for w in selected:
            log(f"running {w.key} ...")
            try:
                results[w.key] = measure(w, cfg, l2_bytes)
            except Exception as e:  # a failed row (compile error, OOM) must not end the run
                msg = f"{type(e).__name__}: {e}"
                log(f"  [{w.key}] FAILED: {msg.splitlines()[0][:300]}")
                traceback.print_exc(file=sys.stdout)
                sys.stdout.flush()
                row = {"device_us": None, "host_us": None, "wall_us": None}
                if w.metric:
                    row[w.metric] = None
                row.update({"peak_mib": None, "peak_extra_mib": None, "nsets": None,
                            "reps": cfg.reps, "error": msg[:4000]})
                results[w.key] = row
                if w.compiled:
                    try:
                        dynamo_reset()
                    except Exception:
                        pass
                try:
                    free_memory()
                except Exception:
                    pass
            r = results[w.key]
            if "error" not in r:
                log(f"  device {r['device_us']:.2f} us, host {r['host_us']:.2f} us, "
                    f"wall {r['wall_us']:.2f} us, peak {r['peak_mib']:.1f} MiB, nsets {r['nsets']}")

    print_table(results)

    if args.json:
        doc = {
            "source": "pytorch",
            "torch_version": torch.__version__,
            "gpu": gpu,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "cuda_version": torch.version.cuda,
            "quick": cfg.quick,
            "method": {
                "device_us": "median per-step CUDA event time"
                             + (", GPU pre-queued behind a spin kernel" if cfg.prequeue else ""),
                "host_us": "median per-call enqueue time; tiny ops: (1000 calls + sync) / 1000",
                "wall_us": "median of sync; t0; step; sync; t1",
                "prequeue": cfg.prequeue,
                "warmup": cfg.warmup,
                "reps": cfg.reps,
                "inference_mode": True,
                "allow_tf32": False,
                "l2_bytes": l2_bytes,
            },
            "results": results,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
