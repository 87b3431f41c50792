#pragma once
/// Inputs, parameters and outputs of the attention engine.
///
/// Shape contract (canonical index order (b, s, n, d); see core/layout.hpp for the layouts):
///   q:     [B, S_q, N_q, D]      (TND: [1, T_q, N_q, D] plus SeqLens::q_cu)
///   q_rope / k_rope: q's / k's extents with R elements per head (optional, both or neither)
///   k:     [B, S_kv, N_kv, D]    (TND: [1, T_kv, N_kv, D] plus SeqLens::kv_cu;
///                                 paged: [num_blocks, block_size, N_kv, D] plus block_table)
///   v:     [B, S_kv, N_kv, D_v]  (paged: [num_blocks, block_size, N_kv, D_v])
///   o:     [B, S_q, N_q, D_v]    (same batch/sequence packing as q)
///   lse:   [B, N_q, S_q]         optional, natural log (TND: [1, N_q, T_q])
///   probs: [B, N_q, S_q, S_kv]   optional debug output of the normalised probabilities, indexed
///                                by positions inside each sequence
///   mask_add / mask_bool: [B | 1, N_q | 1, >= max q_len, >= max kv_len], indexed by positions
///                                inside each sequence; an extent of 1 broadcasts.
/// GQA: N_q must be a multiple of N_kv; q head h reads kv head h / (N_q / N_kv).

#include <cstdint>
#include <vector>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/core/exec.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref {

/// Causal masking, with its alignment when S_q != S_kv:
///   TopLeft:     key j is visible to query i iff j <= i                 (PyTorch is_causal)
///   BottomRight: key j is visible to query i iff j <= i + S_kv - S_q    (FlashAttention >= 2.1,
///                FlashInfer, vLLM, ATB PREFIX_ENCODER; the last query sees every key)
enum class CausalMode { None, TopLeft, BottomRight };

/// Per-sequence lengths (varlen batches). Every vector is optional (empty).
///   q / kv:       lengths [B]; absent means every sequence spans the view's S extent.
///   q_cu / kv_cu: cumulative token offsets [B + 1] for packed (TND) views, whose batch extent
///                 must be 1; sequence b occupies tokens [cu[b], cu[b + 1]). When q_cu is given,
///                 q lengths must be absent (they are cu[b + 1] - cu[b]); same for kv.
///   q_start / kv_start: per batch, the view position of the sequence's first token in a padded
///                 (not packed, not paged) view: left-padded data, sequence b spans
///                 [start[b], start[b] + length) of its row of the view (absent: 0). Masks and
///                 the hooks still see positions inside each sequence.
struct SeqLens {
  std::vector<Index> q;
  std::vector<Index> kv;
  std::vector<Index> q_cu;
  std::vector<Index> kv_cu;
  std::vector<Index> q_start;
  std::vector<Index> kv_start;
};

/// Input views of one attention call. TQ / TKV: float, double, half or bfloat16.
template <class TQ, class TKV = TQ>
struct AttentionInputs {
  StridedView<const TQ, 4> q;
  StridedView<const TKV, 4> k;
  StridedView<const TKV, 4> v;
  SeqLens seq{};
  /// Optional additive mask, added to the scaled score; -inf marks a masked position.
  StridedView<const float, 4> mask_add{};
  /// Optional boolean mask: nonzero = masked (the PyTorch/CANN "1 = masked" convention).
  StridedView<const std::uint8_t, 4> mask_bool{};
  /// Optional block table of a paged KV cache, [B, max_blocks_per_seq]. When given, k and v are
  /// block pools [num_blocks, block_size, N_kv, D(_v)], key t of sequence b is row
  /// t % block_size of block block_table(b, t / block_size), seq.kv holds the kv lengths
  /// (required) and seq.kv_cu must be empty. Entries past a sequence's last block are never read
  /// (-1 padding is fine); a used entry outside [0, num_blocks) throws std::out_of_range.
  StridedView<const std::int32_t, 2> block_table{};
  /// Optional split scores (MLA's rope part): with both given, logit = scale · (q·k +
  /// q_rope·k_rope). q_rope has q's batch, token and head extents, k_rope k's (paged: the same
  /// blocks through the same block table), both R elements per head. The value rows stay v's.
  StridedView<const TQ, 4> q_rope{};
  StridedView<const TKV, 4> k_rope{};

  /// Reads keys and values from a paged cache: k, v, block_table and seq.kv (its context_lens)
  /// come from `cache` (the one paged K/V type every operator maps its vendor tensors onto).
  AttentionInputs& read_kv(const PagedKvCache<const TKV>& cache) {
    k = cache.k;
    v = cache.v;
    block_table = cache.block_table;
    seq.kv = cache.context_lens;
    return *this;
  }
  /// The paged cache these inputs read (meaningful when block_table is given).
  PagedKvCache<const TKV> paged_kv() const { return {k, v, block_table, seq.kv}; }
};

/// Scalars and switches of the engine (no activations; how a call runs is its ExecConfig).
struct AttentionParams {
  /// Multiplies q·k (the softmax scale, typically 1/sqrt(D)). Must be finite.
  double scale = 1.0;
  CausalMode causal = CausalMode::None;
  /// Sliding-window attention (needs a causal mode): each query sees its own position and the
  /// window - 1 keys before it (aligned like the causal mode), i.e. key j is visible to query i
  /// iff i' - window < j <= i'. 0 = no window; a window >= kv_len is plain causal.
  Index window = 0;
};

/// Output views. TO: float, double, half or bfloat16. TS: float or double for lse / probs.
template <class TO, class TS = float>
struct AttentionOutputs {
  StridedView<TO, 4> o;
  StridedView<TS, 3> lse{};
  StridedView<TS, 4> probs{};
};

}  // namespace attnref
