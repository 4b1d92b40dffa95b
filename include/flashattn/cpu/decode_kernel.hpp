#pragma once
// One decode program: the few query rows of a decoding step (seq_q ≤ kRows, one token or a speculative
// handful) of the query heads of one GQA group, packed as the rows of one tile, against a range of keys
// of their shared KV head. Decoding is bound by reading K and V, not by arithmetic: each K/V element
// feeds only (rows) multiply-adds. So the program reads each K/V byte of its range once for all the rows
// it packs (a whole GQA group when kRows holds it), and it has no padding waste: the prefill kernel
// (forward_kernel.hpp) would compute a single query row as a full panel of PanelQ rows.
//
// The layout turns around for it. The prefill kernel holds query rows in vector lanes and broadcasts K
// and V elements; here the vectors run along the head dim:
//   qk: S[r][j] = Σ_c Q[r][c] · K[j][c]   dot products of a staged Q row with a K row, kRowBlock rows ×
//       kKeyBlock keys per register block, each block's partial sums reduced across lanes at the end;
//   pv: O[r][c] = alpha[r] · O[r][c] + Σ_j P[r][j] · V[j][c]   V rows as vectors, P elements broadcast.
// The scores are stored transposed, Sᵀ[j][r] with kRows lanes, so that online_softmax.hpp runs unchanged
// (rows past the packed ones are idle lanes: cheap next to the K/V work, since they cost per key, not per
// K/V element).
//
// K and V rows are read in place, 16-bit ones widened as they are loaded, when their dim stride is 1 and
// d a whole number of packets; else each tile is converted into a padded Acc buffer first. bf16 queries
// with bf16 K/V on AVX512_BF16 without AMX multiply bf16 pairs instead (decode_bf16.hpp): K/V in place or
// staged as bf16, never widened.
//
// On the AMX tile unit (Isa::Amx, bf16) programs of kLaneRows rows or more run the two products as the
// prefill kernel's AMX tile operations with kRows lanes (tile_ops_amx.hpp), in its transposed layout (Oᵀ
// as (d, kRows), V staged transposed): the tile unit spends no more on a program of 16 rows than on one
// of 5, so a step of speculative decoding's few rows per head costs about what one row does. Fewer rows
// (one token of a GQA group of 4) do not pay for the staging; they take the dim layout.
//
// The program leaves each row's unnormalised output and softmax state in a SplitKvPartials buffer; the
// scheduler merges a row's key ranges and writes O and the LSE (forward_scheduler.hpp), so sinks and
// output transforms are applied there, once per row.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstddef>
#include <limits>
#include <optional>
#include <type_traits>

#include "flashattn/core/forward_params.hpp"
#include "flashattn/core/kv_source.hpp"
#include "flashattn/core/masks.hpp"
#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/cpu/aligned_buffer.hpp"
#include "flashattn/cpu/convert.hpp"
#include "flashattn/cpu/decode_bf16.hpp"
#include "flashattn/cpu/online_softmax.hpp"
#include "flashattn/cpu/simd.hpp"
#if defined(__SSE__)
#include <xmmintrin.h>
#endif
#include "flashattn/cpu/split_kv.hpp"
#include "flashattn/cpu/tile_ops_amx.hpp"
#include "flashattn/cpu/tiles.hpp"
#include "flashattn/instrument/accounting.hpp"

namespace flashattn::cpu {

// Rows of K or V to bring towards L1 while other rows are computed on: decoding streams K and V once, and
// the hardware prefetchers alone leave the memory idle while a tile is being computed on. Always on here
// (unlike prefetch.hpp's, which the compute-bound prefill kernel leaves off by default). One pointer per
// row, so that rows spread over pages are fetched as well as evenly spaced ones. Into L2, not L1: on Zen 4
// that reads 15 % faster, on the Xeon as fast (docs/inference.md, "Prefetching"); a tile ahead is far
// enough (two or three tiles measured no faster).
template <int MaxRows>
struct StreamAhead {
  const char* first = nullptr;  // evenly spaced rows: the first, and the spacing in bytes
  index_t stride_bytes = 0;
  bool listed = false;          // else one pointer per row in row[]
  const char* row[MaxRows];
  int rows = 0, row_bytes = 0;
  void issue(int r0, int r1) const {
#if defined(__SSE__)
    for (int r = r0; r < r1 && r < rows; ++r) {
      const char* p = listed ? row[r] : first + r * stride_bytes;
      for (int off = 0; off < row_bytes; off += 64) _mm_prefetch(p + off, _MM_HINT_T1);
    }
#else
    (void)r0;
    (void)r1;
#endif
  }
};

template <class T, int HeadDim, Isa isa>
class DecodeKernel {
 public:
  using Acc = acc_t<T>;
  using V = Simd<Acc, isa>;
  using Reg = typename V::Reg;
  static constexpr int W = V::width;
  static constexpr int kRows = 16;    // packed query rows per program: the lanes of Sᵀ
  static constexpr int BlockKV = 64;  // keys per tile
  // Register blocks: qk keeps kRowBlock × kKeyBlock dot products, pv kRowBlock rows × kPackets packets of O.
  // 16 accumulators plus their operands fit AVX-512's 32 registers; AVX2's 16 take half the keys (packets).
  static constexpr int kRowBlock = 4;
  static constexpr int kKeyBlock = is_avx512(isa) ? 4 : 2;
  static constexpr int kPackets = is_avx512(isa) ? 4 : 2;
  static constexpr Acc kLog2e = Acc(1.4426950408889634074);
  using Softmax = OnlineSoftmax<Acc, kRows, isa>;
  using Ahead = StreamAhead<BlockKV>;
  static_assert(kRows % W == 0, "kRows must be a whole number of packets");
  // The lane layout: the prefill kernel's tile operations with kRows lanes (tile_ops*.hpp), query rows in
  // vector lanes (or tile columns), K and V staged as the prefill kernel stages them, Oᵀ as (d, kRows).
  // Programs of kLaneRows rows or more run it. On the AMX tile unit that is 5 rows: the tile unit's cost
  // does not depend on how many of its 16 rows are used, but staging K and V for it costs more than the
  // dim layout's vector work on 4 rows, and less than on 6 (docs/inference.md has the measurements). On
  // vector units the dim layout stays the faster one even at 16 rows for bf16 and fp16 (fp32 gains a few
  // percent), so there the lane layout is off. FLASHATTN_DECODE_LANE_ROWS=n sets the threshold: for
  // measuring, and for test_decode_amx, which runs every program in it.
  using LaneOps = TileOps<T, kRows, BlockKV, HeadDim, isa>;
  static constexpr bool kAmxTiles = is_bf16<T> && isa == Isa::Amx && kHasAmx;
#if defined(FLASHATTN_DECODE_LANE_ROWS)
  static constexpr int kLaneRows = FLASHATTN_DECODE_LANE_ROWS;
#else
  static constexpr int kLaneRows = kAmxTiles ? 5 : kRows + 1;
#endif
  // Whether any program can run in the lane layout (else LaneOps is never instantiated, nor its buffers
  // allocated), and whether a program of `rows` rows does.
  static constexpr bool kLanesUsed = kLaneRows <= kRows;
  static bool lane_layout(int rows) { return kLanesUsed && rows >= kLaneRows; }
  // The dim layout's bf16 pairs where vdpbf16ps is compiled in and AMX is not (decode_bf16.hpp). On the
  // Xeon that has AMX, vdpbf16ps takes the FMA ports for twice as long, which makes the pairs slower than
  // widening bf16 to fp32 as it is loaded (a shift); on Zen 4 they are faster.
  static constexpr bool kBf16Dot = is_bf16<T> && isa == Isa::Avx512Bf16 && kHasAvx512Bf16;
  using Bf16Dot = detail::DecodeBf16Dot<T>;
  // What a worker's thread holds while it runs programs (the AMX tile configuration), else nothing; a
  // worker's Scratch holds it.
  using WorkerSetup = std::conditional_t<kLanesUsed, worker_setup_t<LaneOps>, detail::NoWorkerSetup>;
  // Elements per step of the head dim in the dim layout: a packet of Acc, or 32 bf16 (16 pairs).
  static constexpr int kDimStep = kBf16Dot ? 2 * W : W;

  // Whether a call's query rows are few enough for this kernel.
  static constexpr bool takes(index_t seq_q) { return seq_q >= 1 && seq_q <= kRows; }
  // Query heads a program packs: as many whole heads of one group as kRows rows hold (at least one).
  static index_t heads_per_program(index_t seq_q, index_t group) {
    return std::max<index_t>(1, std::min<index_t>(group, kRows / std::max<index_t>(1, seq_q)));
  }
  // LaneOps's buffers, where the lane layout is used.
  static std::size_t lane_elems(int d) {
    if constexpr (kLanesUsed) return LaneOps::lane_elems(d);
    return 0;
  }
  static std::size_t stage_elems(int d) {
    if constexpr (kLanesUsed) return LaneOps::stage_elems(d);
    return 0;
  }
  // The head dim rounded up to whole steps: rows of the staged Q, O and K/V buffers.
  static int padded(int d) { return (d + kDimStep - 1) / kDimStep * kDimStep; }

  class Scratch {
   public:
    // dk: the head dim of Q and K; dv: of V and O. dpk, dpv: the same rounded up to whole steps.
    Scratch(int dk, int dv)
        : dpk_(padded(dk)),
          dpv_(padded(dv)),
          q_(std::size_t(kRows) * dpk_),
          o_(std::size_t(kRows) * dpv_),
          kv_(std::size_t(BlockKV) * std::max(dpk_, dpv_)),
          st_(std::size_t(BlockKV) * kRows),
          alpha_(kRows),
          q16_(kBf16Dot ? std::size_t(kRows) * dpk_ : 0),
          kv16_(kBf16Dot ? std::size_t(BlockKV + 1) * std::max(dpk_, dpv_) : 0),
          pp_(kBf16Dot ? std::size_t(BlockKV / 2) * kRows : 0),
          q_rows_(kLanesUsed ? std::size_t(kRows) * dk : 0),
          row_buf_(kLanesUsed ? std::size_t(std::max(dk, dv)) : 0),
          qt_(lane_elems(dk)),
          stage_(std::max(stage_elems(dk), stage_elems(dv))) {
      std::fill(st_.data(), st_.data() + st_.size(), Acc(0));  // idle lanes stay finite
      std::fill(kv16_.data(), kv16_.data() + kv16_.size(), std::uint16_t(0));
    }
    int dpk() const { return dpk_; }
    int dpv() const { return dpv_; }
    Acc* q(int r) { return q_.data() + std::size_t(r) * dpk_; }  // (kRows, dpk) scaled query rows
    Acc* o(int r) { return o_.data() + std::size_t(r) * dpv_; }  // (kRows, dpv) unnormalised output rows
    Acc* kv() { return kv_.data(); }  // (BlockKV, padded(d)) a staged K or V tile
    Acc* st() { return st_.data(); }                            // (BlockKV, kRows) Sᵀ, then Pᵀ
    Acc* alpha() { return alpha_.data(); }                      // (kRows) O rescale of the current tile
    // bf16 pairs (kBf16Dot only): Q rows as bf16 bits, a staged K or V tile as bf16 bits followed by a
    // zero row (the partner of an odd tile's last V row), and Pᵀ as (BlockKV / 2, kRows) pairs.
    std::uint16_t* q16(int r) { return q16_.data() + std::size_t(r) * dpk_; }
    std::uint16_t* kv16() { return kv16_.data(); }
    const std::uint16_t* zero16() const { return kv16_.data() + std::size_t(BlockKV) * std::max(dpk_, dpv_); }
    std::uint32_t* pp() { return pp_.data(); }
    // The lane layout: Q rows as T (kRows, d), then LaneOps's Qᵀ; a staged K or V tile in LaneOps's layout.
    T* q_rows() { return q_rows_.data(); }
    Acc* row_buf() { return row_buf_.data(); }
    typename LaneOps::LaneElem* qt() { return qt_.data(); }
    typename LaneOps::StagedElem* stage() { return stage_.data(); }

   private:
    WorkerSetup setup_;  // first: set up before, and torn down after, everything that uses it
    int dpk_, dpv_;
    AlignedBuffer<Acc> q_, o_, kv_, st_, alpha_;
    AlignedBuffer<std::uint16_t> q16_, kv16_;
    AlignedBuffer<std::uint32_t> pp_;
    AlignedBuffer<T> q_rows_;
    AlignedBuffer<Acc> row_buf_;
    AlignedBuffer<typename LaneOps::LaneElem> qt_;
    AlignedBuffer<typename LaneOps::StagedElem> stage_;
  };

  // Query heads [h0, h0 + heads) of batch entry b, row r being query r % seq_q of head h0 + r / seq_q,
  // against keys [kv_lo, kv_hi). Leaves row r's unnormalised O, running max (base-2 units) and running
  // sum in `partials` at range `split`, row row_of(head, query).
  template <class Kv, class Layout, class Mask, class RowOf, class Accounting>
  static void run(const ForwardParams<T, Kv, Layout>& p, const Mask& mask, index_t b, index_t h0, int heads, index_t kv_lo,
                  index_t kv_hi, Scratch& s, SplitKvPartials<Acc>& partials, index_t split, RowOf&& row_of,
                  Accounting& acct) {
    using Policy = decltype(policy_for(mask, SequenceInfo{}));
    const int dk = HeadDim > 0 ? HeadDim : int(p.head_dim());
    const int dv = HeadDim > 0 ? HeadDim : int(p.value_dim());
    const int dpk = s.dpk(), dpv = s.dpv();
    const index_t seq_q = p.seqs.q_len(b), seq_k = p.seqs.kv_len(b);
    const int rows = int(heads * seq_q);
    const index_t h_kv = p.kv_head(h0);
    const index_t k_row_bytes = dk * index_t(sizeof(kv_elem_t<Kv>));
    const index_t v_row_bytes = dv * index_t(sizeof(kv_elem_t<Kv>));

    std::array<std::optional<Policy>, kRows> policy;
    index_t begin = seq_k, end = 0;
    for (int g = 0; g < heads; ++g) {
      policy[g].emplace(policy_for(mask, sequence_info(p.seqs, b, h0 + g)));
      begin = std::min(begin, policy[g]->kv_begin(0, seq_q));
      end = std::max(end, policy[g]->kv_end(0, seq_q));
    }
    // Clipped to the keys that exist, so that no mask policy, however written, can make us read past K/V.
    begin = std::max({begin, kv_lo, index_t{0}});
    end = std::min({end, kv_hi, seq_k});

    // Raw scores become base-2 logits inside the softmax, as in the prefill kernel: scaling the dot
    // product rather than Q keeps q·k·scale's order of operations (a Q element that scale would round to 0
    // must still meet an infinite K element as itself: q·inf·scale = ±inf, where 0·inf would be NaN). A
    // score modifier sees natural units scale·q·k, so then only log2(e) remains to apply.
    const Acc score_scale = modifies_scores_v<Policy> ? kLog2e : Acc(p.scale) * kLog2e;
    const TensorView<const T> q = p.q_rows(b);
    const bool lanes = lane_layout(rows);
    if (lanes) {  // the rows gathered as one (rows, dk) matrix, then transposed as the prefill kernel does
      for (int r = 0; r < rows; ++r) {
        const T* q_row = q.row(b, r % seq_q, h0 + r / seq_q);
        for (int c = 0; c < dk; ++c) s.q_rows()[r * dk + c] = q_row[c * q.stride_dim];
      }
      const TensorView<const T> gathered{s.q_rows(), 1, rows, 1, dk, index_t(kRows) * dk, dk, dk, 1};
      if constexpr (kLanesUsed) LaneOps::load_lanes(s.qt(), s.row_buf(), gathered, 0, 0, 0, rows, dk);
      std::fill(s.o(0), s.o(0) + std::size_t(kRows) * dpv, Acc(0));  // Oᵀ (dv, kRows)
    }
    for (int r = 0; r < rows && !lanes; ++r) {
      const T* q_row = q.row(b, r % seq_q, h0 + r / seq_q);
      if constexpr (kBf16Dot) {
        for (int c = 0; c < dpk; ++c) s.q16(r)[c] = c < dk ? Bf16Dot::bits(q_row + c * q.stride_dim) : 0;
      } else {
        load_row(s.q(r), q_row, q.stride_dim, dk);
        std::fill(s.q(r) + dk, s.q(r) + dpk, Acc(0));
      }
      std::fill(s.o(r), s.o(r) + dpv, Acc(0));
    }
    acct.read(Traffic::Q, rows * dk * index_t(sizeof(T)));

    Softmax softmax;
    for (index_t k0 = begin; k0 < end; k0 += BlockKV) {
      const index_t k1 = std::min(k0 + BlockKV, end);
      const int cols = int(k1 - k0);
      std::array<TileKind, kRows> kind;
      bool any = false, all_full = true;
      for (int g = 0; g < heads; ++g) {
        kind[g] = policy[g]->tile(0, seq_q, k0, k1);
        any |= kind[g] != TileKind::Empty;
        all_full &= kind[g] == TileKind::Full;
      }
      if (!any) continue;

      // While Q·Kᵀ runs, this tile's V rows are fetched; while P·V runs, the next tile's K rows.
      const Ahead v_ahead = ahead(p.v, b, h_kv, k0, cols, v_row_bytes);
      const Ahead k_ahead = ahead(p.k, b, h_kv, k1, int(std::min<index_t>(BlockKV, end - k1)), k_row_bytes);
      if (lanes) {
        v_ahead.issue(0, cols);
        if constexpr (kLanesUsed)
          LaneOps::qk(s.st(), s.qt(), LaneOps::stage_for_qk(s.stage(), p.k, b, h_kv, k0, cols, dk), cols, dk);
      } else {
        with_rows(s, p.k, b, h_kv, k0, cols, dk, [&](const auto& k) { qk(s.st(), s, rows, k, cols, v_ahead); });
      }
      acct.read(Traffic::K, cols * k_row_bytes);
      if (!all_full || modifies_scores_v<Policy>) {
        for (int g = 0; g < heads; ++g)
          mask_rows(s.st(), *policy[g], kind[g], int(g * seq_q), int(seq_q), k0, cols, Acc(p.scale));
      }
      softmax.update(s.st(), cols, score_scale, s.alpha());

      if (lanes) {
        k_ahead.issue(0, k_ahead.rows);
        if constexpr (kLanesUsed)
          LaneOps::pv(s.o(0), s.alpha(), s.st(), LaneOps::stage_for_pv(s.stage(), p.v, b, h_kv, k0, cols, dv), cols,
                      dv);
      } else {
        if constexpr (kBf16Dot) Bf16Dot::pack_p(s.st(), s.pp(), cols);
        with_rows(s, p.v, b, h_kv, k0, cols, dv,
                  [&](const auto& v) { pv(s, rows, s.alpha(), s.st(), v, cols, k_ahead); });
      }
      acct.read(Traffic::V, cols * v_row_bytes);
    }

    for (int r = 0; r < rows; ++r) {
      const index_t row = row_of(h0 + r / seq_q, r % seq_q);
      *partials.m(split, row) = softmax.running_max(r);
      *partials.l(split, row) = softmax.running_sum(r);
      store_o_row(s, r, partials.o(split, row), dv, lanes);
    }
    acct.write(Traffic::Partial, rows * partials.row_bytes(dv));
    // The lane layout fills every lane of Sᵀ (and leaves bf16 pairs in it); the dim layout's idle lanes
    // must stay finite, so a later program of few rows on this scratch finds zeros there.
    if (lanes) std::fill(s.st(), s.st() + std::size_t(BlockKV) * kRows, Acc(0));
  }

 private:
  // Whether the micro-kernels read K/V rows of element type E as they are: unit dim stride, d a whole
  // number of packets, and a storage type a packet load takes (Acc itself, or bf16/fp16 widened by
  // detail::load_packet on AVX-512; E is the KV source's, which may be 16-bit under fp32 queries). Rows
  // are reached through one pointer each, so rows spread over pages are read in place too. Else a tile is
  // converted into the scratch buffer first (stage).
  template <class E>
  static constexpr bool kLoadsStorage =
      std::is_same_v<E, Acc> || (std::is_same_v<Acc, float> && is_avx512(isa) && (is_bf16<E> || is_fp16<E>));
  // The rows of a tile as the micro-kernels reach them, rows[j] being key k0 + j's: evenly spaced, or one
  // pointer each (a tile that crosses pages).
  template <class E>
  struct EvenRows {
    const E* first;
    index_t ld;
    const E* operator[](int j) const { return first + j * ld; }
  };
  template <class E>
  struct RowList {
    const E* const* row;
    const E* operator[](int j) const { return row[j]; }
  };
  // f(rows): rows [k0, k0 + cols) of one head, as the storage type in place or staged (as Acc; as bf16
  // for the bf16 pairs).
  template <class Rows, class F>
  static void with_rows(Scratch& s, const Rows& x, index_t b, index_t h, index_t k0, int cols, int d, F&& f) {
    using E = kv_elem_t<Rows>;
    if constexpr (kLoadsStorage<E> || kBf16Dot) {
      if (x.dim_stride() == 1 && d % kDimStep == 0) {
        if (x.even_run(b, h, k0) >= cols) return f(EvenRows<E>{x.row(b, h, k0), x.row_stride()});
        const E* rows[BlockKV];
        row_pointers(x, b, h, k0, cols, rows);
        return f(RowList<E>{rows});
      }
    }
    if constexpr (kBf16Dot) {
      f(EvenRows<std::uint16_t>{stage_bf16(s, x, b, h, k0, cols, d), index_t(padded(d))});
    } else {
      f(EvenRows<Acc>{stage(s, x, b, h, k0, cols, d), index_t(padded(d))});
    }
  }
  // One packet of a K or V row: Acc, or storage widened to it.
  template <class E>
  static Reg load_kv(const E* p) {
    if constexpr (std::is_same_v<E, Acc>) {
      return V::load(p);
    } else {
#if defined(__AVX512F__)
      return detail::load_packet(p);
#else
      static_assert(std::is_same_v<E, Acc>, "no packet load for this storage type on this instruction set");
      return V::zero();
#endif
    }
  }

  // Rows [k0, k0 + n) of one head of a row source, to prefetch (none where the dim stride is not 1).
  template <class Rows>
  static Ahead ahead(const Rows& x, index_t b, index_t h, index_t k0, int n, index_t row_bytes) {
    Ahead a;
    if (n <= 0 || x.dim_stride() != 1) return a;
    if (x.even_run(b, h, k0) >= n) {
      a.first = reinterpret_cast<const char*>(x.row(b, h, k0));
      a.stride_bytes = x.row_stride() * index_t(sizeof(kv_elem_t<Rows>));
    } else {
      const kv_elem_t<Rows>* rows[BlockKV];
      row_pointers(x, b, h, k0, n, rows);
      for (int j = 0; j < n; ++j) a.row[j] = reinterpret_cast<const char*>(rows[j]);
      a.listed = true;
    }
    a.rows = n;
    a.row_bytes = int(row_bytes);
    return a;
  }

  // Rows [k0, k0 + cols) of one head of a row source as Acc rows dp = padded(d) apart, zero past d, in the
  // scratch buffer.
  template <class Rows>
  static const Acc* stage(Scratch& s, const Rows& x, index_t b, index_t h, index_t k0, int cols, int d) {
    const int dp = padded(d);
    for (int j = 0; j < cols; ++j) {
      Acc* dst = s.kv() + std::size_t(j) * dp;
      load_row(dst, x.row(b, h, k0 + j), x.dim_stride(), d);
      std::fill(dst + d, dst + dp, Acc(0));
    }
    return s.kv();
  }

  // The bf16 rows of the staged tile, dp = padded(d) apart: bf16 bits, zero past d (the buffer is shared
  // by K and V, whose head dims may differ).
  template <class Rows>
  static const std::uint16_t* stage_bf16(Scratch& s, const Rows& x, index_t b, index_t h, index_t k0, int cols,
                                         int d) {
    const int dp = padded(d);
    for (int j = 0; j < cols; ++j) {
      const auto* src = x.row(b, h, k0 + j);
      std::uint16_t* dst = s.kv16() + std::size_t(j) * dp;
      for (int c = 0; c < d; ++c) dst[c] = Bf16Dot::bits(src + c * x.dim_stride());
      std::fill(dst + d, dst + dp, std::uint16_t(0));
    }
    return s.kv16();
  }

  // One step of the head dim in qk: packets of Acc multiplied by FMAs (16-bit K/V widened as they are
  // loaded), or 32 bf16 by vdpbf16ps (Bf16Dot).
  struct FmaStep {
    using Operand = Reg;
    template <class E>
    static Reg load_k(const E* p) {
      return load_kv(p);
    }
    // A Q packet is used by kKeyBlock FMAs: held in a register, not folded by the compiler into each
    // FMA's memory operand (GCC does, which makes the loop's loads, not its FMAs, the limit on Zen 5).
    static Reg load_q(const Acc* p) {
      Reg r = V::load(p);
#if defined(__GNUC__) && defined(__AVX512F__)
      if constexpr (is_avx512(isa)) __asm__("" : "+v"(r));
#endif
      return r;
    }
    static Reg madd(Reg acc, Reg q, Reg k) { return V::fma(q, k, acc); }
  };
  using Step = std::conditional_t<kBf16Dot, Bf16Dot, FmaStep>;
  static const auto* staged_q(Scratch& s, int r) {
    if constexpr (kBf16Dot) {
      return s.q16(r);
    } else {
      return s.q(r);
    }
  }

  // Sᵀ[j][r] = q_r · k_j for rows r < rows and keys j < cols. Blocks at the edges repeat their last row
  // or key (computed, not stored), so that every block has the same compile-time shape. Row blocks are the
  // outer loop: a block's Q pointers are set up once, and a GQA group of 4 (one row block) walks the keys
  // with nothing but K pointers to advance; the tile's K rows, re-read by further row blocks, are in L1.
  template <class KRows>
  static void qk(Acc* st, Scratch& s, int rows, const KRows& k, int cols, const Ahead& ahead) {
    using E = std::remove_cv_t<std::remove_pointer_t<decltype(k[0])>>;
    using QElem = std::remove_cv_t<std::remove_pointer_t<decltype(staged_q(s, 0))>>;
    const int dp = s.dpk();
    for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
      const QElem* qr[kRowBlock];
      for (int rr = 0; rr < kRowBlock; ++rr) qr[rr] = staged_q(s, std::min(r0 + rr, rows - 1));
      const int nr = std::min(kRowBlock, rows - r0);
      for (int j0 = 0; j0 < cols; j0 += kKeyBlock) {
        if (r0 == 0) ahead.issue(j0, j0 + kKeyBlock);  // paced with the pass that reads K from memory
        const E* kr[kKeyBlock];
        for (int jj = 0; jj < kKeyBlock; ++jj) kr[jj] = k[std::min(j0 + jj, cols - 1)];
        Reg acc[kRowBlock][kKeyBlock];
        FLASHATTN_UNROLL
        for (int rr = 0; rr < kRowBlock; ++rr)
          FLASHATTN_UNROLL
          for (int jj = 0; jj < kKeyBlock; ++jj) acc[rr][jj] = V::zero();
        for (int c = 0; c < dp; c += kDimStep) {
          typename Step::Operand kv[kKeyBlock];
          FLASHATTN_UNROLL
          for (int jj = 0; jj < kKeyBlock; ++jj) kv[jj] = Step::load_k(kr[jj] + c);
          FLASHATTN_UNROLL
          for (int rr = 0; rr < kRowBlock; ++rr) {
            const typename Step::Operand qv = Step::load_q(qr[rr] + c);
            FLASHATTN_UNROLL
            for (int jj = 0; jj < kKeyBlock; ++jj) acc[rr][jj] = Step::madd(acc[rr][jj], qv, kv[jj]);
          }
        }
        store_sums(acc, st + j0 * kRows + r0, nr, std::min(kKeyBlock, cols - j0));
      }
    }
  }

  // out[jj · kRows + rr] = the sum of acc[rr][jj]'s lanes, for rr < nr and jj < nj.
  static void store_sums(const Reg (&acc)[kRowBlock][kKeyBlock], Acc* out, int nr, int nj) {
#if defined(__AVX512F__)
    if constexpr (std::is_same_v<Acc, float> && is_avx512(isa) && kRowBlock * kKeyBlock == 16) {
      const __m512 sums = sum_lanes_512(acc);  // lane jj · kRowBlock + rr
      if (nr == kRowBlock && nj == kKeyBlock) {  // whole block: four quarters, one per key
        _mm_storeu_ps(out, _mm512_extractf32x4_ps(sums, 0));
        _mm_storeu_ps(out + kRows, _mm512_extractf32x4_ps(sums, 1));
        _mm_storeu_ps(out + 2 * kRows, _mm512_extractf32x4_ps(sums, 2));
        _mm_storeu_ps(out + 3 * kRows, _mm512_extractf32x4_ps(sums, 3));
        return;
      }
      alignas(64) Acc lanes[16];
      _mm512_store_ps(lanes, sums);
      for (int jj = 0; jj < nj; ++jj)
        for (int rr = 0; rr < nr; ++rr) out[jj * kRows + rr] = lanes[jj * kRowBlock + rr];
      return;
    }
#endif
    alignas(64) Acc lanes[W];
    FLASHATTN_UNROLL
    for (int rr = 0; rr < kRowBlock; ++rr)
      FLASHATTN_UNROLL
      for (int jj = 0; jj < kKeyBlock; ++jj) {
        V::store(lanes, acc[rr][jj]);
        Acc sum = Acc(0);
        for (int i = 0; i < W; ++i) sum += lanes[i];
        if (rr < nr && jj < nj) out[jj * kRows + rr] = sum;
      }
  }

#if defined(__AVX512F__)
  // The 16 accumulators' lane sums as one register, lane jj · kRowBlock + rr holding acc[rr][jj]'s (fp32
  // on AVX-512). Every loop over acc is unrolled: an index that is not a compile-time constant would keep
  // the whole block in memory instead of registers. One tree reduces all 16 at once (45 instructions
  // instead of 16 reductions of 8 each): at each level, two registers' halves are added into one register
  // that holds both; the inputs enter in the order pi (an involution), which makes lane L of the result
  // the sum of accumulator L.
  static __m512 sum_lanes_512(const Reg (&acc)[kRowBlock][kKeyBlock]) {
    constexpr int pi[16] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};
    const auto at = [&](int i) { return acc[pi[i] % kRowBlock][pi[i] / kRowBlock]; };
    __m512 y[8], z[4], w[2];
    FLASHATTN_UNROLL
    for (int i = 0; i < 8; ++i)  // 256-bit halves
      y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(at(i), at(i + 8), 0x44), _mm512_shuffle_f32x4(at(i), at(i + 8), 0xEE));
    FLASHATTN_UNROLL
    for (int i = 0; i < 4; ++i)  // 128-bit quarters
      z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[i], y[i + 4], 0x88), _mm512_shuffle_f32x4(y[i], y[i + 4], 0xDD));
    FLASHATTN_UNROLL
    for (int i = 0; i < 2; ++i)  // pairs within quarters
      w[i] = _mm512_add_ps(_mm512_shuffle_ps(z[i], z[i + 2], 0x44), _mm512_shuffle_ps(z[i], z[i + 2], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xDD));
  }
#endif

  // Rows [r0, r0 + n) of Sᵀ (one head's queries 0..n) for a tile of kind `kind`: an Empty tile's scores are
  // all −inf, a Partial one's where the policy drops them; a score modifier is applied to the rest.
  template <class Policy>
  static void mask_rows(Acc* st, const Policy& policy, TileKind kind, int r0, int n, index_t k0, int cols,
                        Acc scale) {
    constexpr Acc neg_inf = -std::numeric_limits<Acc>::infinity();
    if (kind == TileKind::Full && !modifies_scores_v<Policy>) return;
    for (int j = 0; j < cols; ++j) {
      Acc* s_row = st + j * kRows + r0;
      for (int i = 0; i < n; ++i) {
        if (kind == TileKind::Empty || (kind == TileKind::Partial && !policy.keep(i, k0 + j))) {
          s_row[i] = neg_inf;
        } else if constexpr (modifies_scores_v<Policy>) {
          s_row[i] = Acc(policy.score(i, k0 + j, s_row[i] * scale));
        }
      }
    }
  }

  // O rows r < rows: O[r] = alpha[r] · O[r] + Σ_j Pᵀ[j][r] · V[j], in blocks of kRowBlock rows × kPackets
  // packets (then single packets for the rest of the head dim), rows at the edge repeated as in qk. Each
  // block is a pass over the tile's keys; `ahead`'s rows are issued in the first, which reads V from
  // memory, one per key: paced as the data is consumed, so that each row is asked for a tile ahead.
  template <class VRows>
  static void pv(Scratch& s, int rows, const Acc* alpha, const Acc* pt, const VRows& v, int cols,
                 const Ahead& ahead) {
    const int dp = s.dpv();
    if constexpr (kBf16Dot) {  // pairs of keys: 2 × 32 columns per block, then 32
      for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
        int c = 0;
        for (; c + 2 * kDimStep <= dp; c += 2 * kDimStep)
          pv_pairs_block<2>(s, r0, rows, c, alpha, v, cols, r0 == 0 && c == 0 ? &ahead : nullptr);
        for (; c < dp; c += kDimStep) pv_pairs_block<1>(s, r0, rows, c, alpha, v, cols, c == 0 ? &ahead : nullptr);
      }
      return;
    }
    for (int r0 = 0; r0 < rows; r0 += kRowBlock) {
      int c = 0;
      for (; c + kPackets * W <= dp; c += kPackets * W)
        pv_block<kPackets>(s, r0, rows, c, alpha, pt, v, cols, r0 == 0 && c == 0 ? &ahead : nullptr);
      for (; c < dp; c += W) pv_block<1>(s, r0, rows, c, alpha, pt, v, cols, c == 0 ? &ahead : nullptr);
    }
  }

  // ahead: rows to prefetch alongside, one per key (the first block only).
  template <int NC, class VRows>
  static void pv_block(Scratch& s, int r0, int rows, int c, const Acc* alpha, const Acc* pt, const VRows& v,
                       int cols, const Ahead* ahead) {
    int r[kRowBlock];
    for (int rr = 0; rr < kRowBlock; ++rr) r[rr] = std::min(r0 + rr, rows - 1);
    Reg acc[kRowBlock][NC];
    FLASHATTN_UNROLL
    for (int rr = 0; rr < kRowBlock; ++rr) {
      const Reg a = V::set1(alpha[r[rr]]);
      FLASHATTN_UNROLL
      for (int cc = 0; cc < NC; ++cc) acc[rr][cc] = V::mul(V::load(s.o(r[rr]) + c + cc * W), a);
    }
    for (int j = 0; j < cols; ++j) {
      if (ahead != nullptr) ahead->issue(j, j + 1);
      const auto* v_row = v[j] + c;
      Reg vv[NC];
      FLASHATTN_UNROLL
      for (int cc = 0; cc < NC; ++cc) vv[cc] = load_kv(v_row + cc * W);
      FLASHATTN_UNROLL
      for (int rr = 0; rr < kRowBlock; ++rr) {
        const Reg pj = V::set1(pt[j * kRows + r[rr]]);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < NC; ++cc) acc[rr][cc] = V::fma(pj, vv[cc], acc[rr][cc]);
      }
    }
    // Rows repeated at the edge hold the same values as the row they repeat: storing them twice is harmless.
    FLASHATTN_UNROLL
    for (int rr = 0; rr < kRowBlock; ++rr)
      FLASHATTN_UNROLL
      for (int cc = 0; cc < NC; ++cc) V::store(s.o(r[rr]) + c + cc * W, acc[rr][cc]);
  }

  // pv_block on bf16 pairs: NC groups of 32 columns from c, each two packets of O in Bf16Dot::column_of
  // order, keys taken two at a time with their P pairs (s.pp(), packed after the softmax); an odd tile's
  // last key is paired with a zero row.
  template <int NC, class VRows>
  static void pv_pairs_block(Scratch& s, int r0, int rows, int c, const Acc* alpha, const VRows& v, int cols,
                             const Ahead* ahead) {
    int r[kRowBlock];
    for (int rr = 0; rr < kRowBlock; ++rr) r[rr] = std::min(r0 + rr, rows - 1);
    Reg acc[kRowBlock][2 * NC];
    FLASHATTN_UNROLL
    for (int rr = 0; rr < kRowBlock; ++rr) {
      const Reg a = V::set1(alpha[r[rr]]);
      FLASHATTN_UNROLL
      for (int h = 0; h < 2 * NC; ++h) acc[rr][h] = V::mul(V::load(s.o(r[rr]) + c + h * W), a);
    }
    const std::uint32_t* pp = s.pp();
    for (int j = 0; j < cols; j += 2) {
      if (ahead != nullptr) ahead->issue(j, j + 2);
      const void* first = v[j] + c;
      const void* second = j + 1 < cols ? static_cast<const void*>(v[j + 1] + c) : s.zero16() + c;
      typename Step::Operand lo[NC], hi[NC];
      FLASHATTN_UNROLL
      for (int cc = 0; cc < NC; ++cc)
        Bf16Dot::interleave(static_cast<const std::uint16_t*>(first) + cc * kDimStep,
                            static_cast<const std::uint16_t*>(second) + cc * kDimStep, lo[cc], hi[cc]);
      FLASHATTN_UNROLL
      for (int rr = 0; rr < kRowBlock; ++rr) {
        const typename Step::Operand pj = Bf16Dot::broadcast(pp[(j / 2) * kRows + r[rr]]);
        FLASHATTN_UNROLL
        for (int cc = 0; cc < NC; ++cc) {
          acc[rr][2 * cc] = Step::madd(acc[rr][2 * cc], lo[cc], pj);
          acc[rr][2 * cc + 1] = Step::madd(acc[rr][2 * cc + 1], hi[cc], pj);
        }
      }
    }
    FLASHATTN_UNROLL
    for (int rr = 0; rr < kRowBlock; ++rr)
      FLASHATTN_UNROLL
      for (int h = 0; h < 2 * NC; ++h) V::store(s.o(r[rr]) + c + h * W, acc[rr][h]);
  }

  // A program's output row r into the partials: column r of Oᵀ (the lane layout), or row r as it is or in
  // the bf16 pairs' column order.
  static void store_o_row(Scratch& s, int r, Acc* out, int d, bool lanes) {
    const Acc* o = s.o(r);
    if (lanes) {
      for (int c = 0; c < d; ++c) out[c] = s.o(0)[c * kRows + r];
    } else if constexpr (kBf16Dot) {
      for (int g = 0; g < d; g += kDimStep)
        for (int half = 0; half < 2; ++half)
          for (int lane = 0; lane < W; ++lane) {
            const int col = g + Bf16Dot::column_of(half, lane);
            if (col < d) out[col] = o[g + half * W + lane];
          }
    } else {
      std::copy(o, o + d, out);
    }
  }
};

}  // namespace flashattn::cpu
