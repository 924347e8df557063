#!/usr/bin/env python3
"""kiln's flash attention kernel (libkf.so: the same NVRTC source as kiln) against PyTorch SDPA.

1. torch 2.11 semantics: what SDPA (math fp32, flash, efficient, cuDNN) gives for a fully masked
   row, and for causal with Lq != Lk.
2. correctness of kiln's kernel against torch's math backend in fp32 (masks, GQA, views).
3. device time, same method for every row: CUDA events around each call, chunks queued behind a
   torch.cuda._sleep spin so the GPU never waits for the host, inputs rotated over sets; median.
Usage: python3 bench.py OUT_DIR [LIBKF]   (writes bench.json into OUT_DIR; LIBKF defaults to
libkf.so next to this file). run.sh builds libkf.so and calls it.
"""
import ctypes
import json
import math
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

OUT = sys.argv[1] if len(sys.argv) > 1 else "."
lib = ctypes.CDLL(sys.argv[2] if len(sys.argv) > 2 else
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "libkf.so"))


class KfConfig(ctypes.Structure):
    _fields_ = [(n, ctypes.c_int) for n in "d bm bn warps qreg minb bf16 causal mask onesync".split()]


class KfArgs(ctypes.Structure):
    _fields_ = ([("cfg", KfConfig)] + [(n, ctypes.c_void_p) for n in "q k v o mask".split()]
                + [(n, ctypes.c_longlong) for n in
                   "q_b q_h q_r k_b k_h k_r v_b v_h v_r o_b o_h o_r m_b m_h m_r m_c".split()]
                + [(n, ctypes.c_int) for n in "batch heads group q_len kv_len".split()]
                + [("scale", ctypes.c_float), ("stream", ctypes.c_void_p)])


lib.kf_launch.argtypes = [ctypes.POINTER(KfArgs)]
lib.kf_error.restype = ctypes.c_char_p

# name -> (bm, bn, warps, qreg, minb); the first per head dim is kiln's default
# name -> (bm, bn, warps, q_in_regs, min_blocks, one_sync); the first per head dim is kiln's
# PlanFlashAttention (keep in step with harness.cu)
VARIANTS = {
    64: {"A": (128, 64, 4, 1, 2, 1), "A2": (128, 64, 4, 1, 2, 0), "B": (128, 64, 4, 0, 2, 1),
         "D": (64, 64, 4, 1, 3, 1), "N": (128, 128, 4, 0, 1, 1), "C": (128, 64, 8, 1, 2, 1)},
    128: {"F2": (128, 64, 4, 0, 2, 0), "F": (128, 64, 4, 0, 2, 1), "I": (128, 32, 4, 0, 2, 1),
          "I2": (128, 32, 4, 0, 2, 0), "G": (64, 64, 4, 1, 2, 1), "H": (128, 64, 8, 1, 1, 1)},
}
MASK_KIND = {None: 0, torch.bool: 1, torch.float32: 2, torch.float16: 3, torch.bfloat16: 4}


def log(*a):
    print(*a, flush=True)


def kiln_args(q, k, v, o, mask=None, causal=False, scale=None, variant=None):
    """q, k, v: [B, H, T, D] (any strides with a contiguous D); o: contiguous [B, H, L, D]."""
    d = q.shape[-1]
    name = variant or next(iter(VARIANTS[d]))
    bm, bn, w, qreg, minb, onesync = VARIANTS[d][name]
    a = KfArgs()
    a.cfg = KfConfig(d, bm, bn, w, qreg, minb, int(q.dtype == torch.bfloat16), int(causal),
                     MASK_KIND[None if mask is None else mask.dtype], onesync)
    a.q, a.k, a.v, a.o = q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr()
    a.q_b, a.q_h, a.q_r = q.stride(0), q.stride(1), q.stride(2)
    a.k_b, a.k_h, a.k_r = k.stride(0), k.stride(1), k.stride(2)
    a.v_b, a.v_h, a.v_r = v.stride(0), v.stride(1), v.stride(2)
    a.o_b, a.o_h, a.o_r = o.stride(0), o.stride(1), o.stride(2)
    B, H, L, _ = q.shape
    S = k.shape[2]
    if mask is not None:
        m = mask.expand(B, H, L, S)
        a.mask = m.data_ptr()
        a.m_b, a.m_h, a.m_r, a.m_c = m.stride()
    a.batch, a.heads, a.group, a.q_len, a.kv_len = B, H, H // k.shape[1], L, S
    a.scale = scale if scale is not None else 1.0 / math.sqrt(d)
    a.stream = torch.cuda.current_stream().cuda_stream
    return a


def kiln_launch(a):
    rc = lib.kf_launch(ctypes.byref(a))
    if rc != 0:
        raise RuntimeError(lib.kf_error().decode())


def kiln_sdpa(q, k, v, mask=None, causal=False, scale=None, variant=None):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    kiln_launch(kiln_args(q, k, v, o, mask, causal, scale, variant))
    return o


def torch_ref(q, k, v, mask=None, causal=False, scale=None):
    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                              attn_mask=None if mask is None else (
                                                  mask if mask.dtype == torch.bool else mask.float()),
                                              is_causal=causal, scale=scale, enable_gqa=gqa)


def semantics():
    log("== torch", torch.__version__, "semantics ==")
    q = torch.randn(1, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, 2, 6, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(1, 2, 6, 64, device="cuda", dtype=torch.bfloat16)
    mask = torch.ones(4, 6, dtype=torch.bool, device="cuda")
    mask[1] = False
    addm = torch.zeros(4, 6, device="cuda", dtype=torch.bfloat16)
    addm[2] = float("-inf")
    res = {}
    for name, be in [("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)]:
        for mname, m in [("bool row 1 all False", mask), ("additive row 2 all -inf", addm)]:
            try:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
                row = 1 if m.dtype == torch.bool else 2
                val = o[0, 0, row, :4].float().tolist()
                res[f"{name}/{mname}"] = val
                log(f"  {name:9s} {mname}: row -> {val}")
            except Exception as e:  # noqa: BLE001
                log(f"  {name:9s} {mname}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    # causal with Lq != Lk: top-left (tril) or bottom-right?
    ql = torch.randn(1, 1, 3, 64, device="cuda")
    kl = torch.randn(1, 1, 5, 64, device="cuda")
    vl = torch.eye(5, 64, device="cuda")[None, None]
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
    nz = (o[0, 0, :, :5] > 0).int().tolist()
    log("  causal Lq=3 Lk=5, keys attended per row:", nz, "(tril = top-left)")
    res["causal_3x5"] = nz
    return res


def correctness():
    log("== kiln vs torch math fp32 ==")
    torch.manual_seed(0)
    dev = "cuda"
    results = []
    cases = [
        # (B, H, Hk, L, S, D, causal, mask kind, bthd)
        (2, 3, 3, 37, 45, 64, False, None, False),
        (1, 2, 2, 1024, 1024, 64, True, None, False),
        (2, 4, 4, 1000, 1337, 128, False, None, False),
        (2, 8, 2, 300, 300, 128, True, None, False),
        (2, 6, 3, 77, 501, 64, False, "bool_full_rows", False),
        (2, 2, 2, 129, 130, 64, False, "f32_inf", False),
        (1, 4, 4, 65, 200, 128, False, "qdtype", False),
        (2, 3, 3, 257, 257, 64, True, None, True),
        (4, 16, 16, 1024, 1024, 64, True, None, True),
        (1, 2, 2, 333, 20, 64, True, None, False),
    ]
    for dtype in (torch.bfloat16, torch.float16):
        for (B, H, Hk, L, S, D, causal, mk, bthd) in cases:
            if bthd:
                q = torch.randn(B, L, H, D, device=dev, dtype=dtype).transpose(1, 2)
                k = torch.randn(B, S, Hk, D, device=dev, dtype=dtype).transpose(1, 2)
                v = torch.randn(B, S, Hk, D, device=dev, dtype=dtype).transpose(1, 2)
            else:
                q = torch.randn(B, H, L, D, device=dev, dtype=dtype)
                k = torch.randn(B, Hk, S, D, device=dev, dtype=dtype)
                v = torch.randn(B, Hk, S, D, device=dev, dtype=dtype)
            mask = None
            if mk == "bool_full_rows":
                mask = torch.rand(B, 1, L, S, device=dev) < 0.7
                mask[:, :, 3::7] = False
            elif mk == "f32_inf":
                mask = torch.randn(B, H, L, S, device=dev)
                mask[torch.rand_like(mask) < 0.1] = float("-inf")
                mask[:, :, 5::9] = float("-inf")
            elif mk == "qdtype":
                mask = torch.randn(L, S, device=dev, dtype=dtype)
            out = kiln_sdpa(q, k, v, mask, causal)
            ref = torch_ref(q, k, v, mask, causal)
            err = (out.float() - ref).abs()
            tol = (2e-2 if dtype == torch.bfloat16 else 4e-3) * (1 + ref.abs())
            bad = int(((err > tol) | (torch.isnan(out) != torch.isnan(ref))).sum())
            line = (f"  {str(dtype)[6:]:8s} [{B},{H}/{Hk},{L},{S},{D}] causal={int(causal)} "
                    f"mask={mk} bthd={int(bthd)}: max_abs {err.nan_to_num().max().item():.2e} "
                    f"bad {bad} {'PASS' if bad == 0 else 'FAIL'}")
            log(line)
            results.append(line)
    return results


def time_device(fn, nsets, reps=40, chunk=10):
    for i in range(5):
        fn(i % nsets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for c0 in range(0, reps, chunk):
        torch.cuda._sleep(2_000_000)
        for i in range(c0, min(reps, c0 + chunk)):
            starts[i].record()
            fn(i % nsets)
            ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000 for s, e in zip(starts, ends))


def timing():
    log("== device time (median us per call, bf16) ==")
    shapes = [(8, 16, 1024, 64, True), (8, 16, 1024, 64, False), (8, 16, 4096, 64, True),
              (8, 16, 4096, 64, False), (8, 16, 1024, 128, True), (8, 16, 1024, 128, False)]
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    for (B, H, T, D, causal) in shapes:
        set_bytes = 4 * B * H * T * D * 2
        nsets = max(2, min(8, math.ceil(1.5 * l2 / set_bytes)))
        sets = [[torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
                for _ in range(nsets)]
        outs = [torch.empty(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(nsets)]
        flops = 4 * B * H * T * T * D * (0.5 if causal else 1.0)
        row = {"shape": [B, H, T, D], "causal": causal}
        for name, be in [("torch_flash", SDPBackend.FLASH_ATTENTION),
                         ("torch_cudnn", SDPBackend.CUDNN_ATTENTION),
                         ("torch_efficient", SDPBackend.EFFICIENT_ATTENTION)]:
            try:
                with sdpa_kernel(be):
                    us = time_device(lambda i: F.scaled_dot_product_attention(*sets[i], is_causal=causal), nsets)
                row[name] = us
            except Exception as e:  # noqa: BLE001
                row[name] = None
                log(f"  {name}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        for vname in VARIANTS[D]:
            args = [kiln_args(*sets[i], outs[i], None, causal, None, vname) for i in range(nsets)]
            row["kiln_" + vname] = time_device(lambda i: kiln_launch(args[i]), nsets)
        rows.append(row)
        cells = "  ".join(f"{k}={v:.1f}" for k, v in row.items() if isinstance(v, float))
        log(f"  [{B},{H},{T},{D}] {'causal' if causal else 'noncausal'}: {cells}  "
            f"(GFLOP {flops / 1e9:.1f})")
        del sets, outs
        torch.cuda.empty_cache()
    return rows


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    log("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))
    out = {"torch": torch.__version__}
    with torch.inference_mode():
        for name, fn in [("semantics", semantics), ("correctness", correctness), ("timing", timing)]:
            try:
                out[name] = fn()
            except Exception as e:  # noqa: BLE001
                log(f"{name} FAILED: {type(e).__name__}: {e}")
                out[name] = f"failed: {e}"
    with open(os.path.join(OUT, "bench.json"), "w") as f:
        json.dump(out, f, indent=1)
    if isinstance(out.get("timing"), list):
        log("\n== table: device us (TFLOP/s) ==")
        for r in out["timing"]:
            B, H, T, D = r["shape"]
            flops = 4 * B * H * T * T * D * (0.5 if r["causal"] else 1.0)
            cells = []
            for k, v in r.items():
                if isinstance(v, float):
                    cells.append(f"{k} {v:.1f} ({flops / v * 1e-6:.0f})")
            log(f"[{B},{H},{T},{D}] {'causal' if r['causal'] else 'full'}: " + " | ".join(cells))


if __name__ == "__main__":
    main()
