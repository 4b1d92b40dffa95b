#!/usr/bin/env bash
# Speed of two builds of bench_forward (e.g. before and after a change to the headers), alternated on the
# same machine: ROUNDS rounds of [A, B] (B first in odd rounds), each running issue 3's targets
# (bench/targets.py) and bench/run.sh's naive-vs-tiled rows. Raw outputs go to OUT_DIR.
#
#   bash scripts/ab_forward.sh OLD_BENCH_FORWARD NEW_BENCH_FORWARD OUT_DIR [ROUNDS=2]
#
# Build the old binary from a worktree of the old commit: git worktree add /tmp/old OLD_COMMIT, then
# bench/run.sh's cmake lines there (or FLASHATTN_BENCH_BUILD_DIR). Nothing else should run meanwhile.
set -euo pipefail
old="$1" new="$2" out="$3" rounds="${4:-2}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
threads=$(nproc)
runsh() {  # bench/run.sh's rows, on binary $1
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE FLASHATTN_BENCH_THREADS=1 "$1" --benchmark_counters_tabular=true \
    --benchmark_filter='^(naive|tiled)/fp32/N:(512|1024|2048|4096)/d:128/causal:0/threads:1/'
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE FLASHATTN_BENCH_THREADS=1 "$1" --benchmark_counters_tabular=true \
    --benchmark_filter='^(causal_vs_full/fp32/N:4096/d:128|vs_fp32/(bf16|fp16)/N:4096/d:128/causal:0|vs_sgemm/fp32/N:4096)/'
  if [ "$threads" -gt 1 ]; then
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE FLASHATTN_BENCH_THREADS="1,$threads" "$1" \
      --benchmark_counters_tabular=true --benchmark_filter='^scaling/'
  fi
}
for r in $(seq 1 "$rounds"); do
  order=(old new)
  [ $((r % 2)) -eq 1 ] && order=(new old)
  for which in "${order[@]}"; do
    bin=$old
    [ "$which" = new ] && bin=$new
    echo "== round $r: $which ($bin): targets.py ==" >&2
    python3 "$root/bench/targets.py" --bench "$bin" > "$out/targets_${which}_r$r.txt" 2>&1
    tail -12 "$out/targets_${which}_r$r.txt" >&2
    echo "== round $r: $which: run.sh rows ==" >&2
    runsh "$bin" > "$out/run_sh_${which}_r$r.txt" 2>&1
  done
done
echo "done: $out" >&2
