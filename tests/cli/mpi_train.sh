# shellcheck shell=bash disable=SC2154  # sourced: $work, $common and $loss_tolerance belong to the caller
# mpi_train.sh: sourced by the tests of gpc train over MPI on the CPU
# (test_ddp_mpi.sh, test_parallel_mpi.sh), after they set GPC, work and
# fail. It sets the environment mpirun needs here, writes a corpus of 2,500
# short sentences (with documents=1, one document every 25 lines, some of
# them for validation) and prepares $data from it, exits 77 when mpirun,
# python3 or MPI in this build is missing, and picks $seed (GPC_TEST_SEED
# repeats it). Then:
#   train NAME NP ARGS...   one run of `gpc train "${common[@]}" ARGS` into
#                           $work/NAME, under mpirun when NP > 1
#   compare REF RUN         RUN computed what REF did: the losses of every
#                           step within $loss_tolerance (relative), the
#                           final checkpoint's weights, m and v within 1e-3
#                           norm-wise; each test says why its tolerance
command -v mpirun >/dev/null 2>&1 || { echo "mpirun not found: skipped"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "python3 not found: skipped"; exit 77; }
# root in CI containers; one core per rank is plenty for a tiny model;
# MPI's own allocations are not gpc's leaks under the sanitizer build
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0
mpi=(mpirun --oversubscribe --bind-to none -np)

python3 - "$work/corpus.txt" "${documents:-0}" <<'PY'
import random, sys
random.seed(3)
s = ["the cat", "a dog", "my friend", "the old man", "a small bird"]
v = ["sees", "likes", "finds", "follows"]
o = ["the ball", "a tree", "the river", "an apple"]
with open(sys.argv[1], "w") as f:
    for i in range(2500):
        f.write(f"{random.choice(s)} {random.choice(v)} {random.choice(o)}.\n")
        if sys.argv[2] == "1" and i % 25 == 24:
            f.write("%\n")  # 100 documents
PY
data=$work/data
"$GPC" data prepare --input "$work/corpus.txt" --out "$data" --vocab-size 300 >/dev/null 2>"$work/err" ||
  { echo "cannot prepare data: $(cat "$work/err")" >&2; exit 1; }
if ! "${mpi[@]}" 1 "$GPC" train --data "$data" --out "$work/probe" --collectives mpi --layers 1 \
  --heads 1 --channels 8 --context 8 --steps 1 --device cpu --eval-every 0 >/dev/null 2>"$work/err"; then
  grep -q "built without MPI" "$work/err" && { echo "gpc built without MPI: skipped"; exit 77; }
  echo "FAIL: one MPI process does not train: $(cat "$work/err")" >&2
  exit 1
fi

seed=${GPC_TEST_SEED:-$(( $(date +%s%N) % 100000 ))}
echo "seed $seed (set GPC_TEST_SEED to repeat)"

train() { # NAME NP ARGS...: one run into $work/NAME
  local name=$1 np=$2
  shift 2
  if [[ $np -eq 1 ]]; then
    "$GPC" train "${common[@]}" --out "$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err"
  else
    "${mpi[@]}" "$np" "$GPC" train "${common[@]}" --out "$work/$name" "$@" >"$work/$name.out" 2>"$work/$name.err"
  fi || fail "$name: exit $?: $(tail -3 "$work/$name.err")"
}

compare() {
  python3 - "$work/$1" "$work/$2" "$loss_tolerance" <<'PY' || fail "$2 differs from $1"
import array, json, os, sys
ref, run, loss_tol, tol = sys.argv[1], sys.argv[2], float(sys.argv[3]), 1e-3
def losses(d):
    return [json.loads(l)["loss"] for l in open(os.path.join(d, "metrics.jsonl"))]
a, b = losses(ref), losses(run)
ok = len(a) == len(b) == 4
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b)) if ok else 1
if not ok or worst > loss_tol:
    print(f"{run}: losses {b} vs {a} (relative {worst:.2e})")
    sys.exit(1)
def arrays(d):
    raw = open(os.path.join(d, "checkpoint.bin"), "rb").read()
    P = (len(raw) - 256 - 4) // 12
    x = array.array("f")
    x.frombytes(raw[256:256 + 12 * P])
    return [x[i * P:(i + 1) * P] for i in range(3)]
# norm-wise: AdamW divides by sqrt(v), so an element whose gradient is
# almost zero turns rounding of the summation order into a visible step;
# the arrays as a whole must agree to float rounding
errs = []
for name, x, y in zip(("weights", "m", "v"), arrays(ref), arrays(run)):
    norm = sum(p * p for p in x) ** 0.5
    errs.append(sum((p - q) ** 2 for p, q in zip(x, y)) ** 0.5 / norm)
    if errs[-1] > tol:
        print(f"{run}: {name} differ by {errs[-1]:.2e} (relative)")
        sys.exit(1)
print(f"{os.path.basename(run)}: losses within {worst:.1e}, weights/m/v within "
      + "/".join(f"{e:.1e}" for e in errs))
PY
}
