#pragma once
/// attnref::fused_infer_attention_score — CANN FusedInferAttentionScore
/// (aclnnFusedInferAttentionScore V1–V4, torch_npu.npu_fused_infer_attention_score, MindSpore
/// ops.fused_infer_attention_score) as a plan over the PromptFlashAttention and
/// IncreFlashAttention plans (docs/fia.md, docs/semantics.md §7.1).
///
/// Routing (the vendor's tiling, IsUsingIFA, for the layouts attnref implements): layouts BSH,
/// BSND and BNSD with Q_S == 1 take the incremental branch (IncreFlashAttention's semantics);
/// every other call, TND included (even with T == 1), takes the prompt branch
/// (PromptFlashAttention's). BNSD_BSND with Q_S == 1 is rejected, as the vendor rejects it.
/// Parameters the documents call "invalid" (no effect) in a branch are accepted and ignored
/// there: with Q_S == 1 actual_seq_lengths, pre_tokens, next_tokens and sparse_mode (still
/// checked to be 0–4); with Q_S > 1 antiquant_mode.
///
/// softmax_lse (softmax_lse_flag): fp32 [B, N, Q_S, 1] (TND: [T, N, 1]), ln Σ_j exp(s_j) over
/// the row's scores as the branch computes them (scaled, pse added, masked keys at their fill
/// value; the keys a row excludes are not in the sum). A row without any key (a batch with
/// no keys, rows the band or an excluding mask leaves empty, padded query rows) gets the
/// branch's invalid-row value: +inf in the prompt branch, -3.40e38 in the incremental one (the
/// values the vendor's kernels write; the documents say only "inf marks invalid rows"). With
/// the flag off, softmax_lse is neither checked nor written (the vendor returns it as given).
///
/// int4 key / value (TKV int32, eight values per word): cann/detail/fia_int4.hpp.
/// Left padding with Q_S > 1 (query_padding_size / kv_padding_size): cann/detail/fia_parts.hpp.
/// int8 key / value in 5-D NZ caches (V4's GQA antiquant): cann/detail/fia_gqa_nz.hpp.
/// Every check runs before anything is written; results never depend on exec.threads. The
/// combinations of the V2–V4 parameter set not listed here (the separate K / V scales with a
/// shared prefix, or int8 K/V in a paged ND cache, in the prompt branch) are rejected as not
/// implemented yet.
///
/// A paged cache (block_table) in the prompt branch: the vendor's prompt-tiling rules
/// (cann/detail/fia_paged.hpp); the engine reads the cache in place.
///
/// Rope inputs (query_rope / key_rope, V3+): scale · (q·k + q_rope·k_rope). Head size 512 is
/// MLA and takes its own plan over the engine whatever Q_S (the vendor's tiling routes it to
/// its incremental MLA kernel); head size 128 takes the prompt branch (TND, bf16). The rules of
/// each: cann/detail/fia_rope.hpp.
///
/// learnable_sink (V4's code; TND): out = Σ_j exp(s_j - m)·v_j / (Σ_j exp(s_j - m) + exp(sink_h
/// - m)), m the row's max over its keys; softmax_lse leaves the sink out (the kernel writes lse
/// before it adds the sink).

#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/fia_antiquant.hpp"
#include "attnref/cann/detail/fia_gqa_nz.hpp"
#include "attnref/cann/detail/fia_int4.hpp"
#include "attnref/cann/detail/fia_mla_quant.hpp"
#include "attnref/cann/detail/fia_paged.hpp"
#include "attnref/cann/detail/fia_parts.hpp"
#include "attnref/cann/detail/fia_prefix.hpp"
#include "attnref/cann/detail/fia_prompt_aq.hpp"
#include "attnref/cann/detail/fia_rope.hpp"
#include "attnref/cann/fused_infer_attention_score_io.hpp"
#include "attnref/cann/incre_flash_attention.hpp"
#include "attnref/cann/prompt_flash_attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/types.hpp"

namespace attnref {

namespace detail {

template <class T>
FiaRoute fia_route(const FusedInferAttentionScoreParams& p, const StridedView<const T>& q,
                   bool rope) {
  using L = Layout;
  FiaRoute r;
  // MLA's head-major outputs: "<layout>_NBSD" and TND_NTD read the query in <layout>.
  std::string in_layout = p.input_layout;
  for (const char* x : {"BSH_NBSD", "BSND_NBSD", "BNSD_NBSD", "TND_NTD"})
    if (p.input_layout == x) in_layout = p.input_layout.substr(0, p.input_layout.find('_'));
  r.n_major_out = in_layout != p.input_layout;
  r.layout = parse_layout(kFia, "params.input_layout", in_layout,
                          {L::BSH, L::BSND, L::BNSD, L::BNSD_BSND, L::TND});
  const Index rank = r.layout == L::BSH || r.layout == L::TND ? 3 : 4;
  ATTNREF_CHECK(!q.absent() && q.rank() == rank, std::invalid_argument, kFia, "query.shape",
                "rank mismatch for the layout", "rank " + std::to_string(rank), shape_str(q));
  r.q_s = r.layout == L::TND
              ? q.size(0)
              : (r.layout == L::BNSD || r.layout == L::BNSD_BSND ? q.size(2) : q.size(1));
  // Rope inputs with head size 512 take the MLA plan whatever Q_S (the vendor's tiling); it
  // checks its own head rules (up to 128 query heads on one kv head).
  const Index last = q.size(rank - 1), n = static_cast<Index>(p.num_heads);
  const Index d = r.layout != L::BSH ? last : (n > 0 && last % n == 0 ? last / n : 0);
  r.mla = rope && d == 512;
  ATTNREF_CHECK(r.mla || !r.n_major_out, std::invalid_argument, kFia, "params.input_layout",
                "takes query_rope with head size 512 (MLA)", "BSH, BSND, BNSD, BNSD_BSND or TND",
                p.input_layout);
  ATTNREF_CHECK(p.sparse_mode >= 0 && p.sparse_mode <= 4, std::invalid_argument, kFia,
                "params.sparse_mode", "out of range", "0–4", std::to_string(p.sparse_mode));
  if (r.mla) return r;
  ATTNREF_CHECK(!(r.layout == L::BNSD_BSND && r.q_s == 1), std::invalid_argument, kFia,
                "params.input_layout", "BNSD_BSND is not supported when Q_S is 1",
                "BSH, BSND or BNSD", "BNSD_BSND");
  r.incre = r.layout != L::TND && r.layout != L::BNSD_BSND && r.q_s == 1;
  (void)cann_kv_heads(kFia, p.num_heads, p.num_key_value_heads);  // (before shapes use N)
  return r;
}

/// softmax_lse's shape when the flag is set: [B, N, Q_S, 1], or [T, N, 1] with TND.
template <class T>
void fia_check_lse(const FusedInferAttentionScoreParams& p, const FiaRoute& r,
                   const StridedView<const T>& q, const StridedView<float>& lse) {
  if (!p.softmax_lse_flag) return;
  const Index n = static_cast<Index>(p.num_heads);
  const std::vector<Index> want = r.layout == Layout::TND
                                      ? std::vector<Index>{r.q_s, n, 1}
                                      : std::vector<Index>{q.size(0), n, r.q_s, 1};
  ATTNREF_CHECK(!lse.absent() && lse.shape() == want, std::invalid_argument, kFia,
                "softmax_lse.shape", "mismatch (softmax_lse_flag is set)", dims_str(want),
                shape_str(lse));
}

/// The incremental branch: IncreFlashAttention's plan, with the kv lengths from
/// actual_seq_lengths_kv.
template <class T, class TKV, class TM, class TP, class TO>
void fia_incre(const FusedInferAttentionScoreParams& p,
               const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
               const FusedInferAttentionScoreOutputs<TO>& out, const ExecConfig& exec,
               const FiaRoute& r, bool run) {
  constexpr bool kFloatQ = !std::is_same_v<T, std::int8_t>;
  ATTNREF_CHECK(kFloatQ, std::invalid_argument, kFia, "query",
                "int8 query / key / value with Q_S == 1 (the incremental branch has no int8 "
                "query)",
                "half or bfloat16 with Q_S == 1", "int8");
  if constexpr (kFloatQ) {
    ATTNREF_CHECK(in.learnable_sink.absent(), std::invalid_argument, kFia, "learnable_sink",
                  "given with a layout other than TND", "input_layout TND", p.input_layout);
    ATTNREF_CHECK(!fia_has_rope(kFia, in), std::invalid_argument, kFia, "query_rope",
                  "with head size 128 takes TND (head size 512: MLA)", "input_layout TND",
                  p.input_layout);
    ATTNREF_CHECK(in.deq_scale1.absent() && in.quant_scale1.absent() && in.deq_scale2.absent(),
                  std::invalid_argument, kFia, "deq_scale1 / quant_scale1 / deq_scale2",
                  "given without int8 query / key / value", "none", shape_str(in.deq_scale1));
    IncreFlashAttentionParams ip;
    ip.num_heads = p.num_heads;
    ip.scale_value = p.scale_value;
    ip.input_layout = p.input_layout;
    ip.num_key_value_heads = p.num_key_value_heads;
    ip.block_size = p.block_size;
    ip.inner_precise = p.inner_precise;
    ip.pse_order = p.pse_order;
    ip.antiquant_mode = p.antiquant_mode;
    IncreFlashAttentionInputs<T, TKV, TM> ii;
    ii.query = in.query;
    ii.key = in.key;
    ii.value = in.value;
    ii.pse_shift = in.pse_shift;
    ii.atten_mask = in.atten_mask;
    ii.actual_seq_lengths = in.actual_seq_lengths_kv;
    ii.antiquant_scale = in.antiquant_scale;
    ii.antiquant_offset = in.antiquant_offset;
    ii.antiquant_scale_per_token = in.antiquant_scale_per_token;
    ii.antiquant_offset_per_token = in.antiquant_offset_per_token;
    ii.kv_padding_size = in.kv_padding_size;
    ii.block_table = in.block_table;
    ii.quant_scale2 = in.quant_scale2;
    ii.quant_offset2 = in.quant_offset2;
    constexpr bool kInt8Kv = std::is_same_v<TKV, std::int8_t>;
    const bool sep = fia_check_separate(p, in, kInt8Kv, "given with floating-point key / value");
    ATTNREF_CHECK(!sep || p.antiquant_mode == 0 || p.antiquant_mode == 1, std::invalid_argument,
                  kFia, "params.antiquant_mode", "out of range", "0 or 1",
                  std::to_string(p.antiquant_mode));
    if (sep) {  // the separate scales win over the combined ones
      ii.antiquant_scale = ii.antiquant_offset = {};
      ii.antiquant_scale_per_token = ii.antiquant_offset_per_token = {};
    }
    IfaProblem<T, TKV, TM, TO> pr;
    pr.fn = kFia;
    pr.lens_arg = "actual_seq_lengths_kv";
    pr.external_antiquant = sep;
    FiaPrefix<TKV> prefix;  // (the plan's pages point into it until the run ends)
    if (fia_prefix(p, in, r, prefix))
      pr.extend_kv = [&prefix](IfaPlan<TKV>& pl) {
        pl.kv.cache.k = prefix.k;
        pl.kv.cache.v = prefix.v;
        pl.kv.pages = prefix.pages;
        for (Index& l : pl.kv.cache.context_lens) l += prefix.P;
        pl.kv.mask_cols += prefix.P;
      };
    const Index B = in.query.size(0), n = static_cast<Index>(p.num_heads);
    if (p.softmax_lse_flag) pr.eo.lse = fia_lse_view(out.softmax_lse.data(), r, B, n);
    ifa_prepare(ip, ii, IncreFlashAttentionOutputs<TO>{out.attention_out}, exec, pr);
    FiaAntiquant aq;  // (the variant points into it until the run ends)
    if (sep) {
      const auto& cache = pr.pl.kv.cache;  // (modes 4 / 5: the paged cache's blocks)
      const FiaAqPages pg{cache.block_table, &cache.context_lens, cache.k.size(0), cache.k.size(1)};
      aq = fia_antiquant(kFia, p.key_antiquant_mode, p.value_antiquant_mode, in, B, pr.pl.kvn,
                         pr.pl.D, pr.pl.kv.mask_cols, pg);
      constexpr bool kHalfQ = std::is_same_v<T, half>;
      ATTNREF_CHECK(p.key_antiquant_mode == p.value_antiquant_mode || kHalfQ, std::invalid_argument,
                    kFia, "query", "key per channel with value per token takes an fp16 query",
                    "half", "another type");
      fia_bind_antiquant(aq, static_cast<float>(pr.ep.scale), B, pr.var);
    }
    if (!run) return;
    ifa_run(pr);
    if (p.softmax_lse_flag) fia_invalid_rows(pr.eo.lse, -3.40e38f);
  }
}

/// The prompt branch: PromptFlashAttention's plan (one key / value tensor; int8 key / value with
/// a bf16 query: fia_prompt_aq.hpp).
template <class T, class TKV, class TM, class TP, class TO>
void fia_prompt(const FusedInferAttentionScoreParams& p,
                const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
                const FusedInferAttentionScoreOutputs<TO>& out, const ExecConfig& exec,
                const FiaRoute& r, bool run) {
  constexpr bool kPfaOut =
      std::is_same_v<TO, std::int8_t> ||
      std::is_same_v<TO, std::conditional_t<std::is_same_v<T, std::int8_t>, half, T>>;
  constexpr bool kAq = !std::is_same_v<TKV, T>;  // int8 key / value, a floating query
  ATTNREF_CHECK(kPfaOut, std::invalid_argument, kFia, "attention_out",
                "a bf16 output with an int8 query is MLA's full quantization only",
                "half or int8 with an int8 query", "bfloat16");
  ATTNREF_CHECK(in.key.size() == 1 && in.value.size() == 1, std::invalid_argument, kFia,
                "key / value", "tensor lists are taken with Q_S == 1 only", "one tensor each",
                std::to_string(in.key.size()) + " and " + std::to_string(in.value.size()));
  const bool no_antiquant = in.antiquant_scale.absent() && in.antiquant_offset.absent() &&
                            in.antiquant_scale_per_token.absent() &&
                            in.antiquant_offset_per_token.absent();
  ATTNREF_CHECK(no_antiquant || kAq, std::invalid_argument, kFia,
                "antiquant_scale / antiquant_offset", "given with floating-point key / value",
                "none", shape_str(in.antiquant_scale));
  (void)fia_check_separate(p, in, kAq, "given with floating-point key / value");
  if constexpr (kAq) fia_prompt_aq_rules<T, TO>(kFia, p, in, r.layout, r.q_s);
  if constexpr (kPfaOut) {
    PromptFlashAttentionParams pp = fia_pfa_params(p);
    Index q_pad = -1, kv_pad = -1;  // left padding (none: -1)
    fia_left_padding(p, in, r, pp, q_pad, kv_pad);
    FiaPaged<TKV> paged;  // (the engine reads through it until the run ends)
    const bool pa = fia_paged(kFia, p, in, r.layout, paged);
    PromptFlashAttentionInputs<T, TM, TP> pi{in.query, {}, {}, in.pse_shift, in.atten_mask};
    const T unread{};  // int8 key / value: the plan's stand-ins (zero strides, never read)
    if constexpr (kAq) {
      const auto stand_in = [&unread](const StridedView<const TKV>& v) {
        return StridedView<const T>(&unread, v.shape(),
                                    std::vector<Index>(static_cast<size_t>(v.rank()), 0));
      };
      pi.key = stand_in(pa ? paged.key : in.key[0]);
      pi.value = stand_in(pa ? paged.value : in.value[0]);
    } else {
      pi.key = pa ? paged.key : in.key[0];
      pi.value = pa ? paged.value : in.value[0];
    }
    pi.actual_seq_lengths = in.actual_seq_lengths;
    pi.actual_seq_lengths_kv = pa ? paged.kv_list : in.actual_seq_lengths_kv;
    pi.deq_scale1 = in.deq_scale1;
    pi.quant_scale1 = in.quant_scale1;
    pi.deq_scale2 = in.deq_scale2;
    pi.quant_scale2 = in.quant_scale2;
    pi.quant_offset2 = in.quant_offset2;
    PfaProblem<T, TM, TP, TO, TKV> pr;
    pr.fn = kFia;
    pr.q_pad = q_pad;
    pr.kv_pad = kv_pad;
    if constexpr (kAq)
      if (!pa) pr.kv_key = in.key[0], pr.kv_value = in.value[0];
    if (pa) pr.paged = &paged.cache;
    if (fia_has_rope(kFia, in)) {
      ATTNREF_CHECK((!std::is_same_v<T, std::int8_t>), std::invalid_argument, kFia, "query_rope",
                    "with an int8 query takes head size 512 (MLA full quantization)",
                    "head size 512", "another head size");
      if constexpr (!std::is_same_v<T, std::int8_t> && !kAq)
        fia_rope_prompt(kFia, p, in, r.layout, pr.q_rope, pr.k_rope);
    }
    FiaPrefix<TKV> prefix;  // (the engine's pages point into it until the run ends)
    if (fia_prefix(p, in, r, prefix)) {
      pr.front_keys = prefix.P;
      pr.kv_pages = &prefix.pages;
      pr.kv_k = prefix.k;
      pr.kv_v = prefix.v;
    }
    const Index n = static_cast<Index>(p.num_heads), B = in.query.size(0);
    // (int8 key / value: the rows' lse, to zero those without a visible key)
    std::vector<float> rows_lse(kAq && !p.softmax_lse_flag ? B * n * r.q_s : 0);
    if (p.softmax_lse_flag || kAq)
      pr.eo.lse =
          fia_lse_view(p.softmax_lse_flag ? out.softmax_lse.data() : rows_lse.data(), r, B, n);
    pfa_prepare(pp, pi, PromptFlashAttentionOutputs<TO>{out.attention_out}, exec, pr);
    FiaAntiquant aq;  // (the variant points into it until the run ends)
    if constexpr (kAq) fia_prompt_aq_bind(kFia, p, in, pr, aq);
    fia_sink(p, in.learnable_sink, r, pr.pl, pr.var);
    if (!run) return;
    pfa_run(pr);
    if constexpr (kAq) fia_prompt_aq_empty_rows(pr);
    if (!p.softmax_lse_flag) return;
    const float inf = std::numeric_limits<float>::infinity();
    fia_invalid_rows(pr.eo.lse, inf);
    if (!pr.pl.tnd)  // padded query rows (outside [q_begin, q_begin + q_len))
      for (Index b = 0; b < pr.pl.lens.B; ++b) {
        const Index q0 = pr.pl.lens.q_begin(b), q1 = q0 + pr.pl.lens.q_len[static_cast<size_t>(b)];
        for (Index h = 0; h < n; ++h)
          for (Index i = 0; i < pr.pl.S1; ++i)
            if (i < q0 || i >= q1) pr.eo.lse(b, h, i) = inf;
      }
  }
}

/// MLA (rope inputs, head size 512): its own plan over the engine (fia_rope.hpp).
template <class T, class TKV, class TM, class TP, class TO>
void fia_mla(const FusedInferAttentionScoreParams& p,
             const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
             const FusedInferAttentionScoreOutputs<TO>& out, const ExecConfig& exec,
             const FiaRoute& r, bool run) {
  constexpr bool kPlain =
      std::is_same_v<TKV, T> && !std::is_same_v<T, std::int8_t> && std::is_same_v<TO, T>;
  constexpr bool kFullQuant =
      std::is_same_v<T, std::int8_t> && std::is_same_v<TKV, T> && std::is_same_v<TO, bfloat16>;
  ATTNREF_CHECK(kPlain || kFullQuant, std::invalid_argument, kFia, "query / key / value",
                "quantized MLA other than the full quantization (int8 query, key and value with "
                "a bf16 output) is not implemented in attnref yet",
                "one floating type for query, key, value and attention_out", "another mix");
  if constexpr (kFullQuant) {
    FiaMlaQuantData d;  // (the stand-ins: they live until the run ends)
    FiaMla<bfloat16, bfloat16> m;
    CannQuantVariant<TM, bfloat16> var;
    fia_mla_quant_prepare<FusedInferAttentionScoreInputs<bfloat16, bfloat16, TM, bfloat16>>(
        kFia, p, in, out, exec, r.layout, r.n_major_out, r.q_s, d, m, var);
    if (run) attention_with(var, m.e, m.ep, m.eo, m.ex);
  }
  if constexpr (kPlain) {
    ATTNREF_CHECK(in.dequant_scale_query.absent() && p.query_quant_mode == 0, std::invalid_argument,
                  kFia, "dequant_scale_query / params.query_quant_mode",
                  "query quantization takes an int8 query (MLA full quantization)", "none / 0",
                  shape_str(in.dequant_scale_query) + " / " + std::to_string(p.query_quant_mode));
    FiaMla<T, TO> m;
    fia_mla_prepare(kFia, p, in, out, exec, r.layout, r.n_major_out, r.q_s, m);
    if (run) fia_mla_run(m);
  }
}

template <class T, class TKV, class TM, class TP, class TO>
void fia_call(const FusedInferAttentionScoreParams& p,
              const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
              const FusedInferAttentionScoreOutputs<TO>& out, const ExecConfig& exec, bool run) {
  static_assert(std::is_same_v<TKV, T> ||
                    ((std::is_same_v<TKV, std::int8_t> ||
                      std::is_same_v<TKV, std::int32_t>)&&!std::is_same_v<T, std::int8_t>),
                "fused_infer_attention_score key / value: the query's type, or int8 / int4 "
                "(int32) with a half / bfloat16 / float query (antiquant)");
  check_exec(kFia, exec);
  FusedInferAttentionScoreOutputs<TO> o = out;
  if (!p.softmax_lse_flag) o.softmax_lse = {};  // neither checked nor written (not even copied)
  if constexpr (std::is_same_v<TKV, std::int32_t>) {  // int4: unpacked, then the int8 call
    FiaInt4Buffers bufs;
    using In8 = FusedInferAttentionScoreInputs<T, std::int8_t, TM, TP>;
    return dense_call(kFia, in, o, run, [&](const auto& din, const auto& dout) {
      const FiaRoute r = p.input_layout == "NTD_TND"
                             ? FiaRoute{}  // (rejected: Q_S > 1)
                             : fia_route(p, din.query, fia_has_rope(kFia, din));
      fia_call(p, fia_int4_inputs<In8>(kFia, p, din, r, bufs), dout, exec, run);
    });
  } else {
    if constexpr (std::is_same_v<TKV, std::int8_t> && !std::is_same_v<T, std::int8_t>)
      if (fia_is_gqa_nz(in)) {  // NZ caches: gathered, then the contiguous int8 call
        FiaGqaNzData nz;
        return dense_call(kFia, in, o, run, [&](const auto& din, const auto& dout) {
          FusedInferAttentionScoreParams q = p;
          const FiaRoute r = fia_route(p, din.query, false);
          fia_call(q, fia_gqa_nz_inputs<TO>(kFia, q, din, r.layout, r.q_s, nz), dout, exec, run);
        });
      }
    if (p.input_layout == "NTD_TND") {  // NTD inputs seen as TND; the outputs are TND's
      FusedInferAttentionScoreParams tp = p;
      tp.input_layout = "TND";
      auto t = in;
      t.query = ntd_as_tnd(kFia, "query", in.query);
      t.query_rope = ntd_as_tnd(kFia, "query_rope", in.query_rope);
      if (in.block_table.absent()) {  // (a paged cache has no layout)
        for (size_t i = 0; i < in.key.size(); ++i)
          t.key[i] = ntd_as_tnd(kFia, "key[" + std::to_string(i) + "]", in.key[i]);
        for (size_t i = 0; i < in.value.size(); ++i)
          t.value[i] = ntd_as_tnd(kFia, "value[" + std::to_string(i) + "]", in.value[i]);
        t.key_rope = ntd_as_tnd(kFia, "key_rope", in.key_rope);
      }
      ATTNREF_CHECK(in.query_rope.absent() || in.query.absent() || in.query.size(2) != 512,
                    std::invalid_argument, kFia, "params.input_layout",
                    "NTD_TND does not take MLA (head size 512 with rope)", "TND or TND_NTD",
                    p.input_layout);
      return fia_call(tp, t, out, exec, run);
    }
    dense_call(kFia, in, o, run, [&](const auto& din, const auto& dout) {
      const FiaRoute r = fia_route(p, din.query, fia_has_rope(kFia, din));
      if (r.mla) return fia_mla(p, din, dout, exec, r, run);
      ATTNREF_CHECK(
          din.dequant_scale_query.absent() && p.query_quant_mode == 0, std::invalid_argument, kFia,
          "dequant_scale_query / params.query_quant_mode",
          "query quantization exists for MLA only (int8 query, head size 512 with rope)",
          "none / 0",
          shape_str(din.dequant_scale_query) + " / " + std::to_string(p.query_quant_mode));
      fia_check_lse(p, r, din.query, dout.softmax_lse);
      if (r.incre)
        fia_incre(p, din, dout, exec, r, run);
      else
        fia_prompt(p, din, dout, exec, r, run);
    });
  }
}

}  // namespace detail

/// Every check of fused_infer_attention_score() (params, tensors, execution config), without
/// computing or writing anything.
template <class T, class TKV, class TM, class TP, class TO>
void validate(const FusedInferAttentionScoreParams& params,
              const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
              const FusedInferAttentionScoreOutputs<TO>& out, const ExecConfig& exec = {}) {
  detail::fia_call(params, in, out, exec, false);
}

/// CANN FusedInferAttentionScore: route -> the branch's validate -> plan -> run (every check
/// before any output is written).
template <class T, class TKV, class TM, class TP, class TO>
void fused_infer_attention_score(const FusedInferAttentionScoreParams& params,
                                 const FusedInferAttentionScoreInputs<T, TKV, TM, TP>& in,
                                 const FusedInferAttentionScoreOutputs<TO>& out,
                                 const ExecConfig& exec = {}) {
  detail::fia_call(params, in, out, exec, true);
}

}  // namespace attnref
