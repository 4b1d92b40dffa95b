#!/usr/bin/env bash
# Device run for issue 21's last piece: AMX on the shared skeleton. Tests on the real tile unit, bit identity
# old vs new (native, AMX), and bf16 (AMX) speed old vs new alternated against torch.
set -uo pipefail
exec > >(tee "$OUT/log.txt") 2>&1
lscpu | grep -E "Model name|^CPU\(s\)|L2"; grep -o -E "amx[a-z_0-9]*" /proc/cpuinfo | sort | uniq -c; g++ --version | head -1
echo "== tests (native, real AMX)"
cmake -S . -B build-dev -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHATTN_BUILD_BENCHMARKS=OFF -DFLASHATTN_BUILD_EXAMPLES=OFF -DFLASHATTN_INSTALL=OFF > /dev/null 2>&1 || echo "cmake failed"
( ninja -C build-dev test_forward test_forward_isa test_forward_amx test_variants > build.log 2>&1 || tail -20 build.log ) & p1=$!
g++ -std=c++17 -O2 -march=native -DNEW_API -Iab_base/include -isystem /usr/include/eigen3 scripts/same_bits.cpp -o /tmp/bits_old -lpthread & p2=$!
g++ -std=c++17 -O2 -march=native -DNEW_API -Iinclude -isystem /usr/include/eigen3 scripts/same_bits.cpp -o /tmp/bits_new -lpthread & p3=$!
wait $p1 $p2 $p3
date
for t in test_forward_isa test_forward_amx test_forward test_variants; do echo "== $t"; ./build-dev/tests/$t --gtest_brief=1 2>&1 | tail -3; done
echo "== same bits (AMX native): old vs new"; /tmp/bits_old > $OUT/bits_old.txt; /tmp/bits_new > $OUT/bits_new.txt; diff $OUT/bits_old.txt $OUT/bits_new.txt && echo identical
echo "== bf16 speed, one thread pinned, old (base) vs new alternated"
DTYPES=bf16 ROUNDS=5 LAYOUTS=bhsd NS=1024,4096 DS=64,128 CAUSAL=0,1 timeout 240 bash bench/device_variants.sh "base:-Iab_base/include" "new:" 2>&1 | tee $OUT/ab_bf16_t1.txt
echo "== fp32 speed (FMA), one thread"
DTYPES=fp32 ROUNDS=3 LAYOUTS=bhsd NS=4096 DS=128 CAUSAL=0 timeout 70 bash bench/device_variants.sh "base:-Iab_base/include" "new:" 2>&1 | tee $OUT/ab_fp32_t1.txt
