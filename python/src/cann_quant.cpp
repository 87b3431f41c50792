/// CANN operators for Python, the second unit (compile time): the combinations listed in
/// cann_instances.hpp, explicitly instantiated here; cann.cpp declares them extern and binds them.

#define ATTNREF_CANN_EXTERN
#include "cann_instances.hpp"
