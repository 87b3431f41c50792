#pragma once
/// Python arrays onto attnref's views, for the extension module `attnref._attnref`.
///
/// Every tensor argument arrives as a NumPy array (the Python layer turns torch CPU tensors into
/// NumPy arrays sharing their memory): its data, extents and strides become a StridedView
/// without a copy. bf16 travels as uint16 (NumPy has no bf16 type). A wrong kind of object or
/// element type raises TypeError, a wrong rank, a misaligned or read-only output ValueError; the
/// message names the operator and the Python argument.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <attnref/core/types.hpp>
#include <attnref/core/view.hpp>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace attnref::python {

namespace py = pybind11;

/// The element types an array may hold, as the module names them.
enum class Dtype { f32, f16, bf16, f64, i8, u8, i32, i64, other };

/// The element type of a NumPy array (uint16 is bf16; bool is uint8: masks hold 0 / 1 bytes).
inline Dtype dtype_of(const py::array& a) {
  const char kind = a.dtype().kind();
  const auto size = a.itemsize();
  if (kind == 'f')
    return size == 4 ? Dtype::f32 : size == 2 ? Dtype::f16 : size == 8 ? Dtype::f64 : Dtype::other;
  if (kind == 'b') return size == 1 ? Dtype::u8 : Dtype::other;
  if (kind == 'u') return size == 2 ? Dtype::bf16 : size == 1 ? Dtype::u8 : Dtype::other;
  if (kind == 'i')
    return size == 1 ? Dtype::i8 : size == 4 ? Dtype::i32 : size == 8 ? Dtype::i64 : Dtype::other;
  return Dtype::other;
}

inline const char* dtype_label(Dtype d) {
  switch (d) {
    case Dtype::f32:
      return "float32";
    case Dtype::f16:
      return "float16";
    case Dtype::bf16:
      return "bfloat16";
    case Dtype::f64:
      return "float64";
    case Dtype::i8:
      return "int8";
    case Dtype::u8:
      return "uint8";
    case Dtype::i32:
      return "int32";
    case Dtype::i64:
      return "int64";
    default:
      return "an unsupported type";
  }
}

template <class T>
constexpr Dtype dtype_v() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return Dtype::f32;
  else if constexpr (std::is_same_v<U, half>)
    return Dtype::f16;
  else if constexpr (std::is_same_v<U, bfloat16>)
    return Dtype::bf16;
  else if constexpr (std::is_same_v<U, double>)
    return Dtype::f64;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return Dtype::i8;
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return Dtype::u8;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return Dtype::i32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return Dtype::i64;
  else
    return Dtype::other;
}

[[noreturn]] inline void type_error(const std::string& op, const std::string& arg,
                                    const std::string& what) {
  throw py::type_error("attnref." + op + ": " + arg + " " + what);
}
[[noreturn]] inline void value_error(const std::string& op, const std::string& arg,
                                     const std::string& what) {
  throw py::value_error("attnref." + op + ": " + arg + " " + what);
}

/// A new C-contiguous array of element type T and the given shape (bf16 as uint16).
template <class T>
py::array new_array(const std::vector<Index>& shape) {
  using U =
      std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, std::uint16_t, T>;
  std::vector<py::ssize_t> sh(shape.begin(), shape.end());
  if constexpr (std::is_same_v<T, half>)
    return py::array(py::dtype("float16"), sh);
  else
    return py::array_t<U>(sh);
}

/// The tensor arguments of one call, by name: each is taken once (view(), ints(), ...); finish()
/// rejects a name no operator field took.
class Args {
 public:
  /// The names are read once here: a lookup compares a few short strings, with no Python
  /// object made (the binding benchmark: ~4 us per call with dictionary lookups, bench/python).
  Args(std::string op, py::dict kw) : op_(std::move(op)), kw_(std::move(kw)) {
    items_.reserve(static_cast<size_t>(PyDict_Size(kw_.ptr())));
    PyObject *key = nullptr, *value = nullptr;
    Py_ssize_t pos = 0;
    while (PyDict_Next(kw_.ptr(), &pos, &key, &value)) {
      Py_ssize_t n = 0;
      const char* k = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, &n) : nullptr;
      if (k == nullptr) {
        PyErr_Clear();
        throw py::type_error("attnref." + op_ + ": argument names must be strings");
      }
      items_.push_back({std::string_view(k, static_cast<size_t>(n)),
                        py::reinterpret_borrow<py::object>(key),
                        py::reinterpret_borrow<py::object>(value)});
    }
  }

  const std::string& op() const { return op_; }
  /// The argument `name` (None when absent or None).
  py::object get(const char* name) const {
    for (const Item& i : items_)
      if (i.name == name) return i.value;
    return py::none();
  }
  bool has(const char* name) const {
    for (const Item& i : items_)
      if (i.name == name) return !i.value.is_none();
    return false;
  }

  /// The array `name` (TypeError when it is not a NumPy array).
  py::array array(const char* name) const {
    py::object o = get(name);
    if (o.is_none()) type_error(op_, name, "is required");
    if (!py::isinstance<py::array>(o))
      type_error(op_, name,
                 std::string("must be an array (a NumPy array or a torch CPU tensor), got ") +
                     std::string(py::str(o.get_type().attr("__name__"))));
    return py::reinterpret_borrow<py::array>(o);
  }
  /// The element type of array `name`, or `fallback` when it is absent.
  Dtype dtype(const char* name, Dtype fallback = Dtype::other) const {
    return has(name) ? dtype_of(array(name)) : fallback;
  }

  /// Fills `v` from array `name` (left empty, i.e. absent, when the argument is None).
  template <class T, int R>
  void view(const char* name, StridedView<T, R>& v) {
    taken_.push_back(name);
    if (!has(name)) return;
    py::array a = array(name);
    check_dtype<T>(name, a);
    const int nd = static_cast<int>(a.ndim());
    check_rank<R>(name, nd);
    T* data = data_of<T>(name, a);
    std::array<Index, (R == dynamic_rank ? max_dynamic_rank : R)> shape{}, strides{};
    for (int d = 0; d < nd; ++d) {
      shape[static_cast<size_t>(d)] = static_cast<Index>(a.shape(d));
      const auto st = a.strides(d);
      if (st % static_cast<py::ssize_t>(sizeof(T)) != 0)
        value_error(
            op_, name,
            "has a stride of " + std::to_string(st) + " bytes, not a multiple of its element size");
      strides[static_cast<size_t>(d)] =
          static_cast<Index>(st / static_cast<py::ssize_t>(sizeof(T)));
    }
    if constexpr (R == dynamic_rank) {
      const std::vector<Index> sh(shape.begin(), shape.begin() + nd),
          st(strides.begin(), strides.begin() + nd);
      v = StridedView<T>(data, Dims(sh), Dims(st));
    } else {
      v = StridedView<T, R>(data, shape, strides);
    }
  }

  /// Fills `v` from the index array `name` (block tables, slot mappings, sparse indices): int32
  /// is viewed; int64 is converted to an int32 copy the call owns (IndexError, naming the
  /// element, for a value outside int32: no table or cache has that many rows).
  template <int R>
  void index_view(const char* name, StridedView<const std::int32_t, R>& v) {
    if (!has(name)) return view(name, v);
    py::array a = array(name);
    if (dtype_of(a) == Dtype::i32) return view(name, v);
    if (dtype_of(a) != Dtype::i64)
      type_error(op_, name, "must hold int32 or int64 indices, got " + label_of(a));
    taken_.push_back(name);
    const int nd = static_cast<int>(a.ndim());
    check_rank<R>(name, nd);
    std::vector<Index> shape(a.shape(), a.shape() + nd), pos(static_cast<size_t>(nd), 0);
    Index n = 1;
    for (Index e : shape) n *= e;  // NumPy's own sizes: no overflow
    owned_.emplace_back(static_cast<size_t>(n));
    std::vector<std::int32_t>& dst = owned_.back();
    const auto* base = static_cast<const char*>(a.data());
    for (Index i = 0; i < n; ++i) {
      const char* p = base;
      for (int d = 0; d < nd; ++d) p += pos[static_cast<size_t>(d)] * a.strides(d);
      std::int64_t x = 0;
      std::memcpy(&x, p, sizeof x);
      if (x < std::numeric_limits<std::int32_t>::min() ||
          x > std::numeric_limits<std::int32_t>::max()) {
        std::string at;
        for (Index q : pos) at += (at.empty() ? "" : ", ") + std::to_string(q);
        throw py::index_error("attnref." + op_ + ": " + name + "[" + at + "] holds " +
                              std::to_string(x) + ", outside the int32 range of an index");
      }
      dst[static_cast<size_t>(i)] = static_cast<std::int32_t>(x);
      for (int d = nd - 1; d >= 0 && ++pos[static_cast<size_t>(d)] == shape[static_cast<size_t>(d)];
           --d)
        pos[static_cast<size_t>(d)] = 0;
    }
    std::vector<Index> strides(static_cast<size_t>(nd), 1);
    for (int d = nd - 2; d >= 0; --d)
      strides[static_cast<size_t>(d)] =
          strides[static_cast<size_t>(d) + 1] * shape[static_cast<size_t>(d) + 1];
    if constexpr (R == dynamic_rank) {
      v = StridedView<const std::int32_t>(dst.data(), Dims(shape), Dims(strides));
    } else {
      std::array<Index, R> sh{}, st{};
      std::copy(shape.begin(), shape.end(), sh.begin());
      std::copy(strides.begin(), strides.end(), st.begin());
      v = StridedView<const std::int32_t, R>(dst.data(), sh, st);
    }
  }

  /// Fills `v` from a sequence or 1-D integer array `name` (left empty when absent).
  template <class I>
  void ints(const char* name, std::vector<I>& v) {
    taken_.push_back(name);
    if (!has(name)) return;
    py::object o = get(name);
    if (py::isinstance<py::array>(o)) {
      py::array a = py::reinterpret_borrow<py::array>(o);
      const Dtype d = dtype_of(a);
      if (d != Dtype::i32 && d != Dtype::i64)
        type_error(op_, name, std::string("must hold int32 or int64, got ") + dtype_label(d));
      if (a.ndim() != 1)
        value_error(op_, name, "must have 1 dimension, got " + std::to_string(a.ndim()));
      v.resize(static_cast<size_t>(a.shape(0)));
      const auto* base = static_cast<const char*>(a.data());
      for (py::ssize_t i = 0; i < a.shape(0); ++i) {
        const char* p = base + i * a.strides(0);
        const std::int64_t x = d == Dtype::i32 ? *reinterpret_cast<const std::int32_t*>(p)
                                               : *reinterpret_cast<const std::int64_t*>(p);
        v[static_cast<size_t>(i)] = narrow<I>(name, x);
      }
      return;
    }
    if (!py::isinstance<py::sequence>(o) || py::isinstance<py::str>(o))
      type_error(op_, name, "must be a sequence of integers or an integer array");
    py::sequence s = py::reinterpret_borrow<py::sequence>(o);
    v.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      py::object e = s[i];
      if (!py::isinstance<py::int_>(e) && !py::hasattr(e, "__index__"))
        type_error(op_, std::string(name) + "[" + std::to_string(i) + "]", "must be an integer");
      v[i] = narrow<I>(name, e.attr("__index__")().cast<long long>());
    }
  }

  /// Rejects arguments no field took (TypeError naming the first).
  void finish() const {
    for (const Item& i : items_) {
      bool ok = false;
      for (const char* t : taken_) ok = ok || i.name == t;
      if (!ok) type_error(op_, std::string(i.name), "is not an argument of this operator");
    }
  }
  /// Marks `name` as taken by something other than a field (an output, an option).
  void take(const char* name) { taken_.push_back(name); }

  /// Fills `v` from a list of arrays `name` (left empty when absent).
  template <class T, int R>
  void view_list(const char* name, std::vector<StridedView<T, R>>& v) {
    taken_.push_back(name);
    if (!has(name)) return;
    py::object o = get(name);
    if (!py::isinstance<py::sequence>(o) || py::isinstance<py::array>(o))
      type_error(op_, name, "must be a list of arrays");
    py::sequence s = py::reinterpret_borrow<py::sequence>(o);
    v.resize(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      const std::string item = std::string(name) + "[" + std::to_string(i) + "]";
      Args one(op_, py::dict(py::arg(item.c_str()) = s[i]));
      one.view(item.c_str(), v[i]);
    }
  }

  /// The output `name`: the caller's array when given (written in place), else a new
  /// C-contiguous array of `shape`; `v` views it.
  template <class T, int R>
  py::array output(const char* name, StridedView<T, R>& v, const std::vector<Index>& shape) {
    if (!has(name)) {
      py::dict d;
      try {
        d[name] = new_array<T>(shape);
      } catch (py::error_already_set& e) {
        // A shape derived from bad arguments (a huge head count, say): the operator's checks,
        // which run after the allocation, would reject it; NumPy cannot even allocate it.
        if (!e.matches(PyExc_MemoryError) && !e.matches(PyExc_ValueError)) throw;
        std::string s;
        for (Index x : shape) s += (s.empty() ? "" : ", ") + std::to_string(x);
        value_error(op_, name,
                    "cannot be allocated with the shape [" + s +
                        "] the other arguments imply (check them)");
      }
      Args fresh(op_, d);
      fresh.view(name, v);
      taken_.push_back(name);
      return d[name];
    }
    view(name, v);
    return array(name);
  }

 private:
  template <int R>
  void check_rank(const char* name, int nd) const {
    if constexpr (R == dynamic_rank) {
      if (nd < 1 || nd > max_dynamic_rank)
        value_error(op_, name, "must have 1 to 8 dimensions, got " + std::to_string(nd));
    } else if (nd != R) {
      value_error(op_, name,
                  "must have " + std::to_string(R) + " dimensions, got " + std::to_string(nd));
    }
  }
  template <class T>
  void check_dtype(const char* name, const py::array& a) const {
    if (dtype_of(a) != dtype_v<T>())
      type_error(
          op_, name,
          std::string("must hold ") + dtype_label(dtype_v<T>()) + " here, got " + label_of(a));
  }
  /// The element type of `a` as the module names it, or as NumPy does when unsupported.
  static std::string label_of(const py::array& a) {
    const Dtype d = dtype_of(a);
    return d != Dtype::other ? dtype_label(d) : std::string(py::str(a.dtype()));
  }
  template <class T>
  T* data_of(const char* name, py::array& a) const {
    void* p = nullptr;
    if constexpr (std::is_const_v<T>) {
      p = const_cast<void*>(a.data());
    } else {
      if (!a.writeable()) value_error(op_, name, "is read-only, and it is written");
      p = a.mutable_data();
    }
    if (reinterpret_cast<std::uintptr_t>(p) % alignof(T) != 0)
      value_error(op_, name, "is not aligned to its element size");
    return static_cast<T*>(p);
  }
  template <class I>
  I narrow(const char* name, long long x) const {
    if (x < static_cast<long long>(std::numeric_limits<I>::min()) ||
        x > static_cast<long long>(std::numeric_limits<I>::max()))
      throw py::value_error("attnref." + op_ + ": " + name + " holds " + std::to_string(x) +
                            ", outside the range of its element type");
    return static_cast<I>(x);
  }

  std::string op_;
  /// One argument; the references keep the key (whose UTF-8 `name` views) and the value alive
  /// for the whole call, even if the dictionary changes while the kernel runs without the GIL.
  struct Item {
    std::string_view name;
    py::object key, value;
  };
  py::dict kw_;
  std::vector<Item> items_;
  std::vector<const char*> taken_;
  std::deque<std::vector<std::int32_t>> owned_;  ///< int64 index arrays converted to int32
};

}  // namespace attnref::python
