"""attention_bench.py: PyTorch's scaled_dot_product_attention (causal, bf16,
flash backend) on the GPT-2 shape, the peer of bench/attention_bench.c.

q, k and v are views into one [B, T, 3C] tensor, as in nanoGPT and in gpc,
so both sides read the same layout. Median of --reps timed runs (CUDA
events) after warm-up; backward time = (forward + backward) - forward.
"""
import argparse

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--reps", type=int, default=20)
    a = p.parse_args()
    B, T, NH, hs = a.batch, a.context, a.heads, a.head_size
    C = NH * hs
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    dout = torch.randn(B, NH, T, hs, device="cuda", dtype=torch.bfloat16)

    def fwd():
        q, k, v = qkv.split(C, dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def timed(fn):
        times = []
        for r in range(a.reps + 3):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            torch.cuda.synchronize()
            if r >= 3:
                times.append(e0.elapsed_time(e1))
        times.sort()
        return times[len(times) // 2]

    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        with torch.no_grad():
            f = timed(fwd)
        fb = timed(lambda: fwd().backward(dout))
    flops = 4.0 * B * NH * T * T * hs / 2
    b = fb - f
    print(f"RESULT torch_sdpa B={B} T={T} NH={NH} hs={hs} bf16 fwd_ms={f:.3f} bwd_ms={b:.3f} "
          f"fwd_tflops={flops / (f * 1e9):.1f} bwd_tflops={2.5 * flops / (b * 1e9):.1f} "
          f"torch={torch.__version__}")


if __name__ == "__main__":
    main()
