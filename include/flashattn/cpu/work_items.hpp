#pragma once
// The work items of a CPU pass: one program per (batch entry, head, block of rows). Items are numbered so
// that the blocks of one (batch, head) are consecutive, so that a worker taking items in order runs a
// head's blocks back to back (the staged tile cache keeps that head's tiles, staged_tile_cache.hpp).
// Within a head the order is the pass's: heaviest_first hands out the last block first (the heaviest of a
// causal forward or dQ pass), so that the dynamic schedule ends evenly; otherwise ascending (a dK/dV pass,
// whose first key blocks see the most queries under a causal mask).
//
// Every (batch, head) gets the grid's `blocks` items, sized by the longest sequence (sequence.hpp): a
// program whose block starts past its own sequence's end has nothing to do.

#include "flashattn/core/views.hpp"

namespace flashattn::cpu {

struct WorkItem {
  index_t batch, head, block;
};

struct WorkGrid {
  index_t batch = 0, heads = 0, blocks = 0;  // blocks per (batch, head)
  bool heaviest_first = false;

  // Blocks of `rows` rows that cover `len` rows.
  static index_t blocks_of(index_t len, int rows) { return (len + rows - 1) / rows; }

  index_t size() const { return batch * heads * blocks; }
  WorkItem operator[](index_t item) const {
    const index_t in_head = item % blocks;
    const index_t bh = item / blocks;
    return {bh / heads, bh % heads, heaviest_first ? blocks - 1 - in_head : in_head};
  }
};

}  // namespace flashattn::cpu
