#pragma once
/// FusedInferAttentionScore's separate K / V antiquant (V2+: key_antiquant_scale / offset,
/// value_antiquant_scale / offset, key_antiquant_mode, value_antiquant_mode) in the incremental
/// branch, bound onto IncreFlashAttention's maps: per channel (the K scale folded into q, its
/// offset into a row constant, V's affine map on the output) and per token (the engine's
/// kv_dequant hook as it loads each tile). Not part of the API.
///
/// Modes (int8 K / V; x8 read as (x8 + offset)·scale, no offset: 0):
///   0  per channel (1, KV_N, 1, D), (1, KV_N, D), (1, KV_N·D), or per tensor (1)
///   1  per token (1, B, S'), S' covering every key position read
///   2  per tensor and head (KV_N)
///   3  per token and head (B, KV_N, S'), fp32
///   4  per token, page-managed (blockNum, blockSize): the scale of a key lives where the key
///      does in the paged cache (its block, its row), fp32; needs block_table
///   5  per token and head, page-managed (blockNum, KV_N, blockSize), fp32; needs block_table
///   key 0 with value 1: key per channel, value per token
/// Per-token maps (modes 1, 3–5) run through the engine's kv_dequant hook, per kv head. Modes 6
/// and above are not the vendor's for this branch.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// One side's (key or value) maps: per channel [KV_N·D], or per token [B, heads, W] (W columns;
/// heads KV_N for modes 3 and 5, else 1).
struct FiaAqSide {
  bool per_token = false;
  Index heads = 1;
  std::vector<float> scale, offset;  // offset empty: none
};

/// The paged cache modes 4 and 5 read their scales through (table absent: not paged).
struct FiaAqPages {
  StridedView<const std::int32_t, 2> table{};
  const std::vector<Index>* lens = nullptr;
  Index blocks = 0, block_size = 0;
};

/// Modes 3–5: the per-token (and head) maps as [B, heads, W]. Mode 3 reads (B, KV_N, S >= cols)
/// as it is; modes 4 and 5 read (blockNum, blockSize) / (blockNum, KV_N, blockSize) through the
/// block table, gathered for the keys each batch has (the rest is never read).
inline void fia_aq_token_heads(const char* fn, const std::string& sa, std::int64_t mode,
                               const StridedView<const float>& sc,
                               const StridedView<const float>& off, Index B, Index kvn, Index cols,
                               const FiaAqPages& pg, Index& W, FiaAqSide& r) {
  r.per_token = true;
  r.heads = mode == 4 ? 1 : kvn;
  if (mode == 3) {
    ATTNREF_CHECK(
        sc.rank() == 3 && sc.size(0) == B && sc.size(1) == kvn && sc.size(2) >= cols,
        std::invalid_argument, fn, sa + ".shape", "mismatch (mode 3, per token and head)",
        "(" + std::to_string(B) + ", " + std::to_string(kvn) + ", >= " + std::to_string(cols) + ")",
        shape_str(sc));
    W = sc.size(2);
    r.scale.assign(sc.data(), sc.data() + B * kvn * W);
    if (!off.absent()) r.offset.assign(off.data(), off.data() + B * kvn * W);
    return;
  }
  ATTNREF_CHECK(!pg.table.absent(), std::invalid_argument, fn, sa,
                "modes 4 and 5 (page-managed scales) take a paged cache", "block_table", "none");
  const std::vector<Index> want = mode == 4 ? std::vector<Index>{pg.blocks, pg.block_size}
                                            : std::vector<Index>{pg.blocks, kvn, pg.block_size};
  ATTNREF_CHECK(sc.shape() == want, std::invalid_argument, fn, sa + ".shape",
                "mismatch (mode " + std::to_string(mode) + ", the cache's blocks)", dims_str(want),
                shape_str(sc));
  W = cols;
  const Index H = r.heads, bs = pg.block_size;
  r.scale.assign(static_cast<size_t>(B * H * W), 0.0f);
  if (!off.absent()) r.offset.assign(r.scale.size(), 0.0f);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < (*pg.lens)[static_cast<size_t>(b)]; ++t) {
      const Index blk = pg.table(b, t / bs);  // (a used entry: validated with the cache)
      for (Index h = 0; h < H; ++h) {
        const size_t dst = static_cast<size_t>((b * H + h) * W + t);
        const Index src = (blk * H + h) * bs + t % bs;
        r.scale[dst] = sc.data()[src];
        if (!off.absent()) r.offset[dst] = off.data()[src];
      }
    }
}

/// Checks and expands the scale / offset of one side for its mode (fn's argument names
/// "<side>_antiquant_scale" / "<side>_antiquant_offset").
inline FiaAqSide fia_aq_side(const char* fn, const std::string& side, std::int64_t mode,
                             const StridedView<const float>& sc,
                             const StridedView<const float>& off, Index B, Index kvn, Index D,
                             Index cols, const FiaAqPages& pg, Index& W) {
  const std::string sa = side + "_antiquant_scale", oa = side + "_antiquant_offset";
  ATTNREF_CHECK(!sc.absent(), std::invalid_argument, fn, sa, "missing (separate antiquant)",
                "a scale tensor", "none");
  ATTNREF_CHECK(off.absent() || off.shape() == sc.shape(), std::invalid_argument, fn, oa + ".shape",
                "differs from the scale's", shape_str(sc), shape_str(off));
  FiaAqSide r;
  const auto shape = sc.shape();
  if (mode >= 3) {
    fia_aq_token_heads(fn, sa, mode, sc, off, B, kvn, cols, pg, W, r);
    return r;
  }
  if (mode == 1) {
    ATTNREF_CHECK(sc.rank() == 3 && sc.size(0) == 1 && sc.size(1) == B && sc.size(2) >= cols,
                  std::invalid_argument, fn, sa + ".shape", "mismatch (mode 1, per token)",
                  "(1, " + std::to_string(B) + ", >= " + std::to_string(cols) + ")", shape_str(sc));
    W = sc.size(2);
    r.per_token = true;
    r.scale.assign(sc.data(), sc.data() + B * W);
    if (!off.absent()) r.offset.assign(off.data(), off.data() + B * W);
    return r;
  }
  const std::vector<std::vector<Index>> channel{{1, kvn, 1, D}, {1, kvn, D}, {1, kvn * D}};
  const bool per_channel =
      mode == 0 && std::find(channel.begin(), channel.end(), shape) != channel.end();
  const bool per_tensor = mode == 0 && shape == std::vector<Index>{1};
  const bool per_head = mode == 2 && shape == std::vector<Index>{kvn};
  ATTNREF_CHECK(per_channel || per_tensor || per_head, std::invalid_argument, fn, sa + ".shape",
                "not an accepted shape for mode " + std::to_string(mode),
                mode == 0 ? "(1, KV_N, 1, D), (1, KV_N, D), (1, KV_N*D) or (1)" : "(KV_N)",
                shape_str(sc));
  const Index per = per_channel ? 1 : per_tensor ? kvn * D : D;  // channels per value
  for (Index c = 0; c < kvn * D; ++c) {
    r.scale.push_back(sc.data()[c / per]);
    if (!off.absent()) r.offset.push_back(off.data()[c / per]);
  }
  return r;
}

/// True when the call uses the separate K / V antiquant.
template <class In>
bool fia_separate_antiquant(const In& in) {
  return !in.key_antiquant_scale.absent() || !in.value_antiquant_scale.absent() ||
         !in.key_antiquant_offset.absent() || !in.value_antiquant_offset.absent();
}

/// The maps of both sides, with the per-token table the engine's kv_dequant hook reads
/// ((2, B, W): [0] the keys' (1 / 0 when the keys are per channel), [1] the values').
struct FiaAntiquant {
  FiaAqSide k, v;
  std::vector<float> tok_scale, tok_offset;
  Index W = 0;
};

/// Checks the modes and both sides; cols: the key positions a per-token table must cover.
template <class In>
FiaAntiquant fia_antiquant(const char* fn, std::int64_t kmode, std::int64_t vmode, const In& in,
                           Index B, Index kvn, Index D, Index cols, const FiaAqPages& pg) {
  const auto mode_str = std::to_string(kmode) + " / " + std::to_string(vmode);
  ATTNREF_CHECK(kmode >= 0 && kmode <= 5 && vmode >= 0 && vmode <= 5, std::invalid_argument, fn,
                "params.key_antiquant_mode / value_antiquant_mode", "out of range with Q_S == 1",
                "0–5", mode_str);
  ATTNREF_CHECK(kmode == vmode || (kmode == 0 && vmode == 1), std::invalid_argument, fn,
                "params.key_antiquant_mode / value_antiquant_mode", "not a documented pair",
                "equal modes, or key 0 with value 1", mode_str);
  ATTNREF_CHECK(in.key_antiquant_offset.absent() == in.value_antiquant_offset.absent(),
                std::invalid_argument, fn, "key_antiquant_offset / value_antiquant_offset",
                "one given without the other", "both or neither",
                in.key_antiquant_offset.absent() ? "value only" : "key only");
  FiaAntiquant a;
  Index wk = 0, wv = 0;
  a.k = fia_aq_side(fn, "key", kmode, in.key_antiquant_scale, in.key_antiquant_offset, B, kvn, D,
                    cols, pg, wk);
  a.v = fia_aq_side(fn, "value", vmode, in.value_antiquant_scale, in.value_antiquant_offset, B, kvn,
                    D, cols, pg, wv);
  if (!a.v.per_token) return a;
  // The per-token table: keys per token too (mode 1), or the identity (key 0, value 1).
  a.W = wv;
  ATTNREF_CHECK(!a.k.per_token || wk == wv, std::invalid_argument, fn, "key_antiquant_scale.shape",
                "differs from value_antiquant_scale's", std::to_string(wv) + " columns",
                std::to_string(wk) + " columns");
  const Index n = B * a.v.heads * a.W;  // (equal modes: the keys' table has the same heads)
  a.tok_scale = a.k.per_token ? a.k.scale : std::vector<float>(static_cast<size_t>(n), 1.0f);
  a.tok_scale.insert(a.tok_scale.end(), a.v.scale.begin(), a.v.scale.end());
  const bool offsets = !a.k.offset.empty() || !a.v.offset.empty();
  if (offsets) {
    const auto side = [n](const FiaAqSide& s) {
      return s.per_token && !s.offset.empty() ? s.offset
                                              : std::vector<float>(static_cast<size_t>(n), 0.0f);
    };
    a.tok_offset = side(a.k);
    const auto vo = side(a.v);
    a.tok_offset.insert(a.tok_offset.end(), vo.begin(), vo.end());
  }
  return a;
}

/// Binds the maps to the incremental branch's variant (IoHooks and the per-token hook). `a`
/// must outlive the run (the variant points into its per-token table).
template <class TM, class T>
void fia_bind_antiquant(const FiaAntiquant& a, float score_scale, Index B,
                        CannVariant<TM, T>& var) {
  if (!a.k.per_token) {  // per channel: the scale folds into q, the offset into a row constant
    var.k_scale = a.k.scale;
    var.k_offset.assign(a.k.offset.begin(), a.k.offset.end());
    var.bias_scale = score_scale;
  }
  if (!a.v.per_token) {
    var.v_scale = a.v.scale;
    var.v_offset = a.v.offset;
    return;
  }
  var.tok_scale = a.tok_scale.data();
  var.tok_offset = a.tok_offset.empty() ? nullptr : a.tok_offset.data();
  var.tok_batch = B;
  var.tok_heads = a.v.heads;
  var.tok_stride = a.W;
}

}  // namespace attnref::detail
