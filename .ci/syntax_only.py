#!/usr/bin/env python3
"""Compiles every translation unit of a configured CMake build folder with -fsyntax-only: the front end
in full (parsing, every template instantiation, the front end's warnings as -Werror errors) without code
generation, which is most of the time these heavily templated files take. Not checked: the warnings of
the optimiser (-Warray-bounds, -Wstringop-*, ...) and linking. CI uses it for the benchmark programs,
which the test build does not build (bench/run.sh and docs/performance.md build them).

    python3 .ci/syntax_only.py BUILD_DIR [PATH_PREFIX ...] [--jobs N]

BUILD_DIR must be configured with -DCMAKE_EXPORT_COMPILE_COMMANDS=ON. Only files under one of the
PATH_PREFIXes (relative to the source tree: a folder, or a file; default: all) are checked. Prints one line per TU as it finishes,
named by its object file (one source can be several TUs, e.g. with different macros).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("prefix", nargs="*", default=[""])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(args.build_dir, "compile_commands.json")) as f:
        entries = json.load(f)
    def wanted(prefix):  # a folder gets a trailing separator (bench/, not bench*); a file is taken as it is
        path = os.path.join(root, prefix)
        return path if os.path.isfile(path) else os.path.join(path, "")

    prefixes = [wanted(p) for p in args.prefix]
    entries = [e for e in entries
               if any(os.path.abspath(os.path.join(e["directory"], e["file"])).startswith(p) for p in prefixes)]
    if not entries:
        sys.exit(f"syntax_only.py: no translation units under {', '.join(prefixes)} in {args.build_dir}")

    def check(entry):
        argv = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
        start = time.time()
        # -fsyntax-only writes no object file; the -o of the original command is ignored.
        proc = subprocess.run(argv + ["-fsyntax-only"], cwd=entry["directory"], capture_output=True, text=True)
        # Named by the object file it stands for (CMake 3.25 writes no "output" key; the -o argument).
        name = argv[argv.index("-o") + 1] if "-o" in argv[:-1] else entry["file"]
        return name, proc.returncode, proc.stdout + proc.stderr, time.time() - start

    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(check, e) for e in entries]
        for i, future in enumerate(as_completed(futures), 1):
            name, rc, out, seconds = future.result()
            status = "ok" if rc == 0 else "FAILED"
            print(f"[{i}/{len(entries)}] {status} {name} ({seconds:.0f} s)", flush=True)
            if rc != 0:
                failed += 1
                print(out, flush=True)
    if failed:
        sys.exit(f"syntax_only.py: {failed} of {len(entries)} translation units failed")


if __name__ == "__main__":
    main()
