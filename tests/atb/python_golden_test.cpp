// The C++ side of the Python layer's cross-check for the ATB operators (see support/npy.hpp):
// with ATTNREF_GOLDEN_DIR set, runs the C++ API as a C++ caller would on fixed inputs (the
// shapes of the matching torch_npu calls) and saves inputs and results; skipped otherwise.
//   rac_*    ReshapeAndCache, fp16: 5 tokens into a 4 x 4-slot cache with 2 heads of 16
//   pa_*     PagedAttention decode, fp16: 3 sequences (37, 16, 5 keys), 8 / 2 heads of 128,
//            block size 16, shuffled blocks, -1 padded table
//   mla_*    PagedAttention MLA decode, bf16: 16 heads, one 576-wide cache, V its first 512
//   sa_*     SelfAttention PA_ENCODER with a NORM mask, fp16: 2 sequences (7, 12), 4 / 2 heads

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/atb/paged_attention.hpp>
#include <attnref/atb/reshape_and_cache.hpp>
#include <attnref/atb/self_attention.hpp>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "support/npy.hpp"

namespace python_golden_test {

using attnref::bfloat16;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using support::normal_values;
using support::save_npy;

/// A block table [batch, max_blocks] over `blocks` shuffled blocks, -1 past each sequence.
std::vector<std::int32_t> block_table(std::mt19937& rng, const std::vector<Index>& ctx, Index bs,
                                      Index blocks, Index max_blocks) {
  std::vector<std::int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<std::int32_t> t(ctx.size() * static_cast<size_t>(max_blocks), -1);
  size_t next = 0;
  for (size_t b = 0; b < ctx.size(); ++b)
    for (Index j = 0; j < (ctx[b] + bs - 1) / bs; ++j)
      t[b * static_cast<size_t>(max_blocks) + static_cast<size_t>(j)] = ids[next++];
  return t;
}

void reshape_and_cache_case(const std::string& dir) {
  std::mt19937 rng(1);
  const Index t = 5, h = 2, d = 16, blocks = 4, bs = 4;
  auto key = normal_values<half>(rng, t * h * d), value = normal_values<half>(rng, t * h * d);
  auto kc = normal_values<half>(rng, blocks * bs * h * d);
  auto vc = normal_values<half>(rng, blocks * bs * h * d);
  const std::vector<std::int32_t> slots{13, 2, 7, 0, 9};
  attnref::ReshapeAndCacheInputs<half> in;
  in.key = StridedView<const half, 3>(key.data(), {t, h, d});
  in.value = StridedView<const half, 3>(value.data(), {t, h, d});
  in.slot_mapping = StridedView<const std::int32_t, 1>(slots.data(), {t});
  StridedView<half, 4> k(kc.data(), {blocks, bs, h, d}), v(vc.data(), {blocks, bs, h, d});
  save_npy(dir, "rac_key", in.key), save_npy(dir, "rac_value", in.value);
  save_npy(dir, "rac_slot_mapping", in.slot_mapping);
  save_npy(dir, "rac_key_cache_before", k), save_npy(dir, "rac_value_cache_before", v);
  attnref::reshape_and_cache(in, k, v);
  save_npy(dir, "rac_key_cache", k), save_npy(dir, "rac_value_cache", v);
}

template <class T>
void paged_case(const std::string& dir, const std::string& tag, Index nh, Index nkv, Index d,
                Index dv_mla, std::vector<Index> ctx) {
  std::mt19937 rng(2);
  const Index bs = 16, batch = static_cast<Index>(ctx.size()), max_blocks = 3, blocks = 9;
  const Index dv = dv_mla ? dv_mla : d;
  auto q = normal_values<T>(rng, batch * nh * d);
  auto kc = normal_values<T>(rng, blocks * bs * nkv * d);
  auto vc = normal_values<T>(rng, blocks * bs * nkv * d);
  const auto table = block_table(rng, ctx, bs, blocks, max_blocks);
  std::vector<T> o(static_cast<size_t>(batch * nh * dv));
  attnref::PagedAttentionParams p;
  p.num_heads = static_cast<int>(nh), p.num_kv_heads = static_cast<int>(nkv);
  p.qk_scale = 0.0625f;
  p.mla_v_head_size = static_cast<std::uint32_t>(dv_mla);
  attnref::PagedAttentionInputs<T> in;
  in.query = StridedView<const T, 3>(q.data(), {batch, nh, d});
  in.key_cache = StridedView<const T, 4>(kc.data(), {blocks, bs, nkv, d});
  if (!dv_mla) in.value_cache = StridedView<const T, 4>(vc.data(), {blocks, bs, nkv, d});
  in.block_tables = StridedView<const std::int32_t, 2>(table.data(), {batch, max_blocks});
  in.context_lens = ctx;
  attnref::PagedAttentionOutputs<T> out;
  out.out = StridedView<T, 3>(o.data(), {batch, nh, dv});
  attnref::paged_attention(p, in, out);
  save_npy(dir, tag + "_query", in.query), save_npy(dir, tag + "_key_cache", in.key_cache);
  if (!dv_mla) save_npy(dir, tag + "_value_cache", in.value_cache);
  save_npy(dir, tag + "_block_tables", in.block_tables);
  save_npy(dir, tag + "_context_lens", in.context_lens), save_npy(dir, tag + "_out", out.out);
}

void self_attention_case(const std::string& dir) {
  std::mt19937 rng(3);
  const std::vector<Index> lens{7, 12};
  const Index tokens = 19, nh = 4, nkv = 2, d = 64, s = 12;
  auto q = normal_values<half>(rng, tokens * nh * d);
  auto k = normal_values<half>(rng, tokens * nkv * d),
       v = normal_values<half>(rng, tokens * nkv * d);
  std::vector<half> mask(static_cast<size_t>(s * s));
  for (Index i = 0; i < s; ++i)
    for (Index j = 0; j < s; ++j)
      mask[static_cast<size_t>(i * s + j)] = half(j > i ? -10000.f : 0.f);
  std::vector<half> o(static_cast<size_t>(tokens * nh * d));
  using SA = attnref::SelfAttentionParams;
  SA p;
  p.num_heads = static_cast<int>(nh), p.num_kv_heads = static_cast<int>(nkv);
  p.qk_scale = 0.125f;
  p.calc_type = SA::CalcType::PaEncoder;
  p.kernel_type = SA::KernelType::Default;
  p.mask_type = SA::MaskType::Norm;
  attnref::SelfAttentionInputs<half> in;
  in.query = StridedView<const half, 3>(q.data(), {tokens, nh, d});
  in.key = StridedView<const half, 3>(k.data(), {tokens, nkv, d});
  in.value = StridedView<const half, 3>(v.data(), {tokens, nkv, d});
  in.seq_len = lens;
  in.mask = StridedView<const half, 3>(mask.data(), {1, s, s});
  attnref::SelfAttentionOutputs<half> out;
  out.out = StridedView<half, 3>(o.data(), {tokens, nh, d});
  attnref::self_attention(p, in, out);
  save_npy(dir, "sa_query", in.query), save_npy(dir, "sa_key", in.key);
  save_npy(dir, "sa_value", in.value), save_npy(dir, "sa_mask", in.mask);
  save_npy(dir, "sa_seq_len", in.seq_len), save_npy(dir, "sa_out", out.out);
}

TEST(PythonGolden, Atb) {
  const std::string dir = support::golden_dir();
  if (dir.empty()) GTEST_SKIP() << "ATTNREF_GOLDEN_DIR unset: run by tests/python/test_cpp_api.py";
  reshape_and_cache_case(dir);
  paged_case<half>(dir, "pa", 8, 2, 128, 0, {37, 16, 5});
  paged_case<bfloat16>(dir, "mla", 16, 1, 576, 512, {40, 3});
  self_attention_case(dir);
}

}  // namespace python_golden_test
