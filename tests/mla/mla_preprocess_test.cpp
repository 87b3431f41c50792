// mla_preprocess (include/attnref/mla/: ATB MlaPreprocess) against the independent reference
// tests/reference/mla_preprocess.hpp, in fp16 and bf16: every quant mode x cache mode x dtype,
// ND and NZ weights, N 1 / 5 / 7, against ref::mla::chain (quantized modes: exact except
// T(q_nope), 1 ulp, and int8 q_nope, ±1; Unquant: within tolerance), once at the DeepSeek-V3
// dims. Metamorphic, bit for bit: ND == NZ weights, de_scale == de_scale_bits, 1 == 2 threads,
// KvCache == KRopeCtkv split, NzCache == KRopeCtkv in NZ; Int8NzCache dequantized ≈ NzCache
// within the quantization step. The stages one by one: mla_preprocess_stages_test.cpp; bad input:
// mla_preprocess_rejects_test.cpp; the shared Problem: mla_preprocess_support.hpp.

#include "reference/mla_preprocess.hpp"

#include <gtest/gtest.h>

#include <attnref/core/nz.hpp>
#include <attnref/mla/mla_preprocess.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "mla/mla_preprocess_support.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"

namespace mla_preprocess_test {

using namespace mla_preprocess_support;

struct ChainStats {
  size_t nope_T = 0, nope_T_off = 0, nope_i8 = 0, nope_i8_off = 0;
};

/// Runs the problem and compares everything with the reference.
template <class T>
void check_against_reference(const Cfg& cfg, ChainStats& st) {
  SCOPED_TRACE(tname<T>() + " " + cfg.str());
  Problem<T> pr(cfg);
  const rm::ChainOut r = pr.reference();
  const Outs<T> e = pr.expected(r);
  pr.run();
  const Outs<T>& o = pr.o;
  const Index C = pr.C, R = pr.R;
  if (cfg.qm == 3) {  // Unquant: floating-point matmuls summed differently -> tolerance
    const auto tol = support::tolerance(support::kind_of<T>());
    EXPECT_TRUE(support::all_close(as_doubles(e.q_out), as_doubles(o.q_out), tol)) << "q_out";
    EXPECT_TRUE(support::all_close(as_doubles(e.q_rope), as_doubles(o.q_rope), tol)) << "q_rope";
    EXPECT_TRUE(support::all_close(as_doubles(e.caches.kv), as_doubles(o.caches.kv), tol))
        << "kv_cache";
    EXPECT_TRUE(support::all_close(as_doubles(e.caches.ctkv), as_doubles(o.caches.ctkv), tol))
        << "ctkv";
    EXPECT_TRUE(support::all_close(as_doubles(e.caches.krope), as_doubles(o.caches.krope), tol))
        << "krope";
    EXPECT_TRUE(support::all_close(as_doubles(e.q_out_i8), as_doubles(o.q_out_i8), {2.0, 0.0}))
        << "q_out_i8";
    EXPECT_TRUE(
        support::all_close(as_doubles(e.caches.ctkv_i8), as_doubles(o.caches.ctkv_i8), {2.0, 0.0}))
        << "ctkv_i8";
    return;
  }
  // Quantized modes: the int8 matmuls are exact, so everything but q_nope · wuk is too.
  EXPECT_TRUE(support::bitwise_equal(o.q_rope, e.q_rope)) << "q_rope";
  EXPECT_TRUE(same_caches(o.caches, e.caches)) << "caches";
  const auto slack = pr.nope_slack(r);
  const Index w = cfg.cm == 0 ? C + R : C;
  size_t bad = 0;
  for (size_t i = 0; i < o.q_out.size(); ++i) {
    const Index th = static_cast<Index>(i) / w, j = static_cast<Index>(i) % w;
    if (j >= C) {  // the rope part of KvCache's q_out
      bad += std::memcmp(&o.q_out[i], &e.q_out[i], sizeof(T)) != 0;
      continue;
    }
    const double want = r.q_nope_T[z(th * C + j)];
    const int u = ulps(o.q_out[i], e.q_out[i]);
    ++st.nope_T;
    st.nope_T_off += u != 0;
    if (u > 1 && std::fabs(dbl(o.q_out[i]) - want) > slack[z(th * C + j)] + ulp_of<T>(want)) ++bad;
  }
  EXPECT_EQ(bad, 0u) << "q_out beyond 1 ulp of T (rope part: not exact)";
  size_t bad8 = 0;
  for (size_t i = 0; i < o.q_out_i8.size(); ++i) {
    const int d = std::abs(int{o.q_out_i8[i]} - int{e.q_out_i8[i]});
    ++st.nope_i8;
    st.nope_i8_off += d != 0;
    bad8 += d > 1;
  }
  EXPECT_EQ(bad8, 0u) << "q_out_i8 beyond ±1";
}

TEST(MlaPreprocess, QuantizedModesMatchReferenceExactlyButQNope) {
  ChainStats st;
  unsigned seed = 500;
  for (int qm = 0; qm < 3; ++qm)
    for (int cm = 0; cm < 4; ++cm)
      for (Index N : {1, 5, 7})
        for (bool nz : {false, true}) {
          Cfg c;
          c.qm = qm;
          c.cm = cm;
          c.N = N;
          c.nz = nz;
          c.bits = nz && N != 5;
          c.beta = c.bias = N != 7;
          c.bs = cm < 2 && N == 7 ? 16 : 128;
          c.seed = ++seed;
          check_against_reference<half>(c, st);
          check_against_reference<bfloat16>(c, st);
        }
  // T(q_nope) is one fp32 GEMM vs a double sum away from the reference: an ulp now and then.
  EXPECT_LE(st.nope_T_off * 20, st.nope_T) << st.nope_T_off << " of " << st.nope_T;
  EXPECT_LE(st.nope_i8_off * 20, st.nope_i8) << st.nope_i8_off << " of " << st.nope_i8;
  ::testing::Test::RecordProperty(
      "q_nope_T_ulp_off", std::to_string(st.nope_T_off) + " / " + std::to_string(st.nope_T));
  ::testing::Test::RecordProperty(
      "q_nope_i8_off", std::to_string(st.nope_i8_off) + " / " + std::to_string(st.nope_i8));
}

TEST(MlaPreprocess, UnquantModeWithinToleranceOfReference) {
  ChainStats st;
  unsigned seed = 700;
  for (int cm = 0; cm < 4; ++cm)
    for (Index N : {1, 5, 7})
      for (bool nz : {false, true}) {
        Cfg c;
        c.qm = 3;
        c.cm = cm;
        c.N = N;
        c.nz = nz;
        c.beta = N != 7;
        c.bs = cm < 2 && N == 7 ? 16 : 128;
        c.seed = ++seed;
        check_against_reference<half>(c, st);
        check_against_reference<bfloat16>(c, st);
      }
}

TEST(MlaPreprocess, DeepSeekV3DimsMatchReference) {
  ChainStats st;
  Cfg c;
  c.dims = attnref::MlaDims{};
  c.heads = 2;
  c.N = 2;
  c.qm = 0;
  c.cm = 2;
  check_against_reference<half>(c, st);
  c.qm = 1;
  c.cm = 3;
  c.nz = true;
  c.seed = 2;
  check_against_reference<bfloat16>(c, st);
  EXPECT_LE(st.nope_i8_off * 20, st.nope_i8) << st.nope_i8_off << " of " << st.nope_i8;
}

/// Runs `a` and `b` (configurations that must agree bit for bit) and compares all outputs.
template <class T>
void expect_same_run(const Cfg& a, const Cfg& b) {
  SCOPED_TRACE(tname<T>() + " [" + a.str() + "] vs [" + b.str() + "]");
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  EXPECT_TRUE(same_outs(pa.o, pb.o));
}

template <class F>
void both_dtypes(F&& f) {
  f(half{});
  f(bfloat16{});
}

TEST(MlaPreprocess, NdAndNzWeightsGiveIdenticalBits) {
  for (int qm = 0; qm < 4; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = (qm + 1) % 4;
      a.seed = 31 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.nz = true;
      expect_same_run<decltype(tag)>(a, b);
    });
}

TEST(MlaPreprocess, DeScaleFloatAndBitsGiveIdenticalBits) {
  for (int qm = 0; qm < 3; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = qm;
      a.nz = qm == 1;
      a.seed = 41 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.bits = true;
      expect_same_run<decltype(tag)>(a, b);
    });
}

TEST(MlaPreprocess, OneAndTwoThreadsGiveIdenticalBits) {
  for (int qm = 0; qm < 4; ++qm)
    both_dtypes([&](auto tag) {
      Cfg a;
      a.qm = qm;
      a.cm = 3 - qm;
      a.N = 7;
      a.seed = 51 + static_cast<unsigned>(qm);
      Cfg b = a;
      b.threads = 2;
      expect_same_run<decltype(tag)>(a, b);
    });
}

template <class T>
void kv_vs_split(int qm, Index bs) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm) + " bs " + std::to_string(bs));
  Cfg a;
  a.qm = qm;
  a.bs = bs;
  a.N = 7;
  a.seed = 61;
  Cfg b = a;
  a.cm = 0;
  b.cm = 1;
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  const Index C = pa.C, R = pa.R;
  std::vector<T> q_cat, cache_cat;
  for (Index th = 0; th < pa.N * pa.NH; ++th) {
    q_cat.insert(q_cat.end(), pb.o.q_out.begin() + th * C, pb.o.q_out.begin() + (th + 1) * C);
    q_cat.insert(q_cat.end(), pb.o.q_rope.begin() + th * R, pb.o.q_rope.begin() + (th + 1) * R);
  }
  for (Index row = 0; row < pa.blocks * bs; ++row) {
    const auto& cb = pb.o.caches;
    cache_cat.insert(cache_cat.end(), cb.ctkv.begin() + row * C, cb.ctkv.begin() + (row + 1) * C);
    cache_cat.insert(cache_cat.end(), cb.krope.begin() + row * R, cb.krope.begin() + (row + 1) * R);
  }
  EXPECT_TRUE(support::bitwise_equal(pa.o.q_out, q_cat)) << "q_out";
  EXPECT_TRUE(support::bitwise_equal(pa.o.caches.kv, cache_cat)) << "kv_cache";
}

TEST(MlaPreprocess, KvCacheOutputsAreKRopeCtkvOutputsConcatenated) {
  for (int qm = 0; qm < 4; ++qm) {
    kv_vs_split<half>(qm, qm % 2 ? 16 : 128);
    kv_vs_split<bfloat16>(qm, qm % 2 ? 128 : 16);
  }
}

template <class T>
void nz_vs_split(int qm) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm));
  Cfg a;
  a.qm = qm;
  a.N = 7;
  a.seed = 71;
  Cfg b = a;
  a.cm = 3;
  b.cm = 1;
  Problem<T> pa(a), pb(b);
  pa.run();
  pb.run();
  EXPECT_TRUE(support::bitwise_equal(pa.o.q_out, pb.o.q_out)) << "q_out";
  EXPECT_TRUE(support::bitwise_equal(pa.o.q_rope, pb.o.q_rope)) << "q_rope";
  const Index blocks = pa.blocks, bs = a.bs;
  auto to_nd = [&](const std::vector<T>& v, Index w) {
    std::vector<T> nd(z(blocks * bs * w));
    attnref::nz_to_nd<T>(StridedView<const T, 4>(v.data(), {blocks, w / 16, bs, 16}),
                         StridedView<T, 3>(nd.data(), {blocks, bs, w}));
    return nd;
  };
  EXPECT_TRUE(support::bitwise_equal(to_nd(pa.o.caches.ctkv, pa.C), pb.o.caches.ctkv)) << "ctkv";
  EXPECT_TRUE(support::bitwise_equal(to_nd(pa.o.caches.krope, pa.R), pb.o.caches.krope)) << "krope";
}

TEST(MlaPreprocess, NzCacheIsKRopeCtkvInNzLayout) {
  for (int qm = 0; qm < 4; ++qm) {
    nz_vs_split<half>(qm);
    nz_vs_split<bfloat16>(qm);
  }
}

/// Int8NzCache vs NzCache of the same data: k8 · ctkv_scale within ctkv_scale of k_nope, and
/// q8 / q_nope_scale within 1 / q_nope_scale of T(q_nope); krope and q_rope identical; q8 and k8
/// exactly the reference's int8 rules applied to NzCache's T(q_nope) and k_nope.
template <class T>
void int8_vs_nz(int qm) {
  SCOPED_TRACE(tname<T>() + " qm " + std::to_string(qm));
  Cfg a;
  a.qm = qm;
  a.N = 7;
  a.seed = 81;
  Cfg b = a;
  a.cm = 2;
  b.cm = 3;
  Problem<T> p8(a), pt(b);
  p8.run();
  pt.run();
  EXPECT_TRUE(support::bitwise_equal(p8.o.q_rope, pt.o.q_rope)) << "q_rope";
  EXPECT_TRUE(support::bitwise_equal(p8.o.caches.krope, pt.o.caches.krope)) << "krope";
  const Index C = p8.C, NH = p8.NH, bs = a.bs;
  size_t bad_q = 0, bad_k = 0, saturated = 0, exact_q = 0, exact_k = 0;
  for (Index th = 0; th < p8.N * NH; ++th) {
    const double s = dbl(p8.qns[z(th % NH)]);
    for (Index j = 0; j < C; ++j) {
      const int q8 = p8.o.q_out_i8[z(th * C + j)];
      const float qt = static_cast<float>(pt.o.q_out[z(th * C + j)]);
      exact_q += q8 != rm::q_nope_quant(qt, static_cast<float>(s), dt_of<T>());
      saturated += q8 <= -127 || q8 >= 127;
      bad_q += !(std::fabs(q8 / s - dbl(pt.o.q_out[z(th * C + j)])) <= 1.0 / std::fabs(s));
    }
  }
  const double qs3 = dbl(p8.qs3);
  std::vector<bool> seen(z(p8.blocks * bs), false);
  for (const i32 sl : p8.slots) {
    if (sl < 0 || seen[z(sl)]) continue;
    seen[z(sl)] = true;
    const int block = static_cast<int>(sl / bs), off = static_cast<int>(sl % bs);
    for (int j = 0; j < static_cast<int>(C); ++j) {
      const int k8 = p8.o.caches.ctkv_i8[rm::nz_cache_index(block, off, j, static_cast<int>(C),
                                                            static_cast<int>(bs), 32)];
      const double kn = dbl(pt.o.caches.ctkv[rm::nz_cache_index(block, off, j, static_cast<int>(C),
                                                                static_cast<int>(bs), 16)]);
      exact_k +=
          k8 != rm::k_nope_quant(static_cast<float>(kn), static_cast<float>(qs3), dt_of<T>());
      saturated += k8 <= -127 || k8 >= 127;
      bad_k += !(std::fabs(k8 * qs3 - kn) <= qs3);
    }
  }
  ASSERT_EQ(saturated, 0u) << "scales chosen so nothing saturates";
  EXPECT_EQ(bad_q, 0u) << "q_out_i8";
  EXPECT_EQ(bad_k, 0u) << "ctkv_i8";
  // Both runs share T(q_nope) and k_nope bit for bit, so the int8 rules apply exactly.
  EXPECT_EQ(exact_q, 0u) << "q_out_i8 != the reference rule applied to NzCache's T(q_nope)";
  EXPECT_EQ(exact_k, 0u) << "ctkv_i8 != the reference rule applied to NzCache's k_nope";
}

TEST(MlaPreprocess, Int8NzCacheDequantizesToNzCacheWithinOneStep) {
  for (int qm = 0; qm < 4; ++qm) {
    int8_vs_nz<half>(qm);
    int8_vs_nz<bfloat16>(qm);
  }
}

}  // namespace mla_preprocess_test
