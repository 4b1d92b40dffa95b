// The harness instantiated for Eigen::bfloat16 (see harness.hpp).
#include "harness.hpp"

namespace flashattn_fuzz {
void fuzz_bfloat16(FuzzedDataProvider& fdp) { run_type<Eigen::bfloat16>(fdp); }
}  // namespace flashattn_fuzz
