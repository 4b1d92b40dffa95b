// libFuzzer harness for the public forward API. Each input decodes into one call of attention_forward or
// attention_forward_masked: scalar type, tile configuration, shapes (GQA included), layouts (BSHD, BHSD,
// padded permutations, broadcast strides, slices of a fused QKV buffer), options, every mask policy and
// variant (score modifiers, per-head ALiBi, per-head attention sinks), value distributions (tiny, huge,
// subnormal, ties) and special values (NaN, ±inf, extremes) at chosen places.
// About one input in eight is turned into an invalid call by exactly one corruption (shape mismatch,
// overlap, null data, negative stride or extent, bad scale, ...). Valid calls with the options' masks also
// run through the KV-cache entry points (cache_paths.hpp) and the backward, dense and packed
// (backward_paths.hpp).
//
// What counts as a finding (reported with __builtin_trap(), besides anything the sanitizers catch):
//   invalid call   -> anything but flashattn::InvalidArgument (a std::invalid_argument), or any write to o/lse;
//   valid call     -> any exception; a write outside the views (padding is filled with a NaN pattern and
//                     must keep it); a row that keeps no key not exactly 0 with LSE −inf (its sink's logit,
//                     under an attention-sink policy); results that differ between contexts of 1 and 2
//                     threads; and, when no finite intermediate can overflow
//                     the accumulator, a disagreement with the fp64 reference of tests/reference.hpp:
//                       finite inputs: every output finite and max|o − ref| <= 2·max|naive − ref| + eps,
//                       naive = the same-precision reference (FlashAttention's tolerance rule);
//                       non-finite inputs: NaN wherever the reference is NaN, and elsewhere the same rule,
//                       except output columns whose V column holds a non-finite value (0·NaN = NaN
//                       reaches rows of the same tile that mask the key; see docs/robustness.md).

#pragma once
#include <fuzzer/FuzzedDataProvider.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "flashattn/flashattn.hpp"
#include "reference.hpp"

namespace flashattn_fuzz {

namespace fa = flashattn;
using fa::index_t;

// Prints why, then stops the process the way libFuzzer records as a crash.
[[noreturn]] inline void finding(const char* what) {
  std::fprintf(stderr, "FINDING: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}
#define FUZZ_CHECK(cond, what) \
  do {                         \
    if (!(cond)) finding(what); \
  } while (0)

// SplitMix64: values are drawn from a seed in the input, so a few input bytes choose a whole tensor.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double symmetric() { return 2.0 * uniform() - 1.0; }                               // [-1, 1)
  index_t below(index_t n) { return n <= 0 ? 0 : index_t(next() % std::uint64_t(n)); }
};

template <class T>
double to_double(T x) {
  return double(static_cast<float>(x));
}
template <>
inline double to_double<double>(double x) {
  return x;
}
template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return T(static_cast<float>(x));
  }
}

// Per-type constants, in double.
template <class T>
struct Limits {
  static double max() { return to_double(std::numeric_limits<T>::max()); }
  static double denorm_min() { return to_double(std::numeric_limits<T>::denorm_min()); }
  static double min_normal() { return to_double(std::numeric_limits<T>::min()); }
  static double unit_roundoff() { return to_double(std::numeric_limits<T>::epsilon()) / 2; }
};

// A distinctive NaN bit pattern for the padding around views: read by a kernel, it turns an output NaN;
// written by one, the pattern changes.
template <class T>
T poison() {
  T x;
  if constexpr (sizeof(T) == 8) {
    const std::uint64_t bits = 0x7FF80000DEADBEEFull;
    std::memcpy(&x, &bits, 8);
  } else if constexpr (sizeof(T) == 4) {
    const std::uint32_t bits = 0x7FC0BEEFu;
    std::memcpy(&x, &bits, 4);
  } else if constexpr (std::is_same_v<T, Eigen::half>) {
    const std::uint16_t bits = 0x7E5Au;
    std::memcpy(&x, &bits, 2);
  } else {
    const std::uint16_t bits = 0x7FA5u;
    std::memcpy(&x, &bits, 2);
  }
  return x;
}
template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// FLASHATTN_FUZZ_VERBOSE=1: print each decoded problem and the element a check fails on (for replaying a
// finding).
inline bool verbose() {
  static const bool on = std::getenv("FLASHATTN_FUZZ_VERBOSE") != nullptr;
  return on;
}

// ---------------------------------------------------------------------------------------------- layouts

enum Dim { kBatch = 0, kSeq = 1, kHead = 2, kDim = 3 };

struct Layout {
  index_t extent[4];
  index_t stride[4];
  index_t offset = 0;  // of element (0, 0, 0, 0) in its buffer
};

// Elements a buffer needs to hold the layout (max offset + 1), 0 for an empty view.
inline index_t span_of(const Layout& l) {
  index_t last = l.offset;
  for (int r = 0; r < 4; ++r) {
    if (l.extent[r] == 0) return 0;
    last += (l.extent[r] - 1) * l.stride[r];
  }
  return last + 1;
}

// Nesting order (outermost first) for each of the 24 permutations.
inline void permutation(int code, int order[4]) {
  int pool[4] = {0, 1, 2, 3};
  for (int r = 0; r < 4; ++r) {
    const int pick = code % (4 - r);
    code /= 4 - r;
    order[r] = pool[pick];
    for (int t = pick; t < 3 - r; ++t) pool[t] = pool[t + 1];
  }
}

// style 0: BSHD, 1: BHSD, 2: a random nesting order with padding and a dim stride of 1 or 2.
inline Layout make_layout(FuzzedDataProvider& fdp, const index_t extent[4], int style) {
  Layout l{};
  for (int r = 0; r < 4; ++r) l.extent[r] = extent[r];
  int order[4] = {kBatch, kSeq, kHead, kDim};
  index_t pad[4] = {0, 0, 0, 0};
  index_t inner = 1;
  if (style == 1) {
    order[1] = kHead;
    order[2] = kSeq;
  } else if (style == 2) {
    permutation(fdp.ConsumeIntegralInRange(0, 23), order);
    for (int r = 0; r < 4; ++r) pad[r] = fdp.ConsumeIntegralInRange(0, 3);
    inner = fdp.ConsumeIntegralInRange(1, 2);
  }
  index_t running = inner;
  for (int r = 3; r >= 0; --r) {
    l.stride[order[r]] = running;
    running = running * std::max<index_t>(extent[order[r]], 1) + pad[r];
  }
  return l;
}

// --------------------------------------------------------------------------------------------- problems

// One tensor: its own buffer or a slice of a shared one.
template <class T>
struct Tensor {
  std::vector<T>* buffer = nullptr;
  Layout layout{};
  fa::TensorView<T> view() const {
    T* base = buffer->empty() ? nullptr : buffer->data() + layout.offset;
    return {base,           layout.extent[0], layout.extent[1], layout.extent[2], layout.extent[3],
            layout.stride[0], layout.stride[1], layout.stride[2], layout.stride[3]};
  }
};

// BlockSparse: block_mask over the Element bits (cells of block_cell); SoftcapBuiltin, AlibiBuiltin: the
// built-ins of core/score_variants.hpp, evaluated on lanes, against the reference's scalar functors;
// Structured: chunked_mask / prefix_lm_mask / streaming_mask against element masks of their definitions;
// SinksBuiltin: sinks(logits, band) against the reference's sink policy; BiasBuiltin: bias(view, band), the
// view broadcast over batch and / or heads or not, against a scalar score_mod per (entry, head).
enum class MaskKind {
  Options, Element, Softcap, SoftcapBand, Alibi, Sink, BlockSparse, SoftcapBuiltin, AlibiBuiltin, Structured,
  SinksBuiltin, BiasBuiltin, Count
};

struct Problem {
  index_t batch = 1, seq_q = 1, seq_k = 1, heads_q = 1, heads_kv = 1, dim = 1;
  index_t dim_v = 1;  // the head dim of v and o: dim, or one of its own (MLA-style heads)
  fa::AttentionOptions opts;
  int threads = 0;  // the backend context's num_threads (cpu::Context)
  MaskKind mask = MaskKind::Options;
  bool band = false;                        // for the score-mod kinds: a band (causal / window) underneath
  index_t band_left = -1, band_right = -1;  // of that band, options' convention (negative = unbounded)
  double softcap = 30.0, alibi_base = 1.0;
  float sink = 0.0f;  // MaskKind::Sink: the sink logit of head 0 (head h adds h / 4)
  std::vector<std::uint8_t> bits;  // ElementMask and BlockSparse, (seq_q, seq_k)
  index_t block_cell = 1;          // BlockSparse: the map's cell (block_cell x block_cell + 1)
  std::vector<float> slopes;       // AlibiBuiltin: one per query head
  std::vector<float> sink_logits;  // SinksBuiltin: one per query head (sink + h / 4, as SinkPolicy)
  int structure = 0;               // Structured: 0 chunked causal, 1 chunked both ways, 2 prefix-LM, 3 streaming
  index_t structure_size = 1;      // the chunk, the prefix, or the sink tokens
  index_t structure_window = -1;   // streaming: the window (negative: unbounded)
  std::vector<float> bias;         // BiasBuiltin: (bias_batch, bias_heads, seq_q, seq_k), contiguous
  index_t bias_batch = 1, bias_heads = 1;
  bool want_lse = false;
};

// The reference's masks are written from the documented semantics, independently of BandMask.
struct RefBand {
  index_t seq_q, seq_k, left, right;  // negative: unbounded
  bool keep(index_t i, index_t j) const {
    const index_t diag = i + seq_k - seq_q;
    return (left < 0 || j >= diag - left) && (right < 0 || j <= diag + right);
  }
};

// The structured masks as documented (p = i + seq_k − seq_q, the query's diagonal position).
struct RefStructured {
  index_t seq_q, seq_k;
  int kind;
  index_t size, window;
  static index_t chunk_of(index_t x, index_t c) { return x >= 0 ? x / c : -((-x + c - 1) / c); }
  bool operator()(index_t i, index_t j) const {
    const index_t p = i + seq_k - seq_q;
    switch (kind) {
      case 0: return chunk_of(p, size) == chunk_of(j, size) && j <= p;
      case 1: return chunk_of(p, size) == chunk_of(j, size);
      case 2: return j < size || j <= p;
      default: return j <= p && (j < size || window < 0 || j >= p - window);
    }
  }
};

// Every callback checks its indices: a kernel asking about a (query, key) outside the problem is a bug.
struct CheckedBits {
  const std::uint8_t* bits;
  index_t seq_q, seq_k;
  bool operator()(index_t i, index_t j) const {
    if (i < 0 || i >= seq_q || j < 0 || j >= seq_k) finding("mask asked about an index outside the problem");
    return bits[i * seq_k + j] != 0;
  }
};

struct Softcap {
  double cap;
  index_t seq_q, seq_k;
  template <class S>
  S operator()(index_t i, index_t j, S s) const {
    if (i < 0 || i >= seq_q || j < 0 || j >= seq_k) finding("score_mod asked about an index outside the problem");
    return S(cap) * std::tanh(s / S(cap));
  }
};

// Its derivative, for the fp64 reference backward (fuzz/backward_paths.hpp): 1 − tanh²(s / cap).
struct SoftcapGrad {
  double cap;
  template <class S>
  S operator()(index_t /*i*/, index_t /*j*/, S s) const {
    const S t = std::tanh(s / S(cap));
    return S(1) - t * t;
  }
};

// The derivative of a score function that adds a term independent of the score (ALiBi, a bias).
struct UnitGrad {
  template <class S>
  S operator()(index_t /*i*/, index_t /*j*/, S /*s*/) const {
    return S(1);
  }
};

struct AlibiFn {
  double slope;
  index_t seq_q, seq_k;
  template <class S>
  S operator()(index_t i, index_t j, S s) const {
    if (i < 0 || i >= seq_q || j < 0 || j >= seq_k) finding("score_mod asked about an index outside the problem");
    const index_t dist = i + (seq_k - seq_q) - j;
    return s - S(slope * double(dist < 0 ? -dist : dist));
  }
};

// ALiBi: a per-head slope, through for_head(). Base: the keep-mask underneath.
template <class Base>
struct AlibiPolicy {
  static constexpr bool modifies_scores = true;
  Base base;
  double base_slope;
  index_t heads, seq_q, seq_k;
  fa::ScoreMod<AlibiFn, Base> for_head(index_t /*b*/, index_t h) const {
    if (h < 0 || h >= heads) finding("for_head asked about a head outside the problem");
    const double slope = base_slope * std::exp2(-8.0 * double(h + 1) / double(heads));
    return fa::score_mod(base, AlibiFn{slope, seq_q, seq_k});
  }
};

// The built-in ALiBi's reference: the same float slopes per head, the distance in double.
template <class Base>
struct AlibiSlopesPolicy {
  static constexpr bool modifies_scores = true;
  Base base;
  const std::vector<float>* slopes;
  index_t seq_q, seq_k;
  fa::ScoreModWithGrad<AlibiFn, UnitGrad, Base> for_head(index_t /*b*/, index_t h) const {
    return fa::score_mod(base, AlibiFn{double((*slopes)[std::size_t(h)]), seq_q, seq_k}, UnitGrad{});
  }
};

// The bias's reference: one (seq_q, seq_k) plane added to the score, bounds-checked.
struct BiasFn {
  const float* plane;
  index_t seq_q, seq_k;
  template <class S>
  S operator()(index_t i, index_t j, S s) const {
    if (i < 0 || i >= seq_q || j < 0 || j >= seq_k) finding("score_mod asked about an index outside the problem");
    return s + S(plane[i * seq_k + j]);
  }
};
template <class Base>
struct RefBiasPolicy {
  static constexpr bool modifies_scores = true;
  Base base;
  const Problem* p;
  fa::ScoreModWithGrad<BiasFn, UnitGrad, Base> for_head(index_t b, index_t h) const {
    const index_t pb = p->bias_batch == 1 ? 0 : b, ph = p->bias_heads == 1 ? 0 : h;
    const float* plane = p->bias.data() + (pb * p->bias_heads + ph) * p->seq_q * p->seq_k;
    return fa::score_mod(base, BiasFn{plane, p->seq_q, p->seq_k}, UnitGrad{});
  }
};

// An attention sink (core/variants.hpp) on a keep-mask, one logit per head through for_head().
template <class Base>
struct SinkHead {
  Base base;
  float sink;
  index_t kv_begin(index_t q0, index_t q1) const { return base.kv_begin(q0, q1); }
  index_t kv_end(index_t q0, index_t q1) const { return base.kv_end(q0, q1); }
  fa::TileKind tile(index_t q0, index_t q1, index_t k0, index_t k1) const { return base.tile(q0, q1, k0, k1); }
  bool keep(index_t i, index_t j) const { return base.keep(i, j); }
  float sink_logit() const { return sink; }
};
template <class Base>
struct SinkPolicy {
  Base base;
  float sink;
  index_t heads;
  SinkHead<Base> for_head(index_t /*b*/, index_t h) const {
    if (h < 0 || h >= heads) finding("for_head asked about a head outside the problem");
    return {base, sink + float(h) / 4};
  }
};

// Calls f(mask_for_the_library, mask_for_the_reference) with the policy the problem describes.
template <class F>
void with_masks(const Problem& p, F&& f) {
  const RefBand opts_band{p.seq_q, p.seq_k, p.opts.window_left, p.opts.causal ? 0 : p.opts.window_right};
  const RefBand mod_band{p.seq_q, p.seq_k, p.band_left, p.band_right};
  const auto ref_keep = [](RefBand b) {
    return fa::element_mask(b.seq_k, [b](index_t i, index_t j) { return b.keep(i, j); });
  };
  const fa::BandMask lib_band = fa::BandMask::window(p.seq_q, p.seq_k, p.band_left, p.band_right);
  switch (p.mask) {
    case MaskKind::Options:
      if (p.opts.has_window()) return f(std::nullopt, ref_keep(opts_band));
      return f(std::nullopt, fa::NoMask{p.seq_k});
    case MaskKind::Element: {
      const CheckedBits bits{p.bits.data(), p.seq_q, p.seq_k};
      return f(fa::element_mask(p.seq_k, bits), fa::element_mask(p.seq_k, bits));
    }
    case MaskKind::BlockSparse: {
      const CheckedBits bits{p.bits.data(), p.seq_q, p.seq_k};
      return f(fa::block_mask(p.seq_q, p.seq_k, bits, p.block_cell, p.block_cell + 1),
               fa::element_mask(p.seq_k, bits));
    }
    case MaskKind::SoftcapBuiltin: {
      const Softcap cap{p.softcap, p.seq_q, p.seq_k};
      const SoftcapGrad grad{p.softcap};
      if (p.band) return f(fa::soft_cap(p.softcap, lib_band), fa::score_mod(ref_keep(mod_band), cap, grad));
      return f(fa::soft_cap(p.softcap, fa::NoMask{p.seq_k}), fa::score_mod(fa::NoMask{p.seq_k}, cap, grad));
    }
    case MaskKind::AlibiBuiltin: {
      if (p.band) {
        using RefBase = decltype(ref_keep(mod_band));
        return f(fa::alibi(p.slopes, lib_band),
                 AlibiSlopesPolicy<RefBase>{ref_keep(mod_band), &p.slopes, p.seq_q, p.seq_k});
      }
      return f(fa::alibi(p.slopes, fa::NoMask{p.seq_k}),
               AlibiSlopesPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, &p.slopes, p.seq_q, p.seq_k});
    }
    case MaskKind::Structured: {
      const auto ref = fa::element_mask(
          p.seq_k, RefStructured{p.seq_q, p.seq_k, p.structure, p.structure_size, p.structure_window});
      switch (p.structure) {
        case 0: return f(fa::chunked_mask(p.structure_size), ref);
        case 1: return f(fa::chunked_mask(p.structure_size, false), ref);
        case 2: return f(fa::prefix_lm_mask(p.structure_size), ref);
        default: return f(fa::streaming_mask(p.structure_size, p.structure_window), ref);
      }
    }
    case MaskKind::SinksBuiltin: {
      if (p.band) {
        using RefBase = decltype(ref_keep(mod_band));
        return f(fa::sinks(p.sink_logits, lib_band), SinkPolicy<RefBase>{ref_keep(mod_band), p.sink, p.heads_q});
      }
      return f(fa::sinks(p.sink_logits, fa::NoMask{p.seq_k}),
               SinkPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, p.sink, p.heads_q});
    }
    case MaskKind::BiasBuiltin: {
      const fa::BiasView view = fa::bias_bhqk(p.bias.empty() ? nullptr : p.bias.data(), p.bias_batch, p.bias_heads,
                                              p.seq_q, p.seq_k);
      if (p.band) {
        using RefBase = decltype(ref_keep(mod_band));
        return f(fa::bias(view, lib_band), RefBiasPolicy<RefBase>{ref_keep(mod_band), &p});
      }
      return f(fa::bias(view, fa::NoMask{p.seq_k}), RefBiasPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, &p});
    }
    case MaskKind::Softcap:
    case MaskKind::SoftcapBand: {
      const Softcap cap{p.softcap, p.seq_q, p.seq_k};
      if (p.band) return f(fa::score_mod(lib_band, cap), fa::score_mod(ref_keep(mod_band), cap));
      return f(fa::score_mod(fa::NoMask{p.seq_k}, cap), fa::score_mod(fa::NoMask{p.seq_k}, cap));
    }
    case MaskKind::Sink: {
      if (p.band) {
        using RefBase = decltype(ref_keep(mod_band));
        return f(SinkPolicy<fa::BandMask>{lib_band, p.sink, p.heads_q},
                 SinkPolicy<RefBase>{ref_keep(mod_band), p.sink, p.heads_q});
      }
      return f(SinkPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, p.sink, p.heads_q},
               SinkPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, p.sink, p.heads_q});
    }
    case MaskKind::Alibi:
    default: {
      if (p.band) {
        using RefBase = decltype(ref_keep(mod_band));
        return f(AlibiPolicy<fa::BandMask>{lib_band, p.alibi_base, p.heads_q, p.seq_q, p.seq_k},
                 AlibiPolicy<RefBase>{ref_keep(mod_band), p.alibi_base, p.heads_q, p.seq_q, p.seq_k});
      }
      return f(AlibiPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, p.alibi_base, p.heads_q, p.seq_q, p.seq_k},
               AlibiPolicy<fa::NoMask>{fa::NoMask{p.seq_k}, p.alibi_base, p.heads_q, p.seq_q, p.seq_k});
    }
  }
}

// --------------------------------------------------------------------------------------------- values

// Fills the elements of a view (the padding keeps the poison).
template <class T>
void fill(FuzzedDataProvider& fdp, Rng& rng, const fa::TensorView<T>& x) {
  static constexpr double kMagnitudes[] = {1e-30, 1e-6, 1e-3, 1, 3, 30, 300, 1e4, 1e8, 1e30};
  const int mode = fdp.ConsumeIntegralInRange(0, 7);
  const double mag = std::min(kMagnitudes[fdp.ConsumeIntegralInRange(0, 9)], Limits<T>::max() / 2);
  if (verbose()) std::fprintf(stderr, "  values: mode %d, magnitude %g\n", mode, mag);
  const double constant = rng.symmetric() * mag;
  for (index_t b = 0; b < x.batch; ++b)
    for (index_t s = 0; s < x.seq; ++s)
      for (index_t h = 0; h < x.heads; ++h)
        for (index_t c = 0; c < x.dim; ++c) {
          double v = 0;
          switch (mode) {
            case 0: v = rng.symmetric(); break;
            case 1: v = rng.symmetric() * mag; break;
            case 2: v = double(rng.below(7) - 3); break;  // small integers: exact products
            case 3: v = constant; break;                   // ties everywhere
            case 4: v = rng.symmetric() * (rng.below(16) == 0 ? mag : 1.0); break;  // sparse outliers
            case 5: v = 0; break;
            case 6: v = (rng.below(2) ? 1 : -1) * std::pow(10.0, -30.0 + 60.0 * rng.uniform()); break;
            default: v = rng.symmetric() * 64 * Limits<T>::denorm_min(); break;  // subnormal range
          }
          v = std::max(-Limits<T>::max(), std::min(Limits<T>::max(), v));
          x(b, s, h, c) = from_double<T>(v);
        }
}

template <class T>
void plant_specials(FuzzedDataProvider& fdp, const fa::TensorView<T>* views[3]) {
  const int count = std::max(0, fdp.ConsumeIntegralInRange(0, 7) - 4);
  for (int n = 0; n < count; ++n) {
    const int which = fdp.ConsumeIntegralInRange(0, 2);
    const fa::TensorView<T>& x = *views[which];
    if (x.numel() == 0) continue;
    const index_t flat = fdp.ConsumeIntegralInRange<index_t>(0, x.numel() - 1);
    const index_t c = flat % x.dim, h = flat / x.dim % x.heads, s = flat / x.dim / x.heads % x.seq,
                  b = flat / x.dim / x.heads / x.seq;
    const double specials[] = {std::numeric_limits<double>::quiet_NaN(), HUGE_VAL, -HUGE_VAL, Limits<T>::max(),
                               -Limits<T>::max(), Limits<T>::denorm_min(), -0.0, Limits<T>::min_normal()};
    const double v = specials[fdp.ConsumeIntegralInRange(0, 7)];
    if (verbose())
      std::fprintf(stderr, "  special %g in %c at (%lld, %lld, %lld, %lld)\n", v, "qkv"[which], (long long)b,
                   (long long)s, (long long)h, (long long)c);
    x(b, s, h, c) = from_double<T>(v);
  }
}

// ------------------------------------------------------------------------------------------ the checks

template <class T>
struct Buffers {
  std::vector<T> q, k, v, o, o2;  // o2: the second run, with the other thread count
  std::vector<float> lse, lse2;
  Tensor<T> tq, tk, tv, to, to2;
  Layout lse_layout{};  // extents (batch, heads, seq) in [0..2]; [3] unused
  fa::LseView lse_view(std::vector<float>& buf) const {
    if (buf.empty()) return {};
    return {buf.data() + lse_layout.offset, lse_layout.extent[0], lse_layout.extent[1], lse_layout.extent[2],
            lse_layout.stride[0], lse_layout.stride[1], lse_layout.stride[2]};
  }
};

template <class T>
bool untouched_outside(const std::vector<T>& buf, const Layout& l, index_t dims) {
  std::vector<std::uint8_t> inside(buf.size(), 0);
  if (span_of(l) > 0) {
    const index_t e3 = dims == 4 ? l.extent[3] : 1;
    for (index_t a = 0; a < l.extent[0]; ++a)
      for (index_t b = 0; b < l.extent[1]; ++b)
        for (index_t c = 0; c < l.extent[2]; ++c)
          for (index_t d = 0; d < e3; ++d)
            inside[std::size_t(l.offset + a * l.stride[0] + b * l.stride[1] + c * l.stride[2] +
                               (dims == 4 ? d * l.stride[3] : 0))] = 1;
  }
  for (std::size_t i = 0; i < buf.size(); ++i)
    if (!inside[i] && !same_bits(buf[i], poison<T>())) return false;
  return true;
}

template <class T>
bool all_poison(const std::vector<T>& buf) {
  for (const T& x : buf)
    if (!same_bits(x, poison<T>())) return false;
  return true;
}

// A contiguous copy of a view, with subnormal values replaced by 0 when `flush` (the reading of bf16 by
// AVX512_BF16's instructions); otherwise just the view itself.
template <class T>
struct Flushed {
  std::vector<T> data;
  fa::TensorView<const T> view;
  Flushed(const fa::TensorView<const T>& x, bool flush) : view(x) {
    if (!flush) return;
    data.resize(std::size_t(x.numel()));
    const fa::TensorView<T> out = fa::bshd(data.data(), x.batch, x.seq, x.heads, x.dim);
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t h = 0; h < x.heads; ++h)
          for (index_t c = 0; c < x.dim; ++c) {
            const double e = to_double(x(b, s, h, c));
            out(b, s, h, c) = e != 0 && std::abs(e) < Limits<T>::min_normal() ? from_double<T>(0.0) : x(b, s, h, c);
          }
    view = out;
  }
  Flushed(const Flushed&) = delete;
  Flushed& operator=(const Flushed&) = delete;
};

template <class T, class RefMask>
void check_results(const fa::TensorView<const T>& q,
                   const fa::TensorView<const T>& k, const fa::TensorView<const T>& v, const fa::TensorView<T>& o,
                   const fa::LseView& lse, double scale, const RefMask& ref_mask, bool flushes_subnormals) {
  using Acc = fa::cpu::acc_t<T>;
  double max_q = 0, max_v = 0;
  const auto scan = [&](const fa::TensorView<const T>& x, double& max_abs) {
    for (index_t b = 0; b < x.batch; ++b)
      for (index_t s = 0; s < x.seq; ++s)
        for (index_t h = 0; h < x.heads; ++h)
          for (index_t c = 0; c < x.dim; ++c) {
            const double e = to_double(x(b, s, h, c));
            if (std::isfinite(e)) max_abs = std::max(max_abs, std::abs(e));
          }
  };
  double unused = 0;
  scan(q, max_q);
  scan(k, unused);
  scan(v, max_v);

  // Could a finite intermediate overflow the accumulator? Then the result is not defined by the reference
  // (documented limit) and only the structural checks run. The bounds: the raw q·k and the base-2 score
  // scale·log2(e)·q·k are both <= their factor times Σ|q||k| (and a kernel may pre-scale Q), and the
  // unnormalised Σ p·v <= seq_k·max|v| (p <= 1).
  const double acc_max = double(std::numeric_limits<Acc>::max()) / 8;
  double max_dot = 0;
  std::vector<std::uint8_t> v_col_bad(std::size_t(v.batch * v.heads * std::max<index_t>(v.dim, 1)), 0);
  for (index_t b = 0; b < q.batch; ++b)
    for (index_t h = 0; h < q.heads; ++h) {
      const index_t hk = h / (q.heads / k.heads);
      for (index_t i = 0; i < q.seq; ++i)
        for (index_t j = 0; j < k.seq; ++j) {
          double dot = 0;
          for (index_t c = 0; c < q.dim; ++c) {
            // Products of finite values only (non-finite inputs are not an overflow); a product of two
            // finite doubles can itself overflow to inf, which then counts.
            const double qc = to_double(q(b, i, h, c)), kc = to_double(k(b, j, hk, c));
            if (std::isfinite(qc) && std::isfinite(kc)) dot += std::abs(qc * kc);
          }
          max_dot = std::max(max_dot, dot);
        }
    }
  for (index_t b = 0; b < v.batch; ++b)
    for (index_t j = 0; j < v.seq; ++j)
      for (index_t h = 0; h < v.heads; ++h)
        for (index_t c = 0; c < v.dim; ++c)
          if (!std::isfinite(to_double(v(b, j, h, c)))) v_col_bad[std::size_t((b * v.heads + h) * v.dim + c)] = 1;
  const double log2e = 1.4426950408889634;
  const bool overflow_risk = max_q * scale * log2e >= acc_max || max_dot * std::max(1.0, scale * log2e) >= acc_max ||
                             double(k.seq) * max_v >= acc_max;

  // Structural checks, whatever the values.
  const index_t group = q.heads / k.heads;
  for (index_t b = 0; b < q.batch; ++b)
    for (index_t h = 0; h < q.heads; ++h) {
      const auto m = fa::policy_for(ref_mask, fa::SequenceInfo{b, h, q.seq, k.seq});
      for (index_t i = 0; i < q.seq; ++i) {
        bool any = false;
        for (index_t j = 0; j < k.seq && !any; ++j) any = m.keep(i, j);
        if (any) continue;
        for (index_t c = 0; c < o.dim; ++c)
          FUZZ_CHECK(to_double(o(b, i, h, c)) == 0.0, "a row that keeps no key is not exactly 0");
        if (lse.empty()) continue;
        if constexpr (fa::has_sink_v<decltype(m)>) {
          // Only the sink: LSE = sink, to the rounding of its trip through base-2 units.
          const double sink = m.sink_logit();
          if (std::isinf(sink)) {
            FUZZ_CHECK(lse(b, h, i) == sink, "a row that keeps no key, with a -inf sink, does not have LSE -inf");
          } else {
            const double tolerance = 4 * std::numeric_limits<float>::epsilon() * std::max(1.0, std::abs(sink));
            FUZZ_CHECK(std::abs(lse(b, h, i) - sink) <= tolerance,
                       "a row that keeps no key does not have the sink as its LSE");
          }
        } else {
          FUZZ_CHECK(lse(b, h, i) == -std::numeric_limits<float>::infinity(),
                     "a row that keeps no key does not have LSE -inf");
        }
      }
    }
  if (overflow_risk) return;

  // The "exact" side: fp64, or x87 long double for T = double (whose same-precision naive run is fp64
  // itself), as in tests/tolerance.hpp. Where the kernel reads subnormal bf16 as 0 (AVX512_BF16), the
  // references read the same flushed inputs: that is the documented semantics.
  using Exact = std::conditional_t<std::is_same_v<T, double>, long double, double>;
  const Flushed<T> fq(q, flushes_subnormals), fk(k, flushes_subnormals), fv(v, flushes_subnormals);
  const fa::testing::ReferenceResult ref =
      fa::testing::reference_attention<Exact>(fq.view, fk.view, fv.view, scale, ref_mask);
  const fa::testing::ReferenceResult naive =
      fa::testing::reference_attention<Acc, T>(fq.view, fk.view, fv.view, scale, ref_mask);

  // delta: how far from exact any correct computation's base-2 scores may be (the a-priori bound below).
  const double u = Limits<Acc>::unit_roundoff();
  const double delta = double(q.dim + 6) * u * scale * log2e * max_dot;
  // When that exceeds float's range, so may a correct LSE (stored as float): a dot product that cancels
  // products near the accumulator's limit (seen: double, q ~ 1e-30 against K entries ±DBL_MAX, whose
  // residual 2.7e261 is the score in double; the long-double reference cancels them exactly).
  const bool lse_undetermined = delta * 0.6931471805599453 >= double(std::numeric_limits<float>::max());

  double err = 0, naive_err = 0, max_ref = 0;
  double lse_err = 0, lse_naive_err = 0, max_lse = 0;
  for (index_t b = 0; b < q.batch; ++b)
    for (index_t i = 0; i < q.seq; ++i)
      for (index_t h = 0; h < q.heads; ++h) {
        const index_t hk = h / group;
        for (index_t c = 0; c < o.dim; ++c) {
          const std::size_t at = std::size_t(((b * q.seq + i) * q.heads + h) * o.dim + c);
          const double r = ref.o[at], n = naive.o[at], x = to_double(o(b, i, h, c));
          if (verbose() && (std::isnan(r) != std::isnan(x) || std::isfinite(r) != std::isfinite(x)))
            std::fprintf(stderr, "o(b=%lld, i=%lld, h=%lld, c=%lld) = %g, reference %g, naive %g\n", (long long)b,
                         (long long)i, (long long)h, (long long)c, x, r, n);
          const bool contaminated = v_col_bad[std::size_t((b * v.heads + hk) * v.dim + c)] != 0;
          if (std::isnan(r)) {
            // A NaN that the same-precision naive run does not have, in a column with a non-finite V entry,
            // is a weight that is exactly 0 in the exact computation times that entry: at scores so large
            // that their rounding decides whether the weight underflows, either result is correct.
            if (contaminated && !std::isnan(n)) continue;
            FUZZ_CHECK(std::isnan(x), "the reference is NaN here but the output is not (NaN must propagate)");
            continue;
          }
          if (std::isinf(r)) {
            FUZZ_CHECK(x == r || std::isnan(x), "the reference is infinite here but the output is finite");
            continue;
          }
          if (contaminated && !std::isfinite(x)) continue;  // 0·NaN / 0·inf from a V entry in the tile
          FUZZ_CHECK(std::isfinite(x), "a non-finite output where the reference is finite");
          if (!std::isfinite(n)) continue;  // e.g. p underflows to 0 in float and meets an inf in V
          err = std::max(err, std::abs(x - r));
          naive_err = std::max(naive_err, std::abs(n - r));
          max_ref = std::max(max_ref, std::abs(r));
        }
        if (!lse.empty()) {
          const std::size_t at = std::size_t((b * q.heads + h) * q.seq + i);
          // The LSE is stored as float whatever T is: for double, beyond float's range it is ±inf.
          const double r = double(float(ref.lse[at])), n = double(float(naive.lse[at])), x = double(lse(b, h, i));
          if (verbose() && !(std::isnan(r) ? std::isnan(x) : std::isfinite(r) ? std::isfinite(x) : true))
            std::fprintf(stderr, "lse(b=%lld, h=%lld, i=%lld) = %g, reference %g, naive %g\n", (long long)b,
                         (long long)h, (long long)i, x, r, n);
          if (std::isnan(r)) {
            FUZZ_CHECK(std::isnan(x), "the reference LSE is NaN but the output LSE is not");
          } else if (std::isinf(r)) {
            FUZZ_CHECK(x == r || (r > 0 && std::isnan(x)), "the reference LSE is infinite but the output's is not");
          } else if (lse_undetermined) {
            FUZZ_CHECK(!std::isnan(x), "a NaN LSE where the reference LSE is finite");
          } else {
            FUZZ_CHECK(std::isfinite(x), "a non-finite LSE where the reference LSE is finite");
            if (std::isfinite(n)) {
              lse_err = std::max(lse_err, std::abs(x - r));
              lse_naive_err = std::max(lse_naive_err, std::abs(n - r));
              max_lse = std::max(max_lse, std::abs(r));
            }
          }
        }
      }
  // The tolerance rule of tests/tolerance.hpp, whose eps is a few units in the last place of the
  // accumulator (LSE: of float, its storage type) at the result's magnitude; eps here also covers one
  // rounding of the output to T, and a few subnormal steps.
  // The bf16 kernels of AVX512_BF16 read subnormal bf16 values as 0 (vdpbf16ps): a documented loss of
  // at most bf16's smallest normal per output.
  // With FTZ (x86, cpu/denormals.hpp) each product P̃_j·v_j below the accumulator's smallest normal is
  // dropped: at most seq_k of them per output, each under that normal, before the division by l >= 1.
  const double eps = 4 * 2 * Limits<Acc>::unit_roundoff() * std::max(1.0, max_ref) +
                     2 * Limits<T>::unit_roundoff() * max_ref + 4 * Limits<T>::denorm_min() +
                     (flushes_subnormals ? 2 * Limits<T>::min_normal() : 0.0) +
                     (fa::cpu::kFlushesDenormals ? (2.0 + double(k.seq)) * Limits<Acc>::min_normal() : 0.0);
  // The 2× rule compares two computations whose errors come from a handful of roundings each, so where
  // both are tiny (a few ulps) or where the scores' own rounding decides which of two near-equal scores
  // wins (large logits), the ratio of the two is chance (seen: double, scale 1000: 6.3e-15 vs 2 × 1.5e-15).
  // So an output also passes within the a-priori forward error bound of the computation, which any
  // correct implementation meets: every base-2 score is within delta of exact (a dot product of D terms,
  // the scale, a score modifier), so every probability is within a factor 2^(±2·delta) (times the exp's
  // and, for 16-bit P, the storage rounding), and o within that much of max|v|, plus the P·V sums and
  // the output's rounding. Masking, tiling and rescaling errors are of the order of max|v| and fail
  // both; the strict rule alone is the unit tests' (tests/tolerance.hpp).
  const double p_rel = 4 * u + (sizeof(T) == 2 ? Limits<T>::unit_roundoff() : 0.0);
  const double apriori = max_v * (std::exp2(2 * delta) * (1 + 2 * p_rel) - 1 + double(k.seq + 2) * u) + eps;
  if (!(err <= 2 * naive_err + eps) && !(err <= apriori)) {
    std::fprintf(stderr, "max|o - ref| = %g, max|naive - ref| = %g, eps = %g, a-priori bound %g\n", err, naive_err,
                 eps, apriori);
    finding("output outside the tolerance rule and the a-priori bound");
  }
  const double lse_eps = 4 * 2 * Limits<float>::unit_roundoff() * std::max(1.0, max_lse);
  const double lse_apriori = (delta + 2 * p_rel) * 0.6931471805599453 + lse_eps;
  if (!(lse_err <= 2 * lse_naive_err + lse_eps) && !(lse_err <= lse_apriori)) {
    std::fprintf(stderr, "max|lse - ref| = %g, max|naive - ref| = %g, eps = %g, a-priori bound %g\n", lse_err,
                 lse_naive_err, lse_eps, lse_apriori);
    finding("LSE outside the tolerance rule and the a-priori bound");
  }
}

// ------------------------------------------------------------------------------------------ the calls
template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, float>) return "float";
  else if constexpr (std::is_same_v<T, double>) return "double";
  else if constexpr (std::is_same_v<T, Eigen::half>) return "half";
  else return "bfloat16";
}
template <class T, class Tiles>
using resolved_tiles =
    std::conditional_t<std::is_same_v<Tiles, fa::cpu::AutoTiles>, fa::cpu::DefaultTiles<T>, Tiles>;
template <class T, class Tiles>
int tile_q() { return resolved_tiles<T, Tiles>::BlockQ; }
template <class T, class Tiles>
int tile_kv() { return resolved_tiles<T, Tiles>::BlockKV; }
template <class T, class Tiles>
const char* tile_isa() { return fa::cpu::isa_name(resolved_tiles<T, Tiles>::isa); }

// One call on the CPU backend with the tiles `Tiles` and `threads` worker threads (the context's
// num_threads, 0: the default).
template <class Tiles, class T, class LibMask>
void call(int threads, const LibMask& lib_mask, const fa::TensorView<const T>& q, const fa::TensorView<const T>& k,
          const fa::TensorView<const T>& v, const fa::TensorView<T>& o, const fa::AttentionOptions& opts,
          const fa::LseView& lse) {
  using Context = fa::cpu::Context<Tiles>;
  const Context ctx{threads};
  if constexpr (std::is_same_v<LibMask, std::nullopt_t>) {
    fa::attention_forward<Context, T>(ctx, q, k, v, o, opts, lse);
  } else {
    fa::attention_forward_masked<Context, T>(ctx, q, k, v, o, lib_mask, opts, lse);
  }
}

}  // namespace flashattn_fuzz

#include "cache_paths.hpp"
#include "backward_paths.hpp"

namespace flashattn_fuzz {

enum class Corruption {
  None, BatchMismatch, KvSeqMismatch, OSeqMismatch, HeadsNotMultiple, DimMismatch, DimTooLarge, ZeroHeads,
  ZeroDim, NullData, NegativeStride, NegativeExtent, BadScale, OOverlapsInput, OSelfOverlap, LseShape,
  LseOverlap, LseSelfOverlap, LseNull, NegativeThreads, MaskWithWindow, StrideOverflow, Count
};

template <class T, class Tiles>
void run(FuzzedDataProvider& fdp) {
  Problem p;
  const bool invalid = fdp.ConsumeIntegralInRange(0, 7) == 0;
  p.batch = fdp.ConsumeIntegralInRange(invalid ? 1 : 0, 3);
  p.seq_q = fdp.ConsumeIntegralInRange(invalid ? 1 : 0, 40);
  p.seq_k = fdp.ConsumeIntegralInRange(0, 70);
  p.heads_kv = fdp.ConsumeIntegralInRange(1, 3);
  p.heads_q = p.heads_kv * fdp.ConsumeIntegralInRange(1, 4);
  const int dim_kind = fdp.ConsumeIntegralInRange(0, 7);
  p.dim = dim_kind == 6 ? 64 : dim_kind == 7 ? 128 : fdp.ConsumeIntegralInRange(1, 40);
  // Keep one input's work small: the fp64 references are O(batch·heads·seq_q·seq_k·dim).
  while (p.batch * p.heads_q * p.seq_q * p.seq_k * p.dim > 150000) {
    if (p.seq_k > 8) p.seq_k /= 2;
    else if (p.seq_q > 8) p.seq_q /= 2;
    else if (p.batch > 1) p.batch = 1;
    else p.heads_q = p.heads_kv;
  }

  // Options and mask policy.
  p.mask = MaskKind(fdp.ConsumeIntegralInRange(0, int(MaskKind::Count) - 1));
  const int scale_kind = fdp.ConsumeIntegralInRange(0, 5);
  static constexpr double kScales[] = {0, 1.0, 0.05, 7.5, 1e-30, 1e3};
  if (scale_kind > 0) p.opts.scale = kScales[scale_kind];
  const auto window = [&] { return index_t(fdp.ConsumeIntegralInRange(-1, 12)); };
  if (p.mask == MaskKind::Options) {
    const int kind = fdp.ConsumeIntegralInRange(0, 3);
    p.opts.causal = kind == 1 || kind == 3;
    if (kind >= 2) {
      p.opts.window_left = window();
      p.opts.window_right = kind == 2 ? window() : -1;
    }
  } else if (p.mask == MaskKind::Element || p.mask == MaskKind::BlockSparse) {
    Rng bits_rng{fdp.ConsumeIntegral<std::uint64_t>()};
    const int density = fdp.ConsumeIntegralInRange(0, 8);  // in eighths; 0: everything masked
    p.bits.resize(std::size_t(std::max<index_t>(p.seq_q * p.seq_k, 1)));
    for (auto& bit : p.bits) bit = bits_rng.below(8) < density ? 1 : 0;
    // Some fully masked rows inside otherwise open problems.
    for (index_t i = 0; i < p.seq_q; ++i)
      if (bits_rng.below(6) == 0)
        for (index_t j = 0; j < p.seq_k; ++j) p.bits[std::size_t(i * p.seq_k + j)] = 0;
    // Whole empty and whole kept cells, so that a block map has Empty and Full cells to skip and run.
    p.block_cell = index_t(1) << fdp.ConsumeIntegralInRange(0, 6);
    if (p.mask == MaskKind::BlockSparse && bits_rng.below(2) == 0)
      for (index_t i = 0; i < p.seq_q; ++i)
        for (index_t j = 0; j < p.seq_k; ++j)
          if ((i / p.block_cell + j / (p.block_cell + 1)) % 3 != 0)
            p.bits[std::size_t(i * p.seq_k + j)] = (i / p.block_cell + j / (p.block_cell + 1)) % 3 == 1;
  } else if (p.mask == MaskKind::Structured) {
    p.structure = fdp.ConsumeIntegralInRange(0, 3);
    p.structure_size = index_t(fdp.ConsumeIntegralInRange(p.structure <= 1 ? 1 : 0, 80));
    p.structure_window = window();
  } else {
    static constexpr double kCaps[] = {1.0, 5.0, 30.0, 50.0};
    p.softcap = kCaps[fdp.ConsumeIntegralInRange(0, 3)];
    p.alibi_base = fdp.ConsumeIntegralInRange(0, 3) * 0.5;
    p.band = p.mask == MaskKind::SoftcapBand || fdp.ConsumeBool();
    static constexpr float kSinks[] = {-std::numeric_limits<float>::infinity(), -2.5f, 0.0f, 1.3f, 8.0f};
    if (p.mask == MaskKind::Sink || p.mask == MaskKind::SinksBuiltin) p.sink = kSinks[fdp.ConsumeIntegralInRange(0, 4)];
    if (p.mask == MaskKind::SinksBuiltin)
      for (index_t h = 0; h < p.heads_q; ++h) p.sink_logits.push_back(p.sink + float(h) / 4);
    if (p.mask == MaskKind::BiasBuiltin) {
      // Broadcast or not in each of batch and heads; values of three magnitudes, and -inf entries (padding).
      p.bias_batch = fdp.ConsumeBool() ? std::max<index_t>(p.batch, 1) : 1;
      p.bias_heads = fdp.ConsumeBool() ? p.heads_q : 1;
      static constexpr float kBiasScales[] = {0.5f, 3.0f, 30.0f};
      const float bias_scale = kBiasScales[fdp.ConsumeIntegralInRange(0, 2)];
      const int holes = fdp.ConsumeIntegralInRange(0, 3);  // in eighths
      Rng bias_rng{fdp.ConsumeIntegral<std::uint64_t>()};
      p.bias.resize(std::size_t(p.bias_batch * p.bias_heads * p.seq_q * p.seq_k));
      for (float& x : p.bias)
        x = int(bias_rng.below(8)) < holes ? -std::numeric_limits<float>::infinity()
                                           : float(bias_rng.symmetric()) * bias_scale;
    }
    if (p.mask == MaskKind::AlibiBuiltin) {
      p.slopes = fa::alibi_slopes(p.heads_q);
      for (float& slope : p.slopes) slope *= float(p.alibi_base);
    }
    p.band_left = window();
    p.band_right = fdp.ConsumeBool() ? 0 : window();
  }
  p.threads = fdp.ConsumeIntegralInRange(0, 2);
  p.want_lse = fdp.ConsumeBool();
  // V's head dim: q/k's, or one time in four its own (drawn last, so that earlier corpus inputs keep theirs).
  p.dim_v = fdp.ConsumeIntegralInRange(0, 3) == 3 ? index_t(fdp.ConsumeIntegralInRange(1, 40)) : p.dim;

  // Layouts and buffers. Everything outside the views holds the poison pattern.
  Buffers<T> bufs;
  const index_t q_ext[4] = {p.batch, p.seq_q, p.heads_q, p.dim};
  const index_t kv_ext[4] = {p.batch, p.seq_k, p.heads_kv, p.dim};
  const index_t v_ext[4] = {p.batch, p.seq_k, p.heads_kv, p.dim_v};
  const index_t o_ext[4] = {p.batch, p.seq_q, p.heads_q, p.dim_v};
  const bool fused = p.seq_q == p.seq_k && p.dim_v == p.dim && fdp.ConsumeIntegralInRange(0, 3) == 0;
  if (fused) {
    // One (batch, seq, heads_q + 2·heads_kv, dim) buffer, q, k and v slices of it (a fused QKV projection).
    const index_t heads = p.heads_q + 2 * p.heads_kv;
    const index_t pad = fdp.ConsumeIntegralInRange(0, 2);
    const index_t row = heads * p.dim + pad;
    Layout base{};
    const index_t strides[4] = {p.seq_q * row, row, p.dim, 1};
    for (int r = 0; r < 4; ++r) base.stride[r] = strides[r];
    bufs.tq.layout = bufs.tk.layout = bufs.tv.layout = base;
    for (int r = 0; r < 4; ++r) {
      bufs.tq.layout.extent[r] = q_ext[r];
      bufs.tk.layout.extent[r] = bufs.tv.layout.extent[r] = kv_ext[r];
    }
    bufs.tk.layout.offset = p.heads_q * p.dim;
    bufs.tv.layout.offset = (p.heads_q + p.heads_kv) * p.dim;
    bufs.q.assign(std::size_t(std::max({span_of(bufs.tq.layout), span_of(bufs.tk.layout), span_of(bufs.tv.layout)})),
                  poison<T>());
    bufs.tq.buffer = bufs.tk.buffer = bufs.tv.buffer = &bufs.q;
  } else {
    const auto place = [&](Tensor<T>& t, std::vector<T>& buf, const index_t ext[4]) {
      t.layout = make_layout(fdp, ext, fdp.ConsumeIntegralInRange(0, 2));
      // Broadcast inputs: one batch or one head read by all (stride 0), as an expanded PyTorch tensor.
      const int broadcast = fdp.ConsumeIntegralInRange(0, 7);
      if (broadcast == 1) t.layout.stride[kBatch] = 0;
      if (broadcast == 2) t.layout.stride[kHead] = 0;
      t.layout.offset = fdp.ConsumeIntegralInRange(0, 2);
      buf.assign(std::size_t(span_of(t.layout)), poison<T>());
      t.buffer = &buf;
    };
    place(bufs.tq, bufs.q, q_ext);
    place(bufs.tk, bufs.k, kv_ext);
    place(bufs.tv, bufs.v, v_ext);
  }
  bufs.to.layout = make_layout(fdp, o_ext, fdp.ConsumeIntegralInRange(0, 2));
  bufs.o.assign(std::size_t(span_of(bufs.to.layout)), poison<T>());
  bufs.to.buffer = &bufs.o;
  bufs.to2 = bufs.to;
  bufs.o2 = bufs.o;
  bufs.to2.buffer = &bufs.o2;
  if (p.want_lse) {
    const index_t ext[4] = {p.batch, p.heads_q, p.seq_q, 1};
    bufs.lse_layout = make_layout(fdp, ext, fdp.ConsumeIntegralInRange(0, 2));
    bufs.lse_layout.extent[3] = 1;
    bufs.lse.assign(std::size_t(std::max<index_t>(span_of(bufs.lse_layout), 1)), poison<float>());
    bufs.lse2 = bufs.lse;
  }

  if (verbose()) {
    std::fprintf(stderr,
                 "problem: %s tiles<%d,%d,%s> batch=%lld seq_q=%lld seq_k=%lld heads_q=%lld heads_kv=%lld dim=%lld/%lld "
                 "mask=%d band=%d(%lld,%lld) softcap=%g alibi=%g causal=%d window=(%lld,%lld) scale=%g threads=%d "
                 "lse=%d fused=%d invalid=%d\n",
                 type_name<T>(), tile_q<T, Tiles>(), tile_kv<T, Tiles>(), tile_isa<T, Tiles>(), (long long)p.batch,
                 (long long)p.seq_q, (long long)p.seq_k, (long long)p.heads_q, (long long)p.heads_kv,
                 (long long)p.dim, (long long)p.dim_v, int(p.mask), int(p.band), (long long)p.band_left, (long long)p.band_right,
                 p.softcap, p.alibi_base, int(p.opts.causal), (long long)p.opts.window_left,
                 (long long)p.opts.window_right, p.opts.scale ? *p.opts.scale : -1.0, p.threads,
                 int(p.want_lse), int(fused), int(invalid));
    const Tensor<T>* ts[4] = {&bufs.tq, &bufs.tk, &bufs.tv, &bufs.to};
    for (const Tensor<T>* t : ts)
      std::fprintf(stderr, "  layout: strides (%lld, %lld, %lld, %lld) offset %lld\n", (long long)t->layout.stride[0],
                   (long long)t->layout.stride[1], (long long)t->layout.stride[2], (long long)t->layout.stride[3],
                   (long long)t->layout.offset);
  }

  // Values.
  Rng rng{fdp.ConsumeIntegral<std::uint64_t>()};
  const fa::TensorView<T> vq = bufs.tq.view(), vk = bufs.tk.view(), vv = bufs.tv.view();
  // With broadcast strides several index tuples share an element; filling in order leaves the last value.
  fill(fdp, rng, vq);
  fill(fdp, rng, vk);
  fill(fdp, rng, vv);
  const fa::TensorView<T>* views[3] = {&vq, &vk, &vv};
  plant_specials(fdp, views);
  const fa::TensorView<const T> q = vq, k = vk, v = vv;
  fa::TensorView<T> o = bufs.to.view();
  fa::LseView lse = bufs.lse_view(bufs.lse);

  // An invalid call: exactly one corruption of the valid one.
  if (invalid) {
    const auto what = Corruption(fdp.ConsumeIntegralInRange(1, int(Corruption::Count) - 1));
    fa::TensorView<const T> cq = q, ck = k, cv = v;
    fa::TensorView<T> co = o;
    fa::LseView clse = lse;
    fa::AttentionOptions copts = p.opts;
    int cthreads = p.threads;  // the context's num_threads
    bool use_options_mask = p.mask == MaskKind::Options;
    const index_t huge = index_t(1) << 62;
    std::vector<float> lse_guard(7, poison<float>());
    switch (what) {
      case Corruption::BatchMismatch: ck.batch += 1; break;
      case Corruption::KvSeqMismatch: cv.seq += 1; break;
      case Corruption::OSeqMismatch: co.seq += 1; break;
      case Corruption::HeadsNotMultiple:
        // heads_q + 1 KV heads never divides heads_q.
        ck.heads = cv.heads = cq.heads + 1;
        break;
      case Corruption::DimMismatch: cv.dim += 1; break;
      case Corruption::DimTooLarge: cq.dim = ck.dim = cv.dim = co.dim = fa::cpu::kMaxHeadDim + 1; break;
      case Corruption::ZeroHeads:
        if (fdp.ConsumeBool()) cq.heads = co.heads = 0;
        else ck.heads = cv.heads = 0;  // would divide heads_q by 0 if not caught first
        break;
      case Corruption::ZeroDim: cq.dim = ck.dim = cv.dim = co.dim = 0; break;
      case Corruption::NullData: cq.data = nullptr; break;
      case Corruption::NegativeStride: {
        const int which = fdp.ConsumeIntegralInRange(0, 3);
        index_t* strides[4] = {&ck.stride_batch, &ck.stride_seq, &ck.stride_head, &ck.stride_dim};
        *strides[which] = -1 - *strides[which];
        break;
      }
      case Corruption::NegativeExtent: cv.seq = -1 - cv.seq; break;
      case Corruption::BadScale: {
        static constexpr double kBad[] = {0.0, -0.0, -1.0, HUGE_VAL, -HUGE_VAL,
                                          std::numeric_limits<double>::quiet_NaN()};
        copts.scale = kBad[fdp.ConsumeIntegralInRange(0, 5)];
        break;
      }
      case Corruption::OOverlapsInput: {
        // o on top of q's (or v's) own memory: same type, same shape.
        const fa::TensorView<const T>& in = fdp.ConsumeBool() ? q : v;
        if (in.numel() == 0 || in.dim != o.dim || in.heads != o.heads || in.seq != o.seq) {
          copts.scale = -1.0;
          break;
        }
        co = {const_cast<T*>(in.data), in.batch,        in.seq,         in.heads,     in.dim,
              in.stride_batch,         in.stride_seq,   in.stride_head, in.stride_dim};
        break;
      }
      case Corruption::OSelfOverlap:
        // Two index tuples on one element; a single-element o cannot alias itself, so that case gets
        // another corruption.
        if (co.seq > 1) co.stride_seq = 0;
        else if (co.dim > 1) co.stride_dim = 0;
        else if (co.heads > 1) co.stride_head = 0;
        else if (co.batch > 1) co.stride_batch = 0;
        else cthreads = -1;
        break;
      case Corruption::LseShape:
        // One row too many: written without the check, it runs past lse_guard (ASan would see it).
        if (clse.empty()) {
          clse = fa::lse_bhs(lse_guard.data(), q.batch, q.heads, q.seq + 1);
        } else {
          clse.seq += 1;
        }
        break;
      case Corruption::LseOverlap: {
        // An LSE whose bytes overlap an input or o.
        static_assert(sizeof(T) <= sizeof(double));
        const bool on_o = fdp.ConsumeBool();
        float* at = reinterpret_cast<float*>(on_o ? static_cast<void*>(o.data) : const_cast<T*>(q.data));
        if (at == nullptr) {
          copts.scale = -1.0;
          break;
        }
        clse = fa::lse_bhs(at, q.batch, q.heads, q.seq);
        break;
      }
      case Corruption::LseSelfOverlap:
        if (clse.empty() || (clse.seq <= 1 && clse.heads <= 1 && clse.batch <= 1)) {
          cthreads = -1;
          break;
        }
        if (clse.seq > 1) clse.stride_seq = 0;
        else if (clse.heads > 1) clse.stride_head = 0;
        else clse.stride_batch = 0;
        break;
      case Corruption::LseNull: clse = {nullptr, q.batch, q.heads, q.seq, q.heads * q.seq, q.seq, 1}; break;
      case Corruption::NegativeThreads: cthreads = -1 - fdp.ConsumeIntegralInRange(0, 100); break;
      case Corruption::MaskWithWindow:
        if (use_options_mask) {
          copts.scale = std::numeric_limits<double>::quiet_NaN();
        } else {
          copts.causal = fdp.ConsumeBool();
          copts.window_left = copts.causal ? -1 : fdp.ConsumeIntegralInRange(0, 5);
        }
        break;
      case Corruption::StrideOverflow:
        // On a dimension of extent >= 2 (a stride under extent 1 is never used, so it is not an error).
        if (cq.seq > 1) cq.stride_seq = huge;
        else if (cq.dim > 1) cq.stride_dim = huge;
        else if (cq.heads > 1) cq.stride_head = huge;
        else if (cq.batch > 1) cq.stride_batch = huge;
        else cthreads = -1;
        break;
      default: copts.scale = 0.0; break;
    }
    const std::vector<T> o_before = bufs.o, q_before = bufs.q;
    const std::vector<float> lse_before = bufs.lse;
    bool threw = false;
    try {
      with_masks(p, [&](const auto& lib_mask, const auto& /*ref*/) {
        call<Tiles, T>(cthreads, lib_mask, cq, ck, cv, co, copts, clse);
      });
    } catch (const fa::InvalidArgument& e) {
      threw = std::strncmp(e.what(), "flashattn: ", 11) == 0 && std::strlen(e.what()) > 20;
      if (!threw) finding("InvalidArgument without a descriptive message");
      // A negative thread count is then the call's only fault: the message must name it.
      if (cthreads < 0 && std::strstr(e.what(), "context.num_threads") == nullptr)
        finding("a negative context.num_threads rejected with a message that does not name it");
    } catch (...) {
      finding("an invalid call threw something other than flashattn::InvalidArgument");
    }
    FUZZ_CHECK(threw, "an invalid call did not throw");
    for (std::size_t i = 0; i < bufs.o.size(); ++i)
      FUZZ_CHECK(same_bits(bufs.o[i], o_before[i]), "an invalid call wrote to o");
    for (std::size_t i = 0; i < bufs.q.size(); ++i)
      FUZZ_CHECK(same_bits(bufs.q[i], q_before[i]), "an invalid call wrote to an input");
    for (std::size_t i = 0; i < bufs.lse.size(); ++i)
      FUZZ_CHECK(same_bits(bufs.lse[i], lse_before[i]), "an invalid call wrote to lse");
    for (float x : lse_guard) FUZZ_CHECK(same_bits(x, poison<float>()), "an invalid call wrote to lse");
    return;
  }

  // A valid call, twice: on a context with the chosen thread count and on one with the other (1 <-> 2).
  const std::vector<T> q_before = bufs.q, k_before = bufs.k, v_before = bufs.v;
  with_masks(p, [&](const auto& lib_mask, const auto& ref_mask) {
    try {
      call<Tiles, T>(p.threads, lib_mask, q, k, v, o, p.opts, lse);
      const int other_threads = p.threads == 1 ? 2 : 1;
      call<Tiles, T>(other_threads, lib_mask, q, k, v, bufs.to2.view(), p.opts, bufs.lse_view(bufs.lse2));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "exception: %s\n", e.what());
      finding("a valid call threw");
    }
    for (std::size_t i = 0; i < bufs.o.size(); ++i)
      FUZZ_CHECK(same_bits(bufs.o[i], bufs.o2[i]), "results differ between context.num_threads = 1 and 2");
    for (std::size_t i = 0; i < bufs.lse.size(); ++i)
      FUZZ_CHECK(same_bits(bufs.lse[i], bufs.lse2[i]), "LSE differs between context.num_threads = 1 and 2");
    FUZZ_CHECK(untouched_outside(bufs.o, bufs.to.layout, 4), "a write to o outside its view");
    if (p.want_lse) FUZZ_CHECK(untouched_outside(bufs.lse, bufs.lse_layout, 3), "a write to lse outside its view");
    // Inputs are read-only: every byte of their buffers (padding included) is as before.
    const auto same = [](const std::vector<T>& a, const std::vector<T>& b) {
      return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
    };
    FUZZ_CHECK(same(bufs.q, q_before) && same(bufs.k, k_before) && same(bufs.v, v_before), "an input was written");
    const double scale = p.opts.scale ? *p.opts.scale : 1.0 / std::sqrt(double(p.dim));
    // Kernels read subnormal inputs as 0: all of them on x86, where they run with DAZ set
    // (cpu/denormals.hpp; fp16's subnormals are normal floats once widened), and elsewhere the bf16
    // dot-product kernels of AVX512_BF16 (the prefill kernel's, and the decode kernel's bf16 pairs).
    constexpr fa::cpu::Isa isa = resolved_tiles<T, Tiles>::isa;
    const bool flushes = fa::cpu::kFlushesDenormals
                             ? !std::is_same_v<T, Eigen::half>
                             : sizeof(T) == 2 && !std::is_same_v<T, Eigen::half> && isa == fa::cpu::Isa::Avx512Bf16;
    check_results<T>(q, k, v, o, lse, scale, ref_mask, flushes);
  });
  check_cache_paths<Tiles, T>(fdp, p, q, k, v, bufs);
  check_backward_paths<Tiles, T>(fdp, p, q, k, v);
}

// The tile configuration. The 16-bit types share the float kernels after conversion, so they take only
// the default tiles and the smallest ones (one instantiation set less to compile per path).
template <class T>
void run_type(FuzzedDataProvider& fdp) {
  using Acc = fa::cpu::acc_t<T>;
  constexpr int best_width = fa::cpu::Simd<Acc, fa::cpu::kBestIsa>::width;
  constexpr bool wide = sizeof(T) >= 4;
  switch (fdp.ConsumeIntegralInRange(0, wide ? 3 : 1)) {
    // The default tiles, named rather than AutoTiles: AutoTiles also compiles the tall tiles, which only
    // CPUs with a 2 MiB L2 run.
    case 0: return run<T, fa::cpu::DefaultTiles<T>>(fdp);
    case 1: return run<T, fa::cpu::Tiles<best_width, 8>>(fdp);  // many key tiles per row block
    case 2:
      if constexpr (fa::cpu::kHasAvx2) {
        return run<T, fa::cpu::Tiles<2 * fa::cpu::Simd<Acc, fa::cpu::Isa::Avx2>::width, 16, fa::cpu::Isa::Avx2>>(fdp);
      } else {
        return run<T, fa::cpu::DefaultTiles<T>>(fdp);
      }
    default: return run<T, fa::cpu::Tiles<3, 5, fa::cpu::Isa::Portable>>(fdp);  // odd tiles, scalar path
  }
}

}  // namespace flashattn_fuzz

