// The harness instantiated for double (see harness.hpp).
#include "harness.hpp"

namespace flashattn_fuzz {
void fuzz_double(FuzzedDataProvider& fdp) { run_type<double>(fdp); }
}  // namespace flashattn_fuzz
