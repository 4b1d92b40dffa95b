#!/usr/bin/env bash
# bf16 decode on the AMX Xeon (2026-12-06, the developers' machine that week): which layout a program of
# r packed rows should take. Four builds of bench/decode_driver.cpp (one thread, 32768 keys, 8 KV heads,
# d = 128, BHSD), alternated call by call, three rounds; median of 15 calls each:
#   tiles_all  FLASHATTN_DECODE_LANE_ROWS=1   every program on the AMX tile unit (the lane layout)
#   dim_widen  FLASHATTN_DECODE_LANE_ROWS=17  every program in the dim layout, bf16 widened to fp32 on load
#   dim_pairs  DECODE_DRIVER_DEFAULT_TILES    AVX512-BF16 without AMX: the dim layout's vdpbf16ps pairs
#   default    as shipped (tiles from 5 rows)
# Rows: 32 query heads x seq_q 1 = 4 rows, x seq_q 2 = 8, x seq_q 4 = 16; 48 query heads x seq_q 1 = 6.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=/tmp/decode_amx_rows
mkdir -p "$out"
D=(-std=c++17 -O3 -march=native -DNDEBUG -isystem /usr/include/eigen3 -Iinclude -DDECODE_DRIVER_TYPE=Eigen::bfloat16
   bench/decode_driver.cpp -lpthread)
g++ "${D[@]}" -DFLASHATTN_DECODE_LANE_ROWS=1 -o "$out/tiles_all" & g++ "${D[@]}" -DFLASHATTN_DECODE_LANE_ROWS=17 -o "$out/dim_widen"
wait
g++ "${D[@]}" -DDECODE_DRIVER_DEFAULT_TILES -o "$out/dim_pairs" & g++ "${D[@]}" -o "$out/default"
wait
lscpu | grep -E "Model name|^CPU\(s\)" ; grep -o -w -m1 amx_bf16 /proc/cpuinfo || true
for shape in "1 32" "2 32" "4 32" "1 48"; do
  set -- $shape
  for round in 1 2 3; do
    for v in tiles_all dim_widen dim_pairs default; do
      echo "round $round $v $("$out/$v" 32768 "$1" 15 "$2")"
    done
  done
done
