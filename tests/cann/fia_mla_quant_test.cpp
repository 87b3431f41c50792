// FusedInferAttentionScore's MLA full quantization (int8 query with dequant_scale_query and
// query_quant_mode 3, int8 NZ latent caches, bf16 rope parts, bf16 output): against the
// independent reference (tests/reference/cann_mla_quant.hpp) in BSH, BSND and TND, with one
// query row and with MTP rows under rightDownCausal, batches without keys, rows longer than one
// 512-key block, a value cache of its own or the key's; two crafted rows whose results depend on
// P being quantized per 512-key block (closed forms); metamorphic: value == key tensor gives the
// bits of a copy, head-major outputs == the rows moved, thread counts give the same bits. Every
// rule's rejection leaves the output untouched.

#include <gtest/gtest.h>

#include <algorithm>
#include <attnref/cann/fused_infer_attention_score.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cann/fia_support.hpp"
#include "reference/atb_paged_modes.hpp"
#include "reference/cann_mla_quant.hpp"
#include "support/errors.hpp"

namespace fia_mla_quant_test {

using attnref::bfloat16;
using attnref::FusedInferAttentionScoreInputs;
using attnref::FusedInferAttentionScoreOutputs;
using attnref::FusedInferAttentionScoreParams;
using attnref::half;
using attnref::Index;
using attnref::StridedView;
using i8 = std::int8_t;
using Shape = std::vector<Index>;
constexpr int kD = 512, kR = 64, kBs = 128;

size_t z(Index i) { return static_cast<size_t>(i); }

struct Case {
  std::string layout = "BSND";  // BSH, BSND, TND; with _NBSD / TND_NTD: head-major output
  std::vector<int> L{300, 0, 700, 1030};
  std::vector<int> Q{1, 1, 1, 1};  // query rows per batch (not TND: all equal)
  int N = 4;
  bool same_kv = true;
  unsigned seed = 1;
  double scale = 0.0417;
  float dqk = 0.02f, dqv = 0.01f;
  int B() const { return static_cast<int>(L.size()); }
  bool tnd() const { return layout.rfind("TND", 0) == 0; }
  bool n_major() const { return layout.find('_') != std::string::npos; }
  bool causal() const { return *std::max_element(Q.begin(), Q.end()) > 1; }
  int rows() const {
    int r = 0;
    for (int q : Q) r += q;
    return r;
  }
};

// A built call: the reference's batches and the vendor tensors (NZ caches, block table).
struct Built {
  Case c;
  std::vector<ref::cann::MlaQuantBatch> ref;
  std::vector<i8> q8, kc, vc;
  std::vector<bfloat16> qr, krc;
  std::vector<float> dqq, dqk, dqv;
  std::vector<std::int32_t> table;
  std::vector<std::uint8_t> mask;
  int nb = 0, cols = 0;
};

// NZ index of channel d of token t of block b, c0 channels per chunk, W channels in all.
size_t nz_at(int b, int t, int d, int c0, int W) {
  return z(((static_cast<Index>(b) * (W / c0) + d / c0) * kBs + t) * c0 + d % c0);
}

// Row-major per-batch data in; NZ caches, block table and flat query tensors out.
// krow(b, j, d) etc. give each batch's key rows; the caller fills the reference's batches.
Built pack(const Case& c, std::vector<ref::cann::MlaQuantBatch> batches) {
  Built r;
  r.c = c;
  const int B = c.B();
  std::vector<int> per(z(B));
  int total = 0;
  for (int b = 0; b < B; ++b) total += per[z(b)] = (c.L[z(b)] + kBs - 1) / kBs;
  r.cols = std::max(1, *std::max_element(per.begin(), per.end()));
  r.nb = total + 1;  // block 0: a spare block no sequence uses
  std::vector<int> ids(z(total));
  for (int i = 0; i < total; ++i) ids[z(i)] = i + 1;
  std::shuffle(ids.begin(), ids.end(), std::mt19937(c.seed + 77));
  r.table.assign(z(B * r.cols), -1);
  r.kc.assign(z(r.nb) * kBs * kD, i8(-128));
  r.vc = r.kc;
  r.krc.assign(z(r.nb) * kBs * kR, bfloat16(NAN));  // rows no key uses: NaN (never read)
  int next = 0;
  for (int b = 0; b < B; ++b) {
    const auto& bt = batches[z(b)];
    for (int i = 0; i < per[z(b)]; ++i) r.table[z(b * r.cols + i)] = ids[z(next++)];
    for (int j = 0; j < bt.kv_len; ++j) {
      const int blk = r.table[z(b * r.cols + j / kBs)], t = j % kBs;
      for (int d = 0; d < kD; ++d) {
        r.kc[nz_at(blk, t, d, 32, kD)] = bt.k8[z(j * kD + d)];
        r.vc[nz_at(blk, t, d, 32, kD)] = bt.v8[z(j * kD + d)];
      }
      for (int e = 0; e < kR; ++e)
        r.krc[nz_at(blk, t, e, 16, kR)] = bfloat16(static_cast<float>(bt.kr[z(j * kR + e)]));
    }
    r.q8.insert(r.q8.end(), bt.q8.begin(), bt.q8.end());
    for (double x : bt.qr) r.qr.push_back(bfloat16(static_cast<float>(x)));
    for (double x : bt.dqq) r.dqq.push_back(static_cast<float>(x));
  }
  r.dqk = {c.dqk};
  r.dqv = {c.dqv};
  if (c.causal()) {
    r.mask.assign(2048 * 2048, 0);
    for (int i = 0; i < 2048; ++i)
      for (int j = i + 1; j < 2048; ++j) r.mask[z(i * 2048 + j)] = 1;
  }
  r.ref = std::move(batches);
  return r;
}

// Random batches: ints in [-127, 127], rope N(0, 40) rounded to bf16, dqQ in [0.01, 0.03].
Built build(const Case& c) {
  std::mt19937 rng(c.seed);
  std::uniform_int_distribution<int> ui(-127, 127);
  std::normal_distribution<double> nd(0.0, 40.0);
  std::uniform_real_distribution<double> us(0.01, 0.03);
  const auto bf = [](double x) {
    return static_cast<double>(static_cast<float>(bfloat16(float(x))));
  };
  std::vector<ref::cann::MlaQuantBatch> bs;
  for (int b = 0; b < c.B(); ++b) {
    ref::cann::MlaQuantBatch bt;
    bt.q_len = c.Q[z(b)];
    bt.kv_len = c.L[z(b)];
    for (int i = 0; i < bt.q_len * c.N * kD; ++i) bt.q8.push_back(i8(ui(rng)));
    for (int i = 0; i < bt.q_len * c.N * kR; ++i) bt.qr.push_back(bf(nd(rng)));
    for (int i = 0; i < bt.q_len * c.N; ++i)
      bt.dqq.push_back(static_cast<double>(static_cast<float>(us(rng))));
    for (int i = 0; i < bt.kv_len * kD; ++i) bt.k8.push_back(i8(ui(rng)));
    for (int i = 0; i < bt.kv_len * kR; ++i) bt.kr.push_back(bf(nd(rng)));
    bt.v8 = c.same_kv ? bt.k8 : std::vector<i8>();
    for (int i = 0; !c.same_kv && i < bt.kv_len * kD; ++i) bt.v8.push_back(i8(ui(rng)));
    bs.push_back(std::move(bt));
  }
  return pack(c, std::move(bs));
}

struct Call {
  FusedInferAttentionScoreParams p;
  FusedInferAttentionScoreInputs<i8, i8> in;
  Shape oshape;
};

Call call_of(const Built& r) {
  const Case& c = r.c;
  Call x;
  x.p.num_heads = c.N;
  x.p.num_key_value_heads = 1;
  x.p.scale_value = c.scale;
  x.p.input_layout = c.layout;
  x.p.block_size = kBs;
  x.p.query_quant_mode = 3;
  x.p.sparse_mode = c.causal() ? 3 : 0;
  const int B = c.B(), S = c.Q[0], T = c.rows(), N = c.N;
  const std::string base = c.layout.substr(0, c.layout.find('_'));
  Shape qs, rs, ds;
  if (base == "TND") {
    qs = {T, N, kD}, rs = {T, N, kR}, ds = {T, N};
    x.oshape = c.n_major() ? Shape{N, T, kD} : qs;
    std::int64_t cu = 0;
    for (int q : c.Q) x.in.actual_seq_lengths.push_back(cu += q);
  } else {
    qs = base == "BSH" ? Shape{B, S, N * kD} : Shape{B, S, N, kD};
    rs = base == "BSH" ? Shape{B, S, N * kR} : Shape{B, S, N, kR};
    ds = {B, S, N};
    x.oshape = c.n_major() ? Shape{N, B, S, kD} : qs;
  }
  x.in.query = {r.q8.data(), qs};
  x.in.query_rope = {r.qr.data(), rs};
  x.in.dequant_scale_query = {r.dqq.data(), ds};
  const Shape kshape{r.nb, 1, kD / 32, kBs, 32};
  x.in.key = {{r.kc.data(), kshape}};
  x.in.value = {{c.same_kv ? r.kc.data() : r.vc.data(), kshape}};
  x.in.key_rope = {r.krc.data(), {r.nb, 1, kR / 16, kBs, 16}};
  x.in.block_table = {r.table.data(), {B, r.cols}};
  for (int l : c.L) x.in.actual_seq_lengths_kv.push_back(l);
  x.in.key_antiquant_scale = {r.dqk.data(), {1}};
  x.in.value_antiquant_scale = {r.dqv.data(), {1}};
  if (!r.mask.empty()) x.in.atten_mask = {r.mask.data(), {2048, 2048}};
  return x;
}

std::vector<bfloat16> run(const Call& x, int threads = 0) {
  Index n = 1;
  for (Index e : x.oshape) n *= e;
  std::vector<bfloat16> out(z(n), bfloat16(7.0f));
  attnref::fused_infer_attention_score(
      x.p, x.in, FusedInferAttentionScoreOutputs<bfloat16>{{out.data(), x.oshape}}, {threads});
  return out;
}

// The output in the query's row order ((row, head, d)), whatever the output layout.
std::vector<double> rows_of(const Case& c, const std::vector<bfloat16>& out) {
  if (!c.n_major()) {
    std::vector<double> r;
    for (const auto& v : out) r.push_back(static_cast<float>(v));
    return r;
  }
  const int R = c.rows(), N = c.N;  // [N, rows, D] (rows: T, or B·S in order)
  std::vector<double> r(z(R) * N * kD);
  for (int h = 0; h < N; ++h)
    for (int i = 0; i < R; ++i)
      for (int d = 0; d < kD; ++d)
        r[z((i * N + h) * kD + d)] = static_cast<float>(out[z((h * R + i) * kD + d)]);
  return r;
}

// Against the reference: each element within bf16's rounding (2^-8 relative), the row's slack
// for P8 near ties, and 1e-4 of the row's largest |value| for the fp32 arithmetic.
::testing::AssertionResult matches_reference(const Built& r, const std::vector<double>& got) {
  ref::cann::MlaQuant pr;
  pr.num_heads = r.c.N;
  pr.scale = r.c.scale;
  pr.dqk = r.c.dqk;
  pr.dqv = r.c.dqv;
  pr.causal = r.c.causal();
  const auto want = ref::cann::mla_full_quant(pr, r.ref);
  if (want.out.size() != got.size()) return ::testing::AssertionFailure() << "size mismatch";
  if (want.near_ties * 20 > want.quantized + 20)
    return ::testing::AssertionFailure() << "too many near ties: " << want.near_ties;
  for (size_t row = 0; row < want.slack.size(); ++row) {
    double big = 0.0;
    for (int d = 0; d < kD; ++d) big = std::max(big, std::fabs(want.out[row * kD + z(d)]));
    for (int d = 0; d < kD; ++d) {
      const size_t i = row * kD + z(d);
      const double tol = 0x1p-8 * std::fabs(want.out[i]) + want.slack[row] + 1e-4 * big;
      if (!(std::fabs(got[i] - want.out[i]) <= tol))
        return ::testing::AssertionFailure() << "element " << i << " (row " << row << "): got "
                                             << got[i] << ", want " << want.out[i];
    }
  }
  return ::testing::AssertionSuccess();
}

bool same_bits(const std::vector<bfloat16>& a, const std::vector<bfloat16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bfloat16)) == 0;
}

TEST(FiaMlaQuant, MatchesReferenceInEveryLayout) {
  unsigned seed = 1;
  for (const std::string lay : {"BSH", "BSND", "TND", "BSND_NBSD", "TND_NTD"})
    for (int qs : {1, 3}) {
      Case c;
      c.layout = lay;
      c.seed = seed++;
      c.same_kv = qs == 1;
      if (lay.rfind("TND", 0) == 0)
        c.Q = qs == 1 ? std::vector<int>{1, 1, 1, 1} : std::vector<int>{3, 1, 4, 2};
      else
        c.Q.assign(c.L.size(), qs);
      c.L = {130, 0, 600, 300};               // batch 2: two 512-key blocks
      if (qs == 3) c.L = {130, 2, 600, 300};  // batch 1: MTP rows without keys
      SCOPED_TRACE(lay + " Q_S " + std::to_string(qs));
      const Built r = build(c);
      const auto x = call_of(r);
      const auto out = run(x);
      EXPECT_TRUE(matches_reference(r, rows_of(c, out)));
      EXPECT_TRUE(same_bits(out, run(x, 1)) && same_bits(out, run(x, 2)))
          << "thread count changed the bits";
    }
}

TEST(FiaMlaQuant, ManyHeadsAndAValueTensorOfItsOwn) {
  Case c;
  c.N = 128;
  c.L = {530, 40};
  c.Q = {1, 1};
  c.same_kv = false;
  c.seed = 40;
  const Built r = build(c);
  EXPECT_TRUE(matches_reference(r, rows_of(c, run(call_of(r)))));
}

TEST(FiaMlaQuant, ValueSharingTheKeyTensorEqualsACopy) {
  Case c;
  c.seed = 41;
  const Built r = build(c);
  auto x = call_of(r);
  const auto shared = run(x);
  std::vector<i8> copy = r.kc;
  x.in.value = {{copy.data(), x.in.key[0].shape()}};
  EXPECT_TRUE(same_bits(shared, run(x)));
}

// One query row, channel 0 only: q8 = e0, rope 0, dqQ = dqK = dqV = 1, so logit_j = k8_j[0] ·
// scale. Returns the output row.
std::vector<double> crafted(const std::vector<int>& k0, const std::vector<int>& v_all,
                            double scale) {
  Case c;
  c.N = 1;
  c.L = {static_cast<int>(k0.size())};
  c.Q = {1};
  c.same_kv = false;
  c.scale = scale;
  c.dqk = c.dqv = 1.0f;
  ref::cann::MlaQuantBatch bt;
  bt.q_len = 1;
  bt.kv_len = c.L[0];
  bt.q8.assign(kD, 0);
  bt.q8[0] = 1;
  bt.qr.assign(kR, 0.0);
  bt.dqq = {1.0};
  for (size_t j = 0; j < k0.size(); ++j) {
    for (int d = 0; d < kD; ++d) {
      bt.k8.push_back(i8(d == 0 ? k0[j] : 0));
      bt.v8.push_back(i8(v_all[j]));
    }
    for (int e = 0; e < kR; ++e) bt.kr.push_back(0.0);
  }
  const Built r = pack(c, {bt});
  const auto got = rows_of(c, run(call_of(r)));
  EXPECT_TRUE(matches_reference(r, got));
  return got;
}

TEST(FiaMlaQuant, PIsQuantizedPerBlockOf512Keys) {
  // Two keys, logits 5.8 and 0: P̂ = (1, e^-5.8 = 0.0030), P8 = (127, rint(0.38) = 0): the second
  // key's value (127) is lost, so the row is exactly 0 (unquantized: 0.38).
  const auto two = crafted({127, 0}, {0, 127}, 5.8 / 127);
  for (double v : two) EXPECT_EQ(v, 0.0);
  // 600 keys: key 0 logit 8, keys 1..511 logit 0 (P8 0), keys 512..599 logit -48 · 8 / 127 in a
  // block of their own, where each P8 is 127 (its block's max): out = (fp16(pmax) / 127) · 88 ·
  // 127 · 127 / l with pmax = e^(-48·8/127 - 8), l = 1 + 511 e^-8 + 88 pmax. One block of 600
  // keys would give 0.
  std::vector<int> k0(600, 0), v(600, 0);
  k0[0] = 127;
  for (int j = 512; j < 600; ++j) k0[z(j)] = -48, v[z(j)] = 127;
  const auto out = crafted(k0, v, 8.0 / 127);
  const double pmax = std::exp(-48.0 * 8.0 / 127.0 - 8.0);
  const double l = 1.0 + 511.0 * std::exp(-8.0) + 88.0 * pmax;
  const double want = 88.0 * 127.0 * ref::fp16_rne(static_cast<float>(pmax)) / l;
  for (double x : out) EXPECT_NEAR(x, want, want * 0x1p-7);
}

TEST(FiaMlaQuant, Rejections) {
  Case c;
  c.L = {300, 5};
  c.Q = {1, 1};
  const Built r = build(c);
  const auto rejected = [&](const std::function<void(Call&)>& edit, const std::string& frag) {
    auto x = call_of(r);
    edit(x);
    fia_support::expect_rejected<bfloat16>(x, x.oshape, frag);
  };
  rejected([](Call& x) { x.p.query_quant_mode = 0; }, "query_quant_mode");
  rejected([](Call& x) { x.p.query_quant_mode = 2; }, "query_quant_mode");
  rejected([](Call& x) { x.in.dequant_scale_query = {}; }, "dequant_scale_query");
  rejected(
      [&](Call& x) {
        x.in.dequant_scale_query = {r.dqq.data(), {2, 1, 2}};
      },
      "dequant_scale_query.shape");
  std::vector<float> two{0.5f, 0.5f};
  rejected(
      [&](Call& x) {
        x.in.key_antiquant_scale = {two.data(), {2}};
      },
      "key_antiquant_scale.shape");
  rejected(
      [&](Call& x) {
        x.in.value_antiquant_offset = {two.data(), {1}};
      },
      "value_antiquant_offset");
  rejected([](Call& x) { x.p.key_antiquant_mode = 1; }, "key_antiquant_mode");
  rejected([](Call& x) { x.p.block_size = 16; }, "block_size");
  rejected([&](Call& x) { x.in.key = {{r.kc.data(), {r.nb, kBs, kD}}}; }, "key[0].shape");
  rejected(
      [&](Call& x) {
        x.in.key_rope = {r.krc.data(), {r.nb, 1, 8, kBs, 8}};
      },
      "key_rope.shape");
  rejected(
      [&](Call& x) {
        x.p.input_layout = "BNSD";
        x.in.query = {r.q8.data(), {2, c.N, 1, kD}};
        x.in.query_rope = {r.qr.data(), {2, c.N, 1, kR}};
      },
      "input_layout");
  rejected([](Call& x) { x.p.softmax_lse_flag = true; }, "softmax_lse");
  // An int8 query whose output is not bf16, and query quantization without MLA.
  {
    auto x = call_of(r);
    std::vector<half> out(z(2 * c.N * kD), half(7.0f));
    support::expect_rejected(
        [&] {
          attnref::fused_infer_attention_score(
              x.p, x.in, FusedInferAttentionScoreOutputs<half>{{out.data(), x.oshape}});
        },
        "full quantization");
  }
  {
    std::vector<half> q(z(2 * 4 * 64), half(0.5f)), kv(z(2 * 8 * 64), half(0.5f)), out(q.size());
    FusedInferAttentionScoreParams p;
    p.num_heads = 4;
    p.input_layout = "BSND";
    p.query_quant_mode = 3;
    FusedInferAttentionScoreInputs<half> in;
    in.query = {q.data(), {2, 1, 4, 64}};
    in.key = {{kv.data(), {2, 2, 4, 64}}};
    in.value = {{kv.data(), {2, 2, 4, 64}}};
    support::expect_rejected(
        [&] {
          attnref::fused_infer_attention_score(
              p, in, FusedInferAttentionScoreOutputs<half>{{out.data(), {2, 1, 4, 64}}});
        },
        "query quantization");
  }
}

}  // namespace fia_mla_quant_test
