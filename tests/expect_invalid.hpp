#pragma once
// The bad-input tests' one assertion: the call throws flashattn::InvalidArgument whose message contains
// `needle` (the argument's name and values), and nothing else.

#include <gtest/gtest.h>

#include <string>

#include "flashattn/core/errors.hpp"

namespace flashattn::testing {

template <class F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace flashattn::testing
