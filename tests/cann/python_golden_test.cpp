// The C++ side of the Python layer's cross-check for the CANN operators (see support/npy.hpp):
// with ATTNREF_GOLDEN_DIR set, runs FusedInferAttentionScore as a C++ caller would on fixed
// inputs and saves inputs and results; skipped otherwise.
//   fia_*  vLLM-Ascend's prefill: TND, bf16, paged cache [blocks, 128, KV_N·D] (block size
//          128), sparse_mode 3 with the 2048 x 2048 mask, 2 sequences of 6 and 3 query tokens
//          over 6 and 140 keys (the second a chunked prefill), 4 / 2 heads of 64, softmax_lse

#include <gtest/gtest.h>

#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "support/npy.hpp"

namespace python_golden_test {

using attnref::bfloat16;
using attnref::Index;
using attnref::StridedView;
using support::save_npy;

TEST(PythonGolden, Cann) {
  const std::string dir = support::golden_dir();
  if (dir.empty()) GTEST_SKIP() << "ATTNREF_GOLDEN_DIR unset: run by tests/python/test_cpp_api.py";
  std::mt19937 rng(4);
  const Index t = 9, n = 4, kvn = 2, d = 64, bs = 128, blocks = 5, s = 2048;
  auto q = support::normal_values<bfloat16>(rng, t * n * d);
  auto kc = support::normal_values<bfloat16>(rng, blocks * bs * kvn * d);
  auto vc = support::normal_values<bfloat16>(rng, blocks * bs * kvn * d);
  const std::vector<std::int32_t> table{3, -1, 0, 4};  // [2, 2]: 1 block, then 2
  std::vector<std::uint8_t> mask(static_cast<size_t>(s * s));
  for (Index i = 0; i < s; ++i)
    for (Index j = 0; j < s; ++j) mask[static_cast<size_t>(i * s + j)] = j > i ? 1 : 0;
  std::vector<bfloat16> o(static_cast<size_t>(t * n * d));
  std::vector<float> lse(static_cast<size_t>(t * n));
  attnref::FusedInferAttentionScoreParams p;
  p.num_heads = n, p.num_key_value_heads = kvn, p.scale_value = 0.125;
  p.input_layout = "TND", p.block_size = bs, p.sparse_mode = 3, p.next_tokens = 0;
  p.softmax_lse_flag = true;
  attnref::FusedInferAttentionScoreInputs<bfloat16, bfloat16, std::uint8_t> in;
  in.query = StridedView<const bfloat16>(q.data(), {t, n, d});
  in.key = {StridedView<const bfloat16>(kc.data(), {blocks, bs, kvn * d})};
  in.value = {StridedView<const bfloat16>(vc.data(), {blocks, bs, kvn * d})};
  in.block_table = StridedView<const std::int32_t>(table.data(), {2, 2});
  in.atten_mask = StridedView<const std::uint8_t>(mask.data(), {s, s});
  in.actual_seq_lengths = {6, 9};
  in.actual_seq_lengths_kv = {6, 140};
  attnref::FusedInferAttentionScoreOutputs<bfloat16> out;
  out.attention_out = StridedView<bfloat16>(o.data(), {t, n, d});
  out.softmax_lse = StridedView<float>(lse.data(), {t, n, 1});
  attnref::fused_infer_attention_score(p, in, out);
  save_npy(dir, "fia_query", in.query), save_npy(dir, "fia_key", in.key[0]);
  save_npy(dir, "fia_value", in.value[0]), save_npy(dir, "fia_block_table", in.block_table);
  save_npy(dir, "fia_atten_mask", in.atten_mask);
  save_npy(dir, "fia_actual_seq_lengths", in.actual_seq_lengths);
  save_npy(dir, "fia_actual_seq_lengths_kv", in.actual_seq_lengths_kv);
  save_npy(dir, "fia_attention_out", out.attention_out);
  save_npy(dir, "fia_softmax_lse", out.softmax_lse);
}

}  // namespace python_golden_test
