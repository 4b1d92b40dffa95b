#pragma once
// A backend context says which backend runs a call and how (threads and tiles on the CPU; a stream on a
// GPU): the optional first argument of every entry point. Each backend defines its own context type with
// `static constexpr const char* backend`, and its own dispatch_forward / dispatch_backward /
// validate_context overloads for it, found by argument-dependent lookup; the entry points stay the same.

#include <type_traits>

namespace flashattn {

template <class C, class = void>
struct is_backend_context : std::false_type {};
template <class C>
struct is_backend_context<C, std::void_t<decltype(C::backend)>> : std::true_type {};

template <class C>
inline constexpr bool is_backend_context_v = is_backend_context<C>::value;

}  // namespace flashattn
