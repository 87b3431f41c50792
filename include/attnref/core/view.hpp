#pragma once
/// StridedView<T, Rank>: a non-owning pointer + shape + strides (in elements), the one tensor
/// type of attnref.
///
/// Every tensor attnref reads or writes is passed as a view, so padded, permuted and broadcast
/// (stride 0) inputs work. `T` may be const-qualified for inputs. A default constructed view is
/// empty (null data, all extents 0) and means "absent" for optional inputs.
///
/// Rank is either fixed (StridedView<T, 4>: the engine, ATB) or decided at run time
/// (StridedView<T>, Rank = dynamic_rank, up to 8 dimensions like an aclTensor: the CANN, MLA and
/// NSA operators, whose layout string or mode, not the type, decides what each dimension means).
/// Both have the same interface: data(), rank(), shape(), strides(), size(d), stride(d),
/// numel(), absent(); a fixed-rank view converts to a dynamic one, and a dynamic one to a fixed
/// rank with fixed<R>().

#include <array>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

/// The Rank of a StridedView whose rank is decided at run time.
inline constexpr int dynamic_rank = -1;
/// The largest rank of a dynamic-rank view (an aclTensor has at most 8 dimensions).
inline constexpr int max_dynamic_rank = 8;

template <class T, int Rank = dynamic_rank>
class StridedView;

/// The extents (or strides) of a dynamic-rank view: a small vector of at most max_dynamic_rank
/// values, stored inline. Built from a braced list, a std::vector or a std::array; more than
/// max_dynamic_rank values throw std::invalid_argument.
class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<Index> v) { assign(v.begin(), v.size()); }  // NOLINT
  Dims(const std::vector<Index>& v) { assign(v.data(), v.size()); }      // NOLINT
  template <size_t N>
  Dims(const std::array<Index, N>& v) {  // NOLINT
    assign(v.data(), N);
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  Index back() const { return v_[static_cast<size_t>(n_ - 1)]; }
  Index operator[](int i) const { return v_[static_cast<size_t>(i)]; }
  Index& operator[](int i) { return v_[static_cast<size_t>(i)]; }
  const Index* begin() const { return v_.data(); }
  const Index* end() const { return v_.data() + n_; }
  friend bool operator==(const Dims& a, const Dims& b) {
    if (a.n_ != b.n_) return false;
    for (int i = 0; i < a.n_; ++i)
      if (a[i] != b[i]) return false;
    return true;
  }
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }

 private:
  void assign(const Index* p, size_t n) {
    ATTNREF_CHECK(n <= static_cast<size_t>(max_dynamic_rank), std::invalid_argument, "Dims", "rank",
                  "too large", "<= 8", n);
    n_ = static_cast<int>(n);
    for (size_t i = 0; i < n; ++i) v_[i] = p[i];
  }
  std::array<Index, max_dynamic_rank> v_{};
  int n_ = 0;
};

namespace detail {
/// The product of the extents (0 when one is 0, 1 for none); overflow throws
/// std::invalid_argument naming StridedView::numel.
template <class Extents>
Index extent_product(const Extents& shape) {
  for (Index e : shape)
    if (e == 0) return 0;
  Index n = 1;
  for (Index e : shape) n = checked_mul("StridedView::numel", "shape", n, e);
  return n;
}

template <class Extents>
bool all_zero(const Extents& shape) {
  for (Index e : shape)
    if (e != 0) return false;
  return true;
}

/// Row-major strides of a dense `shape` (last dimension contiguous); a negative extent or an
/// element count past 64 bits throws std::invalid_argument naming `fn`.
template <int Rank>
std::array<Index, Rank> dense_strides(const char* fn, const std::array<Index, Rank>& shape) {
  std::array<Index, Rank> st{};
  Index s = 1;
  for (int i = Rank - 1; i >= 0; --i) {
    ATTNREF_CHECK(shape[i] >= 0, std::invalid_argument, fn, "shape[" + std::to_string(i) + "]",
                  "negative", ">= 0", shape[i]);
    st[i] = s;
    s = checked_mul(fn, "shape", s, shape[i]);
  }
  return st;
}
}  // namespace detail

template <class T, int Rank>
class StridedView {
  static_assert(Rank >= 1, "StridedView needs rank >= 1 (or dynamic_rank)");

 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using Shape = std::array<Index, Rank>;
  static constexpr int rank() { return Rank; }

  StridedView() = default;

  /// View with explicit strides (elements, may be 0 for broadcast or any sign).
  StridedView(T* data, const Shape& shape, const Shape& strides)
      : data_(data), shape_(shape), strides_(strides) {}

  /// Densely packed row-major view (last dimension contiguous). A negative extent, or a shape
  /// whose element count overflows 64 bits, throws std::invalid_argument.
  StridedView(T* data, const Shape& shape)
      : data_(data), shape_(shape), strides_(detail::dense_strides<Rank>("StridedView", shape)) {}

  /// A mutable view converts to a const one.
  template <class U, class = std::enable_if_t<std::is_same_v<const U, T> && !std::is_same_v<U, T>>>
  StridedView(const StridedView<U, Rank>& other)  // NOLINT(google-explicit-constructor)
      : data_(other.data()), shape_(other.shape()), strides_(other.strides()) {}

  T* data() const { return data_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  Index size(int dim) const { return shape_[dim]; }
  Index stride(int dim) const { return strides_[dim]; }

  /// Number of elements (product of extents; 0 when any extent is 0). Throws
  /// std::invalid_argument when the product overflows 64 bits: operators run detail::check_view
  /// on their arguments first, so the error names the operator and the argument.
  Index numel() const { return detail::extent_product(shape_); }
  /// True for a default-constructed view (null data, every extent 0): an absent optional input.
  /// A view with null data and some nonzero extent is present (and empty when another extent is
  /// 0; rejected by check_view when it has elements).
  bool absent() const { return data_ == nullptr && detail::all_zero(shape_); }

  template <class... I>
  T& operator()(I... idx) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    return data_[offset(idx...)];
  }

  /// Element offset of idx (no bounds check). One fold over the indices: no index array, so an
  /// unoptimised build (the sanitizer tests) makes no call per dimension.
  template <class... I>
  Index offset(I... idx) const {
    static_assert(sizeof...(I) == Rank, "wrong number of indices");
    const Index* st = strides_.data();
    Index off = 0;
    ((off += static_cast<Index>(idx) * *st++), ...);
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

/// The dynamic-rank view: the same interface with the rank decided at run time. The dense
/// constructor does not validate the shape (a negative or overflowing extent gives unspecified
/// strides): every operator runs detail::check_view first, which rejects it naming the operator
/// and the argument.
template <class T>
class StridedView<T, dynamic_rank> {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;

  StridedView() = default;

  /// Densely packed row-major view (last dimension contiguous).
  StridedView(T* data, const Dims& shape) : data_(data), shape_(shape), strides_(shape) {
    std::uint64_t s = 1;  // unsigned: wraps instead of overflowing; check_view rejects such shapes
    for (int i = shape.size() - 1; i >= 0; --i) {
      strides_[i] = static_cast<Index>(s);
      s *= static_cast<std::uint64_t>(shape[i]);
    }
  }

  /// View with explicit strides (elements, any sign, 0 to broadcast); one per dimension.
  StridedView(T* data, const Dims& shape, const Dims& strides)
      : data_(data), shape_(shape), strides_(strides) {
    ATTNREF_CHECK(shape.size() == strides.size(), std::invalid_argument, "StridedView", "strides",
                  "rank differs from the shape's", shape.size(), strides.size());
  }

  /// A fixed-rank view, or a mutable dynamic one, converts (to const T where T is const).
  template <class U, int R,
            class = std::enable_if_t<(R >= 1 || std::is_const_v<T>)&&(std::is_same_v<U, T> ||
                                                                      std::is_same_v<const U, T>)>>
  StridedView(const StridedView<U, R>& o)  // NOLINT(google-explicit-constructor)
      : data_(o.data()), shape_(o.shape()), strides_(o.strides()) {}

  T* data() const { return data_; }
  int rank() const { return shape_.size(); }
  const Dims& shape() const { return shape_; }
  const Dims& strides() const { return strides_; }
  Index size(int dim) const { return shape_[dim]; }
  Index stride(int dim) const { return strides_[dim]; }

  /// Number of elements (1 for rank 0; overflow throws, see the fixed-rank numel()).
  Index numel() const { return detail::extent_product(shape_); }
  /// True for null data with every extent 0 (a default-constructed view: an absent input).
  bool absent() const { return data_ == nullptr && detail::all_zero(shape_); }
  /// True when the strides are the dense row-major ones (extents of 1 may have any stride).
  bool dense() const {
    Index s = 1;
    for (int i = rank() - 1; i >= 0; --i) {
      if (shape_[i] != 1 && strides_[i] != s) return false;
      s *= shape_[i];
    }
    return true;
  }

  /// Element at a multi-index of rank() values (no bounds check).
  T& at(const Index* idx) const {
    Index off = 0;
    for (int d = 0; d < rank(); ++d) off += idx[d] * strides_[d];
    return data_[off];
  }

  /// The same view with fixed rank R; another rank throws std::invalid_argument naming
  /// `fn` / `name`.
  template <int R>
  StridedView<T, R> fixed(const char* fn = "StridedView::fixed", const char* name = "view") const {
    ATTNREF_CHECK(rank() == R, std::invalid_argument, fn, std::string(name) + ".rank", "mismatch",
                  R, rank());
    std::array<Index, R> sh{}, st{};
    for (int d = 0; d < R; ++d) sh[d] = shape_[d], st[d] = strides_[d];
    return StridedView<T, R>(data_, sh, st);
  }

 private:
  T* data_ = nullptr;
  Dims shape_{};
  Dims strides_{};
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
  for (int d = 0; d < v.rank(); ++d) {
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

/// The edge check every operator runs on each view argument before using it: every extent
/// >= 0; the product of the nonzero extents (so any size an operator derives from them) and the
/// memory span in bytes representable in 64 bits; a non-null pointer when the view has
/// elements. Messages name `fn` and `name`.
template <class T, int Rank>
void check_view(const char* fn, const std::string& name, const StridedView<T, Rank>& v) {
  if (Rank == dynamic_rank && v.absent()) return;  // an absent optional input (rank 0, null)
  for (int d = 0; d < v.rank(); ++d)
    ATTNREF_CHECK(v.size(d) >= 0, std::invalid_argument, fn,
                  name + ".shape[" + std::to_string(d) + "]", "negative", ">= 0", v.size(d));
  Index n = 1, span = 0;
  bool empty = false;
  for (int d = 0; d < v.rank(); ++d) {  // the element count first: it names the shape
    empty = empty || v.size(d) == 0;
    n = checked_mul(fn, name + ".shape", n, v.size(d) == 0 ? 1 : v.size(d));
  }
  for (int d = 0; d < v.rank(); ++d) {
    const Index e = v.size(d), st = v.stride(d);
    ATTNREF_CHECK(st != std::numeric_limits<Index>::min(), std::invalid_argument, fn,
                  name + ".strides[" + std::to_string(d) + "]", "out of range", "|stride| < 2^63",
                  st);
    if (e > 1)
      span = checked_add(fn, name + " memory span", span,
                         checked_mul(fn, name + " memory span", e - 1, st < 0 ? -st : st));
  }
  checked_mul(fn, name + " memory span", checked_add(fn, name + " memory span", span, 1),
              static_cast<Index>(sizeof(T)));
  ATTNREF_CHECK(empty || v.data() != nullptr, std::invalid_argument, fn, name, "data is null",
                "a non-null pointer for " + std::to_string(n) + " elements", "nullptr");
}

/// check_view on each (name, view) pair: check_views(fn, "query", q, "key", k, ...).
inline void check_views(const char*) {}
template <class T, int Rank, class... Rest>
void check_views(const char* fn, const char* name, const StridedView<T, Rank>& v,
                 const Rest&... rest) {
  check_view(fn, name, v);
  check_views(fn, rest...);
}

/// True when two views touch overlapping memory (conservative: compares byte ranges).
template <class A, int RA, class B, int RB>
bool overlaps(const StridedView<A, RA>& a, const StridedView<B, RB>& b) {
  const auto ra = byte_range(a);
  const auto rb = byte_range(b);
  if (ra[0] == ra[1] || rb[0] == rb[1]) return false;
  return ra[0] < rb[1] && rb[0] < ra[1];
}

/// `v` with dimension `dim` (extent outer * inner, checked by the caller) split into
/// [outer, inner]: the view of [.., H·D, ..] as [.., H, D, ..], strides kept.
template <class T>
StridedView<T> split_dim(const StridedView<T>& v, int dim, Index outer, Index inner) {
  Dims sh, st;
  std::vector<Index> a, b;
  for (int d = 0; d < v.rank(); ++d) {
    if (d == dim) {
      a.push_back(outer), b.push_back(v.stride(d) * inner);
      a.push_back(inner), b.push_back(v.stride(d));
    } else {
      a.push_back(v.size(d)), b.push_back(v.stride(d));
    }
  }
  return StridedView<T>(v.data(), Dims(a), Dims(b));
}

/// "[a, b, c]": the shape of a view (or of an extent array; "none" for an absent dynamic-rank
/// view), for error messages.
template <class T, int R>
inline std::string shape_str(const StridedView<T, R>& v) {
  if (R == dynamic_rank && v.absent()) return "none";
  std::string s = "[";
  for (int i = 0; i < v.rank(); ++i) s += (i ? ", " : "") + std::to_string(v.size(i));
  return s + "]";
}

inline std::string shape_str(const Dims& a) {
  std::string s = "[";
  for (int i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
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
