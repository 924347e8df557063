"""PyTorch's scaled_dot_product_attention with each backend (cuDNN, FlashAttention-2, memory
efficient) at the shapes of bench/attention_bench.cc, bf16, device time measured as
bench/torch_baseline.py measures it (cold L2, the GPU kept busy behind a spin kernel, median of
CUDA-event times), repetitions interleaved backend by backend; each backend's answer is checked
against float32 math on the first batch first.

    python3 bench/attention_torch.py [--reps 3] [--only s1024_d64_causal,...] [--backends cudnn,flash]

Prints one line per shape and backend, the format of attention_bench:
    "attention <shape> torch_<backend> <device µs> [min-max] us <TFLOP/s> TFLOP/s"
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_baseline as tb  # noqa: E402  (its measuring functions)

SHAPES = [("s1024_d64_causal", 8, 16, 1024, 64, True), ("s1024_d64", 8, 16, 1024, 64, False),
          ("s4096_d64_causal", 8, 16, 4096, 64, True), ("s4096_d64", 8, 16, 4096, 64, False),
          ("s2048_d64_causal", 8, 16, 2048, 64, True),
          ("s1024_d128_causal", 8, 16, 1024, 128, True), ("s1024_d128", 8, 16, 1024, 128, False),
          ("s4096_d128", 8, 16, 4096, 128, False), ("s4096_d128_causal", 8, 16, 4096, 128, True)]
BACKENDS = ["cudnn", "flash", "efficient"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    args = ap.parse_args()
    backends = [b for b in args.backends.split(",") if b in BACKENDS]
    only = [s for s in args.only.split(",") if s]
    cfg = tb.Config(argparse.Namespace(quick=False, no_prequeue=False, no_kernels=True,
                                       reps=args.reps))
    torch.manual_seed(0)
    for name, b, h, l, d, causal in SHAPES:
        if only and name not in only:
            continue
        q, k, v = (torch.randn(b, h, l, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        want = F.scaled_dot_product_attention(q[0].float(), k[0].float(), v[0].float(),
                                              is_causal=causal)
        steps = {}
        for backend in backends:
            ctx = tb.sdpa_backend_ctx(backend)
            def step(ctx=ctx):
                with ctx():
                    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            try:
                got = step()[0].float()
            except RuntimeError as e:
                print(f"attention {name} torch_{backend}: not run ({str(e).splitlines()[0]})")
                continue
            diff = (got - want).abs().max().item()
            scale = want.abs().max().item()
            print(f"attention {name} torch_{backend} check: vs float32 (batch 0) {diff:.3g} "
                  f"(output max {scale:.3g}) {'ok' if diff <= 2e-2 * (1 + scale) else 'MISMATCH'}")
            steps[backend] = step
        us = {backend: [] for backend in steps}
        for _ in range(cfg.reps):
            for backend, step in steps.items():
                us[backend].append(tb.measure(step, cfg)["device_us"])
        flop = 4.0 * b * h * l * l * d * (0.5 if causal else 1.0)
        for backend, times in us.items():
            med = statistics.median(times)
            print(f"attention {name} torch_{backend} {med:.2f} [{min(times):.2f}-{max(times):.2f}]"
                  f" us {flop / med * 1e-6:.1f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
