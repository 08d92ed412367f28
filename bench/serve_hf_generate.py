"""serve_hf_generate.py: the peer of gpc serve's decode throughput:
Hugging Face transformers' generate on GPT-2 124M (random weights from the
config, bf16, CUDA), greedy, a prompt of --prompt tokens and exactly --new
new tokens per stream (min_new_tokens = max_new_tokens, so no stream stops
early), at each batch size of --batches.

Prints one JSON object: {"transformers": VERSION, "torch": VERSION,
"prompt": P, "new": N, "results": [{"batch": B, "seconds": S,
"tokens_per_s": B * N / S}, ...]}, where S is the median of --reps timed
calls after one warm-up call (CUDA synchronised around each).
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batches", default="1,32,256", help="batch sizes, comma-separated")
    p.add_argument("--prompt", type=int, default=128)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--reps", type=int, default=1)
    a = p.parse_args()
    batches = [int(b) for b in a.batches.split(",") if b]
    torch.manual_seed(0)
    config = GPT2Config()  # GPT-2 124M: 12 layers, 12 heads, 768 channels
    model = GPT2LMHeadModel(config).to(device="cuda", dtype=torch.bfloat16).eval()
    eos = config.eos_token_id
    results = []
    for batch in batches:
        ids = torch.randint(0, config.vocab_size - 1, (batch, a.prompt), device="cuda")
        mask = torch.ones_like(ids)

        def call():
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    do_sample=False,
                    max_new_tokens=a.new,
                    min_new_tokens=a.new,
                    pad_token_id=eos,
                )
            torch.cuda.synchronize()
            return out

        out = call()  # warm-up
        if out.shape != (batch, a.prompt + a.new):
            want = (batch, a.prompt + a.new)
            raise SystemExit(f"generate gave {tuple(out.shape)}, expected {want}")
        times = []
        for _ in range(a.reps):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        s = statistics.median(times)
        results.append({"batch": batch, "seconds": round(s, 4),
                        "tokens_per_s": round(batch * a.new / s, 1)})
    print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                      "prompt": a.prompt, "new": a.new, "results": results}))


if __name__ == "__main__":
    main()
