#pragma once
// The CPU side of score tables (core/variants.hpp): before a tile whose rows are keys and whose lanes are
// queries (the forward's Sᵀ, the backward's dQ program) is scored by a policy that reads a table (a bias),
// the table's block for that tile is transposed into the worker's scratch and bound on a copy of the
// policy, so that each packet of queries is one contiguous load instead of a gather from rows seq_k floats
// apart. Measured on Zen 5 (docs/performance.md, bias rows): the gather made a bias cost 1.8x the plain
// forward.

#include <algorithm>
#include <memory>

#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/cpu/transpose.hpp"

namespace flashattn::cpu {

// A worker's buffer for one transposed table tile of (keys, ld) floats, allocated on first use: only calls
// whose policy reads a table pay for it.
template <int KeysPerTile, int Ld>
class TableTileBuffer {
 public:
  float* get() {
    if (!buffer_) buffer_ = std::make_unique<AlignedBuffer<float>>(std::size_t(KeysPerTile) * Ld);
    return buffer_->data();
  }

 private:
  std::unique_ptr<AlignedBuffer<float>> buffer_;
};

// Binds, on `policy` (the worker's copy), the tile of its table for queries [q0, q0 + rows) and keys
// [k0, k0 + cols), transposed into `buffer` with leading dimension `ld` (>= rows); lanes rows..ld of each
// key's row are zeros (the packets that run past the tile's last query read them).
template <Isa isa, class Policy>
void bind_table_tile(Policy& policy, float* buffer, int ld, index_t q0, int rows, index_t k0, int cols) {
  ScoreTable& table = score_table_of(policy);
  transpose<isa>(table.values + q0 * table.stride + k0, table.stride, buffer, ld, rows, cols);
  if (rows < ld)
    for (int c = 0; c < cols; ++c) std::fill(buffer + c * ld + rows, buffer + (c + 1) * ld, 0.0f);
  table.tile = buffer;
  table.tile_q0 = q0;
  table.tile_k0 = k0;
  table.tile_ld = ld;
}

}  // namespace flashattn::cpu
