// Block-sparse masks (core/block_mask.hpp): the map's tile answers against brute force over every
// rectangle of a small grid, and the promise that a BlockMask call gives exactly the bits of the element
// mask with the same keep() (a skipped tile changes nothing), forward and backward, for fp32, bf16 and
// fp64, on one and two threads, with cells aligned and not aligned to the kernel tiles; the fp64 reference
// checks the result itself; bad maps are rejected with InvalidArgument naming the problem.

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "expect_invalid.hpp"
#include "flashattn/backward.hpp"
#include "flashattn/core/block_mask.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/cpu/context.hpp"
#include "flashattn/forward.hpp"
#include "flashattn/instrument/accounting.hpp"
#include "reference.hpp"
#include "tolerance.hpp"

namespace flashattn::testing {
namespace {

// Document-causal: keys of the query's own document, at or before it. Documents of uneven lengths so that
// their edges fall inside cells and tiles.
struct DocumentCausal {
  std::vector<index_t> doc_start;  // first position of each document, ascending, doc_start[0] = 0
  index_t doc_of(index_t i) const {
    index_t d = 0;
    while (d + 1 < index_t(doc_start.size()) && doc_start[std::size_t(d + 1)] <= i) ++d;
    return d;
  }
  bool operator()(index_t i, index_t j) const { return j <= i && doc_of(i) == doc_of(j); }
};

TileKind brute_force(const DocumentCausal& keep, index_t q0, index_t q1, index_t k0, index_t k1) {
  bool any = false, all = true;
  for (index_t i = q0; i < q1; ++i)
    for (index_t j = k0; j < k1; ++j) {
      any = any || keep(i, j);
      all = all && keep(i, j);
    }
  return !any ? TileKind::Empty : all ? TileKind::Full : TileKind::Partial;
}

TEST(BlockMap, EveryRectangleMatchesBruteForce) {
  const DocumentCausal keep{{0, 7, 19, 20, 33}};
  const index_t n = 41;
  for (index_t cell : {1, 4, 5, 16}) {
    const BlockMap map = BlockMap::build(n, n, cell, cell + 1, keep);
    for (index_t q0 = 0; q0 < n; q0 += 3)
      for (index_t q1 = q0 + 1; q1 <= n; q1 += 4)
        for (index_t k0 = 0; k0 < n; k0 += 2)
          for (index_t k1 = k0 + 1; k1 <= n; k1 += 5) {
            const TileKind got = map.tile(q0, q1, k0, k1), want = brute_force(keep, q0, q1, k0, k1);
            // Where a rectangle covers only part of a Partial cell, Partial is the safe answer; it must
            // never claim Empty or Full wrongly.
            if (got != want) {
              ASSERT_EQ(got, TileKind::Partial) << "cell " << cell << " rows [" << q0 << ", " << q1 << ") keys ["
                                                << k0 << ", " << k1 << ")";
            }
            // Rectangles made of whole cells get the exact answer.
            const bool aligned = q0 % cell == 0 && (q1 % cell == 0 || q1 == n) && k0 % (cell + 1) == 0 &&
                                 (k1 % (cell + 1) == 0 || k1 == n);
            if (aligned) {
              ASSERT_EQ(got, want);
            }
          }
  }
}

TEST(BlockMap, DensityCountsCellsThatKeepAnything) {
  // Two documents of 64 in a grid of 128 with 64-cells: the diagonal cells kept, the two others empty.
  const BlockMap map = BlockMap::build(128, 128, 64, 64, DocumentCausal{{0, 64}});
  EXPECT_EQ(map.cell(0, 1), TileKind::Empty);
  EXPECT_EQ(map.cell(1, 0), TileKind::Empty);
  EXPECT_EQ(map.cell(0, 0), TileKind::Partial);
  EXPECT_DOUBLE_EQ(map.density(), 0.5);
}

template <class T>
struct Problem {
  HostTensor<T> q, k, v, o, d_o, dq, dk, dv;
  HostLse lse;
  Problem(index_t sq, index_t sk, index_t hq, index_t hkv, index_t d, std::uint32_t seed)
      : q(Layout::Bshd, 1, sq, hq, d),
        k(Layout::Bshd, 1, sk, hkv, d),
        v(Layout::Bshd, 1, sk, hkv, d),
        o(Layout::Bshd, 1, sq, hq, d),
        d_o(Layout::Bshd, 1, sq, hq, d),
        dq(Layout::Bshd, 1, sq, hq, d),
        dk(Layout::Bshd, 1, sk, hkv, d),
        dv(Layout::Bshd, 1, sk, hkv, d),
        lse(1, hq, sq) {
    fill_normal(q.view(), seed);
    fill_normal(k.view(), seed + 1);
    fill_normal(v.view(), seed + 2);
    fill_normal(d_o.view(), seed + 3);
  }

  struct Result {
    std::vector<double> o, lse, dq, dk, dv;
  };

  template <class Mask>
  Result run(const Mask& mask, int threads, bool backward) {
    const cpu::Context<> ctx{threads};
    attention_forward_masked(ctx, q.cview(), k.cview(), v.cview(), o.view(), mask, {}, lse.view());
    Result r{to_double(o.cview()), to_double(lse.view()), {}, {}, {}};
    if (backward) {
      attention_backward_masked(ctx, q.cview(), k.cview(), v.cview(), o.cview(), d_o.cview(), lse.view(), dq.view(),
                                dk.view(), dv.view(), mask);
      r.dq = to_double(dq.cview()), r.dk = to_double(dk.cview()), r.dv = to_double(dv.cview());
    }
    return r;
  }
};

// Same bits as the element mask, for each cell shape and thread count; and the right result (fp64
// reference, tolerance.hpp's rule) for the forward.
template <class T>
void check_same_bits_as_element_mask(index_t n, const DocumentCausal& keep, bool backward) {
  Problem<T> pr(n, n, 4, 2, 64, 17);
  const auto element = element_mask(n, keep);
  for (int threads : {1, 2}) {
    const auto want = pr.run(element, threads, backward);
    EXPECT_TRUE(matches_reference(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.lse.view(),
                                  1.0 / 8.0, element, 4.0));
    for (index_t cell : {16, 64, 48}) {
      const auto got = pr.run(block_mask(n, n, keep, cell, cell), threads, backward);
      const std::string where = "cell " + std::to_string(cell) + ", threads " + std::to_string(threads);
      EXPECT_EQ(got.o, want.o) << where;
      EXPECT_EQ(got.lse, want.lse) << where;
      EXPECT_EQ(got.dq, want.dq) << where;
      EXPECT_EQ(got.dk, want.dk) << where;
      EXPECT_EQ(got.dv, want.dv) << where;
    }
  }
}

TEST(BlockMask, SameBitsAsElementMaskFp32) {
  check_same_bits_as_element_mask<float>(300, DocumentCausal{{0, 70, 128, 131, 250}}, true);
}
TEST(BlockMask, SameBitsAsElementMaskBf16) {
  check_same_bits_as_element_mask<Eigen::bfloat16>(200, DocumentCausal{{0, 64, 100}}, true);
}
TEST(BlockMask, SameBitsAsElementMaskFp64) {
  check_same_bits_as_element_mask<double>(150, DocumentCausal{{0, 33, 96}}, true);
}

// A map given directly (from the document boundaries, without calling keep per pair) and shared by two
// policies gives the same bits as the built one.
TEST(BlockMask, GivenMapSharedAcrossPolicies) {
  const index_t n = 256, cell = 64;
  const DocumentCausal keep{{0, 128}};
  std::vector<TileKind> cells(16, TileKind::Empty);
  for (index_t qb = 0; qb < 4; ++qb)
    for (index_t kb = 0; kb <= qb; ++kb)
      if (qb / 2 == kb / 2) cells[std::size_t(qb * 4 + kb)] = qb == kb ? TileKind::Partial : TileKind::Full;
  const auto map = std::make_shared<const BlockMap>(n, n, cell, cell, cells);
  for (index_t qb = 0; qb < 4; ++qb)
    for (index_t kb = 0; kb < 4; ++kb)
      ASSERT_EQ(map->cell(qb, kb), BlockMap::build(n, n, cell, cell, keep).cell(qb, kb));
  Problem<float> pr(n, n, 2, 2, 32, 5);
  const auto built = pr.run(block_mask(n, n, keep), 1, false);
  const auto given = pr.run(block_mask(map, keep), 1, false);
  const auto again = pr.run(block_mask(map, [keep](index_t i, index_t j) { return keep(i, j); }), 2, false);
  EXPECT_EQ(given.o, built.o);
  EXPECT_EQ(again.o, built.o);
}

// The point of the map: K and V tiles of empty cells are not read. Four documents of 256 in 1024 keys:
// the element mask reads every tile, the block mask about the kept share (counted by ByteCounter).
TEST(BlockMask, SkipsTheTilesOfEmptyCells) {
  const index_t n = 1024;
  const DocumentCausal keep{{0, 256, 512, 768}};
  Problem<float> pr(n, n, 2, 2, 32, 9);
  const auto block = block_mask(n, n, keep);
  ByteCounter dense, sparse;
  attention_forward_masked(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), element_mask(n, keep), {},
                           LseView{}, dense);
  attention_forward_masked(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.view(), block, {}, LseView{}, sparse);
  const double kept = block.map->density();
  EXPECT_LT(kept, 0.2);
  EXPECT_GT(sparse.read_bytes(Traffic::K), 0);
  // Kernel tiles wider than the 64-cells may straddle an empty and a kept cell: allow twice the share.
  EXPECT_LE(double(sparse.read_bytes(Traffic::K)), 2.0 * kept * double(dense.read_bytes(Traffic::K)));
}

// ---- Bad inputs -------------------------------------------------------------------------------------------

TEST(BlockMaskErrors, BadMapsAndLengths) {
  const auto keep = [](index_t, index_t) { return true; };
  expect_invalid([] { BlockMap(100, 100, 64, 64, std::vector<TileKind>(3)); },
                 "cells must hold q_blocks * k_blocks = 2 * 2 = 4 entries");
  expect_invalid([&] { BlockMap::build(100, 100, 0, 64, keep); }, "block_q and block_k must be >= 1, got block_q=0");
  expect_invalid([&] { BlockMap::build(-1, 100, 64, 64, keep); }, "seq_q and seq_k must be >= 0, got seq_q=-1");
  expect_invalid([&] { block_mask(std::shared_ptr<const BlockMap>(), keep); }, "block_mask: map is null");

  // A map for other lengths than the call's, forward and backward.
  Problem<float> pr(100, 90, 2, 2, 16, 3);
  const auto wrong = block_mask(100, 100, keep);
  expect_invalid([&] { pr.run(wrong, 1, false); },
                 "built for seq_q=100 seq_k=100, but the call has seq_q=100 seq_k=90");
  const auto right = block_mask(100, 90, keep);
  pr.run(right, 1, false);
  expect_invalid(
      [&] {
        attention_backward_masked(pr.q.cview(), pr.k.cview(), pr.v.cview(), pr.o.cview(), pr.d_o.cview(),
                                  pr.lse.view(), pr.dq.view(), pr.dk.view(), pr.dv.view(), wrong);
      },
      "built for seq_q=100 seq_k=100");
}

}  // namespace
}  // namespace flashattn::testing
