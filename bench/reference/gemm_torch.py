"""gemm_torch.py: GPT-2's matrix products in PyTorch, alone: the peer of
bench_gemm_search's heuristic times (the same shapes, names and layouts).

For N tokens and C channels it times, as the median of --runs runs (CUDA
events around each) after --warmup untimed ones, each product the way
PyTorch's training step runs it: the forward as F.linear with its bias
(cuBLASLt's bias epilogue), dinp as dout @ W and dweight as dout^T @ inp,
all bf16. It prints which cuBLASLt PyTorch loaded, then one line a shape:

  TORCH shape=NAME ms=T tflops=F kernel=NAME

where kernel is the GPU kernel the product ran (from torch.profiler). Each
time is one call between two CUDA events, so it includes the call's launch
and any memset cuBLASLt issues before its kernel: about 10% over the same
kernels inside PyTorch's training step. Read it for the kernel names; for
times, set the kernels' own times from a profile beside gpc's.

  python3 gemm_torch.py [--tokens 16384] [--channels 1280] [--shape NAME|all]
"""
import argparse
import ctypes
import statistics

import torch
import torch.nn.functional as F


def shapes(C):
    """(name, inputs' widths): forward (in, out, bias), dinp (out, in), dweight (out, in)"""
    widths = {"qkv": (C, 3 * C), "attproj": (C, C), "fc": (C, 4 * C), "fcproj": (4 * C, C)}
    out = []
    for layer, (i, o) in widths.items():
        out.append((f"{layer}_fwd", "fwd", i, o))
        out.append((f"{layer}_dinp", "dinp", i, o))
        out.append((f"{layer}_dweight", "dweight", i, o))
    return out


def product(kind, N, i, o):
    """The call for one product, on fresh random bf16 operands."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    w = torch.randn(o, i, **bf) * 0.02
    if kind == "fwd":
        x, b = torch.randn(N, i, **bf), torch.randn(o, **bf)
        return lambda: F.linear(x, w, b)
    dout = torch.randn(N, o, **bf)
    if kind == "dinp":
        return lambda: dout @ w
    x = torch.randn(N, i, **bf)
    return lambda: dout.t() @ x


def median_ms(call, runs, warmup):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def kernel_name(call):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return "+".join(names) or "none"


def cublaslt_version():
    with open("/proc/self/maps") as f:
        libs = {line.split()[-1] for line in f if "libcublasLt" in line}
    for lib in libs:
        try:
            return f"{ctypes.CDLL(lib).cublasLtGetVersion()} ({lib})"
        except OSError:
            continue
    return "not loaded"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--channels", type=int, default=1280)
    p.add_argument("--shape", default="all")
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    a = p.parse_args()
    torch.manual_seed(1234)
    N, C = a.tokens, a.channels
    torch.zeros(1, device="cuda") @ torch.zeros(1, device="cuda")
    print(f"torch {torch.__version__} CUDA {torch.version.cuda}, cuBLASLt {cublaslt_version()}",
          flush=True)
    for name, kind, i, o in shapes(C):
        if a.shape not in ("all", name):
            continue
        call = product(kind, N, i, o)
        ms = median_ms(call, a.runs, a.warmup)
        print(f"TORCH shape={name} ms={ms:.4f} tflops={2 * N * i * o / ms / 1e9:.1f} "
              f"kernel={kernel_name(call)[:120]}", flush=True)


if __name__ == "__main__":
    main()
