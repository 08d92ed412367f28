"""gpt2_torch.py: the PyTorch peer of gpc's GPT-2 training benchmark.

The same model as gpc's d12 (GPT-2 124M: 12 layers, 12 heads, 768 channels,
context 1024, vocabulary 50257 padded to 50304, tied output head, GELU tanh,
pre-norm blocks; --depth, --heads, --channels and --context give gpc's other
shapes: d24 is 24 x 16 x 1024, d36 36 x 20 x 1280, d48 48 x 25 x 1600), written in plain torch.nn as nanoGPT does, and trained the
way a careful PyTorch user would: torch.compile, scaled_dot_product_attention
(flash attention), bf16 autocast with f32 master weights, fused AdamW
(lr 6e-4, betas 0.9/0.95, weight decay 0.1 on 2-D weights), gradient
clipping at 1.0, TF32 allowed for any f32 matrix product. Micro-batch B x T,
gradient accumulation up to --total-batch tokens, random tokens already on
the GPU (throughput does not depend on the text).

--lora R trains rank-R LoRA adapters instead (the peer of `gpc train --lora`):
each of the four projections (c_attn, c_proj, c_fc, mlp_proj) becomes its
frozen base Linear plus (alpha / R) x B A x, A (R x in) and B (out x R) in
f32 with B zero at the start, written in plain PyTorch; the base weights
are held in bf16 without gradients, and only the adapters are in AdamW.

--profile 1 runs one more step under torch.profiler and prints its GPU
time by kernel family (PROFILE lines: products, attention, layernorm,
optimizer, ...) and its 25 longest kernels (KERNEL lines), to set beside
gpc's `GPC_CUDA_PROFILE=1` table.

Prints one line per step and a RESULT line: tokens/s of the median timed
step, MFU against 989 TFLOP/s (6N + 6LCT FLOPs per token, N without the
position embedding), and peak memory (allocated by tensors, and reserved by
PyTorch's caching allocator, which is what the GPU sees).
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        k = k.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        v = v.view(B, T, self.NH, C // self.NH).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class LoRALinear(nn.Module):
    """A frozen Linear plus a rank-R adapter: base(x) + scale * (x A^T) B^T."""

    def __init__(self, base, rank, alpha):
        super().__init__()
        self.base = base
        self.scale = alpha / rank
        self.A = nn.Parameter(torch.randn(rank, base.in_features) / math.sqrt(base.in_features))
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + self.scale * F.linear(F.linear(x, self.A), self.B)


def add_lora(model, rank, alpha):
    """Freezes the model in bf16 and puts adapters on the four projections."""
    model.to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    for block in model.blocks:
        for name in ("c_attn", "c_proj", "c_fc", "mlp_proj"):
            setattr(block, name, LoRALinear(getattr(block, name), rank, alpha).cuda())


class GPT(nn.Module):
    def __init__(self, L, NH, C, T, Vp):
        super().__init__()
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, NH) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        self.head = nn.Linear(C, Vp, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def train_step(opt, run, data, accum, trained):
    """One optimizer step of accum micro-batches: (loss, gradient norm)."""
    opt.zero_grad(set_to_none=True)
    for micro in range(accum):
        x = data[micro & 1, :, :-1]
        y = data[micro & 1, :, 1:]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = run(x, y) / accum
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(trained, 1.0)
    opt.step()
    return loss.item() * accum, norm


# kernel families, first match wins: (family, pattern in the kernel's name)
FAMILIES = [
    ("layernorm", r"layer_norm"),
    ("attention backward", r"bprop|bwd|backward.*(flash|fmha|sdpa)|dot_do_o|convert_dq"),
    ("attention forward", r"fprop|flash|fmha|sdpa|attention"),
    ("products", r"nvjet|gemm|cutlass|xmma|cublas|splitK|gemv"),
    ("optimizer and gradient norm", r"multi_tensor|adam|foreach|norm"),
    ("loss and softmax", r"softmax|nll|cross_entropy|logsumexp"),
    ("gelu (fused)", r"gelu|tanh"),
    ("embedding", r"embedding|index_put|scatter|index_add|sort|radix"),
]


def profile_step(step, tokens):
    """Runs step once under torch.profiler and prints its GPU time by
    kernel family, then the 25 kernels that took the longest."""
    import re
    from collections import defaultdict
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        k = kernels[e.name]
        k[0] += 1
        k[1] += e.time_range.elapsed_us() / 1e3
    families = defaultdict(float)
    for name, (_, ms) in kernels.items():
        family = next((f for f, pat in FAMILIES if re.search(pat, name, re.I)), "other")
        families[family] += ms
    total = sum(families.values())
    print(f"PROFILE torch GPU time {total:.1f} ms a step of {tokens} tokens", flush=True)
    for f, ms in sorted(families.items(), key=lambda x: -x[1]):
        print(f"PROFILE {f:24s} {ms:9.2f} ms {100 * ms / total:5.1f}%", flush=True)
    for name, (n, ms) in sorted(kernels.items(), key=lambda x: -x[1][1])[:25]:
        print(f"KERNEL {ms:9.2f} ms {n:5d} calls  {name[:150]}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--heads", type=int, default=0, help="0: depth (GPT-2 124M's shape rule)")
    p.add_argument("--channels", type=int, default=0, help="0: 64 x heads")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--total-batch", type=int, default=524288)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", type=int, default=1)
    p.add_argument("--lora", type=int, default=0, help="rank of LoRA adapters (0: full training)")
    p.add_argument("--lora-alpha", type=float, default=0, help="LoRA alpha (0: the rank)")
    p.add_argument("--profile", type=int, default=0,
                   help="1: one more step under torch.profiler; GPU time by kernel family")
    a = p.parse_args()
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    L, T, B = a.depth, a.context, a.batch
    NH = a.heads or a.depth
    C = a.channels or 64 * NH
    V, Vp = 50257, 50304
    accum = a.total_batch // (B * T)
    model = GPT(L, NH, C, T, Vp).cuda()
    N = sum(p.numel() for p in model.parameters()) - T * C - (Vp - V) * C
    flops_per_token = 6 * N + 6 * L * C * T
    if a.lora:
        add_lora(model, a.lora, a.lora_alpha or a.lora)
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() >= 2]
    no_decay = [p for p in trained if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups,
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    run = torch.compile(model) if a.compile else model
    data = torch.randint(0, V, (2, B, T + 1), device="cuda")
    print(f"torch {torch.__version__} d{L}: {N / 1e6:.1f}M parameters, B={B} T={T} "
          f"accumulation {accum} ({B * T * accum} tokens a step), bf16 autocast, "
          f"compile={a.compile}"
          + (f", LoRA rank {a.lora}: {sum(p.numel() for p in trained) / 1e6:.2f}M trained"
             if a.lora else ""), flush=True)
    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        lossf, norm = train_step(opt, run, data, accum, trained)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        print(f"step {step + 1:3d}{' (warm-up)' if step < a.warmup else ''} loss {lossf:.4f} "
              f"norm {norm.item():.3f} {dt * 1e3:8.1f} ms {B * T * accum / dt:10.0f} tokens/s",
              flush=True)
    if a.profile:
        profile_step(lambda: train_step(opt, run, data, accum, trained), B * T * accum)
    times.sort()
    med = times[len(times) // 2]
    tps = B * T * accum / med
    print(f"RESULT torch tokens_per_s={tps:.0f} step_ms={med * 1e3:.1f} "
          f"mfu={100 * tps * flops_per_token / 989e12:.1f}% "
          f"peak_allocated_gib={torch.cuda.max_memory_allocated() / 2**30:.2f} "
          f"peak_reserved_gib={torch.cuda.max_memory_reserved() / 2**30:.2f}", flush=True)


if __name__ == "__main__":
    main()
