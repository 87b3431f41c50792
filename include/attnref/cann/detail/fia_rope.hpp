#pragma once
/// FusedInferAttentionScore's split rope inputs (V3+: query_rope, key_rope), the score
/// scale · (q·k + q_rope·k_rope) with V the value tensor alone. Not part of the API.
///
/// Two configurations exist (the vendor's documents and its tiling checks):
///   MLA, head size 512 (the vendor's incremental MLA kernel): rope 64, one kv head, Q_N in
///     {1, 2, 4, ..., 128}, Q_S 1–16 (TND: per batch), a paged cache with blocks of 16 or 128,
///     layouts BSH, BSND, BNSD and TND (with _NBSD / _NTD: the output head-major); sparse_mode 0
///     (no mask) with one query row, 3 (rightDownCausal, the 2048 x 2048 mask) with more (TND: 0 or
///     3), or 4 (the sliding window: BSND, 128 heads, keys [i + kv - q - pre, i + kv - q] with q
///     the batch's query rows (actual_seq_lengths, rows past them 0), pre_tokens in [1, 2048],
///     next_tokens 0, a paged cache with blocks of 64 or 128 or contiguous BSND tensors, kv >= q);
///     no softmax_lse,
///     pse, shared prefix, antiquant, post-quant, kv padding or sink. fia_mla is its plan: the
///     engine with split scores over the paged cache, the causal mode and window its only hooks.
///   Head size 128 (the prompt branch): rope 64, TND only, bf16, q / k / v head size 128; no
///     paged cache, prefix, pse or quantization. fia_prompt passes the rope views to the
///     PromptFlashAttention plan.
/// key_rope_antiquant_scale is reserved by the vendor ("no effect in this version"): ignored.

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// query_rope / key_rope: both or neither. True with both.
template <class In>
bool fia_has_rope(const char* fn, const In& in) {
  const bool q = !in.query_rope.absent(), k = !in.key_rope.absent();
  ATTNREF_CHECK(q == k, std::invalid_argument, fn, q ? "key_rope" : "query_rope",
                "missing (query_rope and key_rope come together)", "a tensor", "none");
  return q;
}

/// The rope part's (B, S, N, R) in `layout`, the tensor's own dims (B, S, N) as `like`'s, R 64.
template <class T>
std::array<Index, 4> fia_rope_dims(const char* fn, const char* arg, const StridedView<T>& t,
                                   Layout layout, Index n, const std::array<Index, 4>& like) {
  const auto d = pfa_dims(fn, arg, t, layout, n);
  ATTNREF_CHECK(
      d[0] == like[0] && d[1] == like[1] && d[3] == 64, std::invalid_argument, fn,
      std::string(arg) + ".shape", "mismatch",
      "the " + std::string(arg[0] == 'q' ? "query" : "key") + "'s shape with head size 64",
      shape_str(t));
  return d;
}

/// The features the MLA configuration does not take, each rejected by name.
template <class P, class In>
void fia_mla_unsupported(const char* fn, const P& p, const In& in) {
  const auto no = [fn](bool given, const char* arg, const std::string& got) {
    ATTNREF_CHECK(!given, std::invalid_argument, fn, arg,
                  "not supported with query_rope and head size 512 (MLA)", "none", got);
  };
  no(p.softmax_lse_flag, "params.softmax_lse_flag", "true");
  no(!in.pse_shift.absent(), "pse_shift", shape_str(in.pse_shift));
  no(!in.key_shared_prefix.absent() || !in.value_shared_prefix.absent() ||
         !in.actual_shared_prefix_len.empty(),
     "key_shared_prefix", shape_str(in.key_shared_prefix));
  no(!in.antiquant_scale.absent() || !in.antiquant_offset.absent() ||
         !in.antiquant_scale_per_token.absent() || !in.antiquant_offset_per_token.absent(),
     "antiquant_scale", shape_str(in.antiquant_scale));
  no(!in.key_antiquant_scale.absent() || !in.key_antiquant_offset.absent() ||
         !in.value_antiquant_scale.absent() || !in.value_antiquant_offset.absent(),
     "key_antiquant_scale / value_antiquant_scale", shape_str(in.key_antiquant_scale));
  no(!in.deq_scale1.absent() || !in.quant_scale1.absent() || !in.deq_scale2.absent(),
     "deq_scale1 / quant_scale1 / deq_scale2", shape_str(in.deq_scale1));
  no(!in.quant_scale2.absent() || !in.quant_offset2.absent(), "quant_scale2 / quant_offset2",
     shape_str(in.quant_scale2));
  no(!in.kv_padding_size.absent(), "kv_padding_size", shape_str(in.kv_padding_size));
  no(!in.query_padding_size.absent(), "query_padding_size", shape_str(in.query_padding_size));
  no(!in.learnable_sink.absent(), "learnable_sink", shape_str(in.learnable_sink));
  ATTNREF_CHECK(p.inner_precise == 0 || p.inner_precise == 1, std::invalid_argument, fn,
                "params.inner_precise", "out of range with query_rope and head size 512 (MLA)",
                "0 or 1", std::to_string(p.inner_precise));
}

/// MLA's sparse mode and mask: TND 0 or 3; otherwise 0 with Q_S 1, 3 with Q_S > 1, or 4 (the
/// sliding window, unquantized MLA: BSND, 128 query heads, pre_tokens in [1, 2048], next_tokens
/// 0; the prepare step checks the rest). Mode 0 takes no mask, 3 and 4 the 2048 x 2048 one.
/// Returns the engine's window: -1 none, 0 causal, w > 0 causal with a window of w keys.
template <class P, class TM>
Index fia_mla_causal(const char* fn, const P& p, const StridedView<const TM>& mask, bool tnd,
                     Index q_s) {
  const std::int64_t sm = p.sparse_mode;
  const std::int64_t want = q_s > 1 ? 3 : 0;
  ATTNREF_CHECK(
      tnd ? (sm == 0 || sm == 3) : (sm == want || sm == 4), std::invalid_argument, fn,
      "params.sparse_mode", "not supported with query_rope and head size 512 (MLA)",
      tnd ? "0 or 3 (TND)" : std::to_string(want) + " or 4 with Q_S " + std::to_string(q_s),
      std::to_string(sm));
  if (sm == 0) {
    ATTNREF_CHECK(mask.absent(), std::invalid_argument, fn, "atten_mask",
                  "given with sparse_mode 0 (MLA takes no mask there)", "none", shape_str(mask));
    return -1;
  }
  ATTNREF_CHECK(!mask.absent() && mask.rank() == 2 && mask.size(0) == 2048 && mask.size(1) == 2048,
                std::invalid_argument, fn, "atten_mask.shape",
                "sparse_mode 3 and 4 take the 2048 x 2048 compressed mask", "[2048, 2048]",
                shape_str(mask));
  if (sm == 3) return 0;
  ATTNREF_CHECK(p.input_layout == "BSND", std::invalid_argument, fn, "params.input_layout",
                "not supported with MLA's sparse_mode 4", "BSND", p.input_layout);
  ATTNREF_CHECK(p.num_heads == 128, std::invalid_argument, fn, "params.num_heads",
                "not supported with MLA's sparse_mode 4", "128", std::to_string(p.num_heads));
  ATTNREF_CHECK(p.pre_tokens >= 1 && p.pre_tokens <= 2048, std::invalid_argument, fn,
                "params.pre_tokens", "out of range with MLA's sparse_mode 4", "[1, 2048]",
                std::to_string(p.pre_tokens));
  ATTNREF_CHECK(p.next_tokens == 0, std::invalid_argument, fn, "params.next_tokens",
                "not supported with MLA's sparse_mode 4", "0", std::to_string(p.next_tokens));
  return static_cast<Index>(p.pre_tokens) + 1;
}

/// The paged latent cache: key / value [blockNum, blockSize, 512] (or, with a BNSD or TND query,
/// [blockNum, 1, blockSize, 512]), key_rope the same with 64; blocks of 16 or 128.
template <class T>
StridedView<const T, 4> fia_mla_cache(const char* fn, const char* arg,
                                      const StridedView<const T>& c, Layout layout, Index width) {
  const bool r4 = c.rank() == 4 && (layout == Layout::BNSD || layout == Layout::TND);
  ATTNREF_CHECK(!c.absent() && (c.rank() == 3 || r4) && c.size(c.rank() - 1) == width &&
                    (c.rank() == 3 || c.size(1) == 1),
                std::invalid_argument, fn, std::string(arg) + ".shape", "not a paged MLA cache",
                "[blockNum, blockSize, " + std::to_string(width) +
                    "] (BNSD / TND query: also [blockNum, 1, blockSize, " + std::to_string(width) +
                    "])",
                shape_str(c));
  const Index nb = c.size(0), bs = c.rank() == 3 ? c.size(1) : c.size(2);
  return StridedView<const T, 4>(c.data(), {nb, bs, 1, width}, {bs * width, width, width, 1});
}

/// A validated MLA call: the engine problem; q_len: the query rows of every batch when some are
/// shorter than Q_S (the sliding window; the rows past them are zeroed before the run).
template <class T, class TO>
struct FiaMla {
  AttentionInputs<T> e;
  AttentionParams ep;
  AttentionOutputs<TO> eo;
  ExecConfig ex;
  std::vector<Index> q_len;
};

/// MLA's latent cache into the engine problem: paged ([blockNum, blockSize, 512], blocks of 16 or
/// 128; 64 or 128 with the sliding window) or, with the sliding window, contiguous BSND ([B, S2,
/// 1, 512] and key_rope [B, S2, 1, 64]); the kv lengths, each at least the batch's query rows
/// and at most 131088 with the sliding window.
template <class P, class In, class T>
void fia_mla_kv(const char* fn, const P& p, const In& in, Layout layout, Index window, Index B,
                Index q_s, AttentionInputs<T>& e) {
  const bool paged = !in.block_table.absent();
  ATTNREF_CHECK(paged || window > 0, std::invalid_argument, fn, "block_table",
                "missing: MLA (query_rope, head size 512) reads a paged cache (a contiguous one "
                "with sparse_mode 4 only)",
                "[B, maxBlocks]", "none");
  ATTNREF_CHECK(in.value[0].shape() == in.key[0].shape(), std::invalid_argument, fn,
                "value[0].shape", "differs from the key's", shape_str(in.key[0]),
                shape_str(in.value[0]));
  Index cols = 0;
  if (paged) {
    e.k = fia_mla_cache(fn, "key[0]", in.key[0], layout, 512);
    e.v = fia_mla_cache(fn, "value[0]", in.value[0], layout, 512);
    e.k_rope = fia_mla_cache(fn, "key_rope", in.key_rope, layout, 64);
    ATTNREF_CHECK(e.k_rope.size(0) == e.k.size(0) && e.k_rope.size(1) == e.k.size(1) &&
                      in.key_rope.rank() == in.key[0].rank(),
                  std::invalid_argument, fn, "key_rope.shape", "mismatch with key[0]",
                  "key[0]'s blocks with head size 64", shape_str(in.key_rope));
    const Index bs = e.k.size(1);
    ATTNREF_CHECK(p.block_size == bs, std::invalid_argument, fn, "params.block_size",
                  "differs from the cache's block size", std::to_string(bs),
                  std::to_string(p.block_size));
    ATTNREF_CHECK(window > 0 ? bs == 64 || bs == 128 : bs == 16 || bs == 128, std::invalid_argument,
                  fn, "params.block_size", "not supported with query_rope and head size 512 (MLA)",
                  window > 0 ? "64 or 128 (sparse_mode 4)" : "16 or 128", std::to_string(bs));
    const auto& bt = in.block_table;
    ATTNREF_CHECK(bt.rank() == 2 && bt.size(0) == B, std::invalid_argument, fn, "block_table.shape",
                  "mismatch", "[" + std::to_string(B) + ", maxBlocksPerSeq]", shape_str(bt));
    e.block_table = StridedView<const std::int32_t, 2>(bt.data(), {B, bt.size(1)});
    ATTNREF_CHECK(!in.actual_seq_lengths_kv.empty(), std::invalid_argument, fn,
                  "actual_seq_lengths_kv", "required with a paged cache", "kv lengths", "none");
    cols = checked_mul(fn, "block_table.shape[1] * blockSize", bt.size(1), bs);
  } else {  // sparse 4 over contiguous BSND tensors
    const auto kd = pfa_dims(fn, "key[0]", in.key[0], layout, 1);
    ATTNREF_CHECK(kd[0] == B && kd[3] == 512, std::invalid_argument, fn, "key[0].shape",
                  "not a contiguous MLA cache", "[" + std::to_string(B) + ", S2, 1, 512]",
                  shape_str(in.key[0]));
    const auto rd = fia_rope_dims(fn, "key_rope", in.key_rope, layout, 1, kd);
    e.k = pfa_view(in.key[0].data(), layout, kd);
    e.v = pfa_view(in.value[0].data(), layout, kd);
    e.k_rope = pfa_view(in.key_rope.data(), layout, rd);
    cols = kd[1];
  }
  e.seq.kv = cann_lengths(fn, "actual_seq_lengths_kv", in.actual_seq_lengths_kv, B, cols);
  if (paged)
    PagedKvCache<const T>{e.k, e.v, e.block_table, e.seq.kv}.validate(
        fn, {"key[0]", "value[0]", "block_table", "actual_seq_lengths_kv", "params.block_size",
             "blockSize"});
  if (window > 0)  // sparse 4: every batch has at least its query rows as keys (no row empty)
    for (Index b = 0; b < B; ++b) {
      const Index kv = e.seq.kv[static_cast<size_t>(b)];
      const Index q = e.seq.q.empty() ? q_s : e.seq.q[static_cast<size_t>(b)];
      ATTNREF_CHECK(kv >= q && kv <= 131088, std::invalid_argument, fn,
                    "actual_seq_lengths_kv[" + std::to_string(b) + "]",
                    "out of range with MLA's sparse_mode 4", "[" + std::to_string(q) + ", 131088]",
                    std::to_string(kv));
    }
}

/// MLA's query: the cumulative TND lengths (each batch at most 16 rows) or, with the sliding
/// window, the per-batch query rows (actual_seq_lengths, each at most Q_S). Returns B.
template <class In, class T>
Index fia_mla_q_lengths(const char* fn, const In& in, bool tnd, Index window,
                        const std::array<Index, 4>& qd, AttentionInputs<T>& e) {
  if (!tnd) {
    if (window > 0 && !in.actual_seq_lengths.empty())
      e.seq.q = cann_lengths(fn, "actual_seq_lengths", in.actual_seq_lengths, qd[0], qd[1]);
    return qd[0];
  }
  const auto& ql = in.actual_seq_lengths;
  ATTNREF_CHECK(!ql.empty(), std::invalid_argument, fn, "actual_seq_lengths",
                "required with TND (cumulative query lengths)", "B values", "none");
  const Index B = static_cast<Index>(ql.size());
  e.seq.q_cu.push_back(0);
  for (Index b = 0; b < B; ++b) {
    const std::int64_t v = ql[static_cast<size_t>(b)], lo = e.seq.q_cu.back();
    const std::string arg = "actual_seq_lengths[" + std::to_string(b) + "]";
    ATTNREF_CHECK(v >= lo && v - lo <= 16, std::invalid_argument, fn, arg,
                  "out of range (cumulative, at most 16 query rows a batch with MLA)",
                  "[" + std::to_string(lo) + ", " + std::to_string(lo + 16) + "]",
                  std::to_string(v));
    e.seq.q_cu.push_back(static_cast<Index>(v));
  }
  ATTNREF_CHECK(e.seq.q_cu.back() == qd[1], std::invalid_argument, fn, "actual_seq_lengths",
                "last value differs from T", std::to_string(qd[1]),
                std::to_string(e.seq.q_cu.back()));
  return B;
}

/// Validates an MLA call (head size 512 with rope) and plans it into `m`: everything checked,
/// nothing written.
template <class P, class In, class Out, class T, class TO>
void fia_mla_prepare(const char* fn, const P& p, const In& in, const Out& out,
                     const ExecConfig& exec, Layout layout, bool n_major_out, Index q_s,
                     FiaMla<T, TO>& m) {
  using L = Layout;
  ATTNREF_CHECK(layout != L::BNSD_BSND, std::invalid_argument, fn, "params.input_layout",
                "not supported with query_rope and head size 512 (MLA)", "BSH, BSND, BNSD or TND",
                p.input_layout);
  const bool tnd = layout == L::TND;
  ATTNREF_CHECK(p.num_heads > 0 && p.num_heads <= 128 && (p.num_heads & (p.num_heads - 1)) == 0,
                std::invalid_argument, fn, "params.num_heads",
                "not supported with query_rope and head size 512 (MLA)",
                "1, 2, 4, 8, 16, 32, 64 or 128", std::to_string(p.num_heads));
  ATTNREF_CHECK(p.num_key_value_heads == 1 || (p.num_key_value_heads == 0 && p.num_heads == 1),
                std::invalid_argument, fn, "params.num_key_value_heads",
                "MLA reads one latent kv head", "1", std::to_string(p.num_key_value_heads));
  const Index n = static_cast<Index>(p.num_heads);
  const auto qd = pfa_dims(fn, "query", in.query, layout, n);
  const auto rd = fia_rope_dims(fn, "query_rope", in.query_rope, layout, n, qd);
  ATTNREF_CHECK(tnd || (q_s >= 1 && q_s <= 16), std::invalid_argument, fn, "query.shape",
                "Q_S out of range with query_rope and head size 512 (MLA)", "Q_S in [1, 16]",
                shape_str(in.query));
  fia_mla_unsupported(fn, p, in);
  ATTNREF_CHECK(in.key.size() == 1 && in.value.size() == 1, std::invalid_argument, fn,
                "key / value", "MLA reads one paged cache tensor each", "one tensor each",
                std::to_string(in.key.size()) + " and " + std::to_string(in.value.size()));
  const Index window = fia_mla_causal(fn, p, in.atten_mask, tnd, q_s);
  auto& e = m.e;
  e.q = pfa_view(in.query.data(), layout, qd);
  e.q_rope = pfa_view(in.query_rope.data(), layout, rd);
  const Index B = fia_mla_q_lengths(fn, in, tnd, window, qd, e);
  fia_mla_kv(fn, p, in, layout, window, B, q_s, e);
  m.q_len = e.seq.q;
  m.ep.scale = p.scale_value;
  m.ep.causal = window >= 0 ? CausalMode::BottomRight : CausalMode::None;
  m.ep.window = window > 0 ? window : 0;
  // The output: the query's layout, or head-major ([N, B, S, D]; TND: [N, T, D]); Dv = D.
  const std::vector<Index> want = !n_major_out
                                      ? pfa_shape(layout, qd)
                                      : (tnd ? std::vector<Index>{qd[2], qd[1], qd[3]}
                                             : std::vector<Index>{qd[2], qd[0], qd[1], qd[3]});
  ATTNREF_CHECK(out.attention_out.shape() == want, std::invalid_argument, fn, "attention_out.shape",
                "mismatch", dims_str(want), shape_str(out.attention_out));
  m.eo.o = !n_major_out ? pfa_view(out.attention_out.data(), layout, qd)
                        : StridedView<TO, 4>(out.attention_out.data(), qd,
                                             {qd[1] * qd[3], qd[3], qd[0] * qd[1] * qd[3], 1});
  m.ex = exec;
  validate(e, m.ep, m.eo, m.ex);  // the engine's own checks (overlaps); nothing written
}

/// Runs a prepared MLA call: the rows past shorter query lengths 0, then the engine.
template <class T, class TO>
void fia_mla_run(const FiaMla<T, TO>& m) {
  const auto& o = m.eo.o;
  for (size_t b = 0; b < m.q_len.size(); ++b)
    for (Index i = m.q_len[b]; i < o.size(1); ++i)
      for (Index h = 0; h < o.size(2); ++h)
        for (Index x = 0; x < o.size(3); ++x) o(static_cast<Index>(b), i, h, x) = TO(0.0f);
  attention(m.e, m.ep, m.eo, m.ex);
}

/// Head size 128 with rope (the prompt branch): the rules, then the engine's rope views.
template <class P, class In, class T>
void fia_rope_prompt(const char* fn, const P& p, const In& in, Layout layout,
                     StridedView<const T, 4>& q_rope, StridedView<const T, 4>& k_rope) {
  ATTNREF_CHECK(layout == Layout::TND, std::invalid_argument, fn, "query_rope",
                "with head size 128 takes TND (head size 512: MLA)", "input_layout TND",
                p.input_layout);
  ATTNREF_CHECK((std::is_same_v<T, bfloat16>), std::invalid_argument, fn, "query_rope",
                "with head size 128 takes bfloat16 data", "bfloat16", "another type");
  const Index n = static_cast<Index>(p.num_heads);
  const Index kvn = p.num_key_value_heads == 0 ? n : static_cast<Index>(p.num_key_value_heads);
  const auto qd = pfa_dims(fn, "query", in.query, layout, n);
  const auto kd = pfa_dims(fn, "key[0]", in.key[0], layout, kvn);
  const auto vd = pfa_dims(fn, "value[0]", in.value[0], layout, kvn);
  ATTNREF_CHECK(
      qd[3] == 128 && kd[3] == 128 && vd[3] == 128, std::invalid_argument, fn,
      "query / key / value", "head sizes with query_rope", "128, 128 and 128 (or 512: MLA)",
      std::to_string(qd[3]) + ", " + std::to_string(kd[3]) + " and " + std::to_string(vd[3]));
  const auto rq = fia_rope_dims(fn, "query_rope", in.query_rope, layout, n, qd);
  const auto rk = fia_rope_dims(fn, "key_rope", in.key_rope, layout, kvn, kd);
  ATTNREF_CHECK(in.pse_shift.absent(), std::invalid_argument, fn, "pse_shift",
                "not supported with query_rope", "none", shape_str(in.pse_shift));
  q_rope = pfa_view(in.query_rope.data(), layout, rq);
  k_rope = pfa_view(in.key_rope.data(), layout, rk);
}

}  // namespace attnref::detail
