#!/usr/bin/env python3
"""gpt2_finetune_torch.py: the PyTorch peer of `gpc train --init-from` for
bench/hf_finetune.sh: fine-tunes a transformers GPT-2 folder on a gpc
dataset's training shards, the way gpc does it.

Same model (GPT2LMHeadModel.from_pretrained, dropout off as in gpc), same
tokens (the dataset's train_NNNN.bin shards, read directly), same optimizer
(AdamW, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on 2-D weights only,
gradient norm clipped to 1), same schedule (linear warmup, cosine to 10% of
the peak), bf16 autocast, torch.compile, fused AdamW. The windows of T+1
tokens are taken in a seeded random order (gpc's loader shuffles too, with
its own generator), so the two loss curves agree within noise, not step by
step.

Prints one JSON line per step ({"step", "loss", "ms", "tokens_per_s"}) and
a final RESULT line with the median tokens/s over the steps after the third.
"""
import argparse
import glob
import json
import math
import os
import statistics
import struct
import time

import numpy as np
import torch


def read_shards(folder):
    parts = []
    for path in sorted(glob.glob(os.path.join(folder, "train_*.bin"))):
        with open(path, "rb") as f:
            header = f.read(64)
            assert header[:8] == b"GPCSHARD", path
            (width,) = struct.unpack_from("<I", header, 12)
            (count,) = struct.unpack_from("<Q", header, 16)
            dtype = np.uint16 if width == 2 else np.uint32
            parts.append(np.frombuffer(f.read(count * width), dtype=dtype).astype(np.int64))
    return np.concatenate(parts)


def lr_at(step, lr, warmup, steps, min_ratio=0.1):
    if step < warmup:
        return lr * (step + 1) / warmup
    lo = lr * min_ratio
    return lo + 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) * (lr - lo)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--no-compile", action="store_true")
    a = p.parse_args()
    from transformers import GPT2LMHeadModel
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    model = GPT2LMHeadModel.from_pretrained(a.model, resid_pdrop=0.0, embd_pdrop=0.0,
                                            attn_pdrop=0.0).to(dev).train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    plain = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": plain, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    step_fn = model if a.no_compile else torch.compile(model)
    tokens = read_shards(a.data)
    T, B = a.context, a.batch
    windows = (len(tokens) - 1) // T
    order = np.random.default_rng(a.seed).permutation(windows)
    at, rates = 0, []
    for step in range(a.steps):
        rows = []
        for _ in range(B):
            if at == len(order):
                order, at = np.random.default_rng(a.seed + step).permutation(windows), 0
            w = order[at] * T
            at += 1
            rows.append(tokens[w:w + T + 1])
        batch = torch.from_numpy(np.stack(rows)).to(dev, non_blocking=True)
        x, y = batch[:, :T], batch[:, 1:]
        torch.cuda.synchronize()
        t0 = time.time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.lr, a.warmup, a.steps)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                                 y.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        value = loss.item()
        ms = (time.time() - t0) * 1e3
        rate = B * T / (ms / 1e3)
        if step >= 3:
            rates.append(rate)
        print(json.dumps({"step": step + 1, "loss": value, "ms": ms, "tokens_per_s": rate}))
    print(f"RESULT torch_finetune tokens_per_s={statistics.median(rates) if rates else 0:.0f} "
          f"final_loss={value:.4f} steps={a.steps} batch={B} context={T}")


if __name__ == "__main__":
    main()
