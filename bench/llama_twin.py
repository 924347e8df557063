#!/usr/bin/env python3
"""PyTorch/transformers twin of examples/06_llama.cc: writes a seeded Llama-style model as a
Hugging Face folder (nothing downloaded), then checks kiln's results on it against transformers.

  python3 bench/llama_twin.py write DIR [--seed 0] [--family llama|qwen3|yarn|gemma|phi3]
  06_llama --model-dir DIR --dtype f32 --new-tokens 64 --out kiln_f32.json    (and bf16)
  python3 bench/llama_twin.py check DIR kiln_f32.json [kiln_bf16.json ...]

The model: grouped-query attention (8 heads, 2 kv heads), llama3 rope scaling, untied LM head,
weights N(0, 0.08) so that greedy picks are not near ties. --family qwen3 writes a Qwen3 model
instead: per-head q/k norms, biases on all four attention projections, head_dim 48 (not
hidden / heads), a tied head whose checkpoint also carries lm_head.weight. --family yarn: the
Llama model with YaRN rope scaling (factor 4 over 128 original positions) instead of llama3's.
--family gemma: a Gemma model (embeddings scaled by sqrt(hidden), (1 + w) norms in float32, the
tanh GELU, head_dim 64 with 4 heads and one kv head, a tied head). --family phi3: a Phi-3 model
(fused qkv_proj and gate_up_proj in the checkpoint, untied head). `check` prints one "check: ... OK" or
"MISMATCH" line per comparison and exits 1 on any mismatch:
  - float32 files: every prompt's greedy ids (each mode) equal transformers' greedy ids for that
    prompt alone (a fresh full forward per token), and the prefill logits agree to 1e-4 relative;
  - bfloat16 files: the prefill logits are judged by the numerics policy against transformers in
    float32: kiln's root-mean-square error is at most 2x transformers' bf16 error plus a floor of
    8e-3 x the reference's root mean square.
"""
import argparse
import json
import math
import sys

import torch
from bench_common import policy_bound
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


def qwen3_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, head_dim=48, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu", tie_word_embeddings=True,
        attention_bias=True, initializer_range=0.08))


def gemma_model():
    from transformers import GemmaConfig, GemmaForCausalLM
    return GemmaForCausalLM(GemmaConfig(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
        rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="gelu_pytorch_tanh",
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, initializer_range=0.08))


def phi3_model():
    from transformers import Phi3Config, Phi3ForCausalLM
    return Phi3ForCausalLM(Phi3Config(
        vocab_size=512, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
        original_max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
        hidden_act="silu", tie_word_embeddings=False, initializer_range=0.08,
        pad_token_id=0, bos_token_id=1, eos_token_id=2))


def config(rope_scaling=None):
    return LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=688,
                       num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                       max_position_embeddings=512, rope_theta=10000.0, rms_norm_eps=1e-5,
                       hidden_act="silu", tie_word_embeddings=False, initializer_range=0.08,
                       rope_scaling=rope_scaling or {
                           "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                           "high_freq_factor": 4.0, "original_max_position_embeddings": 128})


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0}


def write(args):
    torch.manual_seed(args.seed)
    if args.family == "qwen3":
        model = qwen3_model()
    elif args.family == "gemma":
        model = gemma_model()
    elif args.family == "phi3":
        model = phi3_model()
    else:
        model = LlamaForCausalLM(config(YARN if args.family == "yarn" else None))
    with torch.no_grad():  # RMSNorm weights away from 1 and biases away from 0, so they show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # Gemma's norms apply 1 + w: w near 0
                p.copy_((args.family != "gemma") + 0.1 * torch.randn_like(p))
            if name.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
    model.save_pretrained(args.dir, safe_serialization=True)
    if args.family == "qwen3":  # the tied head's key too, as some exporters write it
        from safetensors.torch import load_file, save_file
        path = f"{args.dir}/model.safetensors"
        tensors = load_file(path)
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
        save_file(tensors, path, metadata={"format": "pt"})
    import transformers
    print(f"wrote {args.dir}: transformers {transformers.__version__} "
          f"{type(model).__name__}, seed {args.seed}; config.json:")
    with open(f"{args.dir}/config.json") as f:
        print(f.read())


def load(directory, dtype, device):
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=dtype).to(device)
    return model.eval()


@torch.no_grad()
def last_logits(model, prompt, device):
    ids = torch.tensor([prompt], device=device)
    return model(ids).logits[0, -1].float()


@torch.no_grad()
def greedy(model, prompt, n, device):
    ids, out, gaps = list(prompt), [], []
    for _ in range(n):
        logits = last_logits(model, ids, device)
        top = torch.topk(logits, 2).values
        gaps.append((top[0] - top[1]).item())
        out.append(int(torch.argmax(logits)))
        ids.append(out[-1])
    return out, min(gaps)


def check_line(what, ok, detail=""):
    print(f"check: {what:<58} {'OK' if ok else 'MISMATCH'}{detail}")
    return ok


def rms(a):
    return math.sqrt(float((a.double() ** 2).mean()))


def check(args):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref32 = load(args.dir, torch.float32, device)
    ok = True
    for path in args.kiln:
        with open(path) as f:
            k = json.load(f)
        prompts, n = k["prompts"], len(next(iter(k["modes"].values()))[0])
        kiln_logits = torch.tensor(k["prefill_logits"], dtype=torch.float64)
        want = torch.stack([last_logits(ref32, p, device).double().cpu() for p in prompts])
        if k["dtype"] == "float32":
            for i, p in enumerate(prompts):
                ids, gap = greedy(ref32, p, n, device)
                for mode, tokens in k["modes"].items():
                    ok &= check_line(f"{path}: prompt {i} {mode}: {n} greedy ids vs transformers",
                                     tokens[i] == ids, f" (smallest top-2 gap {gap:.3g})")
            err = (kiln_logits - want).abs().max().item()
            scale = want.abs().max().item()
            ok &= check_line(f"{path}: prefill logits vs transformers (float32)",
                             err <= 1e-4 * max(1.0, scale), f" max |diff| {err:.3g}")
        else:
            ref16 = load(args.dir, torch.bfloat16, device)
            torch16 = torch.stack([last_logits(ref16, p, device).double().cpu() for p in prompts])
            e_kiln, e_torch = rms(kiln_logits - want), rms(torch16 - want)
            bound = policy_bound(e_torch, rms(want))
            ok &= check_line(f"{path}: prefill logits, numerics policy vs float32",
                             e_kiln <= bound,
                             f" rms error kiln {e_kiln:.3g}, torch bf16 {e_torch:.3g}, "
                             f"bound {bound:.3g}")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("dir")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--family", choices=["llama", "qwen3", "yarn", "gemma", "phi3"], default="llama")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("kiln", nargs="+")
    args = parser.parse_args()
    return write(args) or 0 if args.command == "write" else check(args)


if __name__ == "__main__":
    sys.exit(main())
