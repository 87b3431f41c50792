#pragma once
/// FusedInferAttentionScore's GQA antiquant over NZ caches (V4): a bf16 query reading int8 key /
/// value caches in the 5-D NZ layout [blockNum, KV_N, D / 32, blockSize, 32] (element (block,
/// head h, token t, channel d) at [block][h][d / 32][t][d % 32]) through block_table, with the
/// separate K / V scales. The vendor's rules (its V4 document's GQA table and the incremental
/// tiling's checks of this path):
///   query / output  bf16; head size 128; layouts BSH, BSND, BNSD
///   heads           (num_heads, num_key_value_heads) in (10, 1), (64, 8), (80, 8), (128, 16)
///   cache           key and value of that shape, blocks of 128 or 512 (= params.block_size)
///   Q_S             1 (sparse_mode 0, no mask) to 16 (sparse_mode 3 with the 2-D 2048 x 2048
///                   mask: bottom-right causal over each batch's kv length and Q_S rows; the
///                   query lengths are not read)
///   scales          key 0 / value 0 per channel (BSH (KV_N·D), BSND (KV_N, D), BNSD (KV_N, 1,
///                   D)) or 1 / 1 per token ((B, S') with S' >= maxBlocks · blockSize, one scale
///                   per token shared by the kv heads); no offsets, no combined antiquant_scale
///   inner_precise   1
///   not             softmax_lse, pse, a shared prefix, post-quant, the int8 path's scales,
///                   query quantization, tensor lists, the sink, left padding
/// attnref gathers the used blocks into a contiguous int8 key / value pair in the query's
/// layout (the int8 values unchanged, never dequantized) and runs the branch's int8 call over
/// it: the incremental branch with Q_S == 1, the prompt branch's separate antiquant with Q_S >
/// 1. A batch without keys, and a row that sees no key, is 0. The kernel's arithmetic (the
/// query split into two int8 parts, fp16 score and output storage) is not reproduced: the
/// result is the exact attention over (x8 · scale), rounded to bf16. Not part of the API.

#include <algorithm>
#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/cann/detail/layouts.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// The gathered caches of a call (they live until the call returns).
struct FiaGqaNzData {
  std::vector<std::int8_t> k, v;
};

/// True when a call's key is a 5-D (NZ) cache.
template <class In>
bool fia_is_gqa_nz(const In& in) {
  for (const auto& k : in.key)
    if (k.rank() == 5) return true;
  return false;
}

/// The path's rules that need no cache data; returns KV_N.
template <class TO, class P, class In>
Index fia_gqa_nz_rules(const char* fn, const P& p, const In& in, Layout layout, Index q_s) {
  using T = std::remove_const_t<typename decltype(in.query)::element_type>;
  const auto need = [fn](bool ok, const std::string& arg, const std::string& what,
                         const std::string& expected, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, arg, what, expected, got);
  };
  const std::string with = "with an NZ (5-D) key / value cache";
  need(std::is_same_v<T, bfloat16>, "query", "not bf16 " + with, "bfloat16", "another type");
  need(std::is_same_v<TO, bfloat16>, "attention_out", "not bf16 " + with, "bfloat16",
       "another type");
  need(layout == Layout::BSH || layout == Layout::BSND || layout == Layout::BNSD,
       "params.input_layout", "not supported " + with, "BSH, BSND or BNSD", p.input_layout);
  need(in.key.size() == 1 && in.value.size() == 1, "key / value", "tensor lists " + with,
       "one tensor each", std::to_string(in.key.size()) + " tensors");
  const std::int64_t n = p.num_heads, kvn = p.num_key_value_heads;
  need((n == 10 && kvn == 1) || (n == 64 && kvn == 8) || (n == 80 && kvn == 8) ||
           (n == 128 && kvn == 16),
       "params.num_heads / num_key_value_heads", "not a head pair supported " + with,
       "10 / 1, 64 / 8, 80 / 8 or 128 / 16", std::to_string(n) + " / " + std::to_string(kvn));
  need(q_s >= 1 && q_s <= 16, "query.shape", "Q_S out of range " + with, "Q_S in [1, 16]",
       std::to_string(q_s));
  need(q_s == 1 ? p.sparse_mode == 0 && in.atten_mask.absent() : p.sparse_mode == 3,
       "params.sparse_mode", "not supported " + with,
       q_s == 1 ? "0 without a mask (Q_S 1)" : "3 with the 2048 x 2048 mask (Q_S > 1)",
       std::to_string(p.sparse_mode) + (in.atten_mask.absent() ? "" : " with a mask"));
  const auto& m = in.atten_mask;
  need(m.absent() || (m.rank() == 2 && m.size(0) == 2048 && m.size(1) == 2048), "atten_mask.shape",
       "not the 2-D compressed mask the path takes", "[2048, 2048]", shape_str(m));
  need(p.inner_precise == 1, "params.inner_precise", "not supported " + with, "1",
       std::to_string(p.inner_precise));
  need(!in.block_table.absent(), "block_table", "missing " + with, "[B, maxBlocksPerSeq]", "none");
  need(!in.key_antiquant_scale.absent() && !in.value_antiquant_scale.absent(),
       "key_antiquant_scale / value_antiquant_scale", "missing " + with, "both scales", "none");
  need(p.key_antiquant_mode == p.value_antiquant_mode &&
           (p.key_antiquant_mode == 0 || p.key_antiquant_mode == 1),
       "params.key_antiquant_mode / value_antiquant_mode", "not supported " + with,
       "0 / 0 or 1 / 1",
       std::to_string(p.key_antiquant_mode) + " / " + std::to_string(p.value_antiquant_mode));
  const auto none = [&](bool absent, const char* arg, const std::string& got) {
    need(absent, arg, "not supported " + with, "none", got);
  };
  none(in.key_antiquant_offset.absent() && in.value_antiquant_offset.absent(),
       "key_antiquant_offset / value_antiquant_offset", shape_str(in.key_antiquant_offset));
  none(in.antiquant_scale.absent() && in.antiquant_offset.absent() &&
           in.antiquant_scale_per_token.absent() && in.antiquant_offset_per_token.absent(),
       "antiquant_scale / antiquant_offset", shape_str(in.antiquant_scale));
  none(!p.softmax_lse_flag, "params.softmax_lse_flag", "true");
  none(in.pse_shift.absent(), "pse_shift", shape_str(in.pse_shift));
  none(in.key_shared_prefix.absent() && in.value_shared_prefix.absent() &&
           in.actual_shared_prefix_len.empty(),
       "key_shared_prefix", shape_str(in.key_shared_prefix));
  none(in.quant_scale2.absent() && in.quant_offset2.absent(), "quant_scale2",
       shape_str(in.quant_scale2));
  none(in.deq_scale1.absent() && in.quant_scale1.absent() && in.deq_scale2.absent(),
       "deq_scale1 / quant_scale1 / deq_scale2", shape_str(in.deq_scale1));
  none(in.learnable_sink.absent(), "learnable_sink", shape_str(in.learnable_sink));
  none(in.query_padding_size.absent() && in.kv_padding_size.absent(),
       "query_padding_size / kv_padding_size", shape_str(in.kv_padding_size));
  none(in.query_rope.absent() && in.key_rope.absent(), "query_rope", shape_str(in.query_rope));
  return static_cast<Index>(kvn);
}

/// The scale views in the shapes the branch takes: mode 0 the layout's one per-channel shape
/// (Q_S == 1: with a leading 1), mode 1 (B, >= cols) (Q_S == 1: (1, B, S')).
template <class In>
void fia_gqa_nz_scales(const char* fn, std::int64_t mode, Layout layout, Index B, Index kvn,
                       Index D, Index cols, bool incre, In& in) {
  for (auto* v : {&in.key_antiquant_scale, &in.value_antiquant_scale}) {
    const char* arg =
        v == &in.key_antiquant_scale ? "key_antiquant_scale.shape" : "value_antiquant_scale.shape";
    const Dims want = mode == 1                ? Dims{B, v->rank() == 2 ? v->size(1) : 0}
                      : layout == Layout::BSH  ? Dims{kvn * D}
                      : layout == Layout::BSND ? Dims{kvn, D}
                                               : Dims{kvn, 1, D};
    ATTNREF_CHECK(v->shape() == want && (mode == 0 || want[1] >= cols), std::invalid_argument, fn,
                  arg, "not the NZ cache's scale shape",
                  mode == 0 ? shape_str(want)
                            : "(" + std::to_string(B) + ", >= " + std::to_string(cols) + ")",
                  shape_str(*v));
    if (!incre) continue;
    std::vector<Index> lead{1};
    lead.insert(lead.end(), want.begin(), want.end());
    *v = StridedView<const float>(v->data(), lead);
  }
}

/// A call over NZ caches as the contiguous int8 call (dense views): the rules, the block table
/// checked (a used entry outside the pool is std::out_of_range), the used blocks gathered into
/// `d` in the query's layout, the scales reshaped. `p` loses its block size.
template <class TO, class P, class In>
In fia_gqa_nz_inputs(const char* fn, P& p, const In& in, Layout layout, Index q_s,
                     FiaGqaNzData& d) {
  const Index kvn = fia_gqa_nz_rules<TO>(fn, p, in, layout, q_s);
  const Index n = static_cast<Index>(p.num_heads);
  const auto qd = pfa_dims(fn, "query", in.query, layout, n);
  const Index B = qd[0], D = qd[3];
  ATTNREF_CHECK(D == 128, std::invalid_argument, fn, "query.shape",
                "head size not supported with an NZ cache", "128", shape_str(in.query));
  const auto& kc = in.key[0];
  const Index bs = kc.rank() == 5 ? kc.size(3) : 0;
  ATTNREF_CHECK(
      kc.rank() == 5 && kc.size(1) == kvn && kc.size(2) == D / 32 && kc.size(4) == 32,
      std::invalid_argument, fn, "key[0].shape", "not an NZ cache for the heads",
      "[blockNum, " + std::to_string(kvn) + ", " + std::to_string(D / 32) + ", blockSize, 32]",
      shape_str(kc));
  ATTNREF_CHECK(in.value[0].shape() == kc.shape(), std::invalid_argument, fn, "value[0].shape",
                "differs from the key's", shape_str(kc), shape_str(in.value[0]));
  ATTNREF_CHECK((bs == 128 || bs == 512) && p.block_size == bs, std::invalid_argument, fn,
                "params.block_size", "not the NZ cache's block size (128 or 512)",
                std::to_string(bs), std::to_string(p.block_size));
  const auto& bt = in.block_table;
  ATTNREF_CHECK(bt.rank() == 2 && bt.size(0) == B, std::invalid_argument, fn, "block_table.shape",
                "mismatch", "[" + std::to_string(B) + ", maxBlocksPerSeq]", shape_str(bt));
  ATTNREF_CHECK(!in.actual_seq_lengths_kv.empty(), std::invalid_argument, fn,
                "actual_seq_lengths_kv", "required with an NZ cache", "kv lengths", "none");
  const Index cols = checked_mul(fn, "block_table.shape[1] * blockSize", bt.size(1), bs);
  const std::vector<Index> len =
      cann_lengths(fn, "actual_seq_lengths_kv", in.actual_seq_lengths_kv, B, cols);
  Index S2 = 1;
  for (Index b = 0; b < B; ++b) {
    const Index l = len[static_cast<size_t>(b)];
    S2 = std::max(S2, l);
    for (Index j = 0; j * bs < l; ++j) {
      const std::int32_t id = bt.data()[b * bt.size(1) + j];
      ATTNREF_CHECK(id >= 0 && id < kc.size(0), std::out_of_range, fn,
                    "block_table[" + std::to_string(b) + "][" + std::to_string(j) + "]",
                    "outside the cache", "[0, " + std::to_string(kc.size(0)) + ")",
                    std::to_string(id));
    }
  }
  In r = in;
  fia_gqa_nz_scales(fn, p.key_antiquant_mode, layout, B, kvn, D, cols, q_s == 1, r);
  // The gather: token t of batch b from block bt[b][t / bs], row t % bs.
  const std::array<Index, 4> sd{B, S2, kvn, D};
  const std::vector<Index> shape = pfa_shape(layout, sd);
  d.k.assign(static_cast<size_t>(checked_mul(fn, "key", checked_mul(fn, "key", B, S2), kvn * D)),
             0);
  d.v.assign(d.k.size(), 0);
  const auto kv = pfa_view(d.k.data(), layout, sd), vv = pfa_view(d.v.data(), layout, sd);
  for (Index b = 0; b < B; ++b)
    for (Index t = 0; t < len[static_cast<size_t>(b)]; ++t) {
      const Index blk = bt.data()[b * bt.size(1) + t / bs];
      for (Index h = 0; h < kvn; ++h)
        for (Index x = 0; x < D; ++x) {
          const Index at = (((blk * kvn + h) * (D / 32) + x / 32) * bs + t % bs) * 32 + x % 32;
          kv(b, t, h, x) = kc.data()[at];
          vv(b, t, h, x) = in.value[0].data()[at];
        }
    }
  r.key = {StridedView<const std::int8_t>(d.k.data(), shape)};
  r.value = {StridedView<const std::int8_t>(d.v.data(), shape)};
  r.block_table = {};
  r.actual_seq_lengths.clear();  // (the kernel does not read the query lengths)
  p.block_size = 0;
  return r;
}

}  // namespace attnref::detail
