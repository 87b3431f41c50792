#pragma once
/// What every binding unit of `attnref._attnref` includes, and the units' entry points.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <attnref/core/exec.hpp>

#include "args.hpp"
#include "dispatch.hpp"
#include "params.hpp"

namespace attnref::python {

void bind_atb(py::module_& m);
void bind_cann(py::module_& m);
void bind_mla(py::module_& m);
void bind_nsa(py::module_& m);
void bind_dsa(py::module_& m);

}  // namespace attnref::python
