#pragma once
// NumPy .npy files (format 1.0) written from views and vectors: the C++ side of the Python
// layer's cross-check. tests/python/test_cpp_api.py runs a family's `PythonGolden.*` tests with
// ATTNREF_GOLDEN_DIR set; they run the C++ API on inputs they make and save inputs and results
// there, and the Python test compares its own calls' results with these bits. Without the
// variable the tests skip (they check nothing by themselves).

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace support {

/// The folder the golden files go to ("" when the cross-check is not running).
inline std::string golden_dir() {
  const char* d = std::getenv("ATTNREF_GOLDEN_DIR");
  return d ? std::string(d) : std::string();
}

/// NumPy's type string of T (bfloat16 as uint16 bit patterns, the module's convention).
template <class T>
const char* npy_descr() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, attnref::half>) return "<f2";
  if constexpr (std::is_same_v<U, attnref::bfloat16>) return "<u2";
  if constexpr (std::is_same_v<U, float>) return "<f4";
  if constexpr (std::is_same_v<U, std::int8_t>) return "|i1";
  if constexpr (std::is_same_v<U, std::uint8_t>) return "|u1";
  if constexpr (std::is_same_v<U, std::int32_t>) return "<i4";
  if constexpr (std::is_same_v<U, std::int64_t>) return "<i8";
}

/// Writes `n` elements at `data`, C order, with `shape`, to `dir`/`name`.npy.
template <class T>
void save_npy(const std::string& dir, const std::string& name, const T* data,
              const std::vector<attnref::Index>& shape, size_t n) {
  std::string dims;
  for (attnref::Index e : shape) dims += std::to_string(e) + ", ";
  std::string header = std::string("{'descr': '") + npy_descr<T>() +
                       "', 'fortran_order': False, 'shape': (" + dims + "), }";
  header.append(64 - (10 + header.size() + 1) % 64, ' ');
  header += '\n';
  std::ofstream f(dir + "/" + name + ".npy", std::ios::binary);
  const std::uint16_t len = static_cast<std::uint16_t>(header.size());
  f.write("\x93NUMPY\x01\x00", 8);
  f.put(static_cast<char>(len & 0xff)).put(static_cast<char>(len >> 8));
  f << header;
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(T)));
  if (!f) throw std::runtime_error("cannot write " + dir + "/" + name + ".npy");
}

/// A dense (C-order) view, saved with its shape.
template <class T, int R>
void save_npy(const std::string& dir, const std::string& name,
              const attnref::StridedView<T, R>& v) {
  std::vector<attnref::Index> shape;
  size_t n = 1;
  for (int d = 0; d < v.rank(); ++d) {
    shape.push_back(v.size(d));
    n *= static_cast<size_t>(v.size(d));
  }
  save_npy(dir, name, v.data(), shape, n);
}

/// A list of integers (lengths), saved as a 1-D int64 array.
template <class I>
void save_npy(const std::string& dir, const std::string& name, const std::vector<I>& v) {
  const std::vector<std::int64_t> w(v.begin(), v.end());
  save_npy(dir, name, w.data(), {static_cast<attnref::Index>(w.size())}, w.size());
}

/// `n` standard-normal values rounded to T.
template <class T>
std::vector<T> normal_values(std::mt19937& rng, attnref::Index n) {
  std::normal_distribution<float> nd;
  std::vector<T> v(static_cast<size_t>(n));
  for (T& x : v) x = T(nd(rng));
  return v;
}

}  // namespace support
