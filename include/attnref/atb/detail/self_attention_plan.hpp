#pragma once
/// Internal (not part of the API): what the three self_attention overloads share — the cache and
/// layout views in the engine's terms, the plan (SelfAttentionPlan) each overload fills from its
/// ATB inputs, the checks common to both layouts and the run (sa_run).

#include <algorithm>
#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/atb/detail/self_attention_variant.hpp"
#include "attnref/atb/mask_encoding.hpp"
#include "attnref/atb/self_attention_io.hpp"
#include "attnref/atb/self_attention_params.hpp"
#include "attnref/attention/attention.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref {
namespace detail {

template <class E>
StridedView<E, 4> cache_layer(const StridedView<E, 4>& c, Index layer, Index heads, Index d) {
  return StridedView<E, 4>(c.data() + layer * c.stride(0), {c.size(1), c.size(2), heads, d},
                           {c.stride(1), c.stride(2), d * c.stride(3), c.stride(3)});
}

/// [layer, batch, heads, maxSeq, d] BNSD cache -> engine view [batch, maxSeq, heads, d].
template <class E>
StridedView<E, 4> bnsd_cache_layer(const StridedView<E, 5>& c, Index layer) {
  return StridedView<E, 4>(c.data() + layer * c.stride(0),
                           {c.size(1), c.size(3), c.size(2), c.size(4)},
                           {c.stride(1), c.stride(3), c.stride(2), c.stride(4)});
}

/// [n, a, b] -> engine view [1, n, a, b] (packed tokens).
template <class E>
StridedView<E, 4> packed(const StridedView<E, 3>& v) {
  return StridedView<E, 4>(v.data(), {1, v.size(0), v.size(1), v.size(2)},
                           {0, v.stride(0), v.stride(1), v.stride(2)});
}

/// [b, n, s, d] -> engine view [b, s, n, d].
template <class E>
StridedView<E, 4> bnsd_to_engine(const StridedView<E, 4>& v) {
  return StridedView<E, 4>(v.data(), {v.size(0), v.size(2), v.size(1), v.size(3)},
                           {v.stride(0), v.stride(2), v.stride(1), v.stride(3)});
}

/// [rows, cols, heads * d] -> [rows, cols, heads, d] (ATB's hidden-size form of caches).
template <class E>
StridedView<E, 4> split_hidden(const StridedView<E, 3>& v, Index heads, Index d) {
  return StridedView<E, 4>(v.data(), {v.size(0), v.size(1), heads, d},
                           {v.stride(0), v.stride(1), d * v.stride(2), v.stride(2)});
}

/// Everything self_attention resolved from the ATB inputs, in the engine's terms (TIn: the
/// storage of q, k, v; T: of masks and the output).
template <class T, class TIn = T>
struct SelfAttentionPlan {
  AttentionInputs<TIn> ein;
  StridedView<T, 4> o;  // engine output view
  const StridedView<const T, 3>* mask = nullptr;
  const StridedView<const float, 1>* log_n = nullptr;
  const StridedView<const T, 4>* head_mask = nullptr;  // ALiBi masks with a head axis
  const StridedView<const float, 1>* slopes = nullptr;
  Index batch = 0, max_q = 0, max_kv = 0, nh = 0, nkv = 0, d = 0, dv = 0;
  std::vector<Index> q_len;   // per sequence
  std::vector<Index> kv_len;  // per sequence (0 for inactive sequences)
  bool decoder = false;
  bool bottom_right = false;            // PREFIX_ENCODER
  bool swa_rolling = false;             // cacheType SWA: the caches hold the last window tokens
  const KvPages<TIn>* pages = nullptr;  // kv tensorlist
  bool run = true;                      // false: validate() (every check, nothing written)
};

/// Parameter combinations this version does not implement (they pass validate()).
inline void sa_check_implemented(const SelfAttentionParams& params) {
  using P = SelfAttentionParams;
  const P::MaskType m = params.mask_type;
  ATTNREF_NOT_IMPLEMENTED(m == P::MaskType::Undefined || m == P::MaskType::Norm ||
                              m == P::MaskType::CausalMask || m == P::MaskType::NormCompress ||
                              m == P::MaskType::SlidingWindowNorm ||
                              m == P::MaskType::SlidingWindowCompress ||
                              (is_alibi(m) && params.input_layout == P::InputLayout::BSND),
                          "self_attention", "params.mask_type",
                          std::to_string(static_cast<int>(m)) + " (ALiBi masks with BNSD inputs)");
}

/// The mask tensors, slopes and logN of a SelfAttention plan, resolved and checked against
/// params.mask_type / scale_type (shapes and extents), with the switches sa_run reads.
template <class T>
struct SaMasks {
  StridedView<const T, 3> mask{};
  StridedView<const float, 1> log_n{};
  StridedView<const T, 4> head_mask{};
  StridedView<const float, 1> slopes{};
  bool swa_norm = false, alibi_compressed = false, head_mask_form = false;
};

/// The values of the mask tensors the run reads, against the encoding table
/// (atb/mask_encoding.hpp), sequence by sequence over the rows and keys it reads: binary masks
/// hold 0 / 1, additive ones 0 / negative, ALiBi biases no NaN or +inf, the compressed ALiBi tile
/// no NaN and only infinities its slopes turn to -inf.
template <class T, class TIn>
void sa_check_mask_values(const SelfAttentionParams& params, const SelfAttentionPlan<T, TIn>& pl,
                          const SaMasks<T>& mk) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  const auto m = params.mask_type;
  const MaskRule causal = self_attention_mask_rule<T>(params, MaskRole::Causal);
  const MaskRule bias = self_attention_mask_rule<T>(params, MaskRole::HeadBias);
  const bool full = m == P::MaskType::Norm || m == P::MaskType::SlidingWindowNorm;
  if (m == P::MaskType::NormCompress || m == P::MaskType::SlidingWindowCompress)
    check_mask_values<T, 3>(fn, "mask", mk.mask, causal, {0, 0, 0},
                            {1, mk.mask.size(1), mk.mask.size(2)});
  for (Index b = 0; b < pl.batch; ++b) {
    const Index q = pl.q_len[static_cast<size_t>(b)], kv = pl.kv_len[static_cast<size_t>(b)];
    if (q == 0 || kv == 0) continue;  // reads no mask
    if (full && !mk.mask.absent()) {
      const Index mb = mk.mask.size(0) == 1 ? 0 : b;
      check_mask_values<T, 3>(fn, "mask", mk.mask, causal, {mb, 0, 0}, {mb + 1, q, kv});
    }
    if (m == P::MaskType::Alibi) {
      const Index mb = mk.head_mask.size(0) == 1 ? 0 : b;
      check_mask_values<T, 4>(fn, "head_mask", mk.head_mask, bias, {mb, 0, 0, 0},
                              {mb + 1, pl.nh, q, kv});
    }
    if (mk.head_mask_form)
      check_mask_values<T, 4>(fn, "head_mask", mk.head_mask, bias, {0, 0, 0, 0},
                              {1, pl.nh, pl.bottom_right ? kv : q, std::min<Index>(kv, 128)});
  }
  if (mk.alibi_compressed && !mk.head_mask_form)
    check_alibi_tile<T>(fn, mk.mask, mk.slopes, m == P::MaskType::AlibiCompressSqrt);
}

template <class T, class TIn>
SaMasks<T> sa_masks(const SelfAttentionParams& params, const SelfAttentionPlan<T, TIn>& pl) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  SaMasks<T> mk;
  const StridedView<const T, 3>& mask = mk.mask = pl.mask ? *pl.mask : StridedView<const T, 3>{};
  const StridedView<const float, 1>& log_n = mk.log_n =
      pl.log_n ? *pl.log_n : StridedView<const float, 1>{};
  const bool swa_norm = mk.swa_norm = params.mask_type == P::MaskType::SlidingWindowNorm;
  if (swa_norm && pl.decoder)
    ATTNREF_CHECK(mask.absent(), std::invalid_argument, fn, "mask",
                  "given with SLIDING_WINDOW_NORM and DECODER (the window is generated)", "none",
                  shape_str(mask));
  if (params.mask_type == P::MaskType::Norm || (swa_norm && !pl.decoder)) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                  swa_norm ? "missing for SLIDING_WINDOW_NORM" : "missing for NORM",
                  "a [maxSeq, maxSeq], [batch, maxSeq, maxSeq] or [batch, 1, maxSeq] mask", "none");
    ATTNREF_CHECK(mask.size(0) == 1 || mask.size(0) == pl.batch, std::invalid_argument, fn,
                  "mask.shape[0]", "mismatch", "1 or " + std::to_string(pl.batch), mask.size(0));
    ATTNREF_CHECK(mask.size(1) >= pl.max_q, std::invalid_argument, fn, "mask.shape[1]",
                  "smaller than the longest query sequence", ">= " + std::to_string(pl.max_q),
                  mask.size(1));
    ATTNREF_CHECK(mask.size(2) >= pl.max_kv, std::invalid_argument, fn, "mask.shape[2]",
                  "smaller than the longest key sequence", ">= " + std::to_string(pl.max_kv),
                  mask.size(2));
    check_view(fn, "mask", mask);
  }
  if (params.mask_type == P::MaskType::NormCompress) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask", "missing for NORM_COMPRESS",
                  "the [128, 128] tile (as [1, 128, 128])", "none");
    const std::array<Index, 3> want{1, NormCompressHook::kTile, NormCompressHook::kTile};
    ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                  "mismatch for NORM_COMPRESS", shape_str<3>(want), shape_str(mask));
  }
  const StridedView<const T, 4>& head_mask = mk.head_mask =
      pl.head_mask ? *pl.head_mask : StridedView<const T, 4>{};
  const StridedView<const float, 1>& slopes = mk.slopes =
      pl.slopes ? *pl.slopes : StridedView<const float, 1>{};
  const bool alibi_compressed = mk.alibi_compressed =
      params.mask_type == P::MaskType::AlibiCompress ||
      params.mask_type == P::MaskType::AlibiCompressSqrt ||
      params.mask_type == P::MaskType::AlibiCompressLeftAlign;
  // ALIBI_COMPRESS and ALIBI_COMPRESS_SQRT take either the [256, 256] tile with slopes or a
  // [headNum, seqLen, 128] mask of final bias values (read alike: no square root applied).
  const bool head_mask_form = mk.head_mask_form =
      (params.mask_type == P::MaskType::AlibiCompress ||
       params.mask_type == P::MaskType::AlibiCompressSqrt) &&
      !head_mask.absent() && mask.absent();
  if (params.mask_type == P::MaskType::Alibi) {
    ATTNREF_CHECK(!head_mask.absent(), std::invalid_argument, fn, "head_mask", "missing for ALIBI",
                  "[batch or 1, headNum, maxSeq, maxSeq]", "none");
    ATTNREF_CHECK(head_mask.size(0) == 1 || head_mask.size(0) == pl.batch, std::invalid_argument,
                  fn, "head_mask.shape[0]", "mismatch", "1 or " + std::to_string(pl.batch),
                  head_mask.size(0));
    ATTNREF_CHECK(head_mask.size(1) == pl.nh, std::invalid_argument, fn, "head_mask.shape[1]",
                  "mismatch with the number of heads", pl.nh, head_mask.size(1));
    ATTNREF_CHECK(head_mask.size(2) >= pl.max_q, std::invalid_argument, fn, "head_mask.shape[2]",
                  "smaller than the longest query sequence", ">= " + std::to_string(pl.max_q),
                  head_mask.size(2));
    ATTNREF_CHECK(head_mask.size(3) >= pl.max_kv, std::invalid_argument, fn, "head_mask.shape[3]",
                  "smaller than the longest key sequence", ">= " + std::to_string(pl.max_kv),
                  head_mask.size(3));
    check_view(fn, "head_mask", head_mask);
  }
  if (alibi_compressed) {
    ATTNREF_CHECK(pl.d <= 128 && pl.dv <= 128, std::invalid_argument, fn, "head size",
                  "above the compressed ALiBi limit", "<= 128", std::max(pl.d, pl.dv));
    ATTNREF_CHECK(!(std::is_same_v<T, half> && params.kernel_type == P::KernelType::Default),
                  std::invalid_argument, fn, "params.kernel_type",
                  "must be HighPrecision for a compressed ALiBi mask with fp16", "HighPrecision",
                  "Default");
    if (head_mask_form) {
      const Index rows = pl.bottom_right ? pl.max_kv : pl.max_q;
      ATTNREF_CHECK(head_mask.size(0) == 1 && head_mask.size(1) == pl.nh &&
                        head_mask.size(2) >= rows && head_mask.size(3) == AlibiCompressHook::kTile,
                    std::invalid_argument, fn, "head_mask.shape",
                    "mismatch for the compressed ALiBi head form",
                    "[1, " + std::to_string(pl.nh) + ", >= " + std::to_string(rows) + ", 128]",
                    shape_str(head_mask));
      check_view(fn, "head_mask", head_mask);
    } else {
      ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                    "missing for a compressed ALiBi mask",
                    "the [256, 256] tile (as [1, 256, 256]) with slopes", "none");
      const std::array<Index, 3> want{1, 2 * AlibiCompressHook::kTile,
                                      2 * AlibiCompressHook::kTile};
      ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                    "mismatch for a compressed ALiBi mask", shape_str<3>(want), shape_str(mask));
      check_view(fn, "mask", mask);
      ATTNREF_CHECK(!slopes.absent(), std::invalid_argument, fn, "slopes",
                    "missing for a compressed ALiBi mask", "[headNum] float", "none");
      ATTNREF_CHECK(slopes.size(0) == pl.nh, std::invalid_argument, fn, "slopes.shape[0]",
                    "mismatch with the number of heads", pl.nh, slopes.size(0));
      check_finite(fn, "slopes", slopes);
    }
  }
  if (params.mask_type == P::MaskType::SlidingWindowCompress) {
    ATTNREF_CHECK(!mask.absent(), std::invalid_argument, fn, "mask",
                  "missing for SLIDING_WINDOW_COMPRESS",
                  "the [512, 512] pattern (as [1, 512, 512])", "none");
    const std::array<Index, 3> want{1, SwaCompressHook::kSize, SwaCompressHook::kSize};
    ATTNREF_CHECK(mask.shape() == want, std::invalid_argument, fn, "mask.shape",
                  "mismatch for SLIDING_WINDOW_COMPRESS", shape_str<3>(want), shape_str(mask));
    check_view(fn, "mask", mask);
  }
  if (params.scale_type == P::ScaleType::LogN) {
    ATTNREF_CHECK(!log_n.absent(), std::invalid_argument, fn, "log_n", "missing for LOGN",
                  pl.decoder ? "a [batch] float tensor" : "a [maxSeqLen] float tensor", "none");
    const Index need = pl.decoder ? pl.batch : pl.max_q;
    ATTNREF_CHECK(log_n.size(0) >= need, std::invalid_argument, fn, "log_n.shape[0]",
                  pl.decoder ? "smaller than the batch" : "smaller than the longest sequence",
                  ">= " + std::to_string(need), log_n.size(0));
  }

  sa_check_mask_values(params, pl, mk);
  return mk;
}

/// Checks shared by both layouts, then (pl.run) the run: mask and logN shapes, qScale, output
/// overlaps, `prepare` (zeroing, cache writes: after every check), and the engine.
template <class T, class TIn, class Prepare>
void sa_run(const SelfAttentionParams& params, SelfAttentionPlan<T, TIn>& pl,
            const ExecConfig& exec, const std::vector<StridedView<const TIn, 4>>& extra_inputs,
            Prepare&& prepare, const SaQuant* quant = nullptr) {
  using P = SelfAttentionParams;
  constexpr const char* fn = "self_attention";
  const SaMasks<T> mk = sa_masks(params, pl);
  const StridedView<const T, 3>& mask = mk.mask;
  const StridedView<const float, 1>& log_n = mk.log_n;
  const StridedView<const T, 4>& head_mask = mk.head_mask;
  const StridedView<const float, 1>& slopes = mk.slopes;
  const bool swa_norm = mk.swa_norm, alibi_compressed = mk.alibi_compressed,
             head_mask_form = mk.head_mask_form;

  AttentionOutputs<T> eout{pl.o};
  // The kernel the params select decides the mask encoding and the score precision
  // (atb/mask_encoding.hpp). The qkv-quantized path always computes its scores in fp16
  // (docs/semantics.md §2.8).
  const MaskRule rule = self_attention_mask_rule<T>(params, MaskRole::Causal);
  const bool fp16_scores = rule.kernel == AtbKernel::Fp16Default || quant != nullptr;
  const bool alibi_blocks = alibi_compressed && !head_mask_form;  // the [256, 256] tile
  const bool compressed = params.mask_type == P::MaskType::NormCompress || alibi_compressed;
  const bool swa_compressed = params.mask_type == P::MaskType::SlidingWindowCompress;
  const bool mask_read = params.mask_type == P::MaskType::Norm ||
                         params.mask_type == P::MaskType::NormCompress || swa_compressed ||
                         (swa_norm && !pl.decoder) || alibi_blocks;
  const bool transform_needed = fp16_scores || params.scale_type == P::ScaleType::LogN ||
                                params.clamp_type == P::ClampType::MinMax || mask_read ||
                                params.mask_type == P::MaskType::Alibi || alibi_compressed;
  AlibiCompressHook alibi_hook;
  alibi_hook.blocks = NormCompressHook{pl.bottom_right};
  alibi_hook.kind =
      head_mask_form                                            ? AlibiCompressHook::Kind::HeadMask
      : params.mask_type == P::MaskType::AlibiCompressSqrt      ? AlibiCompressHook::Kind::Sqrt
      : params.mask_type == P::MaskType::AlibiCompressLeftAlign ? AlibiCompressHook::Kind::LeftAlign
                                                                : AlibiCompressHook::Kind::Distance;
  // Sliding window (SLIDING_WINDOW_NORM): the encoders' window is aligned top-left like their
  // masks; the decoder's query is the last token (bottom-right), and a rolling cache (cacheType
  // SWA) holds exactly the window, so nothing is hidden there.
  // CAUSAL_MASK is aligned top-left like the encoders' NORM masks, and bottom-right for
  // PREFIX_ENCODER (the vendor's generated mask) and DECODER (its query is the last token: it
  // sees every key).
  CausalHook causal{
      params.mask_type == P::MaskType::CausalMask
          ? (pl.bottom_right || pl.decoder ? CausalMode::BottomRight : CausalMode::TopLeft)
          : CausalMode::None};
  if (swa_norm && !pl.swa_rolling)
    causal =
        CausalHook{pl.decoder ? CausalMode::BottomRight : CausalMode::TopLeft, params.window_size};
  AttentionParams ep;
  // Without a transform the scores are q·k·qkScale in fp32: the engine applies qkScale itself
  // (folded into its q tile, a rounding-level difference from scaling the product).
  // The same when the transform only adds a mask term in fp32.
  const bool scale_folded =
      !transform_needed || (!fp16_scores && params.scale_type != P::ScaleType::LogN &&
                            params.clamp_type != P::ClampType::MinMax);
  ep.scale = scale_folded ? static_cast<double>(params.qk_scale) : 1.0;
  ExecConfig ex = exec;
  if (quant) ex.kv_tile = quant->block;  // P is quantized block by block
  validate(pl.ein, ep, eout, ex);  // engine checks (overlaps included) before anything is written
  for (const auto& x : extra_inputs)
    ATTNREF_CHECK(!overlaps(pl.o, x), std::invalid_argument, fn, "out",
                  "overlaps an input or a cache", "memory disjoint from every input",
                  "overlapping memory");
  if (!pl.run) return;  // validate(): every check has run, nothing is written
  prepare();

  AtbSelfAttentionVariant<T> var{
      {},
      &params,
      fp16_scores,
      rule.factor,
      mask_read ? mask : StridedView<const T, 3>{},
      params.scale_type == P::ScaleType::LogN ? log_n : StridedView<const float, 1>{},
      pl.decoder,
      transform_needed,
      scale_folded,
      causal,
      compressed,
      NormCompressHook{pl.bottom_right},
      swa_compressed,
      SwaCompressHook::make(params.window_size, pl.d, pl.dv),
      params.mask_type == P::MaskType::Alibi || head_mask_form ? head_mask
                                                               : StridedView<const T, 4>{},
      alibi_blocks ? slopes : StridedView<const float, 1>{},
      alibi_hook,
      quant ? quant->qk_descale : StridedView<const float, 1>{}};
  // qScale multiplies q in the data type before the product (ATB golden): the query hook rounds
  // q · qScale to TIn as each row is loaded. (int8 q: validate() rejects qScale != 1 with qkv
  // quantization.)
  if constexpr (!std::is_same_v<TIn, std::int8_t>)
    if (params.q_scale != 1.0f) var.template scale_query<TIn>(params.q_scale);
  if (quant) {
    attention_with(AtbQkvQuantVariant<T>{var, quant->p_stage}, pl.ein, ep, eout, ex);
    return;
  }
  if (pl.pages)
    attention_with_pages(var, pl.ein, ep, eout, *pl.pages, ex);
  else
    attention_with(var, pl.ein, ep, eout, ex);
}

/// seq_len / batchRunStatus checks shared by both layouts; returns the active flags.
inline std::vector<bool> sa_sequences(const SelfAttentionParams& params,
                                      const std::vector<Index>& seq_len,
                                      const std::vector<std::int32_t>& status, Index max_len,
                                      const char* max_name) {
  constexpr const char* fn = "self_attention";
  const Index batch = static_cast<Index>(seq_len.size());
  ATTNREF_CHECK(batch >= 1, std::invalid_argument, fn, "seq_len", "empty", ">= 1 sequence", 0);
  for (Index b = 0; b < batch; ++b) {
    const Index l = seq_len[static_cast<size_t>(b)];
    const std::string arg = "seq_len[" + std::to_string(b) + "]";
    ATTNREF_CHECK(l >= 0, std::invalid_argument, fn, arg, "negative", ">= 0", l);
    if (max_len >= 0)
      ATTNREF_CHECK(l <= max_len, std::invalid_argument, fn, arg,
                    std::string("exceeds ") + max_name, "<= " + std::to_string(max_len), l);
    if (params.calc_type == SelfAttentionParams::CalcType::Decoder)
      ATTNREF_CHECK(l == 1, std::invalid_argument, fn, arg, "not 1 for Decoder", 1, l);
  }
  std::vector<bool> active(static_cast<size_t>(batch), true);
  if (params.batch_run_status_enable) {
    ATTNREF_CHECK(static_cast<Index>(status.size()) == batch, std::invalid_argument, fn,
                  "batch_run_status", "size mismatch", batch, status.size());
    for (Index b = 0; b < batch; ++b) {
      const auto st = status[static_cast<size_t>(b)];
      ATTNREF_CHECK(st == 0 || st == 1, std::invalid_argument, fn,
                    "batch_run_status[" + std::to_string(b) + "]", "not 0 or 1", "0 or 1", st);
      active[static_cast<size_t>(b)] = st == 1;
    }
  }
  return active;
}

/// token_offset checks of the cache calcTypes (active sequences only, but for the sign); returns
/// the kv lengths (0 when inactive).
inline std::vector<Index> sa_token_offsets(const std::vector<Index>& seq_len,
                                           const std::vector<Index>& token_offset,
                                           const std::vector<bool>& active, Index max_seq) {
  constexpr const char* fn = "self_attention";
  const Index batch = static_cast<Index>(seq_len.size());
  ATTNREF_CHECK(static_cast<Index>(token_offset.size()) == batch, std::invalid_argument, fn,
                "token_offset", "size mismatch", batch, token_offset.size());
  std::vector<Index> kv(static_cast<size_t>(batch), 0);
  for (Index b = 0; b < batch; ++b) {
    const Index off = token_offset[static_cast<size_t>(b)];
    const std::string arg = "token_offset[" + std::to_string(b) + "]";
    ATTNREF_CHECK(off >= 0, std::invalid_argument, fn, arg, "negative", ">= 0", off);
    // An inactive sequence (batchRunStatus 0) reads and writes no cache row: a dynamic-batch
    // caller gives it a token offset of 0, below its seq_len (ATB skips it the same way).
    if (!active[static_cast<size_t>(b)]) continue;
    ATTNREF_CHECK(off >= seq_len[static_cast<size_t>(b)], std::invalid_argument, fn, arg,
                  "smaller than seq_len", ">= " + std::to_string(seq_len[static_cast<size_t>(b)]),
                  off);
    ATTNREF_CHECK(off <= max_seq, std::invalid_argument, fn, arg, "exceeds maxSeqLen",
                  "<= " + std::to_string(max_seq), off);
    kv[static_cast<size_t>(b)] = off;
  }
  return kv;
}

template <class T, class TIn>
void sa_finish_lengths(SelfAttentionPlan<T, TIn>& pl) {
  pl.max_q = 0;
  pl.max_kv = 0;
  for (Index l : pl.q_len) pl.max_q = std::max(pl.max_q, l);
  for (Index l : pl.kv_len) pl.max_kv = std::max(pl.max_kv, l);
}

/// The BSND front matter shared by the float and the int8 overloads: mask pointers, head counts
/// and sizes (query and out), the MLA checks, and the packed-token offsets of seq_len (checked
/// against query.shape[0]). Returns the offsets.
template <class Plan, class In, class Out>
std::vector<Index> sa_bsnd_front(Plan& pl, const SelfAttentionParams& params, const In& in,
                                 const Out& out) {
  constexpr const char* fn = "self_attention";
  pl.mask = &in.mask;
  pl.head_mask = &in.head_mask;
  pl.slopes = &in.slopes;
  const Index tokens = in.query.size(0);
  pl.nh = in.query.size(1);
  pl.d = in.query.size(2);
  pl.nkv = params.num_kv_heads > 0 ? params.num_kv_heads : params.num_heads;
  pl.dv = out.out.size(2);
  ATTNREF_CHECK(pl.nh == params.num_heads, std::invalid_argument, fn, "query.shape[1]",
                "mismatch with params.num_heads", params.num_heads, pl.nh);
  if (params.mla_v_head_size > 0) {
    ATTNREF_CHECK(pl.dv == params.mla_v_head_size, std::invalid_argument, fn, "out.shape[2]",
                  "mismatch with params.mla_v_head_size", params.mla_v_head_size, pl.dv);
    ATTNREF_CHECK(pl.dv <= pl.d, std::invalid_argument, fn, "params.mla_v_head_size",
                  "larger than the head size", "<= " + std::to_string(pl.d), pl.dv);
    ATTNREF_CHECK(in.value.absent(), std::invalid_argument, fn, "value",
                  "given with the MLA merged kv cache (V is the first mlaVHeadSize dims of K)",
                  "absent", "a tensor");
  }
  std::vector<Index> cu(1, 0);
  for (Index l : in.seq_len) cu.push_back(cu.back() + l);
  ATTNREF_CHECK(cu.back() == tokens, std::invalid_argument, fn, "seq_len",
                "sum mismatch with query.shape[0]", tokens, cu.back());
  pl.batch = static_cast<Index>(in.seq_len.size());
  pl.q_len = in.seq_len;
  return cu;
}

template <class T>
constexpr void sa_check_type() {
  static_assert(std::is_same_v<T, half> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float>,
                "self_attention data: half, bfloat16 or float");
}

}  // namespace detail
}  // namespace attnref
