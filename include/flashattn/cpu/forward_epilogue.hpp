#pragma once
// The end of a forward program: its panels' Oᵀ accumulators leave the kernel, either normalised into O
// (store_o) or, for a program over one key range of a split call, as unnormalised partial states
// (store_partial, merged by split_kv.hpp).

#include <cstddef>

#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"
#include "flashattn/cpu/isa.hpp"
#include "flashattn/cpu/online_softmax.hpp"
#include "flashattn/cpu/transpose.hpp"

namespace flashattn::cpu {

template <class T, class Acc, int PanelQ, Isa isa>
struct ForwardEpilogue {

  // O rows [q0, q0 + rows) = Oᵀ columns · inv_l (then the policy's output transform, if it has one). ot is
  // consumed (scaled in place when O has unit dim stride). Either way an element is T(the Acc product),
  // so both paths give the same bits.
  template <class Policy>
  static void store_o(const TensorView<T>& o, const Policy& policy, const SequenceInfo& seq, index_t q0, int rows,
                      int d, Acc* ot, const Acc* inv_l) {
    const index_t b = seq.batch, h = seq.head;
    // A row that kept no key is exactly 0, even if a NaN in V reached its accumulator through a 0 weight.
    if constexpr (transforms_output_v<Policy>) {
      for (int i = 0; i < rows; ++i) {
        T* row = o.row(b, q0 + i, h);
        for (int c = 0; c < d; ++c) {
          const Acc x = kept_no_key(inv_l[i]) ? Acc(0) : ot[c * PanelQ + i] * inv_l[i];
          row[c * o.stride_dim] = T(Acc(policy.transform_output(q0 + i, c, x)));
        }
      }
      return;
    }
    if (o.stride_dim == 1) {
      for (int c = 0; c < d; ++c) {
        Acc* col = ot + c * PanelQ;
        for (int i = 0; i < PanelQ; ++i) col[i] = kept_no_key(inv_l[i]) ? Acc(0) : col[i] * inv_l[i];
      }
      transpose<isa>(ot, PanelQ, o.row(b, q0, h), o.stride_seq, d, rows);
      return;
    }
    for (int i = 0; i < rows; ++i) {
      T* row = o.row(b, q0 + i, h);
      const Acc scale = inv_l[i];
      const bool none = kept_no_key(scale);
      for (int c = 0; c < d; ++c) row[c * o.stride_dim] = none ? T(0) : T(ot[c * PanelQ + i] * scale);
    }
  }

  // The panel's partial state for rows [0, rows): unnormalised O rows (d apart), running max and sum.
  template <class Softmax>
  static void store_partial(const Softmax& softmax, const Acc* ot, int rows, int d, Acc* part_o, Acc* part_m,
                            Acc* part_l) {
    for (int i = 0; i < rows; ++i) {
      part_m[i] = softmax.running_max(i);
      part_l[i] = softmax.running_sum(i);
    }
    transpose<isa>(ot, PanelQ, part_o, d, d, rows);
  }
};

}  // namespace flashattn::cpu
