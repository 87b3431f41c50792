#pragma once
/// Thread-count resolution and the parallel-for used by the engine. Without OpenMP everything
/// runs on the calling thread and gives the same bits.

#include <algorithm>
#include <exception>
#include <mutex>

#include "attnref/core/types.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace attnref::detail {

/// Threads the engine will use for a requested count (0 = OpenMP's default).
inline int resolve_threads(int requested) {
#if defined(_OPENMP)
  return requested > 0 ? requested : omp_get_max_threads();
#else
  (void)requested;
  return 1;
#endif
}

/// Runs `body(worker_state, i)` for i in [0, n) on `threads` workers. `make_state()` is called
/// once per worker (per-thread workspaces). Work is handed out dynamically; callers make each
/// item's result independent of which worker runs it. Nested Eigen parallelism is turned off
/// inside the workers so that tile GEMMs never depend on the thread count. An exception thrown by
/// a worker is rethrown on the calling thread.
template <class MakeState, class Body>
void parallel_for(int threads, Index n, MakeState&& make_state, Body&& body) {
  if (n <= 0) return;
  std::exception_ptr error;
#if defined(_OPENMP)
  std::mutex error_mutex;
  const int nt = static_cast<int>(std::min<Index>(threads, n));
#pragma omp parallel num_threads(nt)
  {
    omp_set_num_threads(1);  // this worker's nested regions (Eigen's GEMM) stay serial
    auto record = [&] {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (!error) error = std::current_exception();
    };
    bool ok = true;
    decltype(make_state()) state{};
    try {
      state = make_state();
    } catch (...) {
      ok = false;
      record();
    }
#pragma omp for schedule(dynamic, 1)
    for (Index i = 0; i < n; ++i) {
      if (!ok) continue;
      try {
        body(state, i);
      } catch (...) {
        ok = false;
        record();
      }
    }
  }
#else
  (void)threads;
  try {
    auto state = make_state();
    for (Index i = 0; i < n; ++i) body(state, i);
  } catch (...) {
    error = std::current_exception();
  }
#endif
  if (error) std::rethrow_exception(error);
}

}  // namespace attnref::detail
