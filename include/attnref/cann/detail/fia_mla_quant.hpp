#pragma once
/// FusedInferAttentionScore's MLA full quantization (V4: dequant_scale_query with
/// query_quant_mode 3): an int8 query with bf16 query_rope, int8 latent caches and a bf16
/// key_rope cache in the NZ layout, per-tensor key and value scales, a bf16 output. Not part of
/// the API. What the vendor's kernel computes (docs/fia.md#mla-full-quantization):
///
///   logit = (q8·k8 + q_rope·k_rope) · dqQ[row, head] · dqK · scale_value   (rope term included)
///   per block of 512 keys from key 0, P̂ = exp(logit - m) against the running row max m:
///     pmax = max P̂ of the block + 2.220446049250313e-16
///     P8 = rint(fp16(P̂ · (127 / pmax)))          (in [0, 127]; ties to even at both steps)
///     O += fp16(pmax) · (dqV / 127) · Σ P8 · v8      l += Σ P̂ (unquantized)
///   out = bf16(O / l)
///
/// Layouts BSH, BSND, TND (and BSH_NBSD, BSND_NBSD, TND_NTD); BNSD is not allowed. Caches: key
/// and value int8 [blockNum, 1, 512 / 32, 128, 32], key_rope bf16 [blockNum, 1, 64 / 16, 128, 16]
/// (element d of token t of block b at [b][0][d / c0][t][d % c0]), block_size 128, and every other
/// rule of the MLA plan (fia_rope.hpp). attnref copies the caches once into row-major bf16
/// stand-ins (int8 values are exact in bf16) and runs the MLA plan over them with the P step
/// above (PQuantStep's MlaFullQuant form) and the row scale folded into the query row; the
/// vendor's fp16 accumulation of O between blocks is not reproduced (fp32 here).

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "attnref/attention/attention.hpp"
#include "attnref/cann/detail/common.hpp"
#include "attnref/cann/detail/fia_rope.hpp"
#include "attnref/cann/detail/layouts.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/types.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// Checks an NZ cache [blockNum, 1, width / c0, 128, c0] (blockNum: `nb`'s, or any when nb < 0).
template <class T>
void fia_nz_check(const char* fn, const std::string& arg, const StridedView<const T>& c,
                  Index width, Index c0, Index nb) {
  const Index n = nb < 0 && c.rank() == 5 ? c.size(0) : nb;
  const std::vector<Index> want{n, 1, width / c0, 128, c0};
  ATTNREF_CHECK(c.rank() == 5 && c.shape() == want, std::invalid_argument, fn, arg + ".shape",
                "not an NZ cache of the MLA full quantization", dims_str(want), shape_str(c));
}

/// An NZ cache as a row-major [blockNum, 128, width] bf16 stand-in (dense input).
template <class T>
StridedView<const bfloat16> fia_nz_rows(const StridedView<const T>& nz, Index width,
                                        std::vector<bfloat16>& out) {
  const Index nb = nz.size(0), bs = nz.size(3), c0 = nz.size(4), chunks = width / c0;
  out.resize(static_cast<size_t>(nb * bs * width));
  const T* src = nz.data();
  for (Index b = 0; b < nb; ++b)
    for (Index k = 0; k < chunks; ++k)
      for (Index t = 0; t < bs; ++t)
        for (Index c = 0; c < c0; ++c)
          out[static_cast<size_t>((b * bs + t) * width + k * c0 + c)] =
              bfloat16(static_cast<float>(src[((b * chunks + k) * bs + t) * c0 + c]));
  return StridedView<const bfloat16>(out.data(), {nb, bs, width});
}

/// The rules of the full quantization that the MLA plan does not check on the stand-ins.
template <class P, class In>
void fia_mla_quant_rules(const char* fn, const P& p, const In& in, Layout layout) {
  const auto need = [fn](bool ok, const std::string& arg, const std::string& what,
                         const std::string& expected, const std::string& got) {
    ATTNREF_CHECK(ok, std::invalid_argument, fn, arg, what, expected, got);
  };
  const std::string mla = "with an int8 query (MLA full quantization)";
  need(p.query_quant_mode == 3, "params.query_quant_mode", "not supported " + mla,
       "3 (per token and head)", std::to_string(p.query_quant_mode));
  need(!in.dequant_scale_query.absent(), "dequant_scale_query", "missing " + mla,
       "fp32 per query row and head", "none");
  need(p.key_antiquant_mode == 0 && p.value_antiquant_mode == 0,
       "params.key_antiquant_mode / value_antiquant_mode", "not supported " + mla, "0 / 0",
       std::to_string(p.key_antiquant_mode) + " / " + std::to_string(p.value_antiquant_mode));
  for (const auto* s : {&in.key_antiquant_scale, &in.value_antiquant_scale}) {
    const std::string arg =
        s == &in.key_antiquant_scale ? "key_antiquant_scale" : "value_antiquant_scale";
    need(s->rank() == 1 && s->size(0) == 1, arg + ".shape", "not per tensor " + mla, "(1)",
         shape_str(*s));
  }
  need(in.key_antiquant_offset.absent() && in.value_antiquant_offset.absent(),
       "key_antiquant_offset / value_antiquant_offset", "given " + mla, "none",
       shape_str(in.key_antiquant_offset));
  need(in.antiquant_scale.absent() && in.antiquant_offset.absent(),
       "antiquant_scale / antiquant_offset", "given " + mla, "none", shape_str(in.antiquant_scale));
  need(in.pse_shift.absent(), "pse_shift", "not supported with query_rope and head size 512 (MLA)",
       "none", shape_str(in.pse_shift));
  need(in.key_shared_prefix.absent() && in.value_shared_prefix.absent(), "key_shared_prefix",
       "not supported with query_rope and head size 512 (MLA)", "none",
       shape_str(in.key_shared_prefix));
  need(layout != Layout::BNSD, "params.input_layout", "not supported " + mla,
       "BSH, BSND, TND or their _NBSD / _NTD forms", p.input_layout);
  need(in.key.size() == 1 && in.value.size() == 1, "key / value",
       "MLA reads one paged cache tensor each", "one tensor each",
       std::to_string(in.key.size()) + " and " + std::to_string(in.value.size()));
  need(p.block_size == 128, "params.block_size", "not supported " + mla, "128",
       std::to_string(p.block_size));
  need(p.sparse_mode != 4, "params.sparse_mode", "not supported " + mla, "0 or 3", "4");
  fia_nz_check(fn, "key[0]", in.key[0], 512, 32, -1);
  fia_nz_check(fn, "value[0]", in.value[0], 512, 32, in.key[0].size(0));
  fia_nz_check(fn, "key_rope", in.key_rope, 64, 16, in.key[0].size(0));
}

/// The stand-ins of a full-quantization call (they live until the run ends).
struct FiaMlaQuantData {
  std::vector<bfloat16> q, k, v, kr;
  std::vector<float> row_scale;  // dqQ · dqK per query row and head, in the query's order
};

/// dequant_scale_query's shape: [B, S, N] (BSH, BSND), [T, N] (TND); qd the query's (B, S, N, D).
inline void fia_dqq_check(const char* fn, const StridedView<const float>& s, Layout layout,
                          const std::array<Index, 4>& qd) {
  const std::vector<Index> want = layout == Layout::TND ? std::vector<Index>{qd[1], qd[2]}
                                                        : std::vector<Index>{qd[0], qd[1], qd[2]};
  ATTNREF_CHECK(s.shape() == want, std::invalid_argument, fn, "dequant_scale_query.shape",
                "mismatch (one value per query row and head)", dims_str(want), shape_str(s));
}

/// Plans a full-quantization call (In: int8 query / key / value; In16 its bf16 stand-in type)
/// into `m` and `var`, every check before anything is written.
template <class In16, class P, class In, class Out, class TM>
void fia_mla_quant_prepare(const char* fn, const P& p, const In& in, const Out& out,
                           const ExecConfig& exec, Layout layout, bool n_major_out, Index q_s,
                           FiaMlaQuantData& d, FiaMla<bfloat16, bfloat16>& m,
                           CannQuantVariant<TM, bfloat16>& var) {
  fia_mla_quant_rules(fn, p, in, layout);
  const auto qd = pfa_dims(fn, "query", in.query, layout, static_cast<Index>(p.num_heads));
  fia_dqq_check(fn, in.dequant_scale_query, layout, qd);
  In16 s;  // the call over bf16 stand-ins; everything else as given
  for (Index i = 0; i < in.query.numel(); ++i)  // int8 -> bf16, exact
    d.q.push_back(bfloat16(static_cast<float>(in.query.data()[i])));
  s.query = StridedView<const bfloat16>(d.q.data(), in.query.shape());
  s.key = {fia_nz_rows(in.key[0], 512, d.k)};
  s.value = {in.value[0].data() == in.key[0].data() ? s.key[0]
                                                    : fia_nz_rows(in.value[0], 512, d.v)};
  s.key_rope = fia_nz_rows(in.key_rope, 64, d.kr);
  s.query_rope = in.query_rope;
  s.atten_mask = in.atten_mask;
  s.actual_seq_lengths = in.actual_seq_lengths;
  s.actual_seq_lengths_kv = in.actual_seq_lengths_kv;
  s.deq_scale1 = in.deq_scale1, s.quant_scale1 = in.quant_scale1, s.deq_scale2 = in.deq_scale2;
  s.quant_scale2 = in.quant_scale2, s.quant_offset2 = in.quant_offset2;
  s.antiquant_scale_per_token = in.antiquant_scale_per_token;
  s.antiquant_offset_per_token = in.antiquant_offset_per_token;
  s.actual_shared_prefix_len = in.actual_shared_prefix_len;
  s.block_table = in.block_table;
  s.query_padding_size = in.query_padding_size;
  s.kv_padding_size = in.kv_padding_size;
  s.learnable_sink = in.learnable_sink;
  P ps = p;
  ps.key_antiquant_mode = ps.value_antiquant_mode = 0;
  ps.query_quant_mode = 0;
  fia_mla_prepare(fn, ps, s, out, exec, layout, n_major_out, q_s, m);
  // The row scale dqQ · dqK folded into the query row (q_transform), the engine's scale after it.
  const float dqk = in.key_antiquant_scale.data()[0], dqv = in.value_antiquant_scale.data()[0];
  const Index n = qd[2], rows = in.dequant_scale_query.numel();
  d.row_scale.resize(static_cast<size_t>(rows));
  for (Index i = 0; i < rows; ++i)
    d.row_scale[static_cast<size_t>(i)] = in.dequant_scale_query.data()[i] * dqk;
  var.q_row_scale = d.row_scale.data();
  var.q_row_heads = n;
  const Index B = layout == Layout::TND ? static_cast<Index>(m.e.seq.q_cu.size()) - 1 : qd[0];
  for (Index b = 0; b < B; ++b)
    var.q_row_base.push_back(layout == Layout::TND ? m.e.seq.q_cu[static_cast<size_t>(b)] * n
                                                   : b * qd[1] * n);
  var.band = m.ep.causal == CausalMode::BottomRight;
  var.bottom_right = true;
  var.pre = 2147483647;
  var.next = 0;
  var.zero_empty = true;
  var.form = PQuantStep::Form::MlaFullQuant;
  var.factor = dqv * (1.0f / 127.0f);
  m.ep.causal = CausalMode::None;  // (the variant's band)
  m.ex.kv_tile = 512;              // the kernel's block of keys
}

}  // namespace attnref::detail
