#pragma once
// Compile-time checks of an entry point's types. Each is a static_assert whose message names the fix,
// and a `value` that the entry point tests with `if constexpr` around its body: after a failed check
// nothing else is instantiated, so the user reads one error instead of pages of template backtrace
// (tests/compile_fail holds a program for each mistake and the message it must give).

#include <type_traits>
#include <utility>

#include "flashattn/core/sequence.hpp"
#include "flashattn/core/variants.hpp"
#include "flashattn/core/views.hpp"

namespace flashattn::detail {

template <class T, class = void>
struct is_complete : std::false_type {};
template <class T>
struct is_complete<T, std::void_t<decltype(sizeof(T))>> : std::true_type {};

// The element type of the call, as deduced from its output view (o, or dq / dk / dv).
template <class T>
struct check_element_type {
  static constexpr bool writable = !std::is_const_v<T>;
  static_assert(writable,
                "flashattn: the output view (o, or dq / dk / dv) is a view of const data; outputs are written: "
                "make the view from a non-const pointer");
  static constexpr bool complete = is_complete<std::remove_const_t<T>>::value;
  static_assert(!writable || complete,
                "flashattn: the element type is incomplete here (only declared): include its definition before "
                "the call; flashattn/flashattn.hpp brings the 16-bit types' (half, bfloat16)");
  static constexpr bool value = writable && complete;
};

template <class P, class = void>
struct has_mask_members : std::false_type {};
template <class P>
struct has_mask_members<P, std::void_t<decltype(index_t(std::declval<const P&>().kv_begin(index_t{}, index_t{}))),
                                       decltype(index_t(std::declval<const P&>().kv_end(index_t{}, index_t{}))),
                                       decltype(std::declval<const P&>().tile(index_t{}, index_t{}, index_t{}, index_t{})),
                                       decltype(bool(std::declval<const P&>().keep(index_t{}, index_t{})))>>
    : std::true_type {};

// A policy given to attention_forward_masked / attention_backward_masked (core/masks.hpp, variants.hpp),
// as the kernels see it for one (batch entry, head) (policy_for).
template <class Policy>
struct check_policy_type {
  using Head = decltype(policy_for(std::declval<const Policy&>(), SequenceInfo{}));
  static constexpr bool value = has_mask_members<Head>::value;
  static_assert(value,
                "flashattn: a mask policy needs kv_begin(q0, q1), kv_end(q0, q1), tile(q0, q1, k0, k1) and "
                "keep(i, j) const members (core/masks.hpp): for a keep(i, j) function alone, pass "
                "element_mask(seq_k, fn); to change scores over a mask, score_mod(mask, fn[, grad_fn])");
};

// The same for the backward, which must also differentiate what the policy does to the scores.
template <class Policy>
struct check_backward_policy_type {
  static constexpr bool mask_ok = check_policy_type<Policy>::value;
  using Head = typename check_policy_type<Policy>::Head;
  static constexpr bool differentiable = !mask_ok || differentiable_mask_v<Head>;
  static_assert(differentiable,
                "flashattn: the policy changes scores (modifies_scores) but has no score_grad(i, j, s), which "
                "the backward needs: give score_mod its derivative, score_mod(mask, fn, grad_fn)");
  static constexpr bool no_output_transform = !mask_ok || !transforms_output_v<Head>;
  static_assert(no_output_transform,
                "flashattn: the backward does not differentiate transform_output(): leave it out of the policy "
                "given to attention_backward_masked and apply its derivative to d_o yourself");
  static constexpr bool value = mask_ok && differentiable && no_output_transform;
};

}  // namespace flashattn::detail
