// libFuzzer entry point: the first decoded value picks the scalar type; each type's harness lives in its
// own translation unit (fuzz/type_*.cpp) so that the four compile in parallel. The harness itself, and
// what it checks, is fuzz/harness.hpp.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>

namespace flashattn_fuzz {
void fuzz_float(FuzzedDataProvider& fdp);
void fuzz_double(FuzzedDataProvider& fdp);
void fuzz_half(FuzzedDataProvider& fdp);
void fuzz_bfloat16(FuzzedDataProvider& fdp);
}  // namespace flashattn_fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  switch (fdp.ConsumeIntegralInRange(0, 3)) {
    case 0: flashattn_fuzz::fuzz_float(fdp); break;
    case 1: flashattn_fuzz::fuzz_double(fdp); break;
    case 2: flashattn_fuzz::fuzz_half(fdp); break;
    default: flashattn_fuzz::fuzz_bfloat16(fdp); break;
  }
  return 0;
}
