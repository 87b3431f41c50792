#pragma once
/// How a call runs, never what it computes: the one execution argument every operator takes last
/// (`const ExecConfig& exec = {}`).

#include <stdexcept>

#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

struct ExecConfig {
  /// Worker threads; 0 = OpenMP's default (1 without OpenMP). Results are bitwise identical for
  /// any value.
  int threads = 0;
  /// Tiling of the attention engine (0 = automatic). q_tile counts query positions per work item
  /// (each work item stacks all q heads of one kv head); kv_tile counts keys per inner step;
  /// kv_split is the number of keys per split-KV partial used when a sequence has a single q tile
  /// (decode), at most 32 partials per sequence (longer sequences get longer splits); kv_split < 0
  /// disables split-KV. Tiling changes rounding (the order of the sums), never semantics, and
  /// never depends on threads. Operators whose vendor semantics fix a block grid (the int8 Q/K/V
  /// paths quantize P per block of keys) use their own kv_tile there.
  Index q_tile = 0;
  Index kv_tile = 0;
  Index kv_split = 0;
};

namespace detail {

/// Checks an execution config (part of every operator's validation).
inline void check_exec(const char* fn, const ExecConfig& x) {
  ATTNREF_CHECK(x.threads >= 0, std::invalid_argument, fn, "exec.threads", "negative", ">= 0",
                x.threads);
  ATTNREF_CHECK(x.q_tile >= 0, std::invalid_argument, fn, "exec.q_tile", "negative", ">= 0",
                x.q_tile);
  ATTNREF_CHECK(x.kv_tile >= 0, std::invalid_argument, fn, "exec.kv_tile", "negative", ">= 0",
                x.kv_tile);
}

}  // namespace detail

}  // namespace attnref
