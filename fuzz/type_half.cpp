// The harness instantiated for Eigen::half (see harness.hpp).
#include "harness.hpp"

namespace flashattn_fuzz {
void fuzz_half(FuzzedDataProvider& fdp) { run_type<Eigen::half>(fdp); }
}  // namespace flashattn_fuzz
