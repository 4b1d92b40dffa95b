#!/usr/bin/env bash
# Several builds of the kernels, side by side with PyTorch in one process: each LABEL:DEFINES argument
# builds bench/torch_shim.cpp with those compile definitions, then bench/compare_torch.py alternates every
# build and torch shape by shape. For trying a kernel change on a machine too noisy for separate runs.
# DEFINES come before the repository's -Iinclude, so "-Isome/other/include" builds another version of the
# headers (e.g. `git archive HEAD include | tar -x -C ab_base` for "base:-Iab_base/include").
#   bash bench/device_variants.sh "base:" "prefetch:-DFLASHATTN_PREFETCH=1" "nocache:-DFLASHATTN_STAGED_TILE_CACHE_BYTES=0"
# Environment: THREADS (default 1), PIN (taskset core list; default 3 with one thread, none otherwise), LAYOUTS,
# NS, DS, CAUSAL, DTYPES, ROUNDS, REPS (compare_torch.py's options).
set -euo pipefail
mkdir -p /tmp/flashattn-shims
flags=(-O2 -march=native -std=c++17 -shared -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -Wl,-Bsymbolic
       -Iinclude -I/usr/include/eigen3)
shims=""
for cfg in "$@"; do
  name=${cfg%%:*}
  read -r -a defs <<< "${cfg#*:}"
  g++ "${defs[@]}" "${flags[@]}" bench/torch_shim.cpp -o "/tmp/flashattn-shims/$name.so" -lpthread &
  shims="$shims${shims:+,}$name=/tmp/flashattn-shims/$name.so"
done
wait
echo "# builds: $*"
threads=${THREADS:-1}
pin=${PIN-}
[ "$threads" = 1 ] && pin=${PIN:-3}
${pin:+taskset -c "$pin"} python3 bench/compare_torch.py --shim "$shims" --threads "$threads" \
  --layouts "${LAYOUTS:-bhsd,bshd}" --n "${NS:-1024,4096}" --d "${DS:-64,128}" --causal "${CAUSAL:-0,1}" --dtypes "${DTYPES:-fp32}" \
  --rounds "${ROUNDS:-3}" --reps "${REPS:-3}"
