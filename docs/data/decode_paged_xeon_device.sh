# Device runs of 2026-12-06 (issue 22, KV caches): the scripts behind decode_prefetch_variants_xeon.txt, decode_ab_rows_xeon.txt, paged_xeon.txt.
# run.sh: each binary's rows as JSON -> one line per row (FLASHATTN_BENCH_THREADS=1, pinned with taskset -c $PIN).

#### run.sh
#!/bin/bash
# usage: run.sh filter bins...
f=$1; shift
for n in "$@"; do
  FLASHATTN_BENCH_THREADS=1 taskset -c ${PIN:-3} /tmp/pf/$n --benchmark_format=json --benchmark_filter="$f" 2>/dev/null | python3 -c "
import json,sys
d=json.load(sys.stdin)
for b in d['benchmarks']:
    nm=b['name'].split('/iterations')[0]
    print('$n', nm[:45].ljust(45), 'GBps %.2f'%b['kv_GBps'], 'x_read %.3f'%b['x_read'], ('x_contig %.3f'%b['x_contiguous']) if 'x_contiguous' in b else '')
"
done

#### device_prefetch.sh
#!/usr/bin/env bash
# Device run (issue 22): decode prefetch distance/hint variants on the Xeon, paged and ragged-batch rows; tests of the cache paths.
set -uo pipefail
exec > >(tee "$OUT/log.txt") 2>&1
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3"; g++ --version | head -1
mkdir -p /tmp/pf
cp ab_base/run.sh /tmp/pf/run.sh
pids=""
for v in "a:-DFLASHATTN_DECODE_AHEAD_TILES=1" "f:-DFLASHATTN_DECODE_AHEAD_TILES=1 -DFLASHATTN_DECODE_HINT=_MM_HINT_T1" "c:-DFLASHATTN_DECODE_AHEAD_TILES=2 -DFLASHATTN_DECODE_HINT=_MM_HINT_T1" "d:-DFLASHATTN_DECODE_AHEAD_TILES=3 -DFLASHATTN_DECODE_HINT=_MM_HINT_T1" "b:-DFLASHATTN_DECODE_AHEAD_TILES=2"; do
  n=${v%%:*}; f=${v#*:}
  g++ -O3 -DNDEBUG -march=native -std=c++17 $f -Iinclude -isystem /usr/include/eigen3 bench/bench_decode.cpp -o /tmp/pf/$n -lbenchmark -lpthread & pids="$pids $!"
done
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1 || echo "cmake failed"
( ninja -C build-dev test_kv_cache test_decode > build.log 2>&1 || tail -20 build.log ) & pids="$pids $!"
wait $pids
for t in test_kv_cache test_decode; do echo "== $t"; ./build-dev/tests/$t --gtest_brief=1 2>&1 | tail -3; done
export PIN=3
for r in 1 2; do
  timeout 200 /tmp/pf/run.sh 'decode/(bf16|fp16|fp32)/kv:32768/q:1|paged/bf16/kv:32768/page:(16|64|256)/hnd|batch8/bf16' a f c d b
done 2>&1 | tee $OUT/prefetch_variants.txt

#### device_ab_decode3.sh
#!/usr/bin/env bash
set -uo pipefail
mkdir -p /tmp/pf
[ -x /tmp/pf/old ] || g++ -O3 -DNDEBUG -march=native -std=c++17 -Iab_base/old/include -isystem /usr/include/eigen3 ab_base/old/bench/bench_decode.cpp -o /tmp/pf/old -lbenchmark -lpthread &
g++ -O3 -DNDEBUG -march=native -std=c++17 -Iinclude -isystem /usr/include/eigen3 bench/bench_decode.cpp -o /tmp/pf/n1 -lbenchmark -lpthread &
g++ -O3 -DNDEBUG -march=native -std=c++17 -DFLASHATTN_DECODE_HINT=_MM_HINT_T0 -Iinclude -isystem /usr/include/eigen3 bench/bench_decode.cpp -o /tmp/pf/n0 -lbenchmark -lpthread &
wait
for r in 1 2 3; do timeout 100 bash ab_base/run.sh 'decode/(bf16|fp32)/kv:32768/q:1/threads:1' old n1 n0; done 2>&1 | tee $OUT/ab_decode3.txt
timeout 100 bash ab_base/run.sh 'paged/bf16/kv:32768/page:(16|64)/hnd' n1 n0 2>&1 | tee $OUT/paged3.txt
