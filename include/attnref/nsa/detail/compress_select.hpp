#pragma once
/// nsa_compress_attention_infer's plan (what its checks found), the checks of its outputs, and
/// the selection that fills them: importance scores, forced blocks and top-k of each query row
/// and kv head, run as the engine's item_probs hook (NsaCmpVariant). Not part of the API.

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/paged_kv.hpp"
#include "attnref/attention/variant.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"
#include "attnref/nsa/compress_attention_io.hpp"
#include "attnref/nsa/detail/variant.hpp"
#include "attnref/nsa/importance.hpp"

namespace attnref::detail {

/// What nsa_compress_attention_infer's checks found: block sizes and heads (params), the batch
/// and its lengths, the validated compressed cache, the multi-token mask's tails.
template <class T>
struct NsaCmpPlan {
  std::int64_t l = 0, d = 0, ls = 0, k = 0;
  Index N = 0, KVN = 0, G = 0, B = 0, S = 0, total = 0, max_q = 0, Dqk = 0, Dv = 0;
  Index max_cmp = 0, max_sel_blocks = 0;
  bool tnd = false, mask = false;
  std::string rule;  // appended to the messages of the vendor's rules (params.strict)
  std::vector<Index> qlen, cmp, tail;
  PagedKvCache<const T> cache;
};

/// The output, topk and the optional debug outputs.
template <class T>
void nsa_cmp_outputs(const NsaCompressAttentionInferOutputs<T>& out, const NsaCmpPlan<T>& pl) {
  using detail::shape_str;
  const bool tnd = pl.tnd;
  const Index B = pl.B, S = pl.S, total = pl.total, N = pl.N, KVN = pl.KVN, Dv = pl.Dv;
  const Index max_cmp = pl.max_cmp, max_sel_blocks = pl.max_sel_blocks;
  const std::int64_t k = pl.k;
  // Outputs.
  auto out_shape = [&](Index last, Index heads) {
    return tnd ? std::vector<Index>{total, heads, last} : std::vector<Index>{B, S, heads, last};
  };
  auto dims_str = [](const std::vector<Index>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  ATTNREF_CHECK(!out.output.absent() && out.output.shape() == out_shape(Dv, N),
                std::invalid_argument, "nsa_compress_attention_infer", "output.shape", "mismatch",
                dims_str(out_shape(Dv, N)), shape_str(out.output));
  ATTNREF_CHECK(!out.topk.absent() && out.topk.shape() == out_shape(k, KVN), std::invalid_argument,
                "nsa_compress_attention_infer", "topk.shape", "mismatch",
                dims_str(out_shape(k, KVN)), shape_str(out.topk));
  auto debug = [&](const StridedView<float>& t, const char* name, Index heads, Index need) {
    if (t.absent()) return;
    const auto want = out_shape(need, heads);
    ATTNREF_CHECK(
        !t.absent() && t.rank() == static_cast<Index>(want.size()) &&
            std::equal(want.begin(), want.end() - 1, t.shape().begin()) && t.shape().back() >= need,
        std::invalid_argument, "nsa_compress_attention_infer", std::string(name) + ".shape",
        "mismatch", dims_str(want) + " (last dimension at least)", shape_str(t));
  };
  debug(out.probs, "probs", N, max_cmp);
  debug(out.head_scores, "head_scores", N, max_sel_blocks);
  debug(out.group_scores, "group_scores", KVN, max_sel_blocks);
}

/// The selection outputs of query row `row` for kv head kh: the importance of each head of its
/// group (p_of(g): its probabilities over the row's c compressed keys) summed over the group,
/// the forced blocks and the top-k, plus the optional probs / head_scores / group_scores rows.
/// hs, gs: max_sel_blocks floats of scratch each; order: the top-k's scratch.
template <class T, class P>
void nsa_cmp_select(const NsaCompressAttentionInferOutputs<T>& out, const NsaCmpPlan<T>& pl,
                    Index row, Index kh, Index c, const P& p_of, float* hs, float* gs,
                    std::vector<std::int32_t>& order) {
  const Index N = pl.N, KVN = pl.KVN, G = pl.G;
  const Index ns = nsa_select_block_count(c, pl.l, pl.d, pl.ls);
  const auto put = [](const StridedView<float>& x, Index at, const float* src, Index n) {
    if (x.absent()) return;
    const Index w = x.shape().back();
    float* dst = x.data() + at * w;
    std::fill(dst, dst + w, 0.0f);
    std::copy(src, src + n, dst);
  };
  std::fill(gs, gs + ns, 0.0f);
  for (Index g = 0; g < G; ++g) {
    const Index h = kh * G + g;
    const float* p_h = p_of(g);
    nsa_head_scores(p_h, c, pl.l, pl.d, pl.ls, hs);
    for (Index s2 = 0; s2 < ns; ++s2) gs[s2] += hs[s2];
    put(out.probs, row * N + h, p_h, c);
    put(out.head_scores, row * N + h, hs, ns);
  }
  nsa_force_blocks(gs, ns);
  nsa_topk(gs, ns, pl.k, out.topk.data() + (row * KVN + kh) * pl.k, order);
  put(out.group_scores, row * KVN + kh, gs, ns);
}

/// The selection's scratch: hs then gs (max_sel_blocks floats each), a row of probabilities
/// padded with zeros, the top-k's order.
struct NsaSelectScratch {
  std::vector<float> scores, row;
  std::vector<std::int32_t> order;
};

/// The selection as the engine's item_probs hook: the worker that finishes an item turns its rows
/// into their kv heads' top-k while the probabilities are still in its cache. (Before, a probs
/// tensor of the whole batch went to memory and back: nsa/compress_attention/B:20 now takes
/// 0.90 / 0.88 of that time on one / two threads, AMD Zen 5.) done[row · KV_N + kv head] marks
/// the rows handed over.
template <class T>
struct NsaCmpSelect {
  const NsaCompressAttentionInferOutputs<T>* out = nullptr;
  const NsaCmpPlan<T>* pl = nullptr;
  const std::vector<Index>* q_cu = nullptr;  // TND: each batch's first row
  std::uint8_t* done = nullptr;

  Index row_of(Index b, Index i) const {
    return pl->tnd ? (*q_cu)[static_cast<size_t>(b)] + i : b * pl->S + i;
  }
  void take(const SeqInfo& s, const ItemProbs<float>& p) const {
    thread_local NsaSelectScratch x;
    const Index nsb = std::max<Index>(1, pl->max_sel_blocks), c = s.kv_len;
    x.scores.resize(static_cast<size_t>(2 * nsb));
    // (every item holds all c keys: NsaVariant's kv_range is [0, kv_len), p.kv_begin is 0)
    for (Index i = p.q_begin; i < p.q_end; ++i) {
      const Index row = row_of(s.batch, i);
      for (Index kh = p.head_begin; kh < p.head_end; ++kh) {
        const auto p_of = [&](Index g) { return p.at(kh, g, i); };
        nsa_cmp_select(*out, *pl, row, kh, c, p_of, x.scores.data(), x.scores.data() + nsb,
                       x.order);
        done[static_cast<size_t>(row * pl->KVN + kh)] = 1;
      }
    }
  }
};

/// NsaVariant with the selection hook (nsa_compress_attention_infer's engine call).
template <class T>
struct NsaCmpVariant : NsaVariant<T> {
  NsaCmpSelect<T> sel;
  template <class Acc>
  void item_probs(const SeqInfo& s, const ItemProbs<Acc>& p) const {
    static_assert(std::is_same_v<Acc, float>, "NSA's engine computes in float");
    sel.take(s, p);
  }
};

}  // namespace attnref::detail
