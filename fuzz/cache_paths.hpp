#pragma once
// The KV-cache entry points under the fuzzer (flashattn/kv_cache.hpp). A valid options-mask problem on a
// type's default tiles is run again with its K/V copied into a paged cache (a fuzzed page size, pages in a fuzzed order, unused table
// entries −1, every request's length = seq_k) and through a contiguous cache view of the same K/V: both
// must give the dense call's bits (the same kernel, the same key ranges). About one time in four, one
// argument of the paged call is corrupted instead (a table entry out of range, a length past the table, a
// page size of 0): that must throw InvalidArgument and write nothing. The same problems also run as a packed
// varlen batch of equal lengths (flashattn/varlen.hpp), which must give the dense bits too, and, for fp32,
// with K/V rounded to fp16 (mixed precision, forward.hpp), which must give the bits of the fp32 call on
// those K/V widened back.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "flashattn/kv_cache.hpp"
#include "flashattn/varlen.hpp"

namespace flashattn_fuzz {

template <class T>
struct PagedCopy {
  std::vector<T> k, v;
  std::vector<std::int32_t> table, lengths;
  fa::PagedKvCacheView<const T> view;
};

// The K/V views copied into pages of `page` rows; (page, heads, dim) inside a page.
template <class T>
PagedCopy<T> paged_copy(const fa::TensorView<const T>& k, const fa::TensorView<const T>& v, index_t page, Rng& rng) {
  PagedCopy<T> c;
  const index_t batch = k.batch, seq_k = k.seq, per_seq = (seq_k + page - 1) / page + 1;  // one spare per request
  const index_t pages = batch * per_seq;
  c.k.assign(std::size_t(pages * page * k.heads * k.dim), T(0));
  c.v.assign(std::size_t(pages * page * v.heads * v.dim), T(0));
  c.table.resize(std::size_t(pages));
  for (index_t i = 0; i < pages; ++i) c.table[std::size_t(i)] = std::int32_t(i);
  for (index_t i = pages - 1; i > 0; --i) std::swap(c.table[std::size_t(i)], c.table[std::size_t(rng.below(i + 1))]);
  for (index_t b = 0; b < batch; ++b) c.table[std::size_t(b * per_seq + per_seq - 1)] = -1;  // never read
  c.lengths.assign(std::size_t(batch), std::int32_t(seq_k));
  auto w = fa::paged_kv_cache_nhd(c.k.data(), c.v.data(), pages, page, k.heads, k.dim, c.table.data(), batch,
                                   per_seq, c.lengths.data());
  w.v_pages = fa::bshd(c.v.data(), pages, page, v.heads, v.dim);  // V's head dim may differ from K's
  for (index_t b = 0; b < batch; ++b)
    for (index_t s = 0; s < seq_k; ++s)
      for (index_t h = 0; h < k.heads; ++h) {
        for (index_t d = 0; d < k.dim; ++d) w.k_pages(w.page_of(b, s), s % page, h, d) = k(b, s, h, d);
        for (index_t d = 0; d < v.dim; ++d) w.v_pages(w.page_of(b, s), s % page, h, d) = v(b, s, h, d);
      }
  c.view = w;
  return c;
}

// A contiguous packed (1, batch · seq, heads, dim) copy of a (batch, seq, heads, dim) view.
template <class T>
std::vector<T> packed_copy(const fa::TensorView<const T>& x) {
  std::vector<T> out(std::size_t(x.numel()));
  std::size_t i = 0;
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t d = 0; d < x.dim; ++d) out[i++] = x(b, s, h, d);
  return out;
}

// The same problem as a packed varlen batch of equal lengths: the same kernel and key ranges as the dense
// call, so the same bits, row for row.
template <class Tiles, class T, class Bufs>
void check_varlen_path(const Problem& p, const fa::TensorView<const T>& q, const fa::TensorView<const T>& k,
                       const fa::TensorView<const T>& v, Bufs& bufs) {
  const std::vector<T> qp = packed_copy(q), kp = packed_copy(k), vp = packed_copy(v);
  std::vector<T> op(std::size_t(p.batch * p.seq_q * p.heads_q * p.dim_v), poison<T>());
  std::vector<float> lp(std::size_t(p.batch * p.heads_q * p.seq_q), poison<float>());
  std::vector<std::int32_t> cu_q, cu_k;
  for (index_t b = 0; b <= p.batch; ++b) {
    cu_q.push_back(std::int32_t(b * p.seq_q));
    cu_k.push_back(std::int32_t(b * p.seq_k));
  }
  const index_t total_q = p.batch * p.seq_q, total_k = p.batch * p.seq_k;
  try {
    fa::attention_forward_varlen(fa::cpu::Context<Tiles>{p.threads}, fa::packed<const T>(qp.data(), total_q, p.heads_q, p.dim),
                                 fa::packed<const T>(kp.data(), total_k, p.heads_kv, p.dim),
                                 fa::packed<const T>(vp.data(), total_k, p.heads_kv, p.dim_v),
                                 fa::packed(op.data(), total_q, p.heads_q, p.dim_v),
                                 fa::PackedBatch{cu_q.data(), cu_k.data(), p.batch}, p.opts,
                                 p.want_lse ? fa::lse_packed(lp.data(), p.heads_q, total_q) : fa::LseView{});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    finding("a valid varlen call threw");
  }
  const fa::TensorView<T> o = bufs.to.view();
  const fa::LseView lse = bufs.lse_view(bufs.lse);
  std::size_t i = 0;
  for (index_t b = 0; b < p.batch; ++b)
    for (index_t s = 0; s < p.seq_q; ++s)
      for (index_t h = 0; h < p.heads_q; ++h)
        for (index_t d = 0; d < p.dim_v; ++d, ++i)
          FUZZ_CHECK(same_bits(op[i], o(b, s, h, d)), "a packed varlen batch gave other bits than the dense call");
  if (p.want_lse)
    for (index_t b = 0; b < p.batch; ++b)
      for (index_t h = 0; h < p.heads_q; ++h)
        for (index_t s = 0; s < p.seq_q; ++s)
          FUZZ_CHECK(same_bits(lp[std::size_t(h * total_q + b * p.seq_q + s)], lse(b, h, s)),
                     "a packed varlen batch gave another LSE than the dense call");
}

// fp32 Q/O against fp16 K/V: the bits of the fp32 call on the widened K/V (the same tiles; problems this
// small are not split into key ranges, whose count depends on the bytes per key).
template <class Tiles, class T>
void check_mixed_path(const Problem& p, const fa::TensorView<const T>& q, const fa::TensorView<const T>& k,
                      const fa::TensorView<const T>& v) {
  if constexpr (std::is_same_v<T, float>) {
    using Half = Eigen::half;
    const std::vector<float> qp = packed_copy(q), k32 = packed_copy(k), v32 = packed_copy(v);
    std::vector<Half> kh(k32.size()), vh(v32.size());
    std::vector<float> kw(k32.size()), vw(v32.size());
    for (std::size_t i = 0; i < k32.size(); ++i) {  // K and V apart: their head dims may differ
      kh[i] = Half(k32[i]);
      kw[i] = float(kh[i]);
    }
    for (std::size_t i = 0; i < v32.size(); ++i) {
      vh[i] = Half(v32[i]);
      vw[i] = float(vh[i]);
    }
    const index_t B = p.batch, Sq = p.seq_q, Sk = p.seq_k, D = p.dim, Dv = p.dim_v;
    std::vector<float> o1(std::size_t(B * Sq * p.heads_q * Dv), poison<float>()), o2 = o1;
    std::vector<float> l1(std::size_t(B * p.heads_q * Sq), poison<float>()), l2 = l1;
    const fa::cpu::Context<Tiles> ctx{p.threads};
    try {
      fa::attention_forward(ctx, fa::bshd<const float>(qp.data(), B, Sq, p.heads_q, D),
                            fa::bshd<const Half>(kh.data(), B, Sk, p.heads_kv, D),
                            fa::bshd<const Half>(vh.data(), B, Sk, p.heads_kv, Dv),
                            fa::bshd(o1.data(), B, Sq, p.heads_q, Dv), p.opts,
                            fa::lse_bhs(l1.data(), B, p.heads_q, Sq));
      fa::attention_forward(ctx, fa::bshd<const float>(qp.data(), B, Sq, p.heads_q, D),
                            fa::bshd<const float>(kw.data(), B, Sk, p.heads_kv, D),
                            fa::bshd<const float>(vw.data(), B, Sk, p.heads_kv, Dv),
                            fa::bshd(o2.data(), B, Sq, p.heads_q, Dv), p.opts,
                            fa::lse_bhs(l2.data(), B, p.heads_q, Sq));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception: %s\n", e.what());
      finding("a valid mixed-precision call threw");
    }
    for (std::size_t i = 0; i < o1.size(); ++i)
      FUZZ_CHECK(same_bits(o1[i], o2[i]), "fp32 Q with fp16 K/V gave other bits than fp32 on the widened K/V");
    for (std::size_t i = 0; i < l1.size(); ++i)
      FUZZ_CHECK(same_bits(l1[i], l2[i]), "fp32 Q with fp16 K/V gave another LSE than fp32 on the widened K/V");
  }
}

// o_dense / lse_dense: the dense call's results, in the buffers behind o / lse (bufs.o2 / bufs.lse2 are
// overwritten here).
template <class Tiles, class T, class Bufs>
void check_cache_paths_on(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                          const fa::TensorView<const T>& k, const fa::TensorView<const T>& v, Bufs& bufs) {
  if (p.mask != MaskKind::Options || p.batch == 0 || p.seq_q == 0) return;
  Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
  const index_t page = fdp.ConsumeIntegralInRange<index_t>(1, std::max<index_t>(1, p.seq_k + 1));
  PagedCopy<T> paged = paged_copy(k, v, page, rng);
  const fa::cpu::Context<Tiles> ctx{p.threads};
  fa::TensorView<T> o2 = bufs.to2.view();
  const fa::LseView lse2 = bufs.lse_view(bufs.lse2);

  const int corrupt = fdp.ConsumeIntegralInRange(0, 11);
  if (corrupt < 3) {
    fa::PagedKvCacheView<const T> bad = paged.view;
    if (corrupt == 0) {
      if (p.seq_k == 0) return;
      paged.table[0] = fdp.ConsumeBool() ? -1 : std::int32_t(bad.num_pages());  // request 0's first page
    } else if (corrupt == 1) {
      paged.lengths[std::size_t(p.batch - 1)] = std::int32_t(bad.capacity() + 1);
    } else {
      bad.k_pages.seq = bad.v_pages.seq = 0;
    }
    const std::vector<T> o_before = bufs.o2;
    const std::vector<float> lse_before = bufs.lse2;
    bool threw = false;
    try {
      fa::attention_forward(ctx, q, bad, o2, p.opts, lse2);
    } catch (const fa::InvalidArgument&) {
      threw = true;
    } catch (...) {
      finding("a bad paged-cache call threw something other than flashattn::InvalidArgument");
    }
    FUZZ_CHECK(threw, "a bad paged-cache call did not throw");
    FUZZ_CHECK(std::memcmp(o_before.data(), bufs.o2.data(), o_before.size() * sizeof(T)) == 0,
               "a bad paged-cache call wrote to o");
    FUZZ_CHECK(lse_before == bufs.lse2 || std::memcmp(lse_before.data(), bufs.lse2.data(),
                                                      lse_before.size() * sizeof(float)) == 0,
               "a bad paged-cache call wrote to lse");
    return;
  }

  // Each call starts from poisoned outputs, so that a call that skips rows cannot pass on the dense
  // run's values left in them.
  const auto poison_outputs = [&] {
    std::fill(bufs.o2.begin(), bufs.o2.end(), poison<T>());
    std::fill(bufs.lse2.begin(), bufs.lse2.end(), poison<float>());
  };
  const auto same_as_dense = [&](const char* what) {
    for (std::size_t i = 0; i < bufs.o.size(); ++i)
      if (!same_bits(bufs.o[i], bufs.o2[i])) finding(what);
    for (std::size_t i = 0; i < bufs.lse.size(); ++i)
      if (!same_bits(bufs.lse[i], bufs.lse2[i])) finding(what);
  };
  poison_outputs();
  try {
    fa::attention_forward(ctx, q, paged.view, o2, p.opts, lse2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    finding("a valid paged-cache call threw");
  }
  same_as_dense("a paged cache gave other bits than the dense call");
  std::vector<std::int32_t> lengths(std::size_t(p.batch), std::int32_t(p.seq_k));
  poison_outputs();
  try {
    fa::attention_forward(ctx, q, fa::KvCacheView<const T>{k, v, lengths.data()}, o2, p.opts, lse2);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "exception: %s\n", e.what());
    finding("a valid contiguous-cache call threw");
  }
  same_as_dense("a contiguous cache gave other bits than the dense call");
  check_varlen_path<Tiles, T>(p, q, k, v, bufs);
  check_mixed_path<Tiles, T>(p, q, k, v);
}

// Only with each type's default tiles: the other tile choices would compile these entry points again
// (minutes of the CI's fuzz build) for kernels the dense calls already fuzz.
template <class Tiles, class T, class Bufs>
void check_cache_paths(FuzzedDataProvider& fdp, const Problem& p, const fa::TensorView<const T>& q,
                       const fa::TensorView<const T>& k, const fa::TensorView<const T>& v, Bufs& bufs) {
  if constexpr (std::is_same_v<Tiles, fa::cpu::DefaultTiles<T>>) check_cache_paths_on<Tiles, T>(fdp, p, q, k, v, bufs);
}

}  // namespace flashattn_fuzz
