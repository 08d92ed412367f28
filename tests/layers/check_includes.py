#!/usr/bin/env python3
"""check_includes.py: fails when an #include in gpc's source goes up a layer.

Usage: check_includes.py [ROOT]   (ROOT: the source tree, default this repo)

Reads the layer order from ROOT/src/LAYERS, then every #include "..." line
of ROOT/src/**/*.{c,h,cu,cuh} and ROOT/include/gpc/*.h. A file's layer is
its folder under src/, or for a public header the layer LAYERS gives it.
An include of a higher layer, or of a peer (same rank, other layer), is a
violation, reported as FILE:LINE with both layers. So is a file or header
that LAYERS does not place, so that a new folder or header is placed
before it is used. Conditional includes count too: a layer must not depend
upward in any build. Exit status: 0 clean, 1 violations, 2 usage errors.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
SOURCE_EXTENSIONS = (".c", ".h", ".cu", ".cuh")


def read_layers(path):
    """{layer: rank} and {public header: layer} from a LAYERS file."""
    ranks, headers = {}, {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) < 2 or not words[0].isdigit():
                sys.exit(f"{path}:{number}: expected 'RANK LAYER [HEADER...]', got: {line.strip()}")
            rank, layer = int(words[0]), words[1]
            ranks[layer] = rank
            for header in words[2:]:
                headers[header] = layer
    return ranks, headers


def sources(root):
    """(path relative to root, its layer or None, why not placed) for every file checked."""
    for folder, _, names in sorted(os.walk(os.path.join(root, "src"))):
        for name in sorted(names):
            if name.endswith(SOURCE_EXTENSIONS):
                rel = os.path.relpath(os.path.join(folder, name), root)
                yield rel, rel.split(os.sep)[1] if rel.count(os.sep) >= 2 else None
    public = os.path.join(root, "include", "gpc")
    if os.path.isdir(public):
        for name in sorted(os.listdir(public)):
            if name.endswith(".h"):
                yield os.path.join("include", "gpc", name), ("gpc/" + name)


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    layers_file = os.path.join(root, "src", "LAYERS")
    if not os.path.isfile(layers_file):
        print(f"check_includes: {layers_file} not found", file=sys.stderr)
        return 2
    ranks, headers = read_layers(layers_file)

    def layer_of_header(name):
        return headers.get(name[len("gpc/"):])

    problems, files, includes = [], 0, 0
    for rel, where in sources(root):
        files += 1
        layer = layer_of_header(where) if where and where.startswith("gpc/") else where
        if layer not in ranks:
            what = f"header {where}" if where and where.startswith("gpc/") else f"folder {where}"
            problems.append(f"{rel}: {what} has no layer in src/LAYERS: add it there")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                match = INCLUDE.match(line)
                if not match:
                    continue
                includes += 1
                target = match.group(1)
                if target.startswith("gpc/"):
                    other = layer_of_header(target)
                    if other is None:
                        problems.append(f"{rel}:{number}: includes \"{target}\", which has no "
                                        f"layer in src/LAYERS: add it there")
                        continue
                elif "/" in target:
                    other = target.split("/", 1)[0]
                    if other not in ranks:
                        problems.append(f"{rel}:{number}: includes \"{target}\": {other} is not "
                                        f"a layer in src/LAYERS")
                        continue
                else:
                    other = layer  # beside the including file
                if other == layer or ranks[other] < ranks[layer]:
                    continue
                how = "a peer of it" if ranks[other] == ranks[layer] else "above it"
                problems.append(f"{rel}:{number}: includes \"{target}\": layer {layer} "
                                f"(rank {ranks[layer]}) may not include layer {other} "
                                f"(rank {ranks[other]}), {how}")
    for problem in problems:
        print(problem)
    if problems:
        print(f"check_includes: {len(problems)} include(s) against the layer order of "
              f"src/LAYERS", file=sys.stderr)
        return 1
    print(f"check_includes: {includes} includes in {files} files, none goes up a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
