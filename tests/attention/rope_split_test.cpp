// Split scores (AttentionInputs::q_rope / k_rope, MLA's rope part): logit = scale · (q·k +
// q_rope·k_rope). Checked against the independent reference on the concatenated heads, and,
// bit for bit at every SIMD level, against the engine on the concatenated heads (the split run
// gathers [k | k_rope] per tile, the concatenated one reads the same values in place): dense,
// packed (TND) and paged caches, decode rows (small kernels) and prefill rows (panel kernels),
// slices of one tensor and separate tensors; and the checks of the two views.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <attnref/attention/attention.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/simd_levels.hpp"

namespace rope_split_test {

using attnref::Index;
using attnref::StridedView;

enum class Kv { Dense, Packed, Paged };

struct Case {
  Kv kv = Kv::Dense;
  Index B = 2, S = 1, Hq = 4, Hkv = 2, D = 24, R = 8, Dv = 20;
  std::vector<Index> q_len{1, 1}, kv_len{37, 0};
  attnref::CausalMode causal = attnref::CausalMode::None;
  Index kv_tile = 16;
  Index block = 8;  // paged
};

// Row-major strides of a 4-D shape.
using A4 = std::array<Index, 4>;
A4 dense_strides(const A4& s) { return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}; }

template <class T>
struct Data {
  Case c;
  std::vector<T> qcat, kcat, v, qs, qr, ks, kr;  // concatenated; and separate split tensors
  std::vector<std::int32_t> table;
  A4 qshape{}, kshape{};  // without the last dimension's width
  Index Skv = 0;

  explicit Data(const Case& cs, unsigned seed) : c(cs) {
    std::mt19937 rng(seed);
    const Index W = c.D + c.R;
    const Index Sq = c.kv == Kv::Packed ? sum(c.q_len) : c.S;
    const Index Bq = c.kv == Kv::Packed ? 1 : c.B;
    Index Bk = c.B;
    Skv = *std::max_element(c.kv_len.begin(), c.kv_len.end());
    if (c.kv == Kv::Packed) Bk = 1, Skv = sum(c.kv_len);
    Index blocks_per_seq = 0;
    if (c.kv == Kv::Paged) {
      blocks_per_seq = (Skv + c.block - 1) / c.block;
      Bk = c.B * blocks_per_seq + 1;  // one spare block, never referenced
      Skv = c.block;
      std::vector<std::int32_t> ids(static_cast<size_t>(Bk));
      for (Index i = 0; i < Bk; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
      std::shuffle(ids.begin(), ids.end(), rng);
      table.assign(ids.begin(), ids.begin() + c.B * blocks_per_seq);
    }
    qshape = {Bq, Sq, c.Hq, W};
    kshape = {Bk, Skv, c.Hkv, W};
    qcat = support::randn<T>(static_cast<size_t>(Bq * Sq * c.Hq * W), rng);
    kcat = support::randn<T>(static_cast<size_t>(Bk * Skv * c.Hkv * W), rng);
    v = support::randn<T>(static_cast<size_t>(Bk * Skv * c.Hkv * c.Dv), rng);
    split(qcat, Bq * Sq * c.Hq, qs, qr);
    split(kcat, Bk * Skv * c.Hkv, ks, kr);
  }
  static Index sum(const std::vector<Index>& x) {
    Index s = 0;
    for (Index e : x) s += e;
    return s;
  }
  void split(const std::vector<T>& cat, Index rows, std::vector<T>& a, std::vector<T>& b) const {
    for (Index r = 0; r < rows; ++r) {
      const auto row = cat.begin() + r * (c.D + c.R);
      a.insert(a.end(), row, row + c.D);
      b.insert(b.end(), row + c.D, row + c.D + c.R);
    }
  }
  static A4 with_last(A4 s, Index w) {
    s[3] = w;
    return s;
  }

  /// The engine's inputs: concatenated heads (mode 0), slices of the concatenated tensors
  /// (mode 1) or separate split tensors (mode 2).
  attnref::AttentionInputs<T> inputs(int mode) const {
    attnref::AttentionInputs<T> in;
    const Index W = c.D + c.R;
    const auto qst = dense_strides(qshape), kst = dense_strides(kshape);
    if (mode == 0) {
      in.q = StridedView<const T, 4>(qcat.data(), qshape);
      in.k = StridedView<const T, 4>(kcat.data(), kshape);
    } else if (mode == 1) {
      in.q = StridedView<const T, 4>(qcat.data(), with_last(qshape, c.D), qst);
      in.q_rope = StridedView<const T, 4>(qcat.data() + c.D, with_last(qshape, c.R), qst);
      in.k = StridedView<const T, 4>(kcat.data(), with_last(kshape, c.D), kst);
      in.k_rope = StridedView<const T, 4>(kcat.data() + c.D, with_last(kshape, c.R), kst);
    } else {
      in.q = StridedView<const T, 4>(qs.data(), with_last(qshape, c.D));
      in.q_rope = StridedView<const T, 4>(qr.data(), with_last(qshape, c.R));
      in.k = StridedView<const T, 4>(ks.data(), with_last(kshape, c.D));
      in.k_rope = StridedView<const T, 4>(kr.data(), with_last(kshape, c.R));
    }
    (void)W;
    in.v = StridedView<const T, 4>(v.data(), with_last(kshape, c.Dv));
    if (c.kv == Kv::Packed) {
      in.seq.q_cu = {0};
      in.seq.kv_cu = {0};
      for (Index b = 0; b < c.B; ++b) {
        in.seq.q_cu.push_back(in.seq.q_cu.back() + c.q_len[static_cast<size_t>(b)]);
        in.seq.kv_cu.push_back(in.seq.kv_cu.back() + c.kv_len[static_cast<size_t>(b)]);
      }
    } else {
      in.seq.q = c.q_len;
      in.seq.kv = c.kv_len;
    }
    if (c.kv == Kv::Paged)
      in.block_table = StridedView<const std::int32_t, 2>(
          table.data(), {c.B, static_cast<Index>(table.size()) / c.B});
    return in;
  }

  /// Output [Bq, Sq, Hq, Dv] (and lse) of one engine run.
  std::vector<float> run(int mode, std::vector<float>& lse) const {
    std::vector<float> o(static_cast<size_t>(qshape[0] * qshape[1] * c.Hq * c.Dv), -7.0f);
    lse.assign(static_cast<size_t>(qshape[0] * c.Hq * qshape[1]), -7.0f);
    attnref::AttentionOutputs<float, float> out;
    out.o = StridedView<float, 4>(o.data(), {qshape[0], qshape[1], c.Hq, c.Dv});
    out.lse = StridedView<float, 3>(lse.data(), {qshape[0], c.Hq, qshape[1]});
    attnref::AttentionParams p;
    p.scale = 0.3;
    p.causal = c.causal;
    attnref::ExecConfig ex;
    ex.kv_tile = c.kv_tile;
    ex.kv_split = 24;  // decode rows split their keys (merged partials)
    ex.threads = 2;
    attnref::attention(inputs(mode), p, out, ex);
    return o;
  }

  /// The reference on the concatenated heads; max |engine - reference| over written rows.
  double reference_error(const std::vector<float>& o) const {
    ref::Problem pr;
    pr.num_heads = static_cast<int>(c.Hq);
    pr.num_kv_heads = static_cast<int>(c.Hkv);
    pr.head_size = static_cast<int>(c.D + c.R);
    pr.v_head_size = static_cast<int>(c.Dv);
    pr.scale = 0.3;
    pr.causal = c.causal == attnref::CausalMode::BottomRight ? ref::Causal::kBottomRight
                                                             : ref::Causal::kNone;
    ref::Seqs q, k, vv;
    const Index W = c.D + c.R;
    Index qoff = 0, koff = 0;
    for (Index b = 0; b < c.B; ++b) {
      const Index ql = c.q_len[static_cast<size_t>(b)], kl = c.kv_len[static_cast<size_t>(b)];
      pr.q_len.push_back(static_cast<int>(ql));
      pr.kv_len.push_back(static_cast<int>(kl));
      std::vector<double> qb, kb, vb;
      for (Index i = 0; i < ql; ++i)
        for (Index e = 0; e < c.Hq * W; ++e)
          qb.push_back(static_cast<double>(qcat[static_cast<size_t>(q_row(b, i, qoff) + e)]));
      for (Index t = 0; t < kl; ++t) {
        const Index r = k_row(b, t, koff);
        for (Index e = 0; e < c.Hkv * W; ++e)
          kb.push_back(static_cast<double>(kcat[static_cast<size_t>(r * c.Hkv * W + e)]));
        for (Index e = 0; e < c.Hkv * c.Dv; ++e)
          vb.push_back(static_cast<double>(v[static_cast<size_t>(r * c.Hkv * c.Dv + e)]));
      }
      q.push_back(qb), k.push_back(kb), vv.push_back(vb);
      qoff += ql, koff += kl;
    }
    const ref::Result want = ref::attention(pr, q, k, vv);
    double err = 0;
    qoff = 0;
    for (Index b = 0; b < c.B; ++b) {
      for (Index i = 0; i < c.q_len[static_cast<size_t>(b)]; ++i)
        for (Index e = 0; e < c.Hq * c.Dv; ++e) {
          const Index at = (c.kv == Kv::Packed ? qoff + i : b * qshape[1] + i) * c.Hq * c.Dv + e;
          err = std::max(
              err,
              std::abs(static_cast<double>(o[static_cast<size_t>(at)]) -
                       want.o[static_cast<size_t>(b)][static_cast<size_t>(i * c.Hq * c.Dv + e)]));
        }
      qoff += c.q_len[static_cast<size_t>(b)];
    }
    return err;
  }
  // Element offset of query token i of sequence b in qcat (head 0, element 0).
  Index q_row(Index b, Index i, Index qoff) const {
    const Index tok = c.kv == Kv::Packed ? qoff + i : b * qshape[1] + i;
    return tok * c.Hq * (c.D + c.R);
  }
  // Token row (over [batch-or-block, token]) of key t of sequence b.
  Index k_row(Index b, Index t, Index koff) const {
    if (c.kv == Kv::Packed) return koff + t;
    if (c.kv == Kv::Dense) return b * Skv + t;
    const Index per = static_cast<Index>(table.size()) / c.B;
    return table[static_cast<size_t>(b * per + t / c.block)] * c.block + t % c.block;
  }
};

std::vector<Case> cases() {
  std::vector<Case> v;
  Case decode;  // one query row per sequence: the small-row kernels, split keys
  v.push_back(decode);
  Case prefill;  // row blocks above 8: the panel kernels
  prefill.S = 19;
  prefill.q_len = {19, 11};
  prefill.kv_len = {40, 23};
  prefill.causal = attnref::CausalMode::BottomRight;
  v.push_back(prefill);
  Case packed = prefill;
  packed.kv = Kv::Packed;
  packed.q_len = {3, 17};
  v.push_back(packed);
  Case paged = decode;  // MLA decode's shape: one kv head, 576 = 512 + 64 wide rows
  paged.kv = Kv::Paged;
  paged.Hq = 8, paged.Hkv = 1, paged.D = 64, paged.R = 16, paged.Dv = 64;
  paged.kv_len = {29, 16};
  v.push_back(paged);
  Case mtp = paged;  // paged, a few query rows (MTP)
  mtp.S = 4;
  mtp.q_len = {4, 3};
  mtp.causal = attnref::CausalMode::BottomRight;
  v.push_back(mtp);
  return v;
}

template <class T>
void check_all(double tol) {
  unsigned seed = 11;
  for (const Case& c : cases()) {
    const Data<T> d(c, seed++);
    support::at_every_level([&] {
      std::vector<float> l0, l1, l2;
      const std::vector<float> o0 = d.run(0, l0), o1 = d.run(1, l1), o2 = d.run(2, l2);
      EXPECT_EQ(o1, o0) << "slices, case " << seed;
      EXPECT_EQ(o2, o0) << "separate tensors, case " << seed;
      EXPECT_EQ(l1, l0) << "lse, case " << seed;
      EXPECT_EQ(l2, l0) << "lse, case " << seed;
      EXPECT_LT(d.reference_error(o1), tol) << "case " << seed;
    });
  }
}

TEST(RopeSplit, F32EqualsConcatenatedHeadsAndReference) { check_all<float>(2e-5); }
TEST(RopeSplit, F16EqualsConcatenatedHeadsAndReference) { check_all<attnref::half>(2e-3); }
TEST(RopeSplit, Bf16EqualsConcatenatedHeadsAndReference) { check_all<attnref::bfloat16>(2e-3); }

TEST(RopeSplit, ChecksTheViews) {
  Case c;
  const Data<float> d(c, 5);
  std::vector<float> o(static_cast<size_t>(c.B * c.Hq * c.Dv));
  attnref::AttentionOutputs<float, float> out;
  out.o = StridedView<float, 4>(o.data(), {c.B, 1, c.Hq, c.Dv});
  const auto call = [&](const attnref::AttentionInputs<float>& in) {
    return [in, &out] { attnref::attention(in, attnref::AttentionParams{}, out); };
  };
  auto in = d.inputs(2);
  in.k_rope = {};
  support::expect_rejected(call(in), "q_rope / k_rope one given without the other");
  in = d.inputs(2);
  in.q_rope = StridedView<const float, 4>(d.qr.data(), {c.B, 1, c.Hq - 1, c.R});
  support::expect_rejected(call(in), "q_rope.shape mismatch with q");
  in = d.inputs(2);
  in.k_rope = StridedView<const float, 4>(d.kr.data(), {c.B, d.Skv, c.Hkv, c.R - 1});
  support::expect_rejected(call(in), "k_rope.shape[3] (R) mismatch with q_rope");
  in = d.inputs(2);
  in.k_rope = StridedView<const float, 4>(d.kr.data(), {c.B, d.Skv - 1, c.Hkv, c.R});
  support::expect_rejected(call(in), "k_rope.shape mismatch with k");
  in = d.inputs(2);
  in.q_rope = StridedView<const float, 4>(d.qr.data(), {c.B, 1, c.Hq, 0});
  in.k_rope = StridedView<const float, 4>(d.kr.data(), {c.B, d.Skv, c.Hkv, 0});
  support::expect_rejected(call(in), "q_rope.shape[3] (R) not positive");
  in = d.inputs(2);  // the output over a rope input
  in.q_rope = StridedView<const float, 4>(o.data(), {c.B, 1, c.Hq, c.R});
  support::expect_rejected(call(in), "o overlaps an input");
}

}  // namespace rope_split_test
