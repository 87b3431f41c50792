/// NSA operators for Python (layer 1's C++ side; see atb.cpp for the pattern).

#include "bind.hpp"

namespace attnref::python {

void bind_nsa(py::module_& m) { (void)m; }

}  // namespace attnref::python
