#pragma once
/// The one tiled, online-softmax attention loop. Not part of the API: operators call
/// attnref::attention / attnref::attention_with (attention/attention.hpp), which validate first.
///
/// Work decomposition (never depends on the thread count):
///   item = (sequence b, kv head, q tile of `q_tile` positions, kv split)
/// Each item stacks the G = N_q / N_kv query heads of its kv head into one row block
/// (rows = G * q_tile), so every K/V tile is loaded (and converted from fp16/bf16) once per head
/// group. Per kv tile: S = Q·Kᵀ (Eigen GEMM), mask / transform hooks, online-softmax update,
/// O += P·V (Eigen GEMM). Sequences with a single q tile (decode) are split along kv into fixed
/// `kv_split`-key partials that are merged in split order afterwards (split-KV).
///
/// The engine is split by concern under detail/engine/:
///   rows.hpp      row conversions into the compute type and out of it
///   work.hpp      resolved sequences, the K/V source (pages), work items
///   state.hpp     the resolved problem, its mode switches, per-worker scratch
///   products.hpp  S = Q·Kᵀ and O += P·V: small-row SIMD, int8 or GEMM
///   p_stage.hpp   mask / transform hooks, online softmax, quantized P, rounded P
///   driver.hpp    one item's loop over kv tiles, run_attention and the split-KV merge

#include "attnref/detail/engine/driver.hpp"
