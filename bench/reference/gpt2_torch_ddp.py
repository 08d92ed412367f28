"""gpt2_torch_ddp.py: the PyTorch DistributedDataParallel peer of gpc's
data-parallel benchmark (bench/gpt2_ddp.sh).

The model and training settings of gpt2_torch.py (GPT-2 124M, torch.compile,
SDPA flash attention, bf16 autocast, fused AdamW, clipping at 1.0), wrapped in
DDP over NCCL with its default 25 MB gradient buckets overlapped with
backward. One process per GPU; it reads RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR and MASTER_PORT, which both torchrun and `gpc launch` set:

    gpc launch --nproc 2 -- python3 bench/reference/gpt2_torch_ddp.py

Micro-batch B x T per GPU, --total-batch tokens over all GPUs. Rank 0 prints
one line per step and a RESULT line with the tokens/s of the median timed step
(all GPUs together).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt2_torch import GPT  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=12)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--total-batch", type=int, default=0, help="default: B*T*world")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--compile", type=int, default=1)
    a = p.parse_args()
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    L, NH, C, T, B = a.depth, a.depth, 64 * a.depth, a.context, a.batch
    V, Vp = 50257, 50304
    total = a.total_batch or B * T * world
    accum = total // (B * T * world)
    model = GPT(L, NH, C, T, Vp).cuda()
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    ddp = DDP(model, device_ids=[local])
    run = torch.compile(ddp) if a.compile else ddp
    g = torch.Generator(device="cuda").manual_seed(1000 + rank)
    data = torch.randint(0, V, (2, B, T + 1), device="cuda", generator=g)
    if rank == 0:
        print(f"torch {torch.__version__} DDP on {world} GPUs: B={B} T={T} per GPU, "
              f"accumulation {accum}, {total} tokens a step, compile={a.compile}", flush=True)
    times = []
    for step in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for micro in range(accum):
            x = data[micro & 1, :, :-1]
            y = data[micro & 1, :, 1:]
            sync = micro == accum - 1
            ctx = ddp.no_sync() if not sync else torch.enable_grad()
            with ctx:
                with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                    loss = run(x, y) / accum
                loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lossf = loss.item() * accum
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
        if rank == 0:
            print(f"step {step + 1:3d}{' (warm-up)' if step < a.warmup else ''} loss {lossf:.4f} "
                  f"norm {norm.item():.3f} {dt * 1e3:8.1f} ms {total / dt:10.0f} tokens/s",
                  flush=True)
    times.sort()
    med = times[len(times) // 2]
    if rank == 0:
        print(f"RESULT torch_ddp gpus={world} tokens_per_s={total / med:.0f} "
              f"step_ms={med * 1e3:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
