#pragma once
/// FusedInferAttentionScore's separate K / V antiquant with Q_S > 1 (the prompt branch; the
/// vendor's documents for V2–V4): int8 key / value read as (x8 + offset) · scale with a bf16
/// query and a bf16 output, through PromptFlashAttention's plan with the engine's int8 K/V load
/// path (no dequantized copy). Not part of the API.
///
/// The combined antiquant_scale / antiquant_offset (the vendor's PromptFlashAttention antiquant,
/// its tiling's rules): an fp16 query and output, antiquant_mode 0, per channel in the layout's
/// shape or per tensor (2), head size a multiple of 32, any Q_S, a shared prefix (int8, read with
/// the same maps); computed with the same maps (the kernel's fp16 rounding of the dequantized
/// tile is not reproduced).
///
/// The separate scales (the documents' list for Q_S > 1): Q_S <= 16; query and output bf16; layouts
/// BSH, BSND, BNSD, BNSD_BSND (TND: not listed, rejected); key_antiquant_mode ==
/// value_antiquant_mode, 0 per channel ((KV_N, D), (KV_N, 1, D) or (KV_N·D)) or 1 per token ((B,
/// S'), S' covering the longest kv length); offsets optional, both or neither; not with the
/// combined antiquant fields, a paged cache, tensor lists, left padding, a shared prefix or rope
/// inputs. The vendor passes per-channel scales in bf16; attnref takes fp32 for every mode. Rows
/// without a visible key are 0, as everywhere in the prompt branch (with a value offset the output
/// map would otherwise turn them into offset · scale).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/fia_antiquant.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/cann/prompt_flash_attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// PromptFlashAttention's params of a FusedInferAttentionScore call.
template <class P>
PromptFlashAttentionParams fia_pfa_params(const P& p) {
  PromptFlashAttentionParams pp;
  pp.num_heads = p.num_heads;
  pp.scale_value = p.scale_value;
  pp.pre_tokens = p.pre_tokens;
  pp.next_tokens = p.next_tokens;
  pp.input_layout = p.input_layout;
  pp.num_key_value_heads = p.num_key_value_heads;
  pp.sparse_mode = p.sparse_mode;
  pp.inner_precise = p.inner_precise;
  pp.pse_order = p.pse_order;
  pp.quant_block_size = p.quant_block_size;
  return pp;
}

/// True when an int8 call with Q_S > 1 uses the combined antiquant_scale (no separate scales).
template <class In>
bool fia_prompt_combined(const In& in) {
  return !fia_separate_antiquant(in) && !in.antiquant_scale.absent();
}

/// The paged form's rules (a block table: the vendor's PA per-channel antiquant).
template <class T, class TO, class P, class In>
void fia_prompt_aq_paged_rules(const char* fn, const P& p, const In& in, Layout layout, Index q_s) {
  const auto need = [fn](bool ok, const std::string& arg, const std::string& what,
                         const std::string& expected, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, arg, what, expected, got);
  };
  const std::string with = "with int8 key / value in a paged cache and Q_S > 1";
  need(fia_separate_antiquant(in) && in.antiquant_scale.absent() && in.antiquant_offset.absent(),
       "key_antiquant_scale / value_antiquant_scale",
       "required " + with + " (the combined antiquant_scale is not read there)",
       "the separate scales alone", "another set");
  need(std::is_same_v<T, half> && std::is_same_v<TO, half>, "query / attention_out",
       "not fp16 " + with, "half", "another type");
  need(layout == Layout::BSH || layout == Layout::BSND, "params.input_layout",
       "not supported " + with, "BSH or BSND", p.input_layout);
  need(q_s > 16, "query.shape", "Q_S out of range " + with, "Q_S > 16", std::to_string(q_s));
  need(p.key_antiquant_mode == 0 && p.value_antiquant_mode == 0,
       "params.key_antiquant_mode / value_antiquant_mode", "not supported " + with, "0 / 0",
       std::to_string(p.key_antiquant_mode) + " / " + std::to_string(p.value_antiquant_mode));
  need(p.sparse_mode == 3, "params.sparse_mode", "not supported " + with, "3",
       std::to_string(p.sparse_mode));
  need(p.inner_precise == 1, "params.inner_precise", "not supported " + with, "1",
       std::to_string(p.inner_precise));
  need(in.pse_shift.absent(), "pse_shift", "not supported " + with, "none",
       shape_str(in.pse_shift));
  need(in.quant_scale2.absent() && in.quant_offset2.absent(), "quant_scale2",
       "not supported " + with, "none", shape_str(in.quant_scale2));
  need(in.key_shared_prefix.absent() && in.value_shared_prefix.absent(), "key_shared_prefix",
       "not supported " + with, "none", shape_str(in.key_shared_prefix));
  need(in.query_rope.absent() && in.key_rope.absent(), "query_rope", "not supported " + with,
       "none", shape_str(in.query_rope));
}

/// The rules above that need no plan (T, TO: the query's and output's types).
template <class T, class TO, class P, class In>
void fia_prompt_aq_rules(const char* fn, const P& p, const In& in, Layout layout, Index q_s) {
  const auto need = [fn](bool ok, const std::string& arg, const std::string& what,
                         const std::string& expected, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, arg, what, expected, got);
  };
  const std::string with = "with int8 key / value and Q_S > 1";
  need(layout != Layout::TND, "params.input_layout", "not supported " + with,
       "BSH, BSND, BNSD or BNSD_BSND", p.input_layout);
  need(in.antiquant_scale_per_token.absent() && in.antiquant_offset_per_token.absent(),
       "antiquant_scale_per_token", "not supported " + with, "none",
       shape_str(in.antiquant_scale_per_token));
  need(in.query_rope.absent() && in.key_rope.absent(), "query_rope", "not supported " + with,
       "none", shape_str(in.query_rope));
  if (!in.block_table.absent()) return fia_prompt_aq_paged_rules<T, TO>(fn, p, in, layout, q_s);
  if (fia_prompt_combined(in)) {  // the combined scales: PromptFlashAttention's own antiquant
    const std::string c = "with the combined antiquant_scale and Q_S > 1";
    need(std::is_same_v<T, half>, "query", "not fp16 " + c + " (bf16: the separate scales)", "half",
         "another type");
    need(std::is_same_v<TO, half>, "attention_out", "not fp16 " + c, "half", "another type");
    need(p.antiquant_mode == 0, "params.antiquant_mode", "not supported " + c, "0",
         std::to_string(p.antiquant_mode));
    return;
  }
  need(in.antiquant_scale.absent() && in.antiquant_offset.absent(),
       "antiquant_scale / antiquant_offset", "given beside the separate scales " + with, "none",
       shape_str(in.antiquant_scale));
  need(in.key_shared_prefix.absent() && in.value_shared_prefix.absent(), "key_shared_prefix",
       "not supported with the separate scales and Q_S > 1", "none",
       shape_str(in.key_shared_prefix));
  need(std::is_same_v<T, bfloat16>, "query", "not bf16 " + with, "bfloat16", "another type");
  need(std::is_same_v<TO, bfloat16>, "attention_out", "not bf16 " + with, "bfloat16",
       "another type");
  need(q_s <= 16, "query.shape", "Q_S out of range " + with, "Q_S <= 16", std::to_string(q_s));
  need(!in.key_antiquant_scale.absent() && !in.value_antiquant_scale.absent(),
       "key_antiquant_scale / value_antiquant_scale", "missing " + with + " (separate scales)",
       "both scales", "none");
  need(p.key_antiquant_mode == p.value_antiquant_mode &&
           (p.key_antiquant_mode == 0 || p.key_antiquant_mode == 1),
       "params.key_antiquant_mode / value_antiquant_mode", "not supported " + with,
       "0 / 0 or 1 / 1",
       std::to_string(p.key_antiquant_mode) + " / " + std::to_string(p.value_antiquant_mode));
}

/// `in` with its separate scales and offsets seen in the incremental branch's shapes ((KV_N, D)
/// -> (1, KV_N, D), (KV_N, 1, D) -> (1, KV_N, 1, D), (KV_N·D) -> (1, KV_N·D), (B, S') ->
/// (1, B, S')), each checked against the Q_S > 1 list first.
template <class In>
In fia_prompt_aq_shapes(const char* fn, const In& in, std::int64_t mode, Index B, Index kvn,
                        Index D, Index cols) {
  In r = in;
  for (auto* v : {&r.key_antiquant_scale, &r.key_antiquant_offset, &r.value_antiquant_scale,
                  &r.value_antiquant_offset}) {
    if (v->absent()) continue;
    const std::string arg = v == &r.key_antiquant_scale     ? "key_antiquant_scale"
                            : v == &r.key_antiquant_offset  ? "key_antiquant_offset"
                            : v == &r.value_antiquant_scale ? "value_antiquant_scale"
                                                            : "value_antiquant_offset";
    const auto sh = v->shape();
    Dims to;
    if (mode == 0 && sh == Dims{kvn, D}) to = Dims{1, kvn, D};
    if (mode == 0 && sh == Dims{kvn, 1, D}) to = Dims{1, kvn, 1, D};
    if (mode == 0 && sh == Dims{kvn * D}) to = Dims{1, kvn * D};
    if (mode == 1 && v->rank() == 2 && v->size(0) == B && v->size(1) >= cols)
      to = Dims{1, B, v->size(1)};
    ATTNREF_CHECK(
        to.size() > 0, std::invalid_argument, fn, arg + ".shape",
        "not an accepted shape with Q_S > 1",
        mode == 0 ? "(KV_N, D), (KV_N, 1, D) or (KV_N*D)" : "(B, >= " + std::to_string(cols) + ")",
        shape_str(*v));
    *v = StridedView<const float>(v->data(), to);
  }
  return r;
}

/// The combined scale / offset [2, ...] as both sides' per-channel maps: per tensor (2), or per
/// channel in the layout's one shape (BSH (2, KV_N·D), BSND (2, KV_N, D), BNSD and BNSD_BSND
/// (2, KV_N, 1, D)); head size a multiple of 32.
template <class TS>
FiaAntiquant fia_prompt_combined_maps(const char* fn, const StridedView<const TS>& sc,
                                      const StridedView<const TS>& off, Layout layout, Index kvn,
                                      Index D) {
  const Dims want = layout == Layout::BSH    ? Dims{2, kvn * D}
                    : layout == Layout::BSND ? Dims{2, kvn, D}
                                             : Dims{2, kvn, 1, D};
  const bool per_tensor = sc.shape() == Dims{2};
  ATTNREF_CHECK(per_tensor || sc.shape() == want, std::invalid_argument, fn,
                "antiquant_scale.shape", "not the layout's shape with Q_S > 1",
                shape_str(want) + " or (2)", shape_str(sc));
  ATTNREF_CHECK(off.absent() || off.shape() == sc.shape(), std::invalid_argument, fn,
                "antiquant_offset.shape", "differs from antiquant_scale's", shape_str(sc),
                shape_str(off));
  ATTNREF_CHECK(D % 32 == 0, std::invalid_argument, fn, "query.shape",
                "head size not a multiple of 32 with int8 key / value and Q_S > 1", "D % 32 == 0",
                "D " + std::to_string(D));
  FiaAntiquant a;
  const Index kw = kvn * D, per = per_tensor ? 1 : kw;
  for (int side = 0; side < 2; ++side) {
    FiaAqSide& x = side == 0 ? a.k : a.v;
    for (Index c = 0; c < kw; ++c) {
      const Index at = side * per + (per_tensor ? 0 : c);
      x.scale.push_back(static_cast<float>(sc.data()[at]));
      if (!off.absent()) x.offset.push_back(static_cast<float>(off.data()[at]));
    }
  }
  return a;
}

/// Checks the scales against the plan and binds them to the variant (per channel: the K scale
/// folded into q, its offset into a row constant, V's map on the output; per token: the
/// kv_dequant hook). `aq` must outlive the run.
template <class P, class In, class T, class TM, class TP, class TO, class TKV>
void fia_prompt_aq_bind(const char* fn, const P& p, const In& in,
                        PfaProblem<T, TM, TP, TO, TKV>& pr, FiaAntiquant& aq) {
  const PfaPlan& pl = pr.pl;
  const Index B = pl.lens.B;
  if (pr.paged != nullptr) {  // the paged form: (1, KV_N·D) with BSH, (1, KV_N, D) with BSND
    const Dims want = pl.layout == Layout::BSH ? Dims{1, pl.kvn * pl.D} : Dims{1, pl.kvn, pl.D};
    for (const auto* v : {&in.key_antiquant_scale, &in.key_antiquant_offset,
                          &in.value_antiquant_scale, &in.value_antiquant_offset})
      ATTNREF_CHECK(v->absent() || v->shape() == want, std::invalid_argument, fn,
                    "key_antiquant_scale / value_antiquant_scale (offset) .shape",
                    "not the layout's shape with a paged cache", shape_str(want), shape_str(*v));
    aq = fia_antiquant(fn, 0, 0, in, B, pl.kvn, pl.D, pl.S2, FiaAqPages{});
  } else if (fia_prompt_combined(in)) {
    aq = fia_prompt_combined_maps(fn, in.antiquant_scale, in.antiquant_offset, pl.layout, pl.kvn,
                                  pl.D);
  } else {
    const In s = fia_prompt_aq_shapes(fn, in, p.key_antiquant_mode, B, pl.kvn, pl.D, pl.S2);
    aq = fia_antiquant(fn, p.key_antiquant_mode, p.value_antiquant_mode, s, B, pl.kvn, pl.D, pl.S2,
                       FiaAqPages{});
  }
  pr.var.group = pl.n / pl.kvn;
  pr.var.zero_empty = true;
  fia_bind_antiquant(aq, static_cast<float>(pr.ep.scale), B, pr.var);
}

/// Rows the engine left without a visible key (lse -inf) become 0 (pr.eo.lse: the rows' lse).
template <class T, class TM, class TP, class TO, class TKV>
void fia_prompt_aq_empty_rows(const PfaProblem<T, TM, TP, TO, TKV>& pr) {
  const PfaPlan& pl = pr.pl;
  for (Index b = 0; b < pl.lens.B; ++b)
    for (Index h = 0; h < pl.n; ++h)
      for (Index i = pl.lens.q_begin(b);
           i < pl.lens.q_begin(b) + pl.lens.q_len[static_cast<size_t>(b)]; ++i)
        if (pr.eo.lse(b, h, i) == -std::numeric_limits<float>::infinity())
          for (Index x = 0; x < pl.Dv; ++x) pr.eo.o(b, i, h, x) = TO(0.0f);
}

}  // namespace attnref::detail
