#!/usr/bin/env python3
"""Checks the layering of include/flashattn (docs/architecture.md): no header includes one from a layer
above its own, and the backend-neutral core names no CPU type, intrinsic or Eigen.

    python3 tests/structure/check_layers.py include/flashattn

Layers, lowest first (a header may include its own layer and those below):
    core/, instrument/      backend-neutral: views, options, params, validation, masks, variants, ...
    cpu/                    the CPU backend
    reference/              the naive Eigen reference (a baseline, not part of the fast path)
    forward.hpp, backward.hpp, combine.hpp, eigen.hpp, flashattn.hpp, version.hpp   the public entry points
Exits 1 with one line per violation.
"""
import pathlib
import re
import sys

LAYER = {"core": 0, "instrument": 0, "cpu": 1, "reference": 2, "": 3}
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]')
# What a backend-neutral header must not mention.
NOT_NEUTRAL = re.compile(r"\bcpu::|immintrin|Eigen|\bIsa\b|__m512|__m256|_mm\d*_")


def layer_of(rel):
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else ""


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "include/flashattn")
    problems = []
    headers = sorted(root.rglob("*.hpp"))
    for path in headers:
        rel = path.relative_to(root).as_posix()
        mine = layer_of(rel)
        if mine not in LAYER:
            problems.append(f"{rel}: folder '{mine}' is not a known layer")
            continue
        text = path.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or not m.group(1).startswith("flashattn/"):
                continue
            target = m.group(1)[len("flashattn/"):]
            theirs = layer_of(target)
            if not (root / target).is_file():
                problems.append(f"{rel}:{n}: includes flashattn/{target}, which does not exist")
            elif LAYER.get(theirs, 99) > LAYER[mine]:
                problems.append(f"{rel}:{n}: layer '{mine or 'public'}' includes flashattn/{target} "
                                f"from the layer above ('{theirs or 'public'}')")
        if LAYER[mine] == 0:
            code = re.sub(r"//[^\n]*", "", text)  # comments may name what lives elsewhere
            for n, line in enumerate(code.splitlines(), 1):
                if NOT_NEUTRAL.search(line):
                    problems.append(f"{rel}:{n}: backend-neutral header names a CPU or Eigen type: {line.strip()}")
    for p in problems:
        print(p)
    print(f"check_layers: {len(headers)} headers, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
