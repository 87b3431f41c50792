#pragma once
// Short casts the tests use everywhere: z(i) to size_t (indexing std::vector with Index
// arithmetic), dbl(x) of a float-convertible element (half, bfloat16, float, int8) to double,
// rnd<T>(x) a double rounded to T, and whole vectors as floats or doubles.

#include <cstddef>
#include <vector>

namespace support {

template <class I>
std::size_t z(I i) {
  return static_cast<std::size_t>(i);
}

template <class T>
double dbl(T x) {
  return static_cast<double>(static_cast<float>(x));
}

/// x rounded to T (through float), as a double.
template <class T>
double rnd(double x) {
  return dbl(T(static_cast<float>(x)));
}

template <class T>
std::vector<float> as_floats(const std::vector<T>& x) {
  std::vector<float> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = static_cast<float>(x[i]);
  return r;
}

template <class T>
std::vector<double> as_doubles(const std::vector<T>& x) {
  std::vector<double> r(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) r[i] = dbl(x[i]);
  return r;
}

}  // namespace support
