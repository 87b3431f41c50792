#pragma once
/// Pieces of FusedInferAttentionScore's plan (cann/fused_infer_attention_score.hpp): the route of
/// a call, the softmax_lse view and its invalid rows, the learnable sink, the separate antiquant
/// switch, the shared prefix and left padding in the prompt branch. Not part of the API.

#include <algorithm>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/fia_antiquant.hpp"
#include "attnref/cann/detail/fia_prefix.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/cann/prompt_flash_attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

inline constexpr const char* kFia = "fused_infer_attention_score";

/// The branch of a call: the layout, Q_S (TND: T) and whether it is incremental.
struct FiaRoute {
  Layout layout = Layout::BSH;
  Index q_s = 0;
  bool incre = false;
  bool mla = false;          ///< rope inputs with head size 512: the MLA plan (fia_rope.hpp)
  bool n_major_out = false;  ///< MLA's BSH_NBSD, BSND_NBSD, BNSD_NBSD, TND_NTD
};

/// The engine's view of softmax_lse, [B, N, S] (TND: [1, N, T]), over the dense stand-in.
inline StridedView<float, 3> fia_lse_view(float* p, const FiaRoute& r, Index B, Index n) {
  if (r.layout == Layout::TND) return StridedView<float, 3>(p, {1, n, r.q_s}, {r.q_s * n, 1, n});
  return StridedView<float, 3>(p, {B, n, r.q_s}, {n * r.q_s, r.q_s, 1});
}

/// Rows the engine left without a key (lse -inf) get `invalid`.
inline void fia_invalid_rows(const StridedView<float, 3>& lse, float invalid) {
  for (Index b = 0; b < lse.size(0); ++b)
    for (Index h = 0; h < lse.size(1); ++h)
      for (Index i = 0; i < lse.size(2); ++i)
        if (lse(b, h, i) == -std::numeric_limits<float>::infinity()) lse(b, h, i) = invalid;
}

/// The learnable sink, checked (the vendor's rules: TND, query and value head size 64 or 128,
/// one value per query head, a floating query) and bound to the prompt branch's variant.
template <class P, class TM, class TP>
void fia_sink(const P& p, const StridedView<const bfloat16>& sink, const FiaRoute& r,
              const PfaPlan& pl, CannVariant<TM, TP>& var) {
  if (sink.absent()) return;
  ATTNREF_CHECK(r.layout == Layout::TND, std::invalid_argument, kFia, "learnable_sink",
                "given with a layout other than TND", "input_layout TND", p.input_layout);
  ATTNREF_CHECK((pl.D == 64 || pl.D == 128) && pl.Dv == pl.D, std::invalid_argument, kFia,
                "learnable_sink", "given with a head size other than 64 or 128",
                "query and value head size 64 or 128",
                std::to_string(pl.D) + " and " + std::to_string(pl.Dv));
  ATTNREF_CHECK(sink.rank() == 1 && sink.size(0) == pl.n, std::invalid_argument, kFia,
                "learnable_sink.shape", "mismatch", "[" + std::to_string(pl.n) + "]",
                shape_str(sink));
  ATTNREF_CHECK(!var.int8_scores, std::invalid_argument, kFia, "learnable_sink",
                "given with int8 query / key / value", "a bf16 / fp16 query", "int8");
  var.sinks = sink.data();
}

/// Separate antiquant given or not: its modes need its scales, and its scales int8 K / V in the
/// incremental branch (`allowed`).
template <class P, class In>
bool fia_check_separate(const P& p, const In& in, bool allowed, const char* why) {
  const bool sep = fia_separate_antiquant(in);
  ATTNREF_CHECK(
      sep || (p.key_antiquant_mode == 0 && p.value_antiquant_mode == 0), std::invalid_argument,
      kFia, "params.key_antiquant_mode / value_antiquant_mode",
      "nonzero without key_antiquant_scale / value_antiquant_scale", "0 / 0",
      std::to_string(p.key_antiquant_mode) + " / " + std::to_string(p.value_antiquant_mode));
  ATTNREF_CHECK(!sep || allowed, std::invalid_argument, kFia,
                "key_antiquant_scale / value_antiquant_scale", why, "none",
                shape_str(in.key_antiquant_scale));
  return sep;
}

/// The shared prefix, checked, and its pages over the dense stand-ins; false when the call has
/// none (or uses none of its rows: then it is the call without it).
template <class P, class In, class TKV>
bool fia_prefix(const P& p, const In& in, const FiaRoute& r, FiaPrefix<TKV>& f) {
  using T = typename std::remove_const_t<typename decltype(in.query)::element_type>;
  const auto& pk = in.key_shared_prefix;
  const auto& pv = in.value_shared_prefix;
  const std::string none = "none";
  if (pk.absent() && pv.absent()) {
    ATTNREF_CHECK(in.actual_shared_prefix_len.empty(), std::invalid_argument, kFia,
                  "actual_shared_prefix_len", "given without key_shared_prefix", none,
                  std::to_string(in.actual_shared_prefix_len.size()) + " values");
    return false;
  }
  const auto reject = [&](bool bad, const char* what, const char* expected,
                          const std::string& got) {
    ATTNREF_CHECK(!bad, std::invalid_argument, kFia, "key_shared_prefix", what, expected, got);
  };
  reject(pk.absent() || pv.absent(), "given without value_shared_prefix (or the reverse)", "both",
         shape_str(pk) + " and " + shape_str(pv));
  reject(r.layout == Layout::TND, "not supported with TND", "BSH, BSND, BNSD or BNSD_BSND", "TND");
  reject(!in.block_table.absent(), "not supported with a paged cache", "no block_table",
         shape_str(in.block_table));
  reject(!in.kv_padding_size.absent(), "not supported with kv left padding", "no kv_padding_size",
         shape_str(in.kv_padding_size));
  reject(!r.incre && !in.query_padding_size.absent(), "not supported with query left padding",
         "no query_padding_size", shape_str(in.query_padding_size));
  reject(in.key.size() != 1 || in.value.size() != 1, "not supported with tensor lists",
         "one key / value tensor", std::to_string(in.key.size()) + " tensors");
  reject(std::is_same_v<T, std::int8_t>, "not supported with int8 query / key / value",
         "a floating query", "int8");
  const Index kvn = p.num_key_value_heads == 0 ? static_cast<Index>(p.num_heads)
                                               : static_cast<Index>(p.num_key_value_heads);
  const Layout kl = r.layout == Layout::BNSD_BSND ? Layout::BNSD : r.layout;
  const auto kd = pfa_dims(kFia, "key[0]", in.key[0], kl, kvn);
  const auto vd = pfa_dims(kFia, "value[0]", in.value[0], kl, kvn);
  const auto pkd = pfa_dims(kFia, "key_shared_prefix", pk, kl, kvn);
  const auto pvd = pfa_dims(kFia, "value_shared_prefix", pv, kl, kvn);
  f.P = fia_prefix_len(kFia, in.actual_shared_prefix_len, pkd, pvd, kd, vd);
  if (f.P == 0) return false;
  fia_prefix_pages(f, pfa_view(in.key[0].data(), kl, kd), pfa_view(in.value[0].data(), kl, vd),
                   pfa_view(pk.data(), kl, pkd), pfa_view(pv.data(), kl, pvd));
  return true;
}

/// Left padding in the prompt branch (query_padding_size / kv_padding_size), checked by the
/// vendor's prompt-tiling rules (no TND, paged cache, separate K / V antiquant or per-channel
/// quant_scale2; tensor lists and a shared prefix are rejected by their own checks): one value
/// each, negative counted as 0, with the lengths that place each batch's window. q_pad / kv_pad:
/// the pads for PromptFlashAttention's plan (-1: none). sparse_mode 0 then ignores pre / next
/// tokens (the mask alone decides), as the vendor does.
template <class P, class In, class PP>
void fia_left_padding(const P& p, const In& in, const FiaRoute& r, PP& pp, Index& q_pad,
                      Index& kv_pad) {
  const auto& qp = in.query_padding_size;
  const auto& kp = in.kv_padding_size;
  if (qp.absent() && kp.absent()) return;
  const char* arg = qp.absent() ? "kv_padding_size" : "query_padding_size";
  const auto reject = [&](bool bad, const char* what, const char* expected,
                          const std::string& got) {
    ATTNREF_CHECK(!bad, std::invalid_argument, kFia, arg, what, expected, got);
  };
  reject(r.layout == Layout::TND, "left padding is not supported with TND",
         "BSH, BSND, BNSD or BNSD_BSND", "TND");
  reject(!in.block_table.absent(), "left padding is not supported with a paged cache",
         "no block_table", shape_str(in.block_table));
  reject(fia_separate_antiquant(in),
         "left padding is not supported with the separate key / value antiquant scales", "none",
         shape_str(in.key_antiquant_scale));
  reject(in.quant_scale2.numel() > 1,
         "left padding is not supported with a per-channel quant_scale2", "one value",
         shape_str(in.quant_scale2));
  const auto pad = [&](const StridedView<const std::int64_t>& t, const char* name,
                       const std::vector<std::int64_t>& lens, const char* lens_name) -> Index {
    if (t.absent()) return -1;
    ATTNREF_CHECK(t.rank() <= 1 && t.numel() == 1, std::invalid_argument, kFia,
                  std::string(name) + ".shape", "not one value", "[] or [1]", shape_str(t));
    ATTNREF_CHECK(!lens.empty(), std::invalid_argument, kFia, name,
                  std::string("given without ") + lens_name + " (they place each window)",
                  lens_name, "none");
    return std::max<Index>(0, static_cast<Index>(t.data()[0]));
  };
  q_pad = pad(qp, "query_padding_size", in.actual_seq_lengths, "actual_seq_lengths");
  kv_pad = pad(kp, "kv_padding_size", in.actual_seq_lengths_kv, "actual_seq_lengths_kv");
  if (p.sparse_mode == 0) pp.pre_tokens = pp.next_tokens = 2147483647;
}

}  // namespace attnref::detail
