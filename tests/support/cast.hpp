#pragma once
// Short casts the tests use everywhere: z(i) to size_t (indexing std::vector with Index
// arithmetic), dbl(x) of a float-convertible element (half, bfloat16, float) to double.

#include <cstddef>

namespace support {

template <class I>
std::size_t z(I i) {
  return static_cast<std::size_t>(i);
}

template <class T>
double dbl(T x) {
  return static_cast<double>(static_cast<float>(x));
}

}  // namespace support
