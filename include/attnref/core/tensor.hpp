#pragma once
/// TensorRef<T>: a contiguous row-major tensor with the vendor's shape (an aclTensor in ND
/// format): pointer + extents, rank decided at run time. The CANN operators take their inputs
/// this way because their layout string, not the type, decides what each dimension means.
/// Non-owning; a default-constructed TensorRef is absent.

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

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
  Index numel() const {
    Index n = 1;
    for (Index e : shape) n *= e;
    return n;
  }
};

namespace detail {
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
