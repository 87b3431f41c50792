#pragma once
// Edits of a dynamic-rank view for bad-input tests: the same view with other data, another
// (dense) shape or one extent changed. Views are values; these return the edited copy.

#include "attnref/core/view.hpp"

namespace support {

template <class T>
attnref::StridedView<T> with_data(const attnref::StridedView<T>& v,
                                  typename attnref::StridedView<T>::element_type* p) {
  return attnref::StridedView<T>(p, v.shape(), v.strides());
}

template <class T>
attnref::StridedView<T> reshaped(const attnref::StridedView<T>& v, const attnref::Dims& shape) {
  return attnref::StridedView<T>(v.data(), shape);
}

template <class T>
attnref::StridedView<T> resized(const attnref::StridedView<T>& v, int dim, attnref::Index extent) {
  attnref::Dims s = v.shape();
  s[dim] = extent;
  return attnref::StridedView<T>(v.data(), s);
}

}  // namespace support

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

namespace support {

/// Moves views into padded, spread-out copies: each dimension of a copy leaves a gap (its
/// stride is the inner stride times (inner extent + 1)), and the innermost stride is 2. Gaps
/// hold NaN (or -77 for integers, true for bool), so a kernel that ignores the strides reads
/// garbage. Apply it through an inputs struct's for_each_view: `in.for_each_view(restrider)`.
/// The copies live as long as the Restrider.
class Restrider {
 public:
  template <class T>
  void operator()(const std::string&, attnref::StridedView<T>& v) {
    using V = std::remove_const_t<T>;
    if (v.absent() || v.numel() == 0) return;
    const int r = v.rank();
    attnref::Dims st = v.shape();
    attnref::Index span = 1, inner = 2;
    for (int d = r - 1; d >= 0; --d) {
      st[d] = inner;
      span = inner * v.size(d) + 1;
      inner = span;
    }
    const size_t n = static_cast<size_t>(span) + 1;
    std::shared_ptr<V> buf(new V[n], std::default_delete<V[]>());  // not vector<bool>
    std::fill(buf.get(), buf.get() + n, gap<V>());
    keep_.push_back(buf);
    copy(v, buf.get(), st, 0, 0, 0);
    v = attnref::StridedView<T>(buf.get(), v.shape(), st);
    // The gap check: mark the view's elements, then every other slot must hold the gap value.
    const attnref::StridedView<V> view(buf.get(), v.shape(), st);
    checks_.push_back([view, n] {
      std::vector<char> used(n, 0);
      mark(view, used, 0, 0);
      const V g = gap<V>();
      for (size_t i = 0; i < n; ++i)
        if (!used[i] && std::memcmp(&view.data()[i], &g, sizeof(V)) != 0) return false;
      return true;
    });
  }

  /// True when no slot between the elements of the copies was written.
  bool gaps_intact() const {
    for (const auto& c : checks_)
      if (!c()) return false;
    return true;
  }

 private:
  template <class V>
  static V gap() {
    if constexpr (std::is_same_v<V, bool>)
      return true;
    else if constexpr (std::numeric_limits<V>::has_quiet_NaN)
      return std::numeric_limits<V>::quiet_NaN();
    else
      return V(-77);
  }
  template <class T, class V>
  static void copy(const attnref::StridedView<T>& v, V* dst, const attnref::Dims& st, int d,
                   attnref::Index src_off, attnref::Index dst_off) {
    if (d == v.rank()) {
      dst[dst_off] = v.data()[src_off];
      return;
    }
    for (attnref::Index i = 0; i < v.size(d); ++i)
      copy(v, dst, st, d + 1, src_off + i * v.stride(d), dst_off + i * st[d]);
  }
  template <class V>
  static void mark(const attnref::StridedView<V>& v, std::vector<char>& used, int d,
                   attnref::Index off) {
    if (d == v.rank()) {
      used[static_cast<size_t>(off)] = 1;
      return;
    }
    for (attnref::Index i = 0; i < v.size(d); ++i) mark(v, used, d + 1, off + i * v.stride(d));
  }
  std::vector<std::shared_ptr<void>> keep_;
  std::vector<std::function<bool()>> checks_;
};

}  // namespace support
