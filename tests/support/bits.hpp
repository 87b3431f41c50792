#pragma once
// Bitwise equality of two buffers, as a plain bool (no GoogleTest: the fuzz harness uses it too).
// In a test, support::bitwise_equal (compare.hpp) says where the buffers differ.

#include <cstring>
#include <vector>

namespace support {

/// Same size and the same bytes (NaN == NaN when the bits agree).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace support
