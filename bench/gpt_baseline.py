#!/usr/bin/env python3
"""PyTorch twin of examples/05_gpt.cc: the same GPT-2-class model from the same safetensors file,
prefill + greedy decode with a static KV cache, timed the same way, and the gate on kiln's ids.

What it is for
    kiln's 05_gpt writes seeded weights in Hugging Face GPT-2's layout (--write-weights) and,
    with --out, the prompt, the generated ids and the prefill logits of a run. This script loads
    the same weights into a plain torch implementation of the model (Conv1D weights used as HF
    stores them, [in, out]; tanh GELU; tied logits), checks kiln's answers, and reports prefill
    ms, decode ms/token and tokens/s in the modes a performance-minded PyTorch user would try:
        eager      the model's torch ops, attention through F.scaled_dot_product_attention
        compiled   torch.compile(mode="reduce-overhead") (CUDA graphs via cudagraph trees) with
                   torch._inductor.config.freezing = True, prefill and decode step each compiled
                   once (static shapes)
        graph      the whole decode step — the model, argmax, the position update and the id's
                   write into an id buffer — captured by hand as one torch.cuda.CUDAGraph and
                   replayed per token (eager prefill): the least host work per token PyTorch can
                   do, as kiln's compiled+graph step also writes the id on the device
    When transformers is importable, GPT2LMHeadModel loaded from the same file cross-checks the
    plain model's fp32 prefill logits (so the layout is read as HF reads it).

The KV cache (as in gpt-fast): module buffers [B, H, ctx, Dh], written with index_copy_ at a
position tensor, attention over all ctx slots with a bool mask (slot <= pos) — one graph for every
position, the same shape discipline as kiln's blend (kiln writes by a one-hot where instead).

How to run (GPU machine: torch with CUDA, safetensors; scripts/gpu-run's gpt mode does this)
    05_gpt --write-weights w.safetensors
    05_gpt --weights w.safetensors --dtype f32 --compile --out kiln_f32.safetensors
    05_gpt --weights w.safetensors --dtype bf16 --compile --out kiln_bf16.safetensors
    python3 bench/gpt_baseline.py --weights w.safetensors --kiln-f32 kiln_f32.safetensors \
        --kiln-bf16 kiln_bf16.safetensors --batch 1 8 --json torch_gpt.json
    python3 bench/gpt_baseline.py --table kiln_b1.json kiln_b8.json torch_gpt.json \
        --markdown gpt.md          # the comparison table (kiln's RESULT lines saved as JSON)

Checks (recorded under "checks"; the exit code is 1 when one fails)
    fp32_ids     torch's fp32 greedy ids from kiln's prompt equal kiln's fp32 ids, all new tokens
    bf16_logits  torch's bf16 prefill logits (last position) vs kiln's: relative L2 < 2e-2
    bf16_decode_logits  the same at kiln's first, middle and last decode steps, torch fed kiln's
                 ids (teacher forcing)
    hf_logits    (transformers present) the plain model vs GPT2LMHeadModel, fp32, rel L2 < 1e-5

JSON (--json PATH)
    {"source": "pytorch-gpt", "torch_version", "gpu", "config": {...}, "prompt_len",
     "new_tokens", "results": {"b<B>": {"<mode>": {"prefill_ms", "decode_ms_per_token",
     "tokens_per_s", "error"}}}, "checks": {"<name>": {"ok", ...}}}
"""
import argparse
import json
import math
import sys
import time


def load_file(path):
    """The tensors (CPU) and the metadata of a safetensors file."""
    from safetensors import safe_open

    with safe_open(path, framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return tensors, meta


def config_of(meta, args):
    keys = ["n_layer", "n_embd", "n_head", "vocab_size", "n_positions"]
    cfg = {}
    for k in keys:
        v = getattr(args, k)
        if v is None:
            if k not in meta:
                sys.exit("gpt_baseline: %s is not in the file's metadata; pass --%s" % (k, k))
            v = int(meta[k])
        cfg[k] = v
    return cfg


def build_model(torch, sd, cfg, dtype, device, batch):
    """The plain torch GPT-2 with its static KV cache for `batch` rows."""
    nn = torch.nn
    F = torch.nn.functional
    strip = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    L, D, H, V, C = (cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"],
                     cfg["n_positions"])
    Dh = D // H

    def param(name):
        return nn.Parameter(strip[name].to(device=device, dtype=dtype), requires_grad=False)

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = param("wte.weight")
            self.wpe = param("wpe.weight")
            self.ln_f_w, self.ln_f_b = param("ln_f.weight"), param("ln_f.bias")
            self.p = nn.ParameterDict()
            for i in range(L):
                for n in ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                          "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight",
                          "mlp.c_proj.bias"]:
                    self.p[("h.%d.%s" % (i, n)).replace(".", "_")] = param("h.%d.%s" % (i, n))
            for i in range(L):
                self.register_buffer("k%d" % i, torch.zeros(batch, H, C, Dh, dtype=dtype,
                                                            device=device))
                self.register_buffer("v%d" % i, torch.zeros(batch, H, C, Dh, dtype=dtype,
                                                            device=device))
            self.register_buffer("slots", torch.arange(C, device=device))

        def w(self, i, n):
            return self.p[("h.%d.%s" % (i, n)).replace(".", "_")]

        def conv1d(self, x, i, n):  # HF's Conv1D: x @ W[in, out] + b
            return torch.addmm(self.w(i, n + ".bias"), x.reshape(-1, x.shape[-1]),
                               self.w(i, n + ".weight")).view(*x.shape[:-1], -1)

        def block(self, i, x, pos, mask, causal):
            B, T, _ = x.shape
            a = F.layer_norm(x, (D,), self.w(i, "ln_1.weight"), self.w(i, "ln_1.bias"), 1e-5)
            q, k, v = self.conv1d(a, i, "attn.c_attn").view(B, T, 3, H, Dh).permute(2, 0, 3, 1, 4)
            kc, vc = getattr(self, "k%d" % i), getattr(self, "v%d" % i)
            kc.index_copy_(2, pos, k)
            vc.index_copy_(2, pos, v)
            if causal:  # prefill: attention over the prompt itself
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                y = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask)
            x = x + self.conv1d(y.transpose(1, 2).reshape(B, T, D), i, "attn.c_proj")
            m = F.layer_norm(x, (D,), self.w(i, "ln_2.weight"), self.w(i, "ln_2.bias"), 1e-5)
            m = F.gelu(self.conv1d(m, i, "mlp.c_fc"), approximate="tanh")
            return x + self.conv1d(m, i, "mlp.c_proj")

        def run(self, tokens, pos, causal):
            """Logits [B, vocab] of the last of `tokens` [B, T] at positions `pos` [T]."""
            x = F.embedding(tokens, self.wte) + F.embedding(pos, self.wpe)
            mask = None if causal else (self.slots <= pos[-1]).view(1, 1, 1, C)
            for i in range(L):
                x = self.block(i, x, pos, mask, causal)
            x = F.layer_norm(x[:, -1], (D,), self.ln_f_w, self.ln_f_b, 1e-5)
            return x @ self.wte.t()

        def prefill(self, tokens):
            return self.run(tokens, self.slots[: tokens.shape[1]], True)

        def decode(self, token, pos):
            return self.run(token, pos, False)

    return Gpt().eval()


def generate(torch, prefill, decode, prompt, new_tokens, sync):
    """Greedy ids [B, T + N], prefill logits, prefill ms and decode ms/token."""
    dev = prompt.device
    sync()
    t0 = time.perf_counter()
    logits = prefill(prompt)
    first = logits.float().clone()
    tok = logits.argmax(-1, keepdim=True)
    sync()
    t1 = time.perf_counter()
    out = [tok]
    pos = torch.full((1,), prompt.shape[1], dtype=torch.long, device=dev)
    for _ in range(new_tokens - 1):
        if hasattr(torch.compiler, "cudagraph_mark_step_begin"):
            torch.compiler.cudagraph_mark_step_begin()
        logits = decode(tok, pos)
        tok = logits.argmax(-1, keepdim=True)
        out.append(tok)
        pos += 1
    sync()
    t2 = time.perf_counter()
    ids = torch.cat([prompt] + out, dim=1)
    return ids, first, (t1 - t0) * 1e3, (t2 - t1) * 1e3 / max(1, new_tokens - 1)


def mode_fns(torch, model, mode):
    if mode == "eager":
        return model.prefill, model.decode
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    return (torch.compile(model.prefill, mode="reduce-overhead", dynamic=False),
            torch.compile(model.decode, mode="reduce-overhead", dynamic=False))


class GraphedDecode:
    """The decode step of `model` for `batch` rows as one hand-captured CUDA graph: reads tok
    [B, 1] and pos [1], writes the next token to tok and to ids[:, pos + 1], advances pos."""

    def __init__(self, torch, model, batch, ctx):
        dev = model.wte.device
        self.model = model
        self.tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
        self.pos = torch.zeros(1, dtype=torch.long, device=dev)
        self.ids = torch.zeros(batch, ctx, dtype=torch.long, device=dev)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the capture (cuBLAS workspaces, SDPA choice)
            for _ in range(3):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.step()

    def step(self):
        logits = self.model.decode(self.tok, self.pos)
        self.tok.copy_(logits.argmax(-1, keepdim=True))
        self.pos.add_(1)
        self.ids.index_copy_(1, self.pos, self.tok)
        return logits


def generate_graphed(torch, g, prompt, new_tokens, sync):
    """generate() with the decode steps replayed from `g` (a GraphedDecode of the same model)."""
    sync()
    t0 = time.perf_counter()
    logits = g.model.prefill(prompt)
    first = logits.float().clone()
    t = prompt.shape[1]
    g.ids[:, :t].copy_(prompt)
    g.tok.copy_(logits.argmax(-1, keepdim=True))
    g.ids[:, t:t + 1].copy_(g.tok)
    g.pos.fill_(t)
    sync()
    t1 = time.perf_counter()
    for _ in range(new_tokens - 1):
        g.graph.replay()
    sync()
    t2 = time.perf_counter()
    ids = g.ids[:, :t + new_tokens].clone()
    return ids, first, (t1 - t0) * 1e3, (t2 - t1) * 1e3 / max(1, new_tokens - 1)


def measure(torch, model, mode, prompt, new_tokens, iters, sync):
    def start():  # what a mode sets up once; returns a generation of n tokens
        if mode == "graph":
            g = GraphedDecode(torch, model, prompt.shape[0], model.slots.shape[0])
            return lambda n: generate_graphed(torch, g, prompt, n, sync)
        prefill, decode = mode_fns(torch, model, mode)
        return lambda n: generate(torch, prefill, decode, prompt, n, sync)

    with torch.inference_mode():
        # Time to first result: the set-up, the prefill and one decode step, compiles and
        # captures included (the same steps kiln's `05_gpt --compile-latency` times).
        t0 = time.perf_counter()
        run = start()
        run(2)
        first_ms = (time.perf_counter() - t0) * 1e3
        for _ in range(2):  # warm-up: compiles and captures
            run(new_tokens)
        runs = [run(new_tokens) for _ in range(iters)]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    pre, dec = med([r[2] for r in runs]), med([r[3] for r in runs])
    return {"prefill_ms": pre, "decode_ms_per_token": dec,
            "tokens_per_s": prompt.shape[0] * 1e3 / dec, "first_result_ms": first_ms}


def rel_l2(torch, a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return float(torch.linalg.vector_norm(a - b) / max(float(torch.linalg.vector_norm(b)), 1e-30))


def check_f32_ids(torch, sd, cfg, path, device):
    kiln, _ = load_file(path)
    prompt, ids = kiln["prompt"].to(device), kiln["ids"]
    n = ids.shape[1] - prompt.shape[1]
    model = build_model(torch, sd, cfg, torch.float32, device, prompt.shape[0])
    with torch.inference_mode():
        mine, logits, _, _ = generate(torch, model.prefill, model.decode, prompt, n, lambda: None)
    mine = mine.cpu()
    diff = (mine != ids).nonzero()
    first = int(diff[:, 1].min()) - prompt.shape[1] if diff.numel() else -1
    return {"ok": first < 0, "new_tokens": n, "batch": prompt.shape[0], "first_mismatch": first,
            "prefill_logits_rel_l2": rel_l2(torch, kiln["prefill_logits"], logits)}


def check_bf16_logits(torch, sd, cfg, path, device, tol=2e-2):
    kiln, _ = load_file(path)
    prompt = kiln["prompt"].to(device)
    model = build_model(torch, sd, cfg, torch.bfloat16, device, prompt.shape[0])
    with torch.inference_mode():
        logits = model.prefill(prompt).float()
    err = rel_l2(torch, kiln["prefill_logits"], logits)
    return {"ok": err < tol, "rel_l2": err, "tol": tol}


def check_bf16_decode_logits(torch, sd, cfg, path, device, tol=2e-2):
    """kiln's logits at the decode steps its file keeps (decode_logits_step_<i>: step 1 reads the
    prefill's token) against torch's bf16 model fed kiln's own ids, so both sides see the same
    tokens at every step and their logits compare even where a near-tie made the ids differ."""
    kiln, _ = load_file(path)
    prompt, ids = kiln["prompt"].to(device), kiln["ids"].to(device)
    prefix = "decode_logits_step_"
    steps = sorted(int(k[len(prefix):]) for k in kiln if k.startswith(prefix))
    if not steps:
        return {"ok": False, "error": "no %s* tensors in %s" % (prefix, path)}
    model = build_model(torch, sd, cfg, torch.bfloat16, device, prompt.shape[0])
    t = prompt.shape[1]
    errs = {}
    with torch.inference_mode():
        model.prefill(prompt)
        for i in range(1, steps[-1] + 1):
            pos = torch.full((1,), t + i - 1, dtype=torch.long, device=device)
            logits = model.decode(ids[:, t + i - 1:t + i], pos)
            if i in steps:
                errs[i] = rel_l2(torch, kiln[prefix + str(i)], logits.float())
    return {"ok": all(e < tol for e in errs.values()), "rel_l2_by_step": errs, "tol": tol}


def check_hf(torch, sd, cfg, device, prompt_len=32):
    try:
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        return {"ok": True, "skipped": "transformers not importable: %s" % e}
    hc = GPT2Config(n_layer=cfg["n_layer"], n_embd=cfg["n_embd"], n_head=cfg["n_head"],
                    vocab_size=cfg["vocab_size"], n_positions=cfg["n_positions"],
                    activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, layer_norm_epsilon=1e-5, tie_word_embeddings=True)
    hf = GPT2LMHeadModel(hc)
    strip = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}
    missing, unexpected = hf.transformer.load_state_dict(strip, strict=False)
    missing = [k for k in missing if not k.endswith("attn.bias") and not k.endswith("masked_bias")]
    hf.tie_weights()
    hf = hf.to(device).eval()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg["vocab_size"], (1, prompt_len), generator=g).to(device)
    model = build_model(torch, sd, cfg, torch.float32, device, 1)
    with torch.inference_mode():
        ref = hf(tokens).logits[:, -1].float()
        mine = model.prefill(tokens)
    err = rel_l2(torch, mine, ref)
    return {"ok": err < 1e-5 and not missing and not unexpected, "rel_l2": err,
            "missing": missing, "unexpected": list(unexpected)}


def run(args):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sd, meta = load_file(args.weights)
    cfg = config_of(meta, args)
    out = {"source": "pytorch-gpt", "torch_version": torch.__version__,
           "gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "config": cfg,
           "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "dtype": args.dtype,
           "results": {}, "checks": {}}
    checks = [("hf_logits", lambda: check_hf(torch, sd, cfg, device))]
    if args.kiln_f32:
        checks.append(("fp32_ids", lambda: check_f32_ids(torch, sd, cfg, args.kiln_f32, device)))
    if args.kiln_bf16:
        checks.append(("bf16_logits",
                       lambda: check_bf16_logits(torch, sd, cfg, args.kiln_bf16, device)))
        checks.append(("bf16_decode_logits",
                       lambda: check_bf16_decode_logits(torch, sd, cfg, args.kiln_bf16, device)))
    for name, fn in checks:
        try:
            out["checks"][name] = fn()
        except Exception as e:  # recorded, and a failed check
            out["checks"][name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        print("check %s: %s" % (name, json.dumps(out["checks"][name])), flush=True)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[args.dtype]
    for b in args.batch:
        g = torch.Generator().manual_seed(1)
        prompt = torch.randint(0, cfg["vocab_size"], (b, args.prompt_len), generator=g).to(device)
        row = out["results"]["b%d" % b] = {}
        for mode in args.modes:
            try:
                model = build_model(torch, sd, cfg, dtype, device, b)
                row[mode] = measure(torch, model, mode, prompt, args.new_tokens, args.iters, sync)
            except Exception as e:
                row[mode] = {"error": "%s: %s" % (type(e).__name__, str(e)[:500])}
            print("b%d %s: %s" % (b, mode, json.dumps(row[mode])), flush=True)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=1)
    return 0 if all(c.get("ok") for c in out["checks"].values()) else 1


def profile_prefill(args):
    """Where torch.compile's prefill at batch args.profile_prefill spends its device time: the
    kernels of 5 profiled calls (after warm-up), total µs per call and count per call, by name."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    sd, meta = load_file(args.weights)
    cfg = config_of(meta, args)
    b, calls = args.profile_prefill, 5
    model = build_model(torch, sd, cfg, torch.bfloat16, "cuda", b)
    prefill, _ = mode_fns(torch, model, "compiled")
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, cfg["vocab_size"], (b, args.prompt_len), generator=g).to("cuda")
    with torch.inference_mode():
        for _ in range(3):
            prefill(prompt)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                prefill(prompt)
            torch.cuda.synchronize()
    rows = [(e.device_time_total / calls, e.count / calls, e.key) for e in prof.key_averages()
            if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print("torch.compile prefill, batch %d, %d tokens: %.1f us device per call, %.0f kernels"
          % (b, args.prompt_len, total, sum(r[1] for r in rows)))
    for us, n, name in rows[:25]:
        print("  %8.1f us %5.0f x  %s" % (us, n, name[:110]))
    return 0


def table(paths, markdown):
    """Markdown: kiln's RESULT JSON files (one per batch) beside the twin's JSON."""
    kiln, torch_json = [], None
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if d.get("source") == "pytorch-gpt":
            torch_json = d
        else:
            kiln.append(d)
    lines = ["## GPT-2 small end to end (examples/05_gpt.cc vs bench/gpt_baseline.py)", "",
             "| batch | side | mode | prefill ms | decode ms/token | tokens/s |",
             "|---:|---|---|---:|---:|---:|"]
    best = {}
    for k in sorted(kiln, key=lambda d: d["batch"]):
        for mode, r in k["modes"].items():
            lines.append("| %d | kiln | %s | %.2f | %.3f | %.0f |" % (
                k["batch"], mode, r["prefill_ms"], r["decode_ms_per_token"], r["tokens_per_s"]))
            _best(best, ("kiln", k["batch"]), r)
        lines.append("| %d | kiln | (decode step: %d kernels) | | | |" % (k["batch"],
                                                                         k["decode_kernels"]))
    if torch_json:
        for key, modes in sorted(torch_json["results"].items(), key=lambda kv: int(kv[0][1:])):
            b = int(key[1:])
            for mode, r in modes.items():
                if "error" in r:
                    lines.append("| %d | torch | %s | error: %s | | |" % (b, mode, r["error"][:80]))
                    continue
                lines.append("| %d | torch | %s | %.2f | %.3f | %.0f |" % (
                    b, mode, r["prefill_ms"], r["decode_ms_per_token"], r["tokens_per_s"]))
                _best(best, ("torch", b), r)
    lines += ["", "| batch | best kiln tokens/s | best torch tokens/s | ratio | best kiln prefill ms"
              " | best torch prefill ms |", "|---:|---:|---:|---:|---:|---:|"]
    for b in sorted({b for _, b in best}):
        k, t = best.get(("kiln", b)), best.get(("torch", b))
        if k and t:
            lines.append("| %d | %.0f | %.0f | %.2fx | %.2f | %.2f |" % (
                b, k["tps"], t["tps"], k["tps"] / t["tps"], k["pre"], t["pre"]))
    if torch_json:
        lines += ["", "Checks: " + ", ".join("%s %s" % (n, "OK" if c.get("ok") else "FAILED")
                                            for n, c in torch_json["checks"].items())]
    text = "\n".join(lines) + "\n"
    with open(markdown, "w") as f:
        f.write(text)
    print(text)
    return 0


def _best(best, key, r):
    cur = best.setdefault(key, {"tps": 0.0, "pre": math.inf})
    cur["tps"] = max(cur["tps"], r["tokens_per_s"])
    cur["pre"] = min(cur["pre"], r["prefill_ms"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--weights")
    p.add_argument("--kiln-f32", help="05_gpt --dtype f32 --out FILE: ids to match")
    p.add_argument("--kiln-bf16", help="05_gpt --dtype bf16 --out FILE: prefill logits to match")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    p.add_argument("--modes", nargs="+", default=["eager", "compiled", "graph"])
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--json")
    p.add_argument("--table", nargs="+", help="JSON files to tabulate (no run)")
    p.add_argument("--markdown", default="gpt.md")
    p.add_argument("--profile-prefill", type=int, metavar="B",
                   help="profile torch.compile's bf16 prefill at batch B (no checks, no timing)")
    for k in ["n_layer", "n_embd", "n_head", "vocab_size", "n_positions"]:
        p.add_argument("--" + k, type=int, help="overrides the file's metadata")
    args = p.parse_args()
    if args.table:
        return table(args.table, args.markdown)
    if not args.weights:
        p.error("--weights is required (or --table)")
    if args.profile_prefill:
        return profile_prefill(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
