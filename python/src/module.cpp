/// The extension module `attnref._attnref`: attnref's operators on NumPy arrays. The Python
/// package `attnref` wraps it (torch tensors, defaults, the torch_npu names).
///
/// Exceptions: attnref's std::invalid_argument becomes ValueError and std::out_of_range
/// IndexError (pybind11's own translation); wrong argument kinds and element types raise
/// TypeError from the argument conversion (args.hpp).

#include <attnref/core/simd_level.hpp>
#include <attnref/version.hpp>
#include <cstdint>
#include <utility>
#include <vector>

#include "bind.hpp"

namespace attnref::python {
namespace {

void bind_exec(py::module_& m) {
  ParamsBinder<ExecConfig> b(m, "ExecConfig",
                             "Threads and tiling of a call; results never depend on threads");
  b.field("threads", &ExecConfig::threads)
      .field("q_tile", &ExecConfig::q_tile)
      .field("kv_tile", &ExecConfig::kv_tile)
      .field("kv_split", &ExecConfig::kv_split);
  b.finish();
}

void bind_simd(py::module_& m) {
  bind_enum<SimdLevel>(m, "SimdLevel",
                       {{"Portable", SimdLevel::Portable},
                        {"Avx2", SimdLevel::Avx2},
                        {"Avx512", SimdLevel::Avx512}});
  m.def(
      "simd_level", [] { return simd_level(); }, "The SIMD level the kernels use.");
  m.def(
      "compiled_simd_level", [] { return compiled_simd_level(); },
      "The highest level this module was compiled for.");
  m.def(
      "set_simd_level", [](SimdLevel l) { return set_simd_level(l); },
      "Selects a level (clamped to compiled_simd_level()); returns the previous one. Each "
      "level is deterministic; levels may differ in the last bits (summation order).");
}

/// The torch objects torch_view compares with, read from the loaded torch module on first use
/// (kept for the life of the process: never released at interpreter exit); null while torch
/// is not loaded (no object can be a tensor then).
struct TorchTypes {
  py::object tensor, strided, names[6];
  std::vector<std::pair<py::object, py::dtype>> dtypes;
};

const TorchTypes* torch_types() {
  static const TorchTypes* t = nullptr;
  if (t != nullptr) return t;
  PyObject* torch = PyDict_GetItemString(PySys_GetObject("modules"), "torch");  // borrowed
  if (torch == nullptr) return nullptr;
  py::handle m(torch);
  auto* r = new TorchTypes;
  r->tensor = m.attr("Tensor");
  r->strided = m.attr("strided");
  const char* names[] = {"is_cpu", "layout", "dtype", "shape", "stride", "data_ptr"};
  for (int i = 0; i < 6; ++i)
    r->names[i] = py::reinterpret_steal<py::object>(PyUnicode_InternFromString(names[i]));
  const std::pair<const char*, const char*> types[] = {
      {"float16", "float16"}, {"bfloat16", "uint16"}, {"float32", "float32"},
      {"float64", "float64"}, {"int8", "int8"},       {"uint8", "uint8"},
      {"bool", "bool"},       {"int32", "int32"},     {"int64", "int64"}};
  for (const auto& [torch_name, numpy_name] : types)
    r->dtypes.emplace_back(m.attr(torch_name), py::dtype(numpy_name));
  t = r;
  return t;
}

py::object checked(PyObject* o) {
  if (o == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(o);
}

/// A NumPy array over a torch CPU tensor's memory, the tensor its base (bf16 as uint16 bit
/// patterns); None for anything else: another object, a tensor off the CPU, not strided or of a
/// type the module does not read. The Python layer's own conversion then runs and raises the
/// error that names the problem. What Tensor.numpy() gives, at less than its cost: the C API
/// throughout (bench/python: 0.4 us a tensor against 1.6 us for numpy() and its checks).
py::object torch_view(PyObject* t) {
  const TorchTypes* tt = torch_types();
  if (tt == nullptr) return py::none();
  const int is_tensor = Py_TYPE(t) == reinterpret_cast<PyTypeObject*>(tt->tensor.ptr())
                            ? 1
                            : PyObject_IsInstance(t, tt->tensor.ptr());
  if (is_tensor < 0) throw py::error_already_set();
  if (is_tensor == 0) return py::none();
  const py::object cpu = checked(PyObject_GetAttr(t, tt->names[0].ptr()));
  const py::object layout = checked(PyObject_GetAttr(t, tt->names[1].ptr()));
  const py::object dtype = checked(PyObject_GetAttr(t, tt->names[2].ptr()));
  if (cpu.ptr() != Py_True || !layout.is(tt->strided)) return py::none();
  const py::dtype* np_dtype = nullptr;
  for (const auto& [torch_dtype, np] : tt->dtypes)
    if (dtype.is(torch_dtype)) np_dtype = &np;
  if (np_dtype == nullptr) return py::none();
  const py::object shape = checked(PyObject_GetAttr(t, tt->names[3].ptr()));
  const py::object stride = checked(PyObject_CallMethodNoArgs(t, tt->names[4].ptr()));
  const py::object ptr = checked(PyObject_CallMethodNoArgs(t, tt->names[5].ptr()));
  const Py_ssize_t nd = PyTuple_Size(shape.ptr());
  if (nd < 0 || nd > 32 || PyTuple_Size(stride.ptr()) != nd) return py::none();
  const auto item = static_cast<Py_ssize_t>(np_dtype->itemsize());
  Py_intptr_t sh[32], st[32];
  for (Py_ssize_t d = 0; d < nd; ++d) {
    sh[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape.ptr(), d));
    st[d] = PyLong_AsSsize_t(PyTuple_GET_ITEM(stride.ptr(), d)) * item;
  }
  void* data = PyLong_AsVoidPtr(ptr.ptr());
  if (PyErr_Occurred()) throw py::error_already_set();
  auto& api = py::detail::npy_api::get();
  py::object a = checked(api.PyArray_NewFromDescr_(
      api.PyArray_Type_, np_dtype->inc_ref().ptr(), static_cast<int>(nd), sh, st, data,
      data ? py::detail::npy_api::NPY_ARRAY_WRITEABLE_ : 0, nullptr));
  if (data != nullptr && api.PyArray_SetBaseObject_(a.ptr(), py::handle(t).inc_ref().ptr()) < 0)
    throw py::error_already_set();
  return a;
}

/// torch_view as a METH_O function: no argument parsing (pybind11's adds ~0.1 us a call).
PyObject* torch_view_method(PyObject*, PyObject* t) noexcept {
  try {
    return torch_view(t).release().ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

PyMethodDef torch_view_def = {
    "_torch_view", torch_view_method, METH_O,
    "A NumPy array over a torch CPU tensor's memory, or None (the Python layer's helper)."};

}  // namespace
}  // namespace attnref::python

PYBIND11_MODULE(_attnref, m) {
  namespace ap = attnref::python;
  m.doc() = "attnref: CPU reference of the Ascend attention operators (extension module)";
  m.attr("__version__") = std::to_string(ATTNREF_VERSION_MAJOR) + "." +
                          std::to_string(ATTNREF_VERSION_MINOR) + "." +
                          std::to_string(ATTNREF_VERSION_PATCH);
  m.add_object("_torch_view", pybind11::reinterpret_steal<pybind11::object>(
                                  PyCFunction_NewEx(&ap::torch_view_def, nullptr, m.ptr())));
  ap::bind_exec(m);
  ap::bind_simd(m);
  ap::bind_atb(m);
  ap::bind_cann(m);
  ap::bind_mla(m);
  ap::bind_nsa(m);
  ap::bind_dsa(m);
}
