#pragma once
/// TensorRef<T>: a contiguous row-major tensor with the vendor's shape (an aclTensor in ND
/// format): pointer + extents, rank decided at run time. The CANN operators take their inputs
/// this way because their layout string, not the type, decides what each dimension means.
/// Non-owning; a default-constructed TensorRef is absent.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

template <class T>
struct TensorRef {
  T* data = nullptr;
  std::vector<Index> shape;

  TensorRef() = default;
  TensorRef(T* d, std::vector<Index> s) : data(d), shape(std::move(s)) {}
  /// A mutable tensor converts to a const one.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  TensorRef(const TensorRef<U>& o) : data(o.data), shape(o.shape) {}  // NOLINT

  bool absent() const { return data == nullptr && shape.empty(); }
  Index rank() const { return static_cast<Index>(shape.size()); }
  Index dim(Index i) const { return shape[static_cast<size_t>(i)]; }
  /// Product of the extents (0 when one is 0); overflow throws std::invalid_argument (operators
  /// run detail::check_tensor first, so their errors name the argument).
  Index numel() const {
    for (Index e : shape)
      if (e == 0) return 0;
    Index n = 1;
    for (Index e : shape) n = detail::checked_mul("TensorRef::numel", "shape", n, e);
    return n;
  }
};

namespace detail {
/// The edge check of a tensor argument: every extent >= 0, the product of the nonzero extents
/// and its byte size representable in 64 bits, and non-null data when it has elements. Absent
/// tensors pass.
template <class T>
void check_tensor(const char* fn, const std::string& name, const TensorRef<T>& t) {
  if (t.absent()) return;
  bool empty = false;
  Index n = 1;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    const Index e = t.shape[d];
    ATTNREF_CHECK(e >= 0, std::invalid_argument, fn, name + ".shape[" + std::to_string(d) + "]",
                  "negative", ">= 0", e);
    empty = empty || e == 0;
    n = checked_mul(fn, name + ".shape", n, e == 0 ? 1 : e);
  }
  checked_mul(fn, name + " byte size", n, static_cast<Index>(sizeof(T)));
  ATTNREF_CHECK(empty || t.data != nullptr, std::invalid_argument, fn, name, "data is null",
                "a non-null pointer for " + std::to_string(n) + " elements", "nullptr");
}

/// True when two tensors' memory overlaps (contiguous tensors: [data, data + numel)).
template <class A, class B>
bool overlaps(const TensorRef<A>& a, const TensorRef<B>& b) {
  if (a.data == nullptr || b.data == nullptr || a.numel() == 0 || b.numel() == 0) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data);
  const auto a1 = a0 + static_cast<std::uintptr_t>(a.numel()) * sizeof(A);
  const auto b1 = b0 + static_cast<std::uintptr_t>(b.numel()) * sizeof(B);
  return a0 < b1 && b0 < a1;
}

/// check_tensor on each (name, tensor) pair: check_tensors(fn, "query", q, "key", k, ...).
inline void check_tensors(const char*) {}
template <class T, class... Rest>
void check_tensors(const char* fn, const char* name, const TensorRef<T>& t, const Rest&... rest) {
  check_tensor(fn, name, t);
  check_tensors(fn, rest...);
}

/// "[a, b, c]" (or "none" for an absent tensor), for error messages.
template <class T>
std::string shape_str(const TensorRef<T>& t) {
  if (t.absent()) return "none";
  std::string s = "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}
}  // namespace detail

}  // namespace attnref
