#!/usr/bin/env python3
"""test_check_includes.py: check_includes.py on fixture/, a tree that breaks
its layer order, must fail and name each violation (an include up a layer,
of an upper layer's public header, of a peer, and a public header LAYERS
does not place), and nothing else: includes of the file's own layer, of a
lower layer and of a header beside the file are allowed."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
result = subprocess.run([sys.executable, os.path.join(here, "check_includes.py"),
                         os.path.join(here, "fixture")], capture_output=True, text=True)
expected = {
    'src/core/tensor.c:3: includes "model/graph.h": layer core (rank 1) may not include '
    'layer model (rank 3), above it',
    'src/core/tensor.c:4: includes "gpc/model.h": layer core (rank 1) may not include '
    'layer model (rank 3), above it',
    'src/cpu/kernel.c:3: includes "cuda/stream.h": layer cpu (rank 2) may not include '
    'layer cuda (rank 2), a peer of it',
    'include/gpc/extra.h: header gpc/extra.h has no layer in src/LAYERS: add it there',
}
got = set(result.stdout.splitlines())
if result.returncode != 1 or got != expected:
    print(f"exit status {result.returncode} (want 1)\nstdout:\n{result.stdout}"
          f"stderr:\n{result.stderr}\nmissing: {sorted(expected - got)}\n"
          f"unexpected: {sorted(got - expected)}")
    sys.exit(1)
print("check_includes.py fails on the fixture's", len(expected), "violations, and only those")
