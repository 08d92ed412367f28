"""cli_random.py: random command lines against gpc's promise about bad input
(run by test_cli_random.sh; not a test by itself).

Each command line is one of gpc's commands: most of the time with its
required arguments (a real run, real data, a fresh output folder), then a
random handful of its own options (read from its help) with values of the
kind each option's metavar names, or from a pool of the awkward: empty,
negative, zero, huge, NaN, infinity, not a number, 64 KiB of one letter,
missing, empty and garbage files, devices that do not exist. Every path is
inside the scratch folder, so a command that creates what it writes
litters nothing else. Every line must end the way the README says:

  - exit status 0, 1 (runtime error) or 2 (usage error): no signal, no
    other status, no sanitizer report;
  - on 1 or 2 the last line of standard error is the error, one line that
    starts with "gpc" (gpc doctor instead reports problems on standard
    output, with status 1);
  - a usage error (2) is that one line alone: nothing ran before it.

A line that takes longer than --timeout seconds (a valid training run,
say) is counted and left. The seed is printed; GPC_TEST_SEED repeats a run.

  python3 cli_random.py --gpc GPC --work DIR [--runs 200] [--budget-s 120]
"""
import argparse
import os
import random
import re
import shlex
import subprocess
import sys
import time

COMMANDS = ["data prepare", "data synth", "train", "sample", "import hf", "export hf", "merge",
            "quantize", "tokenize", "eval", "plan", "doctor", "report", "md", "stencil", "submit",
            "queue", "show", "logs", "cancel", "gpu", "sched simulate"]
SANITIZERS = ("AddressSanitizer", "LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


def help_of(gpc, command):
    """A command's help: gpc help WORD, and after it, for a two-word command,
    its own --help."""
    words = command.split()
    text = subprocess.run([gpc, "help", words[0]], capture_output=True, text=True).stdout
    if len(words) > 1:
        text += subprocess.run([gpc] + words + ["--help"], capture_output=True, text=True).stdout
    return text


def options_of(text):
    """The --options a help lists, each with its metavar ("" for a flag):
    "--steps N", "--device auto|cpu|cuda", "--out RUN"."""
    found = {}
    for m in re.finditer(r"^\s+(--[a-z][a-z0-9-]*)(?: (\S+))?(?:\s{2,}|$)", text, re.M):
        found.setdefault(m.group(1), m.group(2) or "")
    # the usage lines spell out choices: "[--device auto|cpu|cuda]"
    for m in re.finditer(r"(--[a-z][a-z0-9-]*) ([^\s\[\]]+\|[^\s\[\]]+)", text):
        found[m.group(1)] = m.group(2)
    return found


def required_of(text, command):
    """(positional metavars, required options) of the command's usage line
    in its help: "gpc quantize RUN --to int8|fp8 [--scales ...] --out RUN2"
    gives (["RUN"], ["--to", "--out"]); of a group "(--data DIR |
    --text-file F)" the first."""
    head = "usage: gpc " + command
    line = next((u for u in text.splitlines() if u == head or u.startswith(head + " ")), "")
    line = line[len(head):]
    while True:
        bare = re.sub(r"\[[^\[\]]*\]", "", line)
        if bare == line:
            break
        line = bare
    line = re.sub(r"\(([^()|]*)\|[^()]*\)", r"\1", line)
    tokens = [t for t in line.split() if t != "|"]
    positional = []
    while tokens and not tokens[0].startswith("-"):
        positional.append(tokens.pop(0))
    return positional, re.findall(r"(--[a-z][a-z0-9-]*)", " ".join(tokens))


def make_files(work):
    files = {"garbage": os.urandom(4096), "empty": b"", "text.txt": b"the cat sees the dog.\n" * 40,
             "trace.csv": b"submit,duration,gpus\n0,60,1\n5,30,2\n"}
    for name, data in files.items():
        with open(os.path.join(work, name), "wb") as f:
            f.write(data)


def value_pools(work):
    """Values of each kind, and "any": all of them and the awkward rest."""
    w = lambda name: os.path.join(work, name)
    kinds = {
        "int": ["0", "1", "2", "7", "64", "-1", "99999999999999999999", "9223372036854775807",
                "1e308", "abc", "1.5", "0x10", "1k", ""],
        "float": ["0", "0.5", "1", "-1", "1e-9", "1e308", "nan", "inf", "-inf", "abc", ""],
        "folder": [w("run"), w("data"), w("out"), w("cwd"), w("missing/dir"), w("garbage"), ""],
        "file": [w("text.txt"), w("garbage"), w("empty"), w("run/config.json"), w("missing/file"),
                 w("data"), ""],
        "device": ["cpu", "cuda", "cuda:0", "cuda:999", "auto", "tpu", "cuda:-1", ""],
        "model": ["d1", "d4", "d0", "d12", "d9999", "dx", "12"],
        "list": ["qkv,proj", "qkv", "fc,fcproj,qkv,proj", ",", "bogus", "1,2,3", ""],
    }
    rest = ["-", "--", "x" * 65536, "1G", "-0", "0.0000001", "all", "block", "bf16", "int8", "fp8"]
    kinds["any"] = sorted({v for values in kinds.values() for v in values} | set(rest))
    return kinds


def value_kind(metavar):
    m = metavar.strip("[]")
    if m in ("DIR", "RUN", "OUT", "FOLDER", "RUN2"):
        return "folder"
    if m in ("FILE", "PATH", "TRACE", "CSV", "JSON", "URL"):
        return "file"
    if m in ("DEV", "DEVICE"):
        return "device"
    if m == "dN":
        return "model"
    if m in ("LIST", "TARGETS"):
        return "list"
    if m in ("X", "A", "P", "F", "LR", "R2", "SCALE"):
        return "float"
    if re.fullmatch(r"[A-Z]|JOB|[A-Z_]*(COUNT|STEPS|TOKENS|SIZE|BYTES|SEED|MS|MB|SECONDS|SHARE|S)", m):
        return "int"
    return "any"


def good_value(name, work, i):
    """A value a required option takes in a line meant to get past parsing."""
    w = lambda f: os.path.join(work, f)
    return {"--data": w("data"), "--run": w("run"), "--init-from": w("run"), "--out": w(f"out{i}"),
            "--input": w("text.txt"), "--trace": w("trace.csv")}.get(name)


def draw_args(rng, options, required, kinds, work, i):
    """Most of the time the command's required options with good values,
    then a random handful of its options, each with a value of its
    metavar's kind most of the time, or any awkward value."""
    args = []
    positional, names = required
    if rng.random() < 0.7:
        for metavar in positional:
            if "|" in metavar:
                args.append(rng.choice(metavar.split("|")))
            elif metavar == "RUN":
                args.append(os.path.join(work, "run"))
            else:
                args.append(rng.choice(kinds[value_kind(metavar)]))
        for name in names:
            value = good_value(name, work, i)
            metavar = options.get(name, "")
            if not value and "|" in metavar:
                value = rng.choice(metavar.split("|"))
            args += [name, value if value else rng.choice(kinds[value_kind(metavar)])]
    names = sorted(options)
    for _ in range(rng.randint(0, 6)):
        name = rng.choice(names)
        args.append(name)
        metavar = options[name]
        if metavar and "|" in metavar and rng.random() < 0.5:
            args.append(rng.choice(metavar.split("|")))
        elif metavar and rng.random() < 0.9:
            kind = value_kind(metavar) if rng.random() < 0.75 else "any"
            args.append(rng.choice(kinds[kind]))
        elif not metavar and rng.random() < 0.2:
            args.append(rng.choice(kinds["any"]))
    return args


def verdict(command, rc, out, err):
    """None when the line ended as promised, else what was wrong."""
    for s in SANITIZERS:
        if s in err:
            return "a sanitizer report"
    if rc not in (0, 1, 2):
        return f"exit status {rc}" + (" (a signal)" if rc < 0 or rc >= 128 else "")
    if rc == 0:
        return None
    lines = [line for line in err.splitlines() if line.strip()]
    if command == "doctor" and rc == 1 and not lines:
        return None if "problem" in out else "doctor's status 1 without a problem on its output"
    if not lines:
        return f"exit status {rc} without a message"
    if not lines[-1].startswith("gpc"):
        return f"the last line of standard error is not gpc's error: {lines[-1][:200]!r}"
    if rc == 2 and len(lines) != 1:
        return f"a usage error of {len(lines)} lines, not one"
    return None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--gpc", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--budget-s", type=float, default=120)
    p.add_argument("--timeout", type=float, default=10)
    a = p.parse_args()
    seed = int(os.environ.get("GPC_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    rng = random.Random(seed)
    print(f"cli_random: seed {seed} (GPC_TEST_SEED={seed} repeats this run)", flush=True)
    make_files(a.work)
    kinds = value_pools(a.work)
    helps = {c: help_of(a.gpc, c) for c in COMMANDS}
    options = {c: options_of(helps[c]) for c in COMMANDS}
    required = {c: required_of(helps[c], c) for c in COMMANDS}
    missing = [c for c in COMMANDS if not options[c]]
    if missing:
        print(f"FAIL: no options read from the help of: {', '.join(missing)}", flush=True)
        return 1
    env = dict(os.environ, GPC_SOCKET=os.path.join(a.work, "no-gpcd.sock"),
               ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", "") + ":detect_leaks=0")
    cwd = os.path.join(a.work, "cwd")
    os.makedirs(cwd, exist_ok=True)
    failures = ran = slow = 0
    statuses = {}
    start = time.monotonic()
    for i in range(a.runs):
        if time.monotonic() - start > a.budget_s:
            break
        command = rng.choice(COMMANDS)
        args = [a.gpc] + command.split() + draw_args(rng, options[command], required[command],
                                                     kinds, a.work, i)
        try:
            r = subprocess.run(args, capture_output=True, timeout=a.timeout, env=env, cwd=cwd,
                               stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            slow += 1
            continue
        ran += 1
        statuses[r.returncode] = statuses.get(r.returncode, 0) + 1
        out = r.stdout.decode(errors="replace")
        err = r.stderr.decode(errors="replace")
        why = verdict(command, r.returncode, out, err)
        if why:
            failures += 1
            shown = " ".join(shlex.quote(x if len(x) < 100 else x[:20] + "...") for x in args)
            print(f"FAIL: {why}\n  {shown}\n  stderr: {err[-1500:]}", flush=True)
    counts = ", ".join(f"{n} exited {s}" for s, n in sorted(statuses.items()))
    print(f"cli_random: {ran} command lines ({counts}), {slow} past {a.timeout:.0f} s, "
          f"{failures} failed", flush=True)
    if ran < min(a.runs, 50):
        print(f"FAIL: only {ran} command lines ran within the budget", flush=True)
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
