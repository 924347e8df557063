#!/usr/bin/env python3
"""PyTorch side of the kiln benchmark: PyTorch at its strongest, and kiln's correctness gate.

What it is for
    Times the workloads of bench/kiln_bench.cc (same keys, shapes and method) in every mode a
    performance-minded PyTorch user would try, so that "best PyTorch" is the minimum over all of
    them; and checks kiln's outputs against PyTorch's on kiln's own inputs before anything is
    ranked (bench/compare.py ranks only rows that pass). The C++ (libtorch) twin is
    bench/libtorch_baseline.cc.

How to run (on the GPU machine; torch with CUDA)
    python3 bench/torch_baseline.py --json torch.json [--check-dir /tmp/kiln-check]
    python3 bench/torch_baseline.py --quick --only mlp,block_2x256_d512/frozen+graph
    python3 bench/torch_baseline.py --no-compile          # no torch.compile rows
    python3 bench/torch_baseline.py --list                # the workload/mode keys
    (scripts/gpu-run runs it with --sync-dir, in turns with kiln_bench and libtorch_baseline.)

Modes (each a row "<workload>/<mode>"; every mode on the same input set, built once)
    eager                 the step's torch ops (attention also eager_inplace: masked_fill_;
                          tiny_add also out: torch.add(out=))
    eager+graph           eager captured once in a torch.cuda.CUDAGraph and replayed
    compiled              torch.compile(fn, dynamic=False), weights as arguments
    compiled+graph        that compiled function captured in a torch.cuda.CUDAGraph (our own
                          capture, not mode="reduce-overhead": one compile serves both rows)
    frozen                an nn.Module holding the weights as parameters, torch.compile'd with
                          torch._inductor.config.freezing = True (weights become constants,
                          like kiln's folded "compiled" rows); workloads with weights only
    frozen+graph          that frozen compiled module captured in a CUDA graph
    sdpa, sdpa+graph      attention through F.scaled_dot_product_attention (default backend
                          pick), eager and captured (attention, block_*, decode_*)
    sdpa_cudnn, sdpa_flash, sdpa_efficient
                          SDPA forced to one backend with torch.nn.attention.sdpa_kernel
    sdpa_frozen(+graph)   the block / decode step with SDPA, compiled with freezing (+ graph)

Method (the same in bench_harness.h and libtorch_baseline.cc)
    * torch.inference_mode() for every step; TF32 off; inputs torch.randn (seed 1234), weights
      randn / sqrt(fan_in) for the block (raw randn for linear and the MLP, as kiln).
    * Set-up per row: warm-up (compiles, captures), a check of the row's output against the
      eager row on the same inputs, the kernel count (torch.profiler, CUDA activity, of N
      steps / N, parsed from its Chrome trace: kernels, memsets, memcpys and kernel names;
      CUPTI is started once before any capture so graph replays are traced node by node), the
      MiB allocated by one step (torch.cuda.max_memory_allocated; not for graph rows).
    * Then --reps repetitions over every row, each with the figures (bench_harness.h):
      device_us (CUDA events around single steps, steps queued behind torch.cuda._sleep),
      latency_us (sync; t0; step; sync; t1), throughput_us (N back-to-back steps / N),
      host_us; before every sample a kernel reads a 256 MiB buffer so L2 holds nothing of
      the inputs.
    * --check-dir DIR (kiln_bench's correctness files, bench_common.py): for each workload
      there, PyTorch's eager step runs on kiln's inputs and every kiln mode's outputs are
      compared with it (relative L2; bf16 < 2e-2, fp32 < 1e-5), recorded under "checks".

JSON (--json PATH; rewritten after every repetition)
    {"source": "pytorch", "torch_version", "gpu", "date", "cuda_version", "quick",
     "repetitions", "method": {...}, "results": {"<workload>/<mode>": {"workload", "mode",
     "metric", "amount", "device_us": [per repetition], "latency_us": [...],
     "throughput_us": [...], "host_us": [...], "kernels", "memsets", "memcpys",
     "kernel_names": {name: per step}, "kernels_error", "check": {"ok", "rel_l2", "tol"},
     "peak_extra_mib", "setup_s", "error"}},
     "checks": {"<workload>/<kiln mode>": {"ok", "rel_l2", "tol", "dtype", "error"}}}
"""

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402  (pure Python, next to this file)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

MIB = float(1 << 20)
CYCLES_PER_US = 2000.0  # spin-kernel cycles per microsecond (H200 boosts to ~1.98 GHz)
DEV = "cuda"
BF16 = torch.bfloat16
HEAD_DIM = 64
KV_LENGTH = 1024


def log(*args):
    print(*args, flush=True)


# ---------------------------------------------------------------------------
# Workloads: build() -> (acts, weights), lists of tensors in kiln's order; fn(*acts, *weights)
# returns a tensor or a tuple of tensors.
# ---------------------------------------------------------------------------

def randn(*shape, dtype=BF16):
    return torch.randn(*shape, device=DEV, dtype=dtype)


def weight(out_f, in_f):
    return randn(out_f, in_f) * (1.0 / math.sqrt(in_f))


def causal_mask(t):
    return torch.triu(torch.ones(t, t, dtype=torch.bool, device=DEV), diagonal=1)


def geglu(x, gate, up, down):
    return F.linear(F.gelu(F.linear(x, gate), approximate="tanh") * F.linear(x, up), down)


def naive_attention(q, k, v, mask, inplace=False):
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if inplace:
        s.masked_fill_(mask, float("-inf"))
    else:
        s = s.masked_fill(mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def sdpa_attention(q, k, v, mask):  # the mask is unused: is_causal applies the same one
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def block_weights(d):
    """ln1.weight, ln1.bias, wq, wk, wv, wo, rms.weight, w_gate, w_up, w_down (kiln's order)."""
    w = [1.0 + randn(d) * 0.1, randn(d) * 0.1]
    w += [weight(d, d) for _ in range(4)]
    w += [1.0 + randn(d) * 0.1, weight(4 * d, d), weight(4 * d, d), weight(d, 4 * d)]
    return w


def split_heads(y, b, t):
    return y.view(b, t, y.shape[-1] // HEAD_DIM, HEAD_DIM).transpose(1, 2)


def merge_heads(o, b, t):
    return o.transpose(1, 2).reshape(b, t, o.shape[1] * HEAD_DIM)


def mlp_half(h, w):
    return h + geglu(F.rms_norm(h, (h.shape[-1],), w[6], eps=1e-6), w[7], w[8], w[9])


def make_block_fn(attend):
    def block(x, mask, *w):
        b, t, d = x.shape
        a = F.layer_norm(x, (d,), w[0], w[1], eps=1e-5)
        o = attend(split_heads(F.linear(a, w[2]), b, t), split_heads(F.linear(a, w[3]), b, t),
                   split_heads(F.linear(a, w[4]), b, t), mask)
        return mlp_half(x + F.linear(merge_heads(o, b, t), w[5]), w)
    return block


def make_decode_fn(use_sdpa):
    def decode(x, k_cache, v_cache, *w):
        d = x.shape[-1]
        a = F.layer_norm(x, (d,), w[0], w[1], eps=1e-5)
        q = split_heads(F.linear(a, w[2]), 1, 1)
        k_new, v_new = F.linear(a, w[3]), F.linear(a, w[4])
        if use_sdpa:
            o = F.scaled_dot_product_attention(q, k_cache, v_cache)
        else:
            s = q @ k_cache.transpose(-2, -1) * (1.0 / math.sqrt(HEAD_DIM))
            o = torch.softmax(s, dim=-1) @ v_cache
        return mlp_half(x + F.linear(merge_heads(o, 1, 1), w[5]), w), k_new, v_new
    return decode


class Workload:
    def __init__(self, key, build, fn, metric=None, amount=0.0, sdpa_fn=None, extras=(),
                 weights=False):
        self.key = key
        self.build = build  # () -> (acts, weights)
        self.fn = fn
        self.metric = metric  # "tbps" | "tflops" | None
        self.amount = amount  # bytes for tbps, flops for tflops
        self.sdpa_fn = sdpa_fn
        self.extras = list(extras)  # (mode, factory(acts, weights) -> fn(*args))
        self.weights = weights  # has weights: frozen modes


def acts_only(*shapes, dtype=BF16):
    return lambda: ([randn(*s, dtype=dtype) for s in shapes], [])


def build_mlp(tokens):
    return lambda: ([randn(tokens, 768)], [randn(3072, 768), randn(3072, 768), randn(768, 3072)])


def build_attention():
    return [randn(8, 16, 1024, 64) for _ in range(3)] + [causal_mask(1024)], []


def block_workload(b, t, d):
    def build():
        return [randn(b, t, d), causal_mask(t)], block_weights(d)
    flops = 2.0 * b * t * 16.0 * d * d + 4.0 * b * t * t * d
    return Workload(f"block_{b}x{t}_d{d}", build, make_block_fn(naive_attention), "tflops",
                    flops, sdpa_fn=make_block_fn(sdpa_attention), weights=True)


def decode_workload(d):
    def build():
        h = d // HEAD_DIM
        return ([randn(1, 1, d), randn(1, h, KV_LENGTH, HEAD_DIM),
                 randn(1, h, KV_LENGTH, HEAD_DIM)], block_weights(d))
    return Workload(f"decode_d{d}", build, make_decode_fn(False), "tbps",
                    2.0 * (16.0 * d * d + 2.0 * KV_LENGTH * d), sdpa_fn=make_decode_fn(True),
                    weights=True)


def tiny_out(acts, weights):
    c = torch.empty_like(acts[0])
    return lambda a, b: torch.add(a, b, out=c)


def make_workloads():
    ew, sm = (8192, 12288), (131072, 1024)
    w = [
        Workload("tiny_add", acts_only((16,), (16,), dtype=torch.float32), lambda a, b: a + b,
                 extras=[("out", tiny_out)]),
        Workload("elementwise", acts_only(ew, ew),
                 lambda x, u: F.gelu(x * 1.5 + 0.5, approximate="tanh") * u, "tbps",
                 3.0 * ew[0] * ew[1] * 2),
        Workload("softmax", acts_only(sm), lambda x: torch.softmax(x, dim=-1), "tbps",
                 2.0 * sm[0] * sm[1] * 2),
        Workload("linear", lambda: ([randn(8192, 768)], [randn(3072, 768), randn(3072)]),
                 lambda x, wt, b: F.linear(x, wt, b), "tflops", 2.0 * 8192 * 3072 * 768,
                 weights=True),
        Workload("mlp", build_mlp(8192), geglu, "tflops", 2.0 * 8192 * 768 * 3072 * 3,
                 weights=True),
        Workload("mlp_1tok", build_mlp(1), geglu, "tflops", 2.0 * 768 * 3072 * 3, weights=True),
        Workload("attention", build_attention, naive_attention, "tflops",
                 4.0 * 8 * 16 * 1024 * 1024 * 64, sdpa_fn=sdpa_attention,
                 extras=[("eager_inplace",
                          lambda a, w: lambda q, k, v, m: naive_attention(q, k, v, m, True))]),
    ]
    w += [block_workload(2, 256, d) for d in (512, 1024)]
    w += [block_workload(8, 1024, d) for d in (512, 1024)]
    w += [decode_workload(d) for d in (512, 1024)]
    return w


# ---------------------------------------------------------------------------
# Modes: each returns the row's step (a callable of no arguments) built on the workload's inputs.
# ---------------------------------------------------------------------------

class Frozen(torch.nn.Module):
    """The step as an nn.Module whose weights are parameters (what freezing folds)."""

    def __init__(self, fn, weights):
        super().__init__()
        self.fn = fn
        self.n = len(weights)
        # Plain named parameters: dynamo cannot unpack a ParameterList with `*` (torch 2.11).
        for i, t in enumerate(weights):
            self.register_parameter(f"w{i}", torch.nn.Parameter(t, requires_grad=False))

    def forward(self, *acts):
        return self.fn(*acts, *[getattr(self, f"w{i}") for i in range(self.n)])


def capture(fn, args, ctx=contextlib.nullcontext):
    """fn(*args) captured once in a torch.cuda.CUDAGraph (after a warm-up on a side stream);
    the step replays it and returns the graph's static output."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with ctx(), torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with ctx(), torch.cuda.graph(graph):
        out = fn(*args)

    def step():
        graph.replay()
        return out
    step.graph = graph  # keeps the graph alive with the step
    return step


def fresh_code(fn, tag):
    """fn with a code object of its own: torch.compile caches compiled code per code object, so
    each row's calls then run only its own guards (the four block sizes share one function)."""
    code = fn.__code__.replace(co_name=f"{fn.__name__}_{tag}")
    return types.FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)


def frozen_module(fn, weights):
    """torch.compile of Frozen(fn, weights); it compiles at its first call, which must run inside
    freezing_on() (so that Inductor folds the parameters)."""
    with torch.inference_mode(False), torch.no_grad():
        module = Frozen(fn, [w.clone() for w in weights]).eval()
    return torch.compile(module, dynamic=False)


@contextlib.contextmanager
def freezing_on():
    import torch._inductor.config as inductor_config
    with inductor_config.patch(freezing=True):
        yield


def sdpa_backend_ctx(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION}[name]
    return lambda: sdpa_kernel(backend)


class Modes:
    """The modes of one workload: .list holds (mode, make(acts, weights) -> step, context of the
    first calls). A getter (acts, weights) -> function says what a mode calls; a compiled
    function is made once and shared by its plain and +graph rows (one compile for both)."""

    def __init__(self, w, no_compile):
        self.w = w
        self.cache = {}
        fn, sdpa = (lambda a, wt: w.fn), (lambda a, wt: w.sdpa_fn)
        self.list = [("eager", self.plain(fn), None), ("eager+graph", self.graph(fn), None)]
        for mode, factory in w.extras:
            self.list.append((mode, self.plain(factory), None))
        if not no_compile:
            compiled = self.compiled(w.fn, "compiled")
            self.list += [("compiled", self.plain(compiled), None),
                          ("compiled+graph", self.graph(compiled), None)]
            if w.weights:
                self.list += self.frozen("frozen", w.fn)
        if w.sdpa_fn is not None:
            self.list += [("sdpa", self.plain(sdpa), None), ("sdpa+graph", self.graph(sdpa), None)]
            self.list += [(f"sdpa_{b}", self.forced(b), None) for b in ("cudnn", "flash", "efficient")]
            if not no_compile and w.weights:
                self.list += self.frozen("sdpa_frozen", w.sdpa_fn)

    @staticmethod
    def plain(get):
        def make(a, wt):
            f = get(a, wt)
            return lambda: f(*a, *wt)
        return make

    @staticmethod
    def graph(get):
        return lambda a, wt: capture(get(a, wt), a + wt)

    def compiled(self, fn, tag):
        def get(a, wt):
            if tag not in self.cache:
                self.cache[tag] = torch.compile(fresh_code(fn, f"{self.w.key}_{tag}"),
                                                dynamic=False)
            return self.cache[tag]
        return get

    def forced(self, backend):
        def make(a, wt):
            ctx = sdpa_backend_ctx(backend)

            def step():
                with ctx():
                    return self.w.sdpa_fn(*a, *wt)
            return step
        return make

    def frozen(self, prefix, fn):
        """The frozen module of fn (weights folded), called with the activations only."""
        def module(a, wt):
            if prefix not in self.cache:
                m = frozen_module(fn, wt)
                with freezing_on():
                    m(*a)  # compiles with freezing
                self.cache[prefix] = m
            return self.cache[prefix]

        def plain(a, wt):
            m = module(a, wt)
            return lambda: m(*a)
        return [(prefix, plain, freezing_on),
                (prefix + "+graph", lambda a, wt: capture(module(a, wt), a), freezing_on)]


# ---------------------------------------------------------------------------
# Measuring (bench_harness.h has the method)
# ---------------------------------------------------------------------------

class Config:
    def __init__(self, args):
        self.quick = args.quick
        self.prequeue = not args.no_prequeue
        self.count_kernels = not args.no_kernels
        self.reps = max(1, args.reps)
        self.warmup = 5
        self.latency_samples = 10 if args.quick else 25
        self.device_samples = 20 if args.quick else 40
        self.throughput_steps = 20 if args.quick else 40
        self.count_steps = 5
        self.chunk = self.device_samples
        self.flush_bytes = 256 << 20


def sync():
    torch.cuda.synchronize()


_FLUSH = {}


def flush_l2(cfg):
    """A kernel that reads a 256 MiB buffer: the next step finds none of its inputs in L2."""
    buf = _FLUSH.get("buf")
    if buf is None:
        buf = _FLUSH["buf"] = torch.zeros(cfg.flush_bytes // 4, dtype=torch.int32, device=DEV)
    return buf.sum()


def spin(us):
    torch.cuda._sleep(int(min(max(us, 20.0), 100000.0) * CYCLES_PER_US))


def host_and_latency(step, cfg):
    host, latency = [], []
    for _ in range(cfg.latency_samples):
        flush_l2(cfg)
        sync()
        t0 = time.perf_counter()
        out = step()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        del out
        host.append((t1 - t0) * 1e6)
        latency.append((t2 - t0) * 1e6)
    return statistics.median(host), statistics.median(latency)


def device_time(step, cfg, host_us):
    n = cfg.device_samples
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    sync()
    for c0 in range(0, n, cfg.chunk):
        c1 = min(n, c0 + cfg.chunk)
        if cfg.prequeue:
            spin(2.0 * (c1 - c0) * (host_us + 25.0))
        for i in range(c0, c1):
            flush_l2(cfg)
            starts[i].record()
            step()
            ends[i].record()
    sync()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))


def throughput(step, cfg):
    flush_l2(cfg)
    sync()
    t0 = time.perf_counter()
    for _ in range(cfg.throughput_steps):
        step()
    sync()
    return (time.perf_counter() - t0) * 1e6 / cfg.throughput_steps


def measure(step, cfg):
    for _ in range(cfg.warmup):
        step()
    sync()
    gc.collect()
    gc.disable()
    try:
        host_us, latency_us = host_and_latency(step, cfg)
        device_us = device_time(step, cfg, host_us)
        throughput_us = throughput(step, cfg)
    finally:
        gc.enable()
    return {"device_us": device_us, "latency_us": latency_us, "throughput_us": throughput_us,
            "host_us": host_us}


def init_cupti():
    """Start and stop the profiler once, before any CUDA graph is captured, so that graph
    replays are traced kernel by kernel (PyTorch's own workaround, profiler
    _init_for_cuda_graphs)."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]):
            pass
    except Exception as e:  # the count then says why it is missing
        log(f"warning: profiler init failed: {e}")


def count_kernels(step, steps):
    from torch.profiler import ProfilerActivity, profile
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync()
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return bench_common.kernel_counts(events, steps)


def peak_extra_mib(step):
    sync()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = step()
    sync()
    peak = torch.cuda.max_memory_allocated()
    del out
    return (peak - base) / MIB


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def rel_errors(got, want):
    """Relative L2 error of each output (float64 on the GPU)."""
    errs = []
    got, want = as_tuple(got), as_tuple(want)
    if len(got) != len(want):
        return [math.inf]
    for g, r in zip(got, want):
        if g.shape != r.shape:
            errs.append(math.inf)
            continue
        g64, r64 = g.detach().double(), r.detach().double()
        if not (torch.isfinite(g64).all() and torch.isfinite(r64).all()):
            errs.append(math.inf)
            continue
        den = torch.linalg.vector_norm(r64).item()
        num = torch.linalg.vector_norm(g64 - r64).item()
        errs.append(num / den if den > 0 else num)
    return errs


def dtype_name(t):
    return {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
            torch.bool: "bool"}.get(t.dtype, str(t.dtype))


# ---------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------

class Row:
    def __init__(self, w, mode):
        self.workload, self.mode = w.key, mode
        self.data = {"workload": w.key, "mode": mode, "metric": w.metric, "amount": w.amount,
                     "device_us": [], "latency_us": [], "throughput_us": [], "host_us": []}
        self.step = None


def setup_row(row, make, ctx, acts, weights, reference, cfg):
    t0 = time.perf_counter()
    step = make(acts, weights)
    with (ctx or contextlib.nullcontext)():
        for _ in range(cfg.warmup):
            out = step()
    sync()
    row.data["setup_s"] = time.perf_counter() - t0
    if row.mode != "eager" and reference is not None:
        errs = rel_errors(out, reference)
        row.data["check"] = bench_common.check_entry(errs, dtype_name(as_tuple(reference)[0]))
    del out
    if cfg.count_kernels:
        try:
            row.data.update(count_kernels(step, cfg.count_steps))
        except Exception as e:
            row.data["kernels_error"] = f"{type(e).__name__}: {e}"[:500]
    row.data["peak_extra_mib"] = None if "graph" in row.mode else peak_extra_mib(step)
    row.step = step


def fail(row, e):
    msg = f"{type(e).__name__}: {e}"
    row.data["error"] = msg[:4000]
    row.step = None
    log(f"  [{row.workload}/{row.mode}] FAILED: {msg.splitlines()[0][:300]}")
    traceback.print_exc(file=sys.stdout)
    sys.stdout.flush()
    try:
        sync()
    except Exception:
        pass


def selected(only, key, mode=None):
    if not only:
        return True
    return key in only or (mode is not None and f"{key}/{mode}" in only) or (
        mode is None and any(k.startswith(key + "/") for k in only))


def setup_workload(w, cfg, args, only, checks):
    torch.manual_seed(1234)
    with torch.no_grad():
        acts, weights = w.build()
    reference = w.fn(*acts, *weights)
    sync()
    rows = []
    for mode, make, ctx in Modes(w, args.no_compile).list:
        if not selected(only, w.key, mode):
            continue
        row = Row(w, mode)
        try:
            setup_row(row, make, ctx, acts, weights, reference, cfg)
            log(f"  {w.key}/{mode}: set up in {row.data['setup_s']:.1f} s, kernels "
                f"{row.data.get('kernels')}, check {row.data.get('check', {}).get('rel_l2')}")
        except Exception as e:
            fail(row, e)
        rows.append(row)
    del reference
    if args.check_dir:
        check_kiln(w, args.check_dir, checks)
    return rows


# ---------------------------------------------------------------------------
# The correctness gate for kiln's outputs
# ---------------------------------------------------------------------------

TORCH_DTYPE = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
               "bool": torch.uint8}


def load_tensor(tf):
    with open(tf.path, "rb") as f:
        data = f.read()
    if len(data) != tf.nbytes():
        raise ValueError(f"{tf.path}: {len(data)} bytes, expected {tf.nbytes()}")
    t = torch.frombuffer(bytearray(data), dtype=TORCH_DTYPE[tf.dtype]) if data else \
        torch.empty(0, dtype=TORCH_DTYPE[tf.dtype])
    if tf.dtype == "bool":
        t = t.to(torch.bool)
    return t.reshape(tf.shape).to(DEV)


def check_kiln(w, check_dir, checks):
    """PyTorch's eager step on kiln's inputs against each kiln mode's outputs."""
    folder = os.path.join(check_dir, w.key)
    if not os.path.isfile(os.path.join(folder, "manifest.txt")):
        log(f"  {w.key}: no kiln check files in {check_dir}")
        return
    try:
        inputs, outputs = bench_common.read_manifest(folder)
        args = [load_tensor(t) for t in inputs]
        want = as_tuple(w.fn(*args))
        dtype = dtype_name(want[0])
    except Exception as e:
        for mode in ("eager",):
            checks[f"{w.key}/{mode}"] = bench_common.check_entry([], "bfloat16", e)
        log(f"  {w.key}: kiln check failed to run: {e}")
        return
    for mode, files in outputs.items():
        key = f"{w.key}/{mode}"
        try:
            got = [load_tensor(t) for t in files]
            checks[key] = bench_common.check_entry(rel_errors(got, want), dtype)
        except Exception as e:
            checks[key] = bench_common.check_entry([], dtype, e)
        c = checks[key]
        log(f"  check kiln {key}: rel L2 {c.get('rel_l2')} (tol {c['tol']}): "
            f"{'ok' if c['ok'] else 'FAIL'}")
    del args, want
    sync()


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

def wait_for(path, timeout_s=1800):
    deadline = time.time() + timeout_s
    while not os.path.exists(path):
        if time.time() > deadline:
            return False
        time.sleep(0.005)
    return True


def touch(path):
    with open(path, "w", encoding="utf-8") as f:
        f.write("ok\n")


def write_json(path, meta, rows, checks):
    if not path:
        return
    doc = dict(meta)
    doc["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    doc["results"] = {f"{r.workload}/{r.mode}": r.data for r in rows}
    doc["checks"] = checks
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, default=str)  # never lose a run to one odd value
    os.replace(tmp, path)


def print_table(rows):
    log(f"\n{'workload/mode':<40} {'device_us':>10} {'latency_us':>11} {'thruput_us':>11} "
        f"{'kernels':>8} {'check':>9}")
    for r in rows:
        d = r.data
        key = f"{r.workload}/{r.mode}"
        if "error" in d:
            log(f"{key:<40} ERROR: {d['error'].splitlines()[0][:80]}")
            continue
        med = {k: bench_common.summary(d[k])[0] for k in
               ("device_us", "latency_us", "throughput_us")}
        fmt = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
        chk = d.get("check", {}).get("rel_l2")
        log(f"{key:<40} {fmt(med['device_us'], '10.2f')} {fmt(med['latency_us'], '11.2f')} "
            f"{fmt(med['throughput_us'], '11.2f')} {fmt(d.get('kernels'), '8.2f')} "
            f"{fmt(chk, '9.2e')}")


def parse_args():
    ap = argparse.ArgumentParser(description="PyTorch side of the kiln benchmark")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON to PATH")
    ap.add_argument("--quick", action="store_true", help="fewer samples per repetition")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the whole set")
    ap.add_argument("--only", metavar="KEYS",
                    help="comma-separated workloads or workload/mode rows to run")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--no-prequeue", action="store_true",
                    help="do not queue the device-timing steps behind a GPU spin kernel")
    ap.add_argument("--no-kernels", action="store_true", help="do not count kernels")
    ap.add_argument("--check-dir", metavar="DIR", help="kiln_bench's correctness files")
    ap.add_argument("--sync-dir", metavar="DIR", help="lock-step with scripts/gpu-run")
    ap.add_argument("--list", action="store_true", help="print the workload/mode keys")
    return ap.parse_args()


def configure_torch():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import torch._dynamo as dynamo  # (a plain "import torch._dynamo" would make torch local here)
    # Every row stays compiled for the whole run: never fall back to eager for too many
    # recompiles of one code object (each block size is one compile of the same function).
    for name, value in (("cache_size_limit", 256), ("recompile_limit", 256),
                        ("accumulated_cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 4096)):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, value)


def run_repetitions(rows, cfg, args, meta, checks):
    for rep in range(cfg.reps):
        if args.sync_dir and not wait_for(os.path.join(args.sync_dir, f"go.pytorch.{rep}")):
            log(f"no go for repetition {rep}: stopping")
            break
        t0 = time.perf_counter()
        with torch.inference_mode():
            for r in rows:
                if r.step is None:
                    continue
                try:
                    for k, v in measure(r.step, cfg).items():
                        r.data[k].append(v)
                except Exception as e:
                    fail(r, e)
        log(f"repetition {rep}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s")
        write_json(args.json, meta, rows, checks)
        if args.sync_dir:
            touch(os.path.join(args.sync_dir, f"done.pytorch.{rep}"))


def main():
    args = parse_args()
    workloads = make_workloads()
    if args.list:
        for w in workloads:
            for mode, _, _ in Modes(w, args.no_compile).list:
                print(f"{w.key}/{mode}")
        return 0
    only = {k.strip() for k in (args.only or "").split(",") if k.strip()}
    unknown = [k for k in only if k.split("/")[0] not in {w.key for w in workloads}]
    if unknown:
        log(f"error: unknown workload(s): {', '.join(unknown)}")
        return 2
    if not torch.cuda.is_available():
        log("error: CUDA is not available to this torch")
        return 2
    configure_torch()
    cfg = Config(args)
    if cfg.prequeue and not hasattr(torch.cuda, "_sleep"):
        log("warning: torch.cuda._sleep missing; measuring without pre-queue")
        cfg.prequeue = False
    props = torch.cuda.get_device_properties(0)
    gpu = torch.cuda.get_device_name(0)
    meta = {"source": "pytorch", "torch_version": torch.__version__, "gpu": gpu,
            "cuda_version": torch.version.cuda, "quick": cfg.quick, "repetitions": cfg.reps,
            "l2_bytes": getattr(props, "L2_cache_size", None), "check_dir": args.check_dir,
            "method": {"device_us": "median CUDA-event time of single steps, L2 flushed before "
                                    "each" + (", GPU kept busy (steps queued behind "
                                              "torch.cuda._sleep)" if cfg.prequeue else ""),
                       "latency_us": "median of (L2 flush; sync; t0; step; sync; t1)",
                       "throughput_us": "(t1 - t0) / N over N back-to-back steps, one sync",
                       "host_us": "median time of the call that enqueues one step",
                       "kernels": "torch.profiler (CUPTI) kernel records of N steps / N",
                       "inference_mode": True, "allow_tf32": False, "warmup": cfg.warmup,
                       "latency_samples": cfg.latency_samples,
                       "device_samples": cfg.device_samples,
                       "throughput_steps": cfg.throughput_steps, "count_steps": cfg.count_steps,
                       "l2_flush_bytes": cfg.flush_bytes,
                       "graph_capture": "torch.cuda.CUDAGraph captured by this script (not "
                                        "mode='reduce-overhead')"}}
    log(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {gpu}, {cfg.reps} repetitions"
        f"{' (quick)' if cfg.quick else ''}, prequeue={'on' if cfg.prequeue else 'off'}")
    init_cupti()
    rows, checks = [], {}
    with torch.inference_mode():
        for w in workloads:
            if not selected(only, w.key):
                continue
            t0 = time.perf_counter()
            log(f"setting up {w.key} ...")
            try:
                rows += setup_workload(w, cfg, args, only, checks)
            except Exception as e:
                log(f"  {w.key}: building the inputs failed: {type(e).__name__}: {e}")
            log(f"set up {w.key} ({time.perf_counter() - t0:.1f} s)")
    write_json(args.json, meta, rows, checks)
    if args.sync_dir:
        touch(os.path.join(args.sync_dir, "ready.pytorch"))
    run_repetitions(rows, cfg, args, meta, checks)
    print_table(rows)
    write_json(args.json, meta, rows, checks)
    if args.json:
        log(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
