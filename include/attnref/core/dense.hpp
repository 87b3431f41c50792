#pragma once
/// detail::DenseArena: the edge of an operator whose kernels walk raw memory (the CANN, MLA and
/// NSA operators). Every tensor argument goes through it before the operator's own checks:
///   input(name, v)          check_view, then v is replaced by a dense row-major stand-in;
///   output(name, v)         check_view, then v is replaced by a dense stand-in filled from the
///                           caller's memory (operators read caches and leave padding alone);
///                           an output overlapping an input or an earlier output is rejected
///                           after the operator's own checks (see Overlap below);
///   commit()                the overlap rejection, if any; else copies the stand-ins of outputs
///                           back into the caller's views;
///   check()                 the overlap rejection alone (validate(): nothing is written back).
/// dense_call() below is the whole edge: arena, the operator's checks, its run, commit().
/// A view that is dense already is its own stand-in (no copy), so dense arguments cost nothing;
/// padded, permuted and broadcast views cost one copy each, and one of more than
/// kMaxDenseCopy elements is rejected (std::invalid_argument) rather than copied. Outputs are
/// written only by commit(), after the operator has run: a rejection leaves them untouched. Not
/// part of the API.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// Calls f(off) with the element offset of every element of `v`, in row-major order.
template <class T, int R, class F>
void for_each_offset(const StridedView<T, R>& v, F&& f) {
  const int r = v.rank();
  if (v.absent() || v.numel() == 0) return;
  std::array<Index, max_dynamic_rank> idx{};
  Index off = 0;
  for (;;) {
    f(off);
    int d = r - 1;
    for (; d >= 0; --d) {
      off += v.stride(d);
      if (++idx[static_cast<size_t>(d)] < v.size(d)) break;
      off -= v.stride(d) * v.size(d);
      idx[static_cast<size_t>(d)] = 0;
    }
    if (d < 0) return;
  }
}

class DenseArena {
 public:
  /// The largest strided (non-dense) argument copied: 2^31 elements.
  static constexpr Index kMaxDenseCopy = Index{1} << 31;

  /// Also opens the error context of `fn` (see CallerScope) for the operator's whole run.
  explicit DenseArena(const char* fn) : fn_(fn), scope_(fn) {}
  DenseArena(const DenseArena&) = delete;
  DenseArena& operator=(const DenseArena&) = delete;

  template <class T>
  void input(const std::string& name, StridedView<const T>& v) {
    check_view(fn_, name, v);
    inputs_.emplace_back(name, byte_range(v));
    if (v.absent() || v.dense()) return;
    v = StridedView<const T>(gather(name, v), v.shape());
  }

  /// in_place: the operator allows this output to be one of its inputs (then both get their own
  /// stand-ins when strided, and the result is the same as out of place).
  template <class T>
  void output(const std::string& name, StridedView<T>& v, bool in_place = false) {
    static_assert(!std::is_const_v<T>, "an output view has mutable elements");
    check_view(fn_, name, v);
    const auto r = byte_range(v);
    if (!overlap_) {
      for (const auto& in : inputs_)
        if (!in_place && hit(r, in.second))
          overlap_ = {name, "overlaps an input", "memory disjoint from the inputs",
                      "the memory of " + in.first};
      for (const auto& o : outputs_)  // named in registration order: "cmp_out overlaps sel_out"
        if (!overlap_ && hit(r, o.second))
          overlap_ = {o.first, "overlaps " + name, "disjoint outputs", "overlapping memory"};
      if (overlap_) quarantine_all();
    }
    outputs_.emplace_back(name, r);
    if (overlap_) {
      quarantine(name, v);
      return;
    }
    quarantines_.emplace_back([this, name, &v] { quarantine(name, v); });
    if (v.absent() || v.dense()) return;
    T* buf = gather(name, v);
    const StridedView<T> orig = v;
    v = StridedView<T>(buf, v.shape());
    commits_.emplace_back([orig, buf] {
      size_t i = 0;
      for_each_offset(orig, [&](Index off) { orig.data()[off] = buf[i++]; });
    });
  }

  /// After the operator's run: the overlap found at registration, if any, is raised now (the
  /// operator's own checks came first, and it wrote only to scratch); otherwise the stand-ins of
  /// strided outputs are written back, in registration order.
  void commit() {
    if (overlap_) raise_overlap();
    for (auto& c : commits_) c();
    commits_.clear();
  }

  /// validate(): the overlap found at registration, if any, raised as commit() would raise it;
  /// nothing is written back.
  void check() const {
    if (overlap_) raise_overlap();
  }

 private:
  using Range = std::array<std::uintptr_t, 2>;
  static bool hit(const Range& a, const Range& b) {
    return a[0] != a[1] && b[0] != b[1] && a[0] < b[1] && b[0] < a[1];
  }
  template <class V>
  V* fresh(const std::string& name, Index n) {
    ATTNREF_CHECK(n <= kMaxDenseCopy, std::invalid_argument, fn_, name,
                  "too large for its dense copy",
                  "at most " + std::to_string(kMaxDenseCopy) + " elements",
                  n);  // an array (not std::vector, which has no data() for bool)
    std::shared_ptr<V> p(new V[static_cast<size_t>(n)](), std::default_delete<V[]>());
    buffers_.push_back(p);
    return p.get();
  }
  template <class T>
  std::remove_const_t<T>* gather(const std::string& name, const StridedView<T>& v) {
    auto* buf = fresh<std::remove_const_t<T>>(name, v.numel());
    size_t i = 0;
    for_each_offset(v, [&](Index off) { buf[i++] = v.data()[off]; });
    return buf;
  }

  /// An output overlapping an input or another output is rejected, but only after the
  /// operator's own checks, so that a wrong shape is reported as such: until then every output
  /// is "quarantined" — replaced by fresh scratch of its shape, not read from the caller's
  /// memory (whose extent is in doubt) and never written back.
  struct Overlap {
    std::string argument, what, expected, got;
  };
  static constexpr Index kMaxQuarantine = Index{1} << 24;
  template <class T>
  void quarantine(const std::string& name, StridedView<T>& v) {
    if (v.absent()) return;
    if (v.numel() > kMaxQuarantine) raise_overlap();  // too large to run on scratch
    v = StridedView<T>(fresh<T>(name, v.numel()), v.shape());
  }
  void quarantine_all() {
    for (auto& q : quarantines_) q();
    quarantines_.clear();
    commits_.clear();
  }
  [[noreturn]] void raise_overlap() const {
    raise<std::invalid_argument>(fn_, overlap_->argument, overlap_->what, overlap_->expected,
                                 overlap_->got);
  }

  const char* fn_;
  CallerScope scope_;
  std::optional<Overlap> overlap_;
  std::vector<std::function<void()>> quarantines_;
  std::vector<std::pair<std::string, Range>> inputs_;
  std::vector<std::pair<std::string, Range>> outputs_;
  std::vector<std::shared_ptr<void>> buffers_;
  std::vector<std::function<void()>> commits_;
};

/// An operator whose kernels walk dense memory, as validate -> plan -> run: every view of `in`
/// (as inputs) and of `out` (as outputs) passes through one DenseArena, named `fn`, in their
/// for_each_view order; then `body(din, dout)` runs on the stand-ins. The body runs every check
/// and, when `run`, computes into the stand-ins. A run ends with commit(); a validation (!run)
/// with check(), so it ends exactly as the run would and writes nothing.
template <class In, class Out, class Body>
void dense_call(const char* fn, const In& in, const Out& out, bool run, Body&& body) {
  DenseArena arena(fn);
  In din = in;
  Out dout = out;
  din.for_each_view([&](const std::string& name, auto& v) { arena.input(name, v); });
  dout.for_each_view([&](const std::string& name, auto& v) { arena.output(name, v); });
  body(static_cast<const In&>(din), static_cast<const Out&>(dout));
  if (run)
    arena.commit();
  else
    arena.check();
}

}  // namespace attnref::detail
