// Bad input of the MLA preprocessing (include/attnref/mla/): mla_preprocess and each stage
// (rms_norm / rms_norm_quant, int8_matmul / float_matmul, rope_rotate_half, q_nope_absorb,
// mla_reshape_and_cache). Every rejection names the argument and leaves outputs and caches
// untouched.

#include <gtest/gtest.h>

#include <attnref/mla/mla_preprocess.hpp>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mla/mla_preprocess_support.hpp"
#include "support/cast.hpp"
#include "support/compare.hpp"
#include "support/errors.hpp"
#include "support/views.hpp"

namespace mla_preprocess_rejects_test {

using namespace mla_preprocess_support;

// ---------------------------------------------------------------------------------------------
// Bad input.

using In = attnref::MlaPreprocessInputs<half>;
using Out = attnref::MlaPreprocessOutputs<half>;
using Params = attnref::MlaPreprocessParams;
using Edit = std::function<void(Problem<half>&, Params&, In&, Out&)>;

/// A fresh problem of `cfg` with one edit must throw naming `what` and write nothing.
void expect_reject(const Cfg& cfg, const Edit& edit, const std::string& what,
                   bool out_of_range = false) {
  SCOPED_TRACE(cfg.str() + ": " + what);
  Problem<half> pr(cfg);
  const Outs<half> before{pr.o.q_out, pr.o.q_rope, pr.o.q_out_i8, pr.o.caches};
  Params p = pr.params();
  In in = pr.inputs();
  Out out = pr.outputs();
  edit(pr, p, in, out);
  support::expect_validate_agrees([&] { attnref::validate(p, in, out); },
                                  [&] { attnref::mla_preprocess<half>(p, in, out); });
  support::expect_throw([&] { attnref::mla_preprocess<half>(p, in, out); }, what, out_of_range);
  EXPECT_TRUE(same_outs(pr.o, before)) << "written before throwing";
}

Cfg cfg_of(int qm, int cm, bool nz = false, Index bs = 128) {
  Cfg c;
  c.qm = qm;
  c.cm = cm;
  c.nz = nz;
  c.bs = bs;
  return c;
}

/// Memory for an output given where the mode takes none: its own, since an output overlapping
/// another argument is rejected first.
template <class U>
U* spare() {
  static std::vector<U> v(std::size_t{1} << 20);
  return v.data();
}

TEST(MlaPreprocess, BadInputThrowsNamingTheArgumentAndWritesNothing) {
  using CT = StridedView<const half>;
  static const half zero(0.0f);
  const Cfg t0 = cfg_of(0, 0), tnz = cfg_of(0, 0, true), t1 = cfg_of(1, 1), t2 = cfg_of(2, 2),
            t3 = cfg_of(0, 3), tu = cfg_of(3, 1);
  // The unedited problems pass validate(), which writes nothing, and run.
  for (const Cfg& c : {t0, tnz, t1, t2, t3, tu}) {
    Problem<half> pr(c);
    const Outs<half> before{pr.o.q_out, pr.o.q_rope, pr.o.q_out_i8, pr.o.caches};
    EXPECT_NO_THROW(attnref::validate(pr.params(), pr.inputs(), pr.outputs())) << c.str();
    EXPECT_TRUE(same_outs(pr.o, before)) << c.str() << ": validate() wrote";
    EXPECT_NO_THROW(pr.run()) << c.str();
    EXPECT_FALSE(same_outs(pr.o, before)) << c.str() << ": the run wrote nothing";
  }
  // Shapes of the inputs.
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.input = support::reshaped(in.input, {pr.N, pr.H0 - 1});
      },
      "input.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.input = support::reshaped(in.input, {0, pr.H0});
      },
      "input.shape[0]");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma0 = support::reshaped(in.gamma0, {pr.H0 - 1}); },
      "gamma0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.beta0 = support::reshaped(in.beta0, {pr.H0 + 1}); },
      "beta0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma1 = support::reshaped(in.gamma1, {pr.Q - 1}); },
      "gamma1.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.gamma2 = support::reshaped(in.gamma2, {pr.C + 1}); },
      "gamma2.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.sin = support::reshaped(in.sin, {pr.N, pr.R - 2});
      },
      "sin.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.cos = support::reshaped(in.cos, {pr.N - 1, pr.R});
      },
      "cos.shape");
  // Static quant scales.
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale0 = {}; }, "quant_scale0.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_offset1 = {}; }, "quant_offset1.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale0 = CT(&zero, {1}); },
      "quant_scale0 not usable");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.quant_scale1 = CT(&zero, {1}); },
      "quant_scale1 not usable");
  expect_reject(
      t1, [](auto& pr, auto&, In& in, auto&) { in.quant_scale0 = CT(&pr.qs0, {1}); },
      "quant_scale0 / quant_offset0");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.quant_offset1 = StridedView<const i8>(&pr.qo1, {1});
      },
      "quant_scale1 / quant_offset1");
  // Weights, de_scales, biases.
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wdqkv.out -= 1; }, "wdqkv (out, in)");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv.tensor = support::reshaped(in.wdqkv.tensor, {pr.W1, pr.H0 - 1});
      },
      "wdqkv.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuq.in += 1; }, "wuq (out, in)");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuq.format = WeightFormat::NdInOut; }, "wuq.shape");
  expect_reject(
      tnz,
      [](auto&, auto&, In& in, auto&) {
        in.wdqkv.tensor = support::resized(in.wdqkv.tensor, 1, in.wdqkv.tensor.size(1) - (16));
      },
      "wdqkv.shape");
  expect_reject(
      tnz, [](auto&, auto&, In& in, auto&) { in.wuq.format = WeightFormat::NdOutIn; }, "wuq.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wuk.tensor = support::reshaped(in.wuk.tensor, {pr.NH, pr.P, pr.C - 16});
      },
      "wuk.shape");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.wuk.nz = true; }, "wuk.shape");
  expect_reject(
      tnz,
      [](auto&, auto&, In& in, auto&) { in.wuk.tensor = support::resized(in.wuk.tensor, 3, 32); },
      "wuk.shape");
  expect_reject(
      tnz, [](auto&, auto&, In& in, auto&) { in.wuk.nz = false; }, "wuk.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.de_scale0_bits = StridedView<const i64>(pr.ds0b.data(), {pr.W1});
      },
      "de_scale0 / de_scale0_bits");
  expect_reject(
      t0, [](auto&, auto&, In& in, auto&) { in.de_scale1 = {}; }, "de_scale1 / de_scale1_bits");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.de_scale0 = support::reshaped(in.de_scale0, {pr.W1 - 1});
      },
      "de_scale0.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) { in.bias1 = support::reshaped(in.bias1, {pr.W2 + 1}); },
      "bias1.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, In& in, auto&) {
        in.bias0 = StridedView<const i32>(pr.bias0.data(), {pr.W1});
      },
      "bias0 given with per-token quantization");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.bias1 = StridedView<const i32>(pr.bias1.data(), {pr.W2});
      },
      "bias1 given with per-token quantization");
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv_float = {CT(pr.input.data(), {1, 1}), 1, 1};
      },
      "wdqkv_float given in a quantized mode");
  expect_reject(
      tu,
      [](auto& pr, auto&, In& in, auto&) {
        in.wdqkv = {StridedView<const i8>(pr.wdqkv.data(), {pr.W1, pr.H0}), pr.W1, pr.H0};
      },
      "wdqkv / de_scale0 / bias0 given in Unquant mode");
  expect_reject(
      tu, [](auto&, auto&, In& in, auto&) { in.wuq_float = {}; }, "wuq_float");
  expect_reject(
      tu,
      [](auto& pr, auto&, In& in, auto&) {
        in.wuq_float.tensor = support::reshaped(in.wuq_float.tensor, {pr.W2 - 1, pr.Q});
      },
      "wuq_float.shape");
  // Outputs and caches per cache mode.
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = support::reshaped(out.q_out, {pr.N, pr.NH, pr.C});
      },
      "q_out.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = support::reshaped(out.q_out, {pr.N, pr.NH, pr.C + pr.R});
      },
      "q_out.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_rope_out = support::reshaped(out.q_rope_out, {pr.N, pr.NH, pr.R / 2});
      },
      "q_rope_out.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_rope_out = StridedView<half>(spare<half>(), {pr.N, pr.NH, pr.R});
      },
      "q_out_i8 / q_rope_out");
  expect_reject(
      t2, [](auto&, auto&, auto&, Out& out) { out.q_out_i8 = {}; }, "q_out_i8.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out_i8 = StridedView<i8>(spare<i8>(), {pr.N, pr.NH, pr.C});
      },
      "q_out_i8 given without cache_mode Int8NzCache");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.q_out = StridedView<half>(spare<half>(), {pr.N, pr.NH, 1});
      },
      "q_out given with cache_mode Int8NzCache");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache =
            support::reshaped(out.caches.kv_cache, {pr.blocks, 128, 1, pr.C + pr.R - 1});
      },
      "kv_cache.shape");
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = StridedView<half>(spare<half>(), {pr.blocks, 128, 1, pr.R});
      },
      "ctkv / krope given for another cache mode");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks - 1, 128, 1, pr.R});
      },
      "krope.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks, 128, 1, pr.C / 2});
      },
      "ctkv.shape");
  expect_reject(
      t1,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache = StridedView<half>(spare<half>(), {1, 16, 1, pr.C + pr.R});
      },
      "kv_cache / ctkv_i8 given for another cache mode");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv_i8 = support::reshaped(out.caches.ctkv_i8, {pr.blocks, pr.C / 16, 128, 16});
      },
      "ctkv_i8.shape");
  expect_reject(
      t2,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks, pr.R / 8, 128, 8});
      },
      "krope.shape");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks, 128, 1, pr.C});
      },
      "ctkv.shape");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks, pr.R / 16, 64, 16});
      },
      "krope.shape");
  // Block sizes ATB does not support.
  expect_reject(
      t0,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.kv_cache = support::reshaped(out.caches.kv_cache, {1, 200, 1, pr.C + pr.R});
      },
      "caches block size");
  expect_reject(
      t3,
      [](auto& pr, auto&, auto&, Out& out) {
        out.caches.ctkv = support::reshaped(out.caches.ctkv, {pr.blocks * 2, pr.C / 16, 64, 16});
        out.caches.krope = support::reshaped(out.caches.krope, {pr.blocks * 2, pr.R / 16, 64, 16});
      },
      "caches block size");
  // Int8NzCache's scales.
  expect_reject(
      t2, [](auto&, auto&, In& in, auto&) { in.ctkv_scale = {}; }, "ctkv_scale.shape");
  expect_reject(
      t2, [](auto&, auto&, In& in, auto&) { in.ctkv_scale = CT(&zero, {1}); },
      "ctkv_scale not usable");
  expect_reject(
      t2,
      [](auto& pr, auto&, In& in, auto&) {
        in.q_nope_scale = support::reshaped(in.q_nope_scale, {pr.NH - 1});
      },
      "q_nope_scale.shape");
  expect_reject(
      t0, [](auto& pr, auto&, In& in, auto&) { in.ctkv_scale = CT(&pr.qs3, {1}); },
      "ctkv_scale / q_nope_scale given without cache_mode Int8NzCache");
  // Slots.
  expect_reject(
      t0, [](auto& pr, auto&, auto&, auto&) { pr.slots[1] = static_cast<i32>(pr.blocks * 128); },
      "slot_mapping[1] out of range", true);
  expect_reject(
      t2, [](auto& pr, auto&, auto&, auto&) { pr.slots[4] = 1 << 30; },
      "slot_mapping[4] out of range", true);
  expect_reject(
      t0,
      [](auto& pr, auto&, In& in, auto&) {
        in.slot_mapping = support::reshaped(in.slot_mapping, {pr.N - 1});
      },
      "slot_mapping.shape");
  // Parameters.
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.quant_mode = static_cast<MlaQuantMode>(7); },
      "params.quant_mode");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.cache_mode = static_cast<MlaCacheMode>(9); },
      "params.cache_mode");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.q_rotary_coeff = 1; }, "params.q_rotary_coeff");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.k_rotary_coeff = 4; }, "k_rotary_coeff");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.wdq_dim = 1536; }, "params.wdq_dim");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.k_rope_dim = 64; }, "params.k_rope_dim");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.transpose_wuk = false; }, "params.transpose_wuk");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.epsilon = -1.0f; }, "params.epsilon");
  expect_reject(
      t0, [](auto&, Params& p, auto&, auto&) { p.dims.rope_dim = 15; }, "params.dims");
}

TEST(MlaStages, BadInputThrowsNamingTheArgumentAndWritesNothing) {
  using CT = StridedView<const half>;
  const Index rows = 3, n = 8;
  const std::vector<half> x(z(rows * n), half(1.0f)), gamma(z(n), half(1.0f));
  const half qs(0.5f), zero(0.0f);
  const i8 qo = 0;
  std::vector<i8> q(z(rows * n), kPoison8);
  std::vector<half> u(z(rows * n), tpoison<half>());
  std::vector<float> d(z(rows), -1.0f);
  const auto q0 = q;
  const auto u0 = u;
  const auto d0 = d;
  auto unchanged = [&] {
    EXPECT_TRUE(support::bitwise_equal(q, q0));
    EXPECT_TRUE(support::bitwise_equal(u, u0));
    EXPECT_TRUE(support::bitwise_equal(d, d0));
  };
  using NI = attnref::RmsNormQuantInputs<half>;
  using NO = attnref::RmsNormQuantOutputs<half>;
  auto norm = [&](MlaQuantMode m, NI in, NO out, const std::string& what) {
    support::expect_throw([&] { attnref::rms_norm_quant<half>(m, kEps, in, out); }, what, false);
    unchanged();
  };
  const NI ok{CT(x.data(), {rows, n}),
              CT(gamma.data(), {n}),
              {},
              CT(&qs, {1}),
              StridedView<const i8>(&qo, {1})};
  const NO okq{StridedView<i8>(q.data(), {rows, n})};
  NI bad = ok;
  bad.gamma = support::reshaped(bad.gamma, {n - 1});
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "gamma.shape");
  bad = ok;
  bad.quant_scale = {};
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "quant_scale.shape");
  bad = ok;
  bad.quant_scale = CT(&zero, {1});
  norm(MlaQuantMode::PerTensorAsymm, bad, okq, "quant_scale not usable");
  norm(MlaQuantMode::PerTokenSymm, ok,
       {StridedView<i8>(q.data(), {rows, n}), StridedView<float>(d.data(), {rows})},
       "quant_scale / quant_offset");
  bad = ok;
  bad.quant_scale = {};
  bad.quant_offset = {};
  norm(MlaQuantMode::PerTokenSymm, bad, okq, "out.descale.shape");
  norm(MlaQuantMode::PerTensorAsymm, ok,
       {StridedView<i8>(q.data(), {rows, n}), {}, {}, StridedView<half>(u.data(), {rows, n})},
       "out.unquant");
  norm(static_cast<MlaQuantMode>(5), ok, okq, "mode");
  support::expect_throw(
      [&] {
        attnref::rms_norm<half>(CT(x.data(), {rows, n}), CT(gamma.data(), {n}), kEps,
                                StridedView<half>(u.data(), {rows, n + 1}));
      },
      "out.shape", false);
  unchanged();

  // int8_matmul / float_matmul.
  const std::vector<i8> a(z(rows * n), 1), w(z(4 * n), 1);
  const std::vector<float> ds(4, 1.0f), ts(z(rows), 1.0f);
  const std::vector<i64> dsb(4, 0);
  const std::vector<i32> bias(4, 0);
  std::vector<half> mo(z(rows * 4), tpoison<half>());
  const auto mo0 = mo;
  const attnref::Int8MatmulInputs mok{StridedView<const i8>(a.data(), {rows, n}),
                                      {StridedView<const i8>(w.data(), {4, n}), 4, n},
                                      {},
                                      StridedView<const float>(ds.data(), {4})};
  auto mm = [&](const attnref::Int8MatmulInputs& in, const std::string& what) {
    support::expect_throw(
        [&] {
          attnref::int8_matmul<half>(in, StridedView<half>(mo.data(), {rows, 4}));
        },
        what, false);
    EXPECT_TRUE(support::bitwise_equal(mo, mo0));
  };
  auto mi = mok;
  mi.de_scale_bits = StridedView<const i64>(dsb.data(), {4});
  mm(mi, "de_scale / de_scale_bits");
  mi = mok;
  mi.token_scale = StridedView<const float>(ts.data(), {rows});
  mi.bias = StridedView<const i32>(bias.data(), {4});
  mm(mi, "bias given with per-token scales");
  mi = mok;
  mi.zero_point = StridedView<const float>(ts.data(), {rows});
  mm(mi, "zero_point given without token_scale");
  mi = mok;
  mi.w.format = WeightFormat::Nz;
  mm(mi, "w.shape");
  mi = mok;
  mi.de_scale = support::reshaped(mi.de_scale, {3});
  mm(mi, "de_scale.shape");
  const std::vector<half> af(z(rows * n), half(1.0f)), wf(z(4 * n), half(1.0f));
  support::expect_throw(
      [&] {
        attnref::float_matmul<half>(CT(af.data(), {rows, n}), {CT(wf.data(), {4, n}), 4, n + 1},
                                    StridedView<half>(mo.data(), {rows, 4}));
      },
      "w (out, in)", false);
  EXPECT_TRUE(support::bitwise_equal(mo, mo0));

  // rope_rotate_half, q_nope_absorb.
  const Index R = 4, heads = 2;
  const std::vector<half> rx(z(rows * heads * R), half(1.0f)), sc(z(rows * R), half(0.5f));
  std::vector<half> ro(rx.size(), tpoison<half>());
  const auto ro0 = ro;
  auto rope = [&](Index r_sin, Index cos_rows, Index out_w, int coeff, const std::string& what) {
    support::expect_throw(
        [&] {
          attnref::rope_rotate_half<half>(CT(rx.data(), {rows, heads * R}),
                                          CT(sc.data(), {rows, r_sin}),
                                          CT(sc.data(), {cos_rows, r_sin}), heads,
                                          StridedView<half>(ro.data(), {rows, out_w}), coeff);
        },
        what, false);
    EXPECT_TRUE(support::bitwise_equal(ro, ro0));
  };
  rope(R, rows, heads * R, 1, "rotary_coeff");
  rope(3, rows, heads * R, 2, "sin.shape[1]");
  rope(R, rows - 1, heads * R, 2, "cos.shape");
  rope(R, rows, heads * R - 1, 2, "out.shape");
  const std::vector<half> qn(z(rows * heads * 16), half(1.0f)), wk(z(heads * 16 * 32), half(1.0f));
  std::vector<float> qa(z(rows * heads * 32), NAN);
  support::expect_throw(
      [&] {
        attnref::q_nope_absorb<half>(CT(qn.data(), {rows, heads, 16}),
                                     {CT(wk.data(), {heads, 15, 32}), false},
                                     StridedView<float>(qa.data(), {rows, heads, 32}));
      },
      "wuk.shape", false);
  support::expect_throw(
      [&] {
        attnref::q_nope_absorb<half>(CT(qn.data(), {rows, heads, 16}),
                                     {CT(wk.data(), {heads, 16, 32}), false},
                                     StridedView<float>(qa.data(), {rows, heads, 16}));
      },
      "out.shape", false);
  for (float v : qa) EXPECT_TRUE(std::isnan(v));

  // mla_reshape_and_cache.
  const Index C = 32, RR = 16, bs = 16, blocks = 2;
  const std::vector<half> kn(z(rows * C), half(1.0f)), kr(z(rows * RR), half(1.0f));
  std::vector<i32> slots{0, -1, 5};
  auto reshape = [&](int cm, const std::vector<i32>& sl, CT qs3, Index width,
                     const std::string& what, bool oor) {
    Caches<half> c(cm, blocks, bs, C, RR);
    const Caches<half> c0(cm, blocks, bs, C, RR);
    auto refs = c.refs(C, RR);
    if (cm == 0 && width) refs.kv_cache = support::resized(refs.kv_cache, 3, width);
    support::expect_throw(
        [&] {
          attnref::mla_reshape_and_cache<half>(
              static_cast<MlaCacheMode>(cm), CT(kn.data(), {rows, C}), CT(kr.data(), {rows, RR}),
              StridedView<const i32>(sl.data(), {rows}), qs3, refs);
        },
        what, oor);
    EXPECT_TRUE(same_caches(c, c0));
  };
  reshape(0, {0, -1, static_cast<i32>(blocks * bs)}, {}, 0, "slot_mapping[2] out of range", true);
  reshape(2, slots, {}, 0, "quant_scale3.shape", false);
  reshape(2, slots, CT(&zero, {1}), 0, "quant_scale3 not usable", false);
  reshape(1, slots, CT(&qs, {1}), 0, "quant_scale3 given outside Int8NzCache", false);
  reshape(0, slots, {}, C, "kv_cache.shape", false);
  support::expect_throw(
      [&] {
        Caches<half> c(0, blocks, bs, C, RR);
        attnref::mla_reshape_and_cache<half>(
            static_cast<MlaCacheMode>(9), CT(kn.data(), {rows, C}), CT(kr.data(), {rows, RR}),
            StridedView<const i32>(slots.data(), {rows}), {}, c.refs(C, RR));
      },
      "cache_mode", false);
}

}  // namespace mla_preprocess_rejects_test
