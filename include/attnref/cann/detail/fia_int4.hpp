#pragma once
/// FusedInferAttentionScore's int4 key / value (V2+: "INT4 (INT32)"): eight signed 4-bit values
/// per int32 word, so the key's and value's last dimension (H or D) is an eighth of the real
/// one. Element k (0–7) of a word is bits 4k..4k+3 read as two's complement, in [-8, 7]: the
/// first value in the low nibble of the word's low byte (docs/fia.md#int4-key--value).
///
/// The vendor's rules (its documents; the incremental branch only, as its prompt tiling has no
/// int4): Q_S == 1 with BSH, BSND or BNSD; the separate antiquant parameters only
/// (key_antiquant_scale ...), in modes 0 per channel, 1 per token, 3 per token and head, or key
/// 0 with value 1; no per-tensor scale, no post-quant (int8 output), no kv left padding, no
/// paged cache with a floating query (so none: the query is always floating here); head size a
/// multiple of 64. The shared prefix is int4 too.
///
/// attnref unpacks each int4 tensor into an int8 one holding the same values (twice the int4
/// bytes, dense), then runs the int8 call: int4 K / V give exactly the bits of int8 K / V with
/// the same values. Not part of the API.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnref/cann/detail/layouts.hpp"
#include "attnref/core/dense.hpp"
#include "attnref/core/error.hpp"
#include "attnref/core/view.hpp"

namespace attnref::detail {

/// Value k (0–7) of a packed word: bits 4k..4k+3, two's complement.
inline std::int8_t int4_at(std::int32_t word, int k) {
  const unsigned nib = (static_cast<std::uint32_t>(word) >> (4 * k)) & 0xFu;
  return static_cast<std::int8_t>(static_cast<int>(nib ^ 8u) - 8);
}

/// The int8 stand-ins of a call's int4 tensors (they live until the call returns).
struct FiaInt4Buffers {
  std::vector<std::vector<std::int8_t>> data;
};

/// The largest int4 tensor unpacked: 2^34 values (16 GiB of int8).
inline constexpr Index kMaxInt4Values = Index{1} << 34;

/// One int4 view unpacked into a dense int8 tensor of the same shape, the last dimension
/// times 8. `words` is the last dimension the call needs (D / 8, or KV_N·D / 8 with BSH).
inline StridedView<const std::int8_t> fia_unpack_int4(const char* fn, const std::string& name,
                                                      const StridedView<const std::int32_t>& v,
                                                      Index words, FiaInt4Buffers& bufs) {
  if (v.absent()) return {};
  check_view(fn, name, v);
  ATTNREF_CHECK(v.rank() >= 1 && v.size(v.rank() - 1) == words, std::invalid_argument, fn,
                name + ".shape", "last dimension mismatch (int4: 8 values per int32 word)",
                std::to_string(words) + " words", shape_str(v));
  Dims shape = v.shape();
  shape[shape.size() - 1] = checked_mul(fn, name + ".shape", words, 8);
  const Index n = checked_mul(fn, name + ".shape", v.numel(), 8);
  ATTNREF_CHECK(n <= kMaxInt4Values, std::invalid_argument, fn, name,
                "too large for its int8 stand-in", "at most 2^34 values", n);
  bufs.data.emplace_back(static_cast<size_t>(n));
  std::int8_t* out = bufs.data.back().data();
  for_each_offset(v, [&](Index off) {
    const std::int32_t w = v.data()[off];
    for (int k = 0; k < 8; ++k) *out++ = int4_at(w, k);
  });
  return StridedView<const std::int8_t>(bufs.data.back().data(), shape);
}

/// The call's vendor rules for int4 K / V (those that do not need the int8 call's own checks).
/// q_s / incre / mla: the call's route; d: the query's head size.
template <class In>
void fia_int4_rules(const char* fn, const In& in, Index q_s, bool incre, bool mla, Index d,
                    std::int64_t kmode, std::int64_t vmode) {
  const auto reject = [fn](bool bad, const std::string& arg, const std::string& what,
                           const std::string& expected, const std::string& got) {
    ATTNREF_CHECK(!bad, std::invalid_argument, fn, arg, what, expected, got);
  };
  reject(mla, "key / value", "int4 key / value with MLA (rope inputs, head size 512)",
         "int8 or floating key / value", "int4");
  reject(!incre, "key / value", "int4 key / value take Q_S == 1 with BSH, BSND or BNSD", "Q_S == 1",
         "Q_S " + std::to_string(q_s));
  reject(d % 64 != 0, "query.shape", "int4 key / value need a head size that is a multiple of 64",
         "D % 64 == 0", "D " + std::to_string(d));
  reject(!in.antiquant_scale.absent() || !in.antiquant_offset.absent() ||
             !in.antiquant_scale_per_token.absent() || !in.antiquant_offset_per_token.absent(),
         "antiquant_scale / antiquant_offset",
         "int4 key / value take the separate scales (key_antiquant_scale ...) only", "none",
         "given");
  reject(in.key_antiquant_scale.absent() || in.value_antiquant_scale.absent(),
         "key_antiquant_scale / value_antiquant_scale", "missing (int4 key / value)", "both scales",
         "none");
  const bool pair =
      (kmode == vmode && (kmode == 0 || kmode == 1 || kmode == 3)) || (kmode == 0 && vmode == 1);
  reject(!pair, "params.key_antiquant_mode / value_antiquant_mode",
         "not a mode int4 key / value take", "0, 1, 3, or key 0 with value 1",
         std::to_string(kmode) + " / " + std::to_string(vmode));
  const auto per_tensor = [](const StridedView<const float>& s) {
    return s.rank() == 1 && s.size(0) == 1;
  };
  reject(kmode == 0 && per_tensor(in.key_antiquant_scale), "key_antiquant_scale.shape",
         "per-tensor scales are int8 only", "a per-channel shape", "(1)");
  reject(vmode == 0 && per_tensor(in.value_antiquant_scale), "value_antiquant_scale.shape",
         "per-tensor scales are int8 only", "a per-channel shape", "(1)");
  reject(!in.quant_scale2.absent() || !in.quant_offset2.absent(), "quant_scale2",
         "int4 key / value have no post-quant (int8 output)", "none", shape_str(in.quant_scale2));
  reject(!in.kv_padding_size.absent(), "kv_padding_size",
         "int4 key / value have no kv left padding", "none", shape_str(in.kv_padding_size));
  reject(!in.query_padding_size.absent(), "query_padding_size",
         "int4 key / value have no query left padding", "none", shape_str(in.query_padding_size));
  reject(!in.block_table.absent(), "block_table",
         "int4 key / value with a floating query take no paged cache", "none",
         shape_str(in.block_table));
}

/// `in` with its int4 key / value / shared prefix replaced by int8 stand-ins; words: the last
/// dimension each packed tensor must have.
/// (In8: the inputs type with int8 key / value.)
template <class In8, class In4>
In8 fia_int4_as_int8(const char* fn, const In4& in, Index words, FiaInt4Buffers& bufs) {
  In8 r;
  for (size_t i = 0; i < in.key.size(); ++i)
    r.key.push_back(fia_unpack_int4(fn, "key[" + std::to_string(i) + "]", in.key[i], words, bufs));
  for (size_t i = 0; i < in.value.size(); ++i)
    r.value.push_back(
        fia_unpack_int4(fn, "value[" + std::to_string(i) + "]", in.value[i], words, bufs));
  r.key_shared_prefix = fia_unpack_int4(fn, "key_shared_prefix", in.key_shared_prefix, words, bufs);
  r.value_shared_prefix =
      fia_unpack_int4(fn, "value_shared_prefix", in.value_shared_prefix, words, bufs);
  // Every other field as it is (the struct's fields in their order).
  r.query = in.query;
  r.pse_shift = in.pse_shift;
  r.atten_mask = in.atten_mask;
  r.actual_seq_lengths = in.actual_seq_lengths;
  r.actual_seq_lengths_kv = in.actual_seq_lengths_kv;
  r.deq_scale1 = in.deq_scale1;
  r.quant_scale1 = in.quant_scale1;
  r.deq_scale2 = in.deq_scale2;
  r.quant_scale2 = in.quant_scale2;
  r.quant_offset2 = in.quant_offset2;
  r.antiquant_scale = in.antiquant_scale;
  r.antiquant_offset = in.antiquant_offset;
  r.antiquant_scale_per_token = in.antiquant_scale_per_token;
  r.antiquant_offset_per_token = in.antiquant_offset_per_token;
  r.key_antiquant_scale = in.key_antiquant_scale;
  r.key_antiquant_offset = in.key_antiquant_offset;
  r.value_antiquant_scale = in.value_antiquant_scale;
  r.value_antiquant_offset = in.value_antiquant_offset;
  r.actual_shared_prefix_len = in.actual_shared_prefix_len;
  r.block_table = in.block_table;
  r.query_padding_size = in.query_padding_size;
  r.kv_padding_size = in.kv_padding_size;
  r.learnable_sink = in.learnable_sink;
  r.query_rope = in.query_rope;
  r.key_rope = in.key_rope;
  r.key_rope_antiquant_scale = in.key_rope_antiquant_scale;
  r.dequant_scale_query = in.dequant_scale_query;
  return r;
}

/// The int8 call's inputs for an int4 call routed `r` (FiaRoute; a default one: NTD_TND): the
/// int4 rules, then the stand-ins.
template <class In8, class Params, class In4, class Route>
In8 fia_int4_inputs(const char* fn, const Params& p, const In4& in, const Route& r,
                    FiaInt4Buffers& bufs) {
  Index d = 0;  // the query's head size (its rank is checked only when the route ran)
  if (r.incre) {
    const Index n = static_cast<Index>(p.num_heads), last = in.query.size(in.query.rank() - 1);
    d = r.layout == Layout::BSH ? last / n : last;
  }
  fia_int4_rules(fn, in, r.q_s, r.incre, r.mla, d, p.key_antiquant_mode, p.value_antiquant_mode);
  const Index kvn = cann_kv_heads(fn, p.num_heads, p.num_key_value_heads);
  return fia_int4_as_int8<In8>(fn, in, (r.layout == Layout::BSH ? kvn * d : d) / 8, bufs);
}

}  // namespace attnref::detail
