#pragma once
/// Element-type dispatch of the bound operators: a run-time Dtype onto a template argument.

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "args.hpp"

namespace attnref::python {

template <class T>
struct Tag {
  using type = T;
};

/// Calls f(Tag<T>{}) for the floating storage type `d` names (float32, float16, bfloat16);
/// another type raises TypeError naming `arg`.
template <class F>
decltype(auto) with_float(const std::string& op, const char* arg, Dtype d, F&& f) {
  switch (d) {
    case Dtype::f32:
      return f(Tag<float>{});
    case Dtype::f16:
      return f(Tag<half>{});
    case Dtype::bf16:
      return f(Tag<bfloat16>{});
    default:
      type_error(op, arg,
                 std::string("must hold float32, float16 or bfloat16, got ") + dtype_label(d));
  }
}

/// As with_float, for the two NPU half types only (float16, bfloat16).
template <class F>
decltype(auto) with_half(const std::string& op, const char* arg, Dtype d, F&& f) {
  switch (d) {
    case Dtype::f16:
      return f(Tag<half>{});
    case Dtype::bf16:
      return f(Tag<bfloat16>{});
    default:
      type_error(op, arg, std::string("must hold float16 or bfloat16, got ") + dtype_label(d));
  }
}

/// Runs `kernel` without the GIL and returns `result`; with repeats > 0 runs it that many times
/// and returns the mean seconds per run instead (the C++ side of the binding benchmark).
template <class F>
py::object run_kernel(int repeats, py::object result, F&& kernel) {
  if (repeats <= 0) {
    py::gil_scoped_release unlocked;
    kernel();
    return result;
  }
  double seconds = 0;
  {
    py::gil_scoped_release unlocked;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) kernel();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return py::float_(seconds / repeats);
}

/// `shape`, or all zeros when an extent is negative or the count passes 2^31 elements: an output
/// shape derived from a params value out of range. The operator then rejects that value; nothing
/// huge is allocated first (Args::output turns a failed allocation into ValueError as well).
inline std::vector<Index> allocatable_shape(std::vector<Index> shape) {
  Index n = 1;
  bool ok = true;
  for (Index e : shape) {
    if (e < 0 || (e > 0 && n > (Index{1} << 31) / e))
      ok = false;
    else
      n *= e;
  }
  if (!ok) std::fill(shape.begin(), shape.end(), Index{0});
  return shape;
}

/// The trailing extent of array `name` (0 when absent).
inline Index last_extent(const Args& a, const char* name) {
  if (!a.has(name)) return 0;
  py::array x = a.array(name);
  return x.ndim() == 0 ? 0 : static_cast<Index>(x.shape(x.ndim() - 1));
}

/// The extents of array `name` (TypeError when absent or not an array).
inline std::vector<Index> extents(const Args& a, const char* name) {
  py::array x = a.array(name);
  return std::vector<Index>(x.shape(), x.shape() + x.ndim());
}

}  // namespace attnref::python
