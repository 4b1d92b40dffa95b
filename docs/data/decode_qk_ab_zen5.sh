#!/usr/bin/env bash
# decode_kernel.hpp's qk before (BASE, bench_decode built from the headers of 584963b) and after (NEW, the
# headers of the commit that brought this file): row blocks as the outer loop, the lane sums stored as four
# quarters, Q packets held in registers. Alternated, ROUNDS rounds, one process per build and round, each
# row's read reference measured in the same process. Raw output: decode_qk_ab_zen5.txt.
#   BASE=/tmp/bd/bench/bench_decode NEW=/tmp/bd_new/bench/bench_decode bash docs/data/decode_qk_ab_zen5.sh
set -euo pipefail
rounds=${ROUNDS:-3}
filter=${FILTER:-'^decode/(fp32|fp16|bf16|fp32q-fp16kv)/kv:32768/q:(1|4)/threads:1/'}
echo "# $(date -u) $(lscpu | grep 'Model name' | sed 's/  */ /g'); filter $filter"
for r in $(seq "$rounds"); do
  for side in BASE NEW; do
    echo "# round $r $side"
    FLASHATTN_BENCH_THREADS=1,2 "${!side}" --benchmark_filter="$filter" --benchmark_counters_tabular=true 2>/dev/null |
      grep -E '^(decode|paged|batch8)/'
  done
done
