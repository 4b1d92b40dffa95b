// The harness instantiated for float (see harness.hpp).
#include "harness.hpp"

namespace flashattn_fuzz {
void fuzz_float(FuzzedDataProvider& fdp) { run_type<float>(fdp); }
}  // namespace flashattn_fuzz
