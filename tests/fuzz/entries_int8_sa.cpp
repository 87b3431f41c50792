// Fuzz entry "self_attention_int8" (qkv full quantization: causal, NORM, NORM_COMPRESS, high
// precision, clamp, MLA) against ref::atb_qkv_quant with the unit tests' tolerances.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/entries_int8.hpp"
#include "fuzz/fuzz.hpp"
#include "reference/atb_qkv_quant.hpp"
#include "support/views.hpp"

namespace fuzz_sa_int8 {

using namespace fuzz_int8_util;
using P = attnref::SelfAttentionParams;
using V1 = StridedView<const float, 1>;
using V3 = StridedView<const i8, 3>;

struct Sa8 {
  bool online = true, mla = false;
  int mk = 0;  // mask: 0 none, 1 CausalMask, 2 NORM [mb, ms, ms], 3 NORM_COMPRESS tile
  Index nh = 1, nkv = 1, d = 32, dv = 32, tokens = 0, ms = 1, mb = 1;
  std::vector<Index> seq;
  std::vector<i8> q, k, v;
  std::vector<float> qkd, vpv, ps;
  std::vector<half> m, o;
  std::vector<std::int32_t> offs;
  std::vector<double> mvals;  // the mask's values as stored
  P p;
  attnref::SelfAttentionQuantInputs<half> in;
  StridedView<half, 3> out;
  bool additive() const { return p.kernel_type == P::KernelType::Default; }  // fp16 output
};

void build(Sa8& c, R& r) {
  c.online = r.chance(0.5), c.mla = r.chance(0.2);
  c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3), c.d = 32 * r.range(1, 2);
  c.dv = c.mla ? 32 : 32 * r.range(1, 2);
  for (Index b = r.range(1, 3); b > 0; --b) c.seq.push_back(r.range(0, 10));
  for (Index l : c.seq) c.tokens += l, c.ms = std::max(c.ms, l);
  c.q = i8s(r, c.tokens * c.nh * c.d);
  c.k = i8s(r, c.tokens * c.nkv * c.d);
  if (!c.mla) c.v = i8s(r, c.tokens * c.nkv * c.dv);
  const float base = 3.0f / (127.0f * 127.0f * std::sqrt(static_cast<float>(c.d)));
  for (Index h = 0; h < c.nh; ++h) {  // the unit test's magnitudes
    c.qkd.push_back(base * (0.5f + unit(r)) * 4.0f);
    c.vpv.push_back((0.5f + unit(r)) / 127.0f);
    if (!c.online) c.ps.push_back((0.5f + unit(r)) * 1.5f / 127.0f);
  }
  P& p = c.p;
  p.num_heads = static_cast<int>(c.nh);
  p.num_kv_heads = c.nkv == c.nh && r.chance(0.5) ? 0 : static_cast<int>(c.nkv);
  p.qk_scale = r.chance(0.5) ? 0.75f : 0.25f + unit(r);
  p.calc_type = P::CalcType::PaEncoder;
  p.quant_type = c.online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
  p.out_data_type = P::OutDataType::Float16;
  if (r.chance(0.3)) p.kernel_type = P::KernelType::HighPrecision;
  if (r.chance(0.2)) p.clamp_type = P::ClampType::MinMax, p.clamp_min = -1.5f, p.clamp_max = 2.0f;
  p.quant_block_size = r.chance(0.6) ? r.range(1, 8) : 128;
  if (c.mla) p.mla_v_head_size = c.dv;
  c.mk = c.mla ? 2 * static_cast<int>(r.range(0, 1)) : static_cast<int>(r.range(0, 3));
  const float hidden = c.additive() ? -10000.0f : 1.0f;  // fp16 additive, or binary x -3e38
  if (c.mk == 1) p.mask_type = P::MaskType::CausalMask;
  if (c.mk == 2) {  // key 0 always visible (a binary mask hiding a whole row is -inf in fp16)
    p.mask_type = P::MaskType::Norm;
    c.mb = r.chance(0.5) ? 1 : static_cast<Index>(c.seq.size());
    for (Index i = 0; i < c.mb * c.ms * c.ms; ++i)
      c.mvals.push_back(i % c.ms != 0 && r.chance(0.3) ? hidden : 0.0f);
  }
  if (c.mk == 3) {  // the [128, 128] triangular tile
    p.mask_type = P::MaskType::NormCompress, p.is_triu_mask = 1, c.ms = 128;
    for (Index i = 0; i < 128 * 128; ++i) c.mvals.push_back(i % 128 > i / 128 ? hidden : 0.0f);
  }
  for (double x : c.mvals) c.m.push_back(half(static_cast<float>(x)));
  if (c.mk >= 2) c.in.mask = {c.m.data(), {c.mb, c.ms, c.ms}};
  c.in.query = V3(c.q.data(), {c.tokens, c.nh, c.d});
  c.in.key = V3(c.k.data(), {c.tokens, c.nkv, c.d});
  if (!c.mla) c.in.value = V3(c.v.data(), {c.tokens, c.nkv, c.dv});
  c.in.seq_len = c.seq;
  c.in.qk_descale = V1(c.qkd.data(), {c.nh});
  c.in.vpv_descale = V1(c.vpv.data(), {c.nh});
  if (!c.online) c.in.p_scale = V1(c.ps.data(), {c.nh});
  c.o.assign(z(c.tokens * c.nh * c.dv), half(555.0f));
  c.out = StridedView<half, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
}

// The fp16 policy against the reference rounded to fp16; a row whose P̂ rounding sat on a tie
// may also move by two P8 steps (vpvDescale · P scale · 128, l >= 1).
std::string verify(const Sa8& c) {
  ref::AtbQkvQuant r;
  r.num_heads = static_cast<int>(c.nh), r.num_kv_heads = static_cast<int>(c.nkv);
  r.head_size = static_cast<int>(c.d), r.v_head_size = static_cast<int>(c.dv);
  for (Index l : c.seq) r.seq_len.push_back(static_cast<int>(l));
  r.qk_scale = c.p.qk_scale;
  r.clamp = c.p.clamp_type == P::ClampType::MinMax;
  r.clamp_min = c.p.clamp_min, r.clamp_max = c.p.clamp_max;
  r.qk_descale = c.qkd, r.vpv_descale = c.vpv, r.p_scale = c.ps;
  r.block = static_cast<int>(c.p.quant_block_size);
  const double coeff = c.additive() ? 1.0 : -3e38, hidden = c.additive() ? -10000.0 : 1.0;
  if (c.mk == 1) r.mask = [](int, int i, int j) { return j > i ? -INFINITY : 0.0; };
  if (c.mk == 2)
    r.mask = [&c, coeff](int b, int i, int j) {
      return c.mvals[z(((c.mb == 1 ? 0 : b) * c.ms + i) * c.ms + j)] * coeff;
    };
  if (c.mk == 3)  // the tile expanded: hidden blocks above the diagonal
    r.mask = [coeff, hidden](int, int i, int j) {
      if (j / 128 > i / 128) return -static_cast<double>(INFINITY);
      return j / 128 == i / 128 && j > i ? hidden * coeff : 0.0;
    };
  std::vector<std::vector<i8>> rq, rk, rv;
  Index t0 = 0;
  for (Index l : c.seq) {
    rq.emplace_back(c.q.begin() + t0 * c.nh * c.d, c.q.begin() + (t0 + l) * c.nh * c.d);
    rk.emplace_back(c.k.begin() + t0 * c.nkv * c.d, c.k.begin() + (t0 + l) * c.nkv * c.d);
    rv.emplace_back();
    for (Index t = t0; t < t0 + l; ++t)
      for (Index h = 0; h < c.nkv; ++h)
        for (Index e = 0; e < c.dv; ++e)  // MLA: V is the first dv elements of each K head
          rv.back().push_back(c.mla ? c.k[z((t * c.nkv + h) * c.d + e)]
                                    : c.v[z((t * c.nkv + h) * c.dv + e)]);
    t0 += l;
  }
  const ref::QuantResult want = ref::atb_qkv_quant(r, rq, rk, rv);
  size_t o = 0;
  for (size_t b = 0; b < want.out.size(); ++b)
    for (size_t i = 0; i < want.out[b].size(); ++i, ++o) {
      const size_t row = i / z(c.dv), h = row % z(c.nh);
      const double w = as_half(want.out[b][i]), got = static_cast<float>(c.o[o]);
      const double step = c.vpv[h] * (c.online ? 1.0 / 127.0 : c.ps[h]) * 128.0;
      if (!(std::fabs(got - w) <= 1e-3 + 1e-3 * std::fabs(w) + (want.tie[b][row] ? 2 * step : 0)))
        return at(o, got, w);
    }
  return "";
}

using PS = fuzz::Perturbation<Sa8>;
using Ok = bool (*)(const Sa8&);
using Edit = void (*)(Sa8&, R&);
PS must(const char* n, Ok ok, Edit e) { return fuzz::edit<Sa8>(n, true, ok, e); }
PS must(const char* n, Edit e) { return fuzz::edit<Sa8>(n, true, nullptr, e); }
bool offline(const Sa8& c) { return !c.online; }
bool tokens(const Sa8& c) { return c.tokens > 0; }
bool norm(const Sa8& c) { return c.mk == 2 && c.tokens > 0; }

const std::vector<PS>& perturbations() {
  static const std::vector<PS> list{
      must("query null", tokens, [](Sa8& c, R&) { c.in.query = V3(nullptr, c.in.query.shape()); }),
      must("key head size mismatch",
           [](Sa8& c, R&) {
             c.in.key = V3(c.k.data(), {c.tokens, c.nkv, c.d / 2});
           }),
      must("qk_descale missing", [](Sa8& c, R&) { c.in.qk_descale = {}; }),
      must("vpv_descale mis-sized",
           [](Sa8& c, R&) {
             c.vpv.push_back(0.01f);
             c.in.vpv_descale = V1(c.vpv.data(), {c.nh + 1});
           }),
      must("p_scale against the mode",
           [](Sa8& c, R&) {  // given for online, missing for offline
             c.ps.assign(c.online ? z(c.nh) : 0, 0.01f);
             c.in.p_scale = c.online ? V1(c.ps.data(), {c.nh}) : V1();
           }),
      must("p_scale not positive", offline,
           [](Sa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = r.chance(0.5) ? 0.0f : -0.01f; }),
      must("a descale not finite",
           [](Sa8& c, R& r) {
             (r.chance(0.5) ? c.qkd : c.vpv)[z(r.range(0, c.nh - 1))] = non_finite(r);
           }),
      must("head size not a multiple of 32",
           [](Sa8& c, R&) {
             c.in.query = V3(c.q.data(), {c.tokens, c.nh, c.d - 1});
           }),
      must("quant_type not a qkv quantization",
           [](Sa8& c, R& r) {
             const int bad[] = {-1, 0, 1, 4};  // Unquant, DequantFusion, out of range
             c.p.quant_type = static_cast<P::QuantType>(bad[r.range(0, 3)]);
           }),
      must("out_data_type mismatch",
           [](Sa8& c, R& r) {
             c.p.out_data_type =
                 r.chance(0.5) ? P::OutDataType::BFloat16 : P::OutDataType::Undefined;
           }),
      must("q_scale not 1", [](Sa8& c, R&) { c.p.q_scale = 0.5f; }),
      must("out overlaps the query", tokens,
           [](Sa8& c, R&) {  // fp16 output over the int8 query
             c.q.resize(std::max(c.q.size(), 2 * c.o.size()));
             c.in.query = V3(c.q.data(), c.in.query.shape());
             c.out = {reinterpret_cast<half*>(c.q.data()), c.out.shape()};
           }),
      must("NORM mask missing or short", norm,
           [](Sa8& c, R& r) {
             c.in.mask = {r.chance(0.5) ? nullptr : c.m.data(), {c.mb, c.ms - 1, c.ms}};
           }),
      fuzz::edit<Sa8>("reserved offsets given", false, nullptr,
                      [](Sa8& c, R&) {
                        c.offs.assign(z(c.nh), 3);
                        c.in.qk_offset = c.in.vpv_offset = {c.offs.data(), {c.nh}};
                      }),
      fuzz::edit<Sa8>("p_scale tiny: P8 saturates", false, offline,
                      [](Sa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = 1e-3f; }),
  };
  return list;
}

void validate_only(Sa8& c) {
  attnref::validate(c.p, c.in, attnref::SelfAttentionOutputs<half>{c.out});
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"self_attention_int8", "self_attention"},
      [seed](Sa8& c) {
        attnref::self_attention(c.p, c.in, attnref::SelfAttentionOutputs<half>{c.out},
                                {static_cast<int>(seed % 2 + 1)});
      },
      verify, &Sa8::q, &Sa8::k, &Sa8::v, &Sa8::o, &Sa8::m, &Sa8::qkd, &Sa8::vpv, &Sa8::ps,
      &Sa8::offs);
}

const fuzz::Register reg("self_attention_int8", run);

}  // namespace fuzz_sa_int8
