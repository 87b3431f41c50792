#pragma once
// What the input-model tests share (input_model_test.cpp, input_model_nsa_sa_test.cpp): an extent
// whose products overflow 64 bits, and the check that an output still holds its sentinel.

#include <attnref/core/types.hpp>
#include <vector>

namespace input_model_support {

using attnref::Index;

constexpr Index kHuge = Index(1) << 33;

inline bool all_equal(const std::vector<float>& x, float v) {
  for (float e : x)
    if (!(e == v)) return false;
  return true;
}

}  // namespace input_model_support
