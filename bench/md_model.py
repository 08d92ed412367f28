"""md_model.py: the memory-traffic model of gpc md's GPU step, shared by
bench/md_gpu.sh and bench/md_gpu_variants.sh so both compare runs against
the same bound.

Per atom and step, with P partners an atom (a full list: 2 pairs / atoms)
and B steps between neighbour-list builds, the DRAM bytes of this layout
(partners' positions are assumed to come from L1/L2, the atoms being sorted
by cell):
  forces     4 P (one 32-bit entry a slot) + 4 (count) + 32 (the force)
             + the atom's own position (32 float64, 16 float32)
  integrate  128 read (x, v, f, x at the build) + 64 written (x, v),
             + 16 with f32 (the float32 position)
  fused step (gpu_step "fused") in place of integrate and the force's
             32 written: 64 read (v, x at the build), + 32 with f32 (the
             float64 position; f64 forces read it already), 64 written
             (x into the other buffer, v), + 16 with f32
  build      (420 + 4 P) / B: bin 40 (positions are written back only
             where wrapping moved them), scatter 12, cell sort 8, gather 164
             (into the build's positions and the float32 ones), copy back
             144, the build 52 and its 4 P of entries
and FLOPs per listed partner: 9 (separation, r^2, test) plus 13 for the
71% within the cutoff ((2.5/2.8)^3), in the pair forces' precision.
Each function takes the run's `gpc md --json` record.
"""


def partners(r):
    """Partners an atom in the full list: each pair counts from both ends."""
    return 2.0 * r["pairs"] / r["atoms"]


def steps_per_build(r):
    """Steps between list builds; the first build is the set-up's."""
    return r["steps"] / max(r["neighbor_builds"] - 1, 1)


def bytes_per_atom_step(r):
    """DRAM bytes an atom-step: forces, integration and the build's share."""
    P = partners(r)
    f32 = r.get("forces") == "f32"
    own = 16 if f32 else 32
    if r.get("gpu_step") == "fused":
        step = 4 * P + 4 + own + 64 + (32 if f32 else 0) + 64 + (16 if f32 else 0)
    else:
        step = 4 * P + 4 + 32 + own + 192 + (16 if f32 else 0)
    return step + (420 + 4 * P) / steps_per_build(r)


def flops_per_atom_step(r):
    """Pair-force FLOPs an atom-step, in the forces' precision."""
    return (9 + 0.71 * 13) * partners(r)
