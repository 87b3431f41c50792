/// The extension module `attnref._attnref`: attnref's operators on NumPy arrays. The Python
/// package `attnref` wraps it (torch tensors, defaults, the torch_npu names).
///
/// Exceptions: attnref's std::invalid_argument becomes ValueError and std::out_of_range
/// IndexError (pybind11's own translation); wrong argument kinds and element types raise
/// TypeError from the argument conversion (args.hpp).

#include <attnref/core/simd_level.hpp>
#include <attnref/version.hpp>

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

}  // namespace
}  // namespace attnref::python

PYBIND11_MODULE(_attnref, m) {
  namespace ap = attnref::python;
  m.doc() = "attnref: CPU reference of the Ascend attention operators (extension module)";
  m.attr("__version__") = std::to_string(ATTNREF_VERSION_MAJOR) + "." +
                          std::to_string(ATTNREF_VERSION_MINOR) + "." +
                          std::to_string(ATTNREF_VERSION_PATCH);
  ap::bind_exec(m);
  ap::bind_simd(m);
  ap::bind_atb(m);
  ap::bind_cann(m);
  ap::bind_mla(m);
  ap::bind_nsa(m);
  ap::bind_dsa(m);
}
