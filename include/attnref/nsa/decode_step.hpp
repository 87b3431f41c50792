#pragma once
/// attnref::nsa_decode_step — one Native Sparse Attention decode step composed of the public
/// pieces, every intermediate inspectable:
///
///   raw paged K/V ──(nsa_compress, done by the caller as tokens arrive)──> compressed paged K/V
///   q ─┬─ nsa_compress_attention_infer(q, compressed K/V) ──> o_cmp, topk [rows, KV_N, k]
///      ├─ nsa_selected_attention_infer(q, raw K/V, topk) ───> o_sel
///      ├─ nsa_sliding_window_attention(q, raw K/V, w) ─────> o_win
///      └─ nsa_gated_sum(gates, o_cmp, o_sel, o_win) ───────> out
///
/// Per batch b the raw cache holds sel_len_b tokens, the last q_len_b of them the query tokens'
/// own keys; the compressed cache holds cmp_len_b = nsa_compressed_count(sel_len_b, l, d)
/// compressed tokens (block i compresses raw tokens [i·d, i·d + l)). Query token i sits at raw
/// position sel_len_b − q_len_b + i and sees raw positions up to itself in every branch: the
/// compressed branch masks the last compressed key for the tokens it does not yet cover (the
/// multi-token rule, on whenever q_len_b > 1), the selected branch cuts its blocks at the
/// token, and the window branch sees the w positions ending at it (BottomRight causal SWA).
/// Gates: fp32 [rows, N, 3] (compressed, selected, window), typically sigmoid outputs; the
/// gated sum is out = T(g0·o_cmp + g1·o_sel + g2·o_win) in fp32 from the T branch outputs.
/// rows = T (TND) or B·S (BSND, padded rows give 0).

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/layout.hpp"
#include "attnref/core/types.hpp"
#include "attnref/nsa/compress.hpp"
#include "attnref/nsa/compress_attention.hpp"
#include "attnref/nsa/select_attention.hpp"

namespace attnref {

struct NsaDecodeParams {
  std::int64_t num_heads = 1;               ///< N
  std::int64_t num_key_value_heads = 1;     ///< KV_N
  std::int64_t compress_block_size = 32;    ///< l
  std::int64_t compress_block_stride = 16;  ///< d
  std::int64_t select_block_size = 64;      ///< l'
  std::int64_t select_block_count = 16;     ///< k
  std::int64_t window_size = 512;           ///< w (raw positions seen by the window branch)
  std::int64_t page_block_size = 128;       ///< raw cache page size
  std::int64_t cmp_page_block_size = 128;   ///< compressed cache page size
  double scale_value = 1.0;                 ///< scale of every branch's q·k
  std::string layout = "TND";               ///< TND or BSND
  bool strict = true;                       ///< the vendor operators' constraint lists
};

template <class T>
struct NsaDecodeInputs {
  StridedView<const T> query{};                       ///< TND [T, N, Dqk] or BSND [B, S, N, Dqk]
  StridedView<const T> key{};                         ///< raw keys [numBlocks, pbs, KV_N·Dqk]
  StridedView<const T> value{};                       ///< raw values [numBlocks, pbs, KV_N·Dv]
  StridedView<const std::int32_t> block_table{};      ///< [B, maxBlocks] (raw cache)
  StridedView<const T> cmp_key{};                     ///< [numCmpBlocks, cmp pbs, KV_N·Dqk]
  StridedView<const T> cmp_value{};                   ///< [numCmpBlocks, cmp pbs, KV_N·Dv]
  StridedView<const std::int32_t> cmp_block_table{};  ///< [B, maxCmpBlocks]
  StridedView<const float> gates{};              ///< [rows, N, 3]: compressed, selected, window
  std::vector<std::int64_t> actual_q_seq_len{};  ///< [B] (empty: 1 each / S)
  std::vector<std::int64_t> actual_sel_kv_seq_len{};  ///< [B] raw lengths (required)

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("query", query), f("key", key), f("value", value), f("block_table", block_table);
    f("cmp_key", cmp_key), f("cmp_value", cmp_value), f("cmp_block_table", cmp_block_table);
    f("gates", gates);
  }
};

/// The output of nsa_sliding_window_attention (the window branch alone).
template <class T>
struct NsaSlidingWindowAttentionOutputs {
  StridedView<T> output{};  ///< [rows, N, Dv] (BSND: [B, S, N, Dv])

  template <class F>
  void for_each_view(F&& f) {
    f("output", output);
  }
};

/// output is required; the rest are optional views of the intermediates.
template <class T>
struct NsaDecodeOutputs {
  StridedView<T> output{};           ///< [rows, N, Dv] (BSND: [B, S, N, Dv])
  StridedView<std::int32_t> topk{};  ///< [rows, KV_N, k] (BSND: [B, S, KV_N, k])
  StridedView<T> cmp_out{};          ///< the three branch outputs, shaped like output
  StridedView<T> sel_out{};
  StridedView<T> win_out{};

  /// Calls f(name, view) for every tensor field.
  template <class F>
  void for_each_view(F&& f) {
    f("output", output), f("cmp_out", cmp_out), f("sel_out", sel_out), f("win_out", win_out);
    f("topk", topk);
  }
};

namespace detail {

/// Rows, heads and Dv of a decode step's query / value (checked).
struct NsaStepDims {
  bool tnd = true;  // params.layout, parsed: TND (else BSND)
  Index B = 0, S = 0, rows = 0, N = 0, KVN = 0, Dqk = 0, Dv = 0;
  std::vector<Index> qlen, q_cu;
};

template <class T>
NsaStepDims nsa_step_dims(const char* fn, const NsaDecodeParams& p, const NsaDecodeInputs<T>& in) {
  check_views(fn, "query", in.query, "key", in.key, "value", in.value, "block_table",
              in.block_table, "cmp_key", in.cmp_key, "cmp_value", in.cmp_value, "cmp_block_table",
              in.cmp_block_table, "gates", in.gates);
  NsaStepDims d;
  const bool tnd = d.tnd = detail::parse_layout(fn, "params.layout", p.layout,
                                                {Layout::TND, Layout::BSND}) == Layout::TND;
  d.N = p.num_heads;
  d.KVN = p.num_key_value_heads;
  ATTNREF_CHECK(d.N > 0 && d.KVN > 0 && d.N % d.KVN == 0, std::invalid_argument, fn,
                "params.num_heads", "not a positive multiple of num_key_value_heads",
                "a multiple of " + std::to_string(d.KVN), std::to_string(d.N));
  const auto& q = in.query;
  ATTNREF_CHECK(!q.absent() && q.rank() == (tnd ? 3 : 4) && q.size(tnd ? 1 : 2) == d.N,
                std::invalid_argument, fn, "query.shape", "mismatch",
                tnd ? "[T, N, Dqk]" : "[B, S, N, Dqk]", shape_str(q));
  d.Dqk = q.size(q.rank() - 1);
  const auto& bt = in.block_table;
  ATTNREF_CHECK(!bt.absent() && bt.rank() == 2 && bt.size(0) > 0, std::invalid_argument, fn,
                "block_table.shape", "required: [B, maxBlocks]", "[B, maxBlocks]", shape_str(bt));
  d.B = bt.size(0);
  ATTNREF_CHECK(static_cast<Index>(in.actual_sel_kv_seq_len.size()) == d.B, std::invalid_argument,
                fn, "actual_sel_kv_seq_len", "required, one per batch", std::to_string(d.B),
                std::to_string(in.actual_sel_kv_seq_len.size()));
  d.S = tnd ? 0 : q.size(1);
  ATTNREF_CHECK(tnd || q.size(0) == d.B, std::invalid_argument, fn, "query.shape[0]",
                "differs from block_table's batch", std::to_string(d.B), shape_str(q));
  d.qlen.assign(static_cast<size_t>(d.B), tnd ? 1 : d.S);
  if (!in.actual_q_seq_len.empty()) {
    ATTNREF_CHECK(static_cast<Index>(in.actual_q_seq_len.size()) == d.B, std::invalid_argument, fn,
                  "actual_q_seq_len", "size mismatch", std::to_string(d.B),
                  std::to_string(in.actual_q_seq_len.size()));
    for (Index b = 0; b < d.B; ++b) {
      const std::int64_t v = in.actual_q_seq_len[static_cast<size_t>(b)];
      ATTNREF_CHECK(v >= 1 && v <= 4 && (tnd || v <= d.S), std::invalid_argument, fn,
                    "actual_q_seq_len[" + std::to_string(b) + "]", "out of range",
                    tnd ? "[1, 4]" : "[1, min(4, S)]", std::to_string(v));
      d.qlen[static_cast<size_t>(b)] = static_cast<Index>(v);
    }
  }
  d.q_cu.assign(1, 0);
  for (Index b = 0; b < d.B; ++b) {
    const std::int64_t sel = in.actual_sel_kv_seq_len[static_cast<size_t>(b)];
    ATTNREF_CHECK(sel >= d.qlen[static_cast<size_t>(b)], std::invalid_argument, fn,
                  "actual_sel_kv_seq_len[" + std::to_string(b) + "]",
                  "shorter than the query (the cache holds the query tokens' keys)",
                  ">= " + std::to_string(d.qlen[static_cast<size_t>(b)]), std::to_string(sel));
    d.q_cu.push_back(d.q_cu.back() + d.qlen[static_cast<size_t>(b)]);
  }
  d.rows = tnd ? d.q_cu.back() : d.B * d.S;
  if (tnd)
    ATTNREF_CHECK(q.size(0) == d.rows, std::invalid_argument, fn, "query.shape[0]",
                  "differs from the sum of actual_q_seq_len", std::to_string(d.rows), shape_str(q));
  const auto& v = in.value;
  ATTNREF_CHECK(!v.absent() && v.rank() == 3 && v.size(2) > 0 && v.size(2) % d.KVN == 0,
                std::invalid_argument, fn, "value.shape", "mismatch",
                "[numBlocks, pageBlockSize, KV_N * Dv]", shape_str(v));
  d.Dv = v.size(2) / d.KVN;
  return d;
}

inline std::string nsa_dims_str(const std::vector<Index>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace detail

namespace detail {

/// The window branch as an engine problem, validated (nothing written).
template <class T>
struct NsaWindowProblem {
  AttentionInputs<T, T> e;
  AttentionParams ep;
  AttentionOutputs<T> eo;
  ExecConfig exec;
  NsaStepDims d;
};

template <class T>
NsaWindowProblem<T> nsa_window_problem(const char* fn, const NsaDecodeParams& p,
                                       const NsaDecodeInputs<T>& in, const StridedView<T>& out,
                                       const ExecConfig& exec) {
  check_view(fn, "output", out);
  NsaWindowProblem<T> w;
  const NsaStepDims& d = w.d = nsa_step_dims(fn, p, in);
  ATTNREF_CHECK(p.window_size >= 1, std::invalid_argument, fn, "params.window_size", "not positive",
                ">= 1", std::to_string(p.window_size));
  const auto& kt = in.key;
  const Index pbs = p.page_block_size;
  ATTNREF_CHECK(
      pbs > 0 && !kt.absent() && kt.rank() == 3 && kt.size(1) == pbs && kt.size(2) == d.KVN * d.Dqk,
      std::invalid_argument, fn, "key.shape", "mismatch",
      "[numBlocks, " + std::to_string(pbs) + ", " + std::to_string(d.KVN * d.Dqk) + "]",
      shape_str(kt));
  ATTNREF_CHECK(in.value.size(0) == kt.size(0) && in.value.size(1) == pbs, std::invalid_argument,
                fn, "value.shape", "mismatch with key",
                "[" + std::to_string(kt.size(0)) + ", " + std::to_string(pbs) + ", ..]",
                shape_str(in.value));
  const bool tnd = d.tnd;
  const std::vector<Index> o_shape =
      tnd ? std::vector<Index>{d.rows, d.N, d.Dv} : std::vector<Index>{d.B, d.S, d.N, d.Dv};
  ATTNREF_CHECK(!out.absent() && out.shape() == o_shape, std::invalid_argument, fn, "output.shape",
                "mismatch", nsa_dims_str(o_shape), shape_str(out));
  auto& e = w.e;
  if (tnd) {
    e.q = StridedView<const T, 4>(in.query.data(), {1, d.rows, d.N, d.Dqk});
    e.seq.q_cu = d.q_cu;
  } else {
    e.q = StridedView<const T, 4>(in.query.data(), {d.B, d.S, d.N, d.Dqk});
    e.seq.q = d.qlen;
  }
  PagedKvCache<const T> cache{
      StridedView<const T, 4>(kt.data(), {kt.size(0), pbs, d.KVN, d.Dqk}),
      StridedView<const T, 4>(in.value.data(), {kt.size(0), pbs, d.KVN, d.Dv}),
      StridedView<const std::int32_t, 2>(in.block_table.data(), {d.B, in.block_table.size(1)}),
      {}};
  for (std::int64_t s : in.actual_sel_kv_seq_len) cache.context_lens.push_back(s);
  e.read_kv(cache);  // resolve() below validates it, named by fn
  w.ep.scale = p.scale_value;
  w.ep.causal = CausalMode::BottomRight;
  w.ep.window = static_cast<Index>(p.window_size);
  w.exec = exec;
  w.eo.o = tnd ? StridedView<T, 4>(out.data(), {1, d.rows, d.N, d.Dv})
               : StridedView<T, 4>(out.data(), {d.B, d.S, d.N, d.Dv});
  (void)resolve(fn, e, w.ep, w.eo, exec);  // lengths, block table entries, overlaps, named by fn
  return w;
}

template <class T>
void nsa_window_run(const NsaWindowProblem<T>& w) {  // after nsa_window_problem: nothing throws
  const NsaStepDims& d = w.d;
  if (d.S > 0)  // BSND padded rows: the engine leaves them alone
    for (Index b = 0; b < d.B; ++b)
      for (Index i = d.qlen[static_cast<size_t>(b)]; i < d.S; ++i)
        std::fill_n(w.eo.o.data() + (b * d.S + i) * d.N * d.Dv, d.N * d.Dv, T(0.0f));
  attention(w.e, w.ep, w.eo, w.exec);
}

}  // namespace detail

namespace detail {
template <class T>
void nsa_sliding_window_attention_call(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                                       const NsaSlidingWindowAttentionOutputs<T>& out,
                                       const ExecConfig& exec, bool run) {
  constexpr const char* fn = "nsa_sliding_window_attention";
  check_exec(fn, exec);
  dense_call(fn, in, out, run, [&](const auto& din, const auto& dout) {
    const NsaWindowProblem<T> w = nsa_window_problem(fn, p, din, dout.output, exec);
    if (run) nsa_window_run(w);
  });
}
}  // namespace detail

/// Every check of nsa_sliding_window_attention() (params, tensors, execution config), without
/// computing or writing anything.
template <class T>
void validate(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
              const NsaSlidingWindowAttentionOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::nsa_sliding_window_attention_call(p, in, out, exec, false);
}

/// The window branch: query token i of batch b (raw position t = sel_len_b − q_len_b + i) over
/// the raw keys (t − w, t] ∩ [0, sel_len_b) of the paged cache, fp32 softmax — the engine's
/// BottomRight-causal sliding window. output: shaped like query with Dv. The compressed-cache
/// inputs and the gates are not read. validate -> plan -> run.
template <class T>
void nsa_sliding_window_attention(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                                  const NsaSlidingWindowAttentionOutputs<T>& out,
                                  const ExecConfig& exec = {}) {
  detail::nsa_sliding_window_attention_call(p, in, out, exec, true);
}

namespace detail {
/// nsa_gated_sum on dense arguments: the public entry below passes every view through a
/// DenseArena first.
template <class T>
void nsa_gated_sum_dense(const StridedView<const float>& gates, const StridedView<const T>& o_cmp,
                         const StridedView<const T>& o_sel, const StridedView<const T>& o_win,
                         const StridedView<T>& out) {
  constexpr const char* fn = "nsa_gated_sum";
  detail::check_views(fn, "gates", gates, "o_cmp", o_cmp, "o_sel", o_sel, "o_win", o_win, "out",
                      out);
  ATTNREF_CHECK(!out.absent() && out.rank() >= 3, std::invalid_argument, fn, "out.shape",
                "needs [rows, N, Dv] or [B, S, N, Dv]", "[rows, N, Dv]", detail::shape_str(out));
  const Index Dv = out.shape().back(), N = out.size(out.rank() - 2);
  const Index rows = out.numel() / std::max<Index>(1, N * Dv);
  for (const auto* t : {&o_cmp, &o_sel, &o_win})
    ATTNREF_CHECK(!t->absent() && t->shape() == out.shape(), std::invalid_argument, fn,
                  "branch output shape", "differs from out", detail::shape_str(out),
                  detail::shape_str(*t));
  ATTNREF_CHECK(!gates.absent() && gates.shape().back() == 3 && gates.numel() / 3 == rows * N,
                std::invalid_argument, fn, "gates.shape", "mismatch",
                "[rows, " + std::to_string(N) + ", 3] (rows = " + std::to_string(rows) + ")",
                detail::shape_str(gates));
  for (Index r = 0; r < rows * N; ++r) {
    const float* g = gates.data() + r * 3;
    for (Index j = 0; j < Dv; ++j) {
      const Index at = r * Dv + j;
      float acc = g[0] * static_cast<float>(o_cmp.data()[at]);
      acc += g[1] * static_cast<float>(o_sel.data()[at]);
      acc += g[2] * static_cast<float>(o_win.data()[at]);
      out.data()[at] = T(acc);
    }
  }
}
}  // namespace detail

/// out = T(g0·o_cmp + g1·o_sel + g2·o_win) per (row, head), fp32 — gates [rows, N, 3], the
/// branch outputs and out [rows, N, Dv] (or [B, S, N, Dv]).
template <class T>
void nsa_gated_sum(const StridedView<const float>& gates, const StridedView<const T>& o_cmp,
                   const StridedView<const T>& o_sel, const StridedView<const T>& o_win,
                   const StridedView<T>& out) {
  detail::DenseArena arena("nsa_gated_sum");
  StridedView<const float> dg = gates;
  StridedView<const T> dc = o_cmp, ds = o_sel, dw = o_win;
  StridedView<T> dout = out;
  arena.input("gates", dg);
  arena.input("o_cmp", dc);
  arena.input("o_sel", ds);
  arena.input("o_win", dw);
  arena.output("out", dout);
  detail::nsa_gated_sum_dense(dg, dc, ds, dw, dout);
  arena.commit();
}

namespace detail {
/// The step's outputs (output, the optional branch outputs and topk), the gates and the window.
template <class T>
void nsa_step_outputs(const char* fn, const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                      const NsaDecodeOutputs<T>& out, const NsaStepDims& d,
                      const std::vector<Index>& o_shape, const std::vector<Index>& t_shape) {
  ATTNREF_CHECK(!out.output.absent() && out.output.shape() == o_shape, std::invalid_argument, fn,
                "output.shape", "mismatch", nsa_dims_str(o_shape), shape_str(out.output));
  for (const auto* t : {&out.cmp_out, &out.sel_out, &out.win_out})
    ATTNREF_CHECK(t->absent() || (!t->absent() && t->shape() == o_shape), std::invalid_argument, fn,
                  "cmp_out / sel_out / win_out shape", "mismatch", nsa_dims_str(o_shape),
                  shape_str(*t));
  ATTNREF_CHECK(out.topk.absent() || (out.topk.shape() == t_shape), std::invalid_argument, fn,
                "topk.shape", "mismatch", nsa_dims_str(t_shape), shape_str(out.topk));
  ATTNREF_CHECK((!in.gates.absent() && in.gates.shape() == std::vector<Index>{d.rows, d.N, 3}),
                std::invalid_argument, fn, "gates.shape", "mismatch",
                nsa_dims_str({d.rows, d.N, 3}), shape_str(in.gates));
  ATTNREF_CHECK(p.window_size >= 1, std::invalid_argument, fn, "params.window_size", "not positive",
                ">= 1", std::to_string(p.window_size));
}

/// The compressed cache, named as the step's arguments (the compressed branch checks it
/// again): its shapes, and the compressed length of every batch within its block table.
template <class T>
std::vector<Index> nsa_step_cmp_cache(const char* fn, const NsaDecodeParams& p,
                                      const NsaDecodeInputs<T>& in, const NsaStepDims& d) {
  const Index l = p.compress_block_size, d_ = p.compress_block_stride;
  ATTNREF_CHECK(l >= 1 && d_ >= 1 && l >= d_, std::invalid_argument, fn,
                "params.compress_block_size / compress_block_stride",
                "need compress_block_size >= compress_block_stride >= 1", "l >= d >= 1",
                std::to_string(l) + " / " + std::to_string(d_));
  const Index cpbs = p.cmp_page_block_size;
  const auto& ck = in.cmp_key;
  const auto& cv = in.cmp_value;
  ATTNREF_CHECK(
      cpbs > 0 && !ck.absent() && ck.rank() == 3 && ck.size(1) == cpbs &&
          ck.size(2) == d.KVN * d.Dqk,
      std::invalid_argument, fn, "cmp_key.shape", "mismatch",
      "[numCmpBlocks, " + std::to_string(cpbs) + ", " + std::to_string(d.KVN * d.Dqk) + "]",
      shape_str(ck));
  ATTNREF_CHECK(!cv.absent() && cv.rank() == 3 && cv.size(0) == ck.size(0) && cv.size(1) == cpbs &&
                    cv.size(2) == d.KVN * d.Dv,
                std::invalid_argument, fn, "cmp_value.shape", "mismatch",
                "[" + std::to_string(ck.size(0)) + ", " + std::to_string(cpbs) + ", " +
                    std::to_string(d.KVN * d.Dv) + "]",
                shape_str(cv));
  const auto& cbt = in.cmp_block_table;
  ATTNREF_CHECK(!cbt.absent() && cbt.rank() == 2 && cbt.size(0) == d.B, std::invalid_argument, fn,
                "cmp_block_table.shape", "mismatch", "[" + std::to_string(d.B) + ", maxCmpBlocks]",
                shape_str(cbt));
  const Index cmp_capacity =
      checked_mul(fn, "cmp_block_table.shape[1] * cmp_page_block_size", cbt.size(1), cpbs);
  std::vector<Index> cmp_len;
  for (Index b = 0; b < d.B; ++b) {
    const Index sel = static_cast<Index>(in.actual_sel_kv_seq_len[static_cast<size_t>(b)]);
    const Index c = nsa_compressed_count(sel, l, d_);
    ATTNREF_CHECK(c <= cmp_capacity, std::invalid_argument, fn,
                  "actual_sel_kv_seq_len[" + std::to_string(b) + "]",
                  "needs more compressed tokens than cmp_block_table holds",
                  "(sel - l) / d + 1 <= " + std::to_string(cmp_capacity),
                  std::to_string(sel) + " (" + std::to_string(c) + " compressed)");
    cmp_len.push_back(c);
  }
  const PagedKvCache<const T> cmp_cache{
      StridedView<const T, 4>(ck.data(), {ck.size(0), cpbs, d.KVN, d.Dqk}),
      StridedView<const T, 4>(cv.data(), {ck.size(0), cpbs, d.KVN, d.Dv}),
      StridedView<const std::int32_t, 2>(cbt.data(), {d.B, cbt.size(1)}), cmp_len};
  cmp_cache.validate(fn, {"cmp_key", "cmp_value", "cmp_block_table", "compressed lengths",
                          "cmp_page_block_size", "cmp_page_block_size"});
  return cmp_len;
}

/// nsa_decode_step on dense arguments (the stand-ins of dense_call): every check, its branches'
/// included, then (run) the branches and the gated sum.
template <class T>
void nsa_decode_step_dense(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                           const NsaDecodeOutputs<T>& out, const ExecConfig& exec, bool run) {
  constexpr const char* fn = "nsa_decode_step";
  detail::check_views(fn, "output", out.output, "topk", out.topk, "cmp_out", out.cmp_out, "sel_out",
                      out.sel_out, "win_out", out.win_out);
  const detail::NsaStepDims d = detail::nsa_step_dims(fn, p, in);
  const bool tnd = d.tnd;
  const std::vector<Index> o_shape =
      tnd ? std::vector<Index>{d.rows, d.N, d.Dv} : std::vector<Index>{d.B, d.S, d.N, d.Dv};
  const std::int64_t k = p.select_block_count;
  const std::vector<Index> t_shape =
      tnd ? std::vector<Index>{d.rows, d.KVN, k} : std::vector<Index>{d.B, d.S, d.KVN, k};
  nsa_step_outputs(fn, p, in, out, d, o_shape, t_shape);
  const std::vector<Index> cmp_len = nsa_step_cmp_cache(fn, p, in, d);
  // The branches write into the caller's views or into scratch.
  const Index n_o = d.rows * d.N * d.Dv;
  std::vector<T> scratch;
  scratch.resize(static_cast<size_t>(3 * n_o));
  std::vector<std::int32_t> topk_buf;
  auto pick = [&](const StridedView<T>& t, Index slot) {
    return t.absent() ? StridedView<T>(scratch.data() + slot * n_o, o_shape) : t;
  };
  const StridedView<T> o_cmp = pick(out.cmp_out, 0), o_sel = pick(out.sel_out, 1),
                       o_win = pick(out.win_out, 2);
  StridedView<std::int32_t> topk = out.topk;
  if (topk.absent()) {
    Index n = 1;
    for (Index e : t_shape) n *= e;
    topk_buf.resize(static_cast<size_t>(n));
    topk = StridedView<std::int32_t>(topk_buf.data(), t_shape);
  }

  // The compressed branch.
  NsaCompressAttentionInferParams cp;
  cp.num_heads = p.num_heads;
  cp.num_key_value_heads = p.num_key_value_heads;
  cp.select_block_size = p.select_block_size;
  cp.select_block_count = k;
  cp.compress_block_size = p.compress_block_size;
  cp.compress_block_stride = p.compress_block_stride;
  cp.scale_value = p.scale_value;
  cp.layout = p.layout;
  cp.page_block_size = p.cmp_page_block_size;
  cp.strict = p.strict;
  NsaCompressAttentionInferInputs<T> ci;
  ci.query = in.query;
  ci.key = in.cmp_key;
  ci.value = in.cmp_value;
  ci.block_table = in.cmp_block_table;
  ci.actual_q_seq_len = in.actual_q_seq_len;
  ci.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  const std::uint8_t mask_flag = 1;  // the multi-token rule (its content is never read)
  ci.atten_mask = StridedView<const std::uint8_t>(&mask_flag, {1});
  ci.actual_cmp_kv_seq_len.assign(cmp_len.begin(), cmp_len.end());
  NsaCompressAttentionInferOutputs<T> co{o_cmp, topk};

  // The selected branch.
  NsaSelectedAttentionInferParams sp;
  sp.num_heads = p.num_heads;
  sp.num_key_value_heads = p.num_key_value_heads;
  sp.select_block_size = p.select_block_size;
  sp.select_block_count = k;
  sp.page_block_size = p.page_block_size;
  sp.scale_value = p.scale_value;
  sp.layout = p.layout;
  sp.strict = p.strict;
  NsaSelectedAttentionInferInputs<T> si;
  si.query = in.query;
  si.key = in.key;
  si.value = in.value;
  if (!tnd && in.key.rank() == 3) {  // the selected operator takes 4-d caches with BSND
    si.key = detail::split_dim(in.key, 2, d.KVN, d.Dqk);
    si.value = detail::split_dim(in.value, 2, d.KVN, d.Dv);
  }
  si.block_table = in.block_table;
  si.actual_q_seq_len = in.actual_q_seq_len;
  si.actual_sel_kv_seq_len = in.actual_sel_kv_seq_len;
  si.topk_indices = topk;

  // Everything the branches check, checked before the first write: the selected branch is
  // validated on a topk of -1 (every entry valid: its top-k comes from the compressed branch),
  // the window branch planned, the compressed branch validated; then they run in that order.
  // They run under the step's error context (its DenseArena): a branch's rejection reads
  // "attnref::nsa_decode_step: ... (in <branch>): ...".
  {
    std::vector<std::int32_t> none(static_cast<size_t>(topk.numel()), -1);
    NsaSelectedAttentionInferInputs<T> probe = si;
    probe.topk_indices = StridedView<const std::int32_t>(none.data(), t_shape);
    validate(sp, probe, NsaSelectedAttentionInferOutputs<T>{o_sel});
  }
  const detail::NsaWindowProblem<T> win = detail::nsa_window_problem(fn, p, in, o_win, exec);
  if (!run) {  // validate(): the compressed branch's checks, nothing written
    validate(cp, ci, co, exec);
    return;
  }
  nsa_compress_attention_infer(cp, ci, co, exec);
  nsa_selected_attention_infer(sp, si, {o_sel}, exec);
  detail::nsa_window_run(win);
  nsa_gated_sum<T>(in.gates, o_cmp, o_sel, o_win, out.output);
  if (!tnd)  // padded rows are 0 whatever their gates
    for (Index b = 0; b < d.B; ++b)
      for (Index i = d.qlen[static_cast<size_t>(b)]; i < d.S; ++i)
        std::fill_n(out.output.data() + (b * d.S + i) * d.N * d.Dv, d.N * d.Dv, T(0.0f));
}

template <class T>
void nsa_decode_step_call(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                          const NsaDecodeOutputs<T>& out, const ExecConfig& exec, bool run) {
  check_exec("nsa_decode_step", exec);
  dense_call("nsa_decode_step", in, out, run, [&](const auto& din, const auto& dout) {
    nsa_decode_step_dense(p, din, dout, exec, run);
  });
}
}  // namespace detail

/// Every check of nsa_decode_step() (params, tensors, caches, execution config; its branches'
/// checks included), without computing or writing anything.
template <class T>
void validate(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
              const NsaDecodeOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::nsa_decode_step_call(p, in, out, exec, false);
}

/// One NSA decode step: the three branches and the gated sum (see the top of this file), as
/// validate -> plan -> run.
template <class T>
void nsa_decode_step(const NsaDecodeParams& p, const NsaDecodeInputs<T>& in,
                     const NsaDecodeOutputs<T>& out, const ExecConfig& exec = {}) {
  detail::nsa_decode_step_call(p, in, out, exec, true);
}

}  // namespace attnref
