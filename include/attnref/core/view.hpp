#pragma once
/// StridedView<T, Rank>: a non-owning pointer + shape + strides (in elements).
///
/// Every tensor attnref reads or writes is passed as a view, so padded, permuted and broadcast
/// (stride 0) inputs work without copies. `T` may be const-qualified for inputs. A default
/// constructed view is empty (null data, all extents 0) and means "absent" for optional inputs.

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/types.hpp"

namespace attnref {

template <class T, int Rank>
class StridedView {
  static_assert(Rank >= 1, "StridedView needs rank >= 1");

 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using Shape = std::array<Index, Rank>;
  static constexpr int rank = Rank;

  StridedView() = default;

  /// View with explicit strides (elements, may be 0 for broadcast or any sign).
  StridedView(T* data, const Shape& shape, const Shape& strides)
      : data_(data), shape_(shape), strides_(strides) {}

  /// Densely packed row-major view (last dimension contiguous).
  StridedView(T* data, const Shape& shape) : data_(data), shape_(shape) {
    Index s = 1;
    for (int i = Rank - 1; i >= 0; --i) {
      strides_[i] = s;
      s *= shape[i];
    }
  }

  /// A mutable view converts to a const one.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  StridedView(const StridedView<U, Rank>& other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  Index size(int dim) const { return shape_[dim]; }
  Index stride(int dim) const { return strides_[dim]; }

  /// Number of elements (product of extents).
  Index numel() const {
    Index n = 1;
    for (Index e : shape_) n *= e;
    return n;
  }
  /// True when the view holds no data pointer (an absent optional input).
  bool absent() const { return data_ == nullptr; }

  template <class... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    return data_[offset(idx...)];
  }

  template <class... I>
  Index offset(I... idx) const {
    const std::array<Index, Rank> i{static_cast<Index>(idx)...};
    Index off = 0;
    for (int d = 0; d < Rank; ++d) off += i[d] * strides_[d];
    return off;
  }

  /// Pointer to element idx (no bounds check).
  template <class... I>
  T* ptr(I... idx) const {
    return data_ + offset(idx...);
  }

 private:
  T* data_ = nullptr;
  Shape shape_{};
  Shape strides_{};
};

/// Densely packed row-major view.
template <int Rank, class T>
StridedView<T, Rank> make_view(T* data, const std::array<Index, Rank>& shape) {
  return StridedView<T, Rank>(data, shape);
}

/// 1-D view over a std::vector (const).
template <class T>
StridedView<const T, 1> make_view(const std::vector<T>& v) {
  return StridedView<const T, 1>(v.data(), {static_cast<Index>(v.size())});
}

/// 1-D view over a std::vector (mutable).
template <class T>
StridedView<T, 1> make_view(std::vector<T>& v) {
  return StridedView<T, 1>(v.data(), {static_cast<Index>(v.size())});
}

namespace detail {

/// Byte range [lo, hi) touched by a view (empty range when the view has no elements).
template <class T, int Rank>
std::array<std::uintptr_t, 2> byte_range(const StridedView<T, Rank>& v) {
  if (v.absent() || v.numel() == 0) return {0, 0};
  Index lo = 0, hi = 0;
  for (int d = 0; d < Rank; ++d) {
    const Index span = (v.size(d) - 1) * v.stride(d);
    if (span < 0)
      lo += span;
    else
      hi += span;
  }
  const auto base = reinterpret_cast<std::uintptr_t>(v.data());
  const auto esz = static_cast<Index>(sizeof(T));
  return {base + static_cast<std::uintptr_t>(lo * esz),
          base + static_cast<std::uintptr_t>((hi + 1) * esz)};
}

/// True when two views touch overlapping memory (conservative: compares byte ranges).
template <class A, int RA, class B, int RB>
bool overlaps(const StridedView<A, RA>& a, const StridedView<B, RB>& b) {
  const auto ra = byte_range(a);
  const auto rb = byte_range(b);
  if (ra[0] == ra[1] || rb[0] == rb[1]) return false;
  return ra[0] < rb[1] && rb[0] < ra[1];
}

/// "[a, b, c]": the shape of a view (or of an extent array), for error messages.
template <class T, int R>
inline std::string shape_str(const StridedView<T, R>& v) {
  std::string s = "[";
  for (int i = 0; i < R; ++i) s += (i ? ", " : "") + std::to_string(v.size(i));
  return s + "]";
}

template <int R>
inline std::string shape_str(const std::array<Index, R>& a) {
  std::string s = "[";
  for (int i = 0; i < R; ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}

}  // namespace detail
}  // namespace attnref
