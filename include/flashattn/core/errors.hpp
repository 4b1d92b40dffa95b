#pragma once
// The one exception type of the public API. Deriving from std::invalid_argument lets callers catch it
// with the standard type; the message always names the offending argument and its values.

#include <stdexcept>
#include <string>

namespace flashattn {

class InvalidArgument : public std::invalid_argument {
 public:
  explicit InvalidArgument(const std::string& what) : std::invalid_argument("flashattn: " + what) {}
};

}  // namespace flashattn
