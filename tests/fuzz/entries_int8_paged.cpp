// Fuzz entry "paged_attention_int8" (DEQUANT_FUSION with offsets and logN; QKV_OFFLINE / ONLINE,
// decode or SPEC; NORM / SPEC masks; shuffled tables) against ref::paged_rows / ref::paged_qkv
// with the unit tests' tolerances.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/entries_int8.hpp"
#include "fuzz/fuzz.hpp"
#include "reference/atb_paged_modes.hpp"
#include "support/views.hpp"

namespace fuzz_pa_int8 {

using namespace fuzz_int8_util;
using P = attnref::PagedAttentionParams;
using i32 = std::int32_t;
template <class T>
StridedView<const T, 1> vec(const std::vector<T>& x) {
  return {x.empty() ? nullptr : x.data(), {static_cast<Index>(x.size())}};
}

struct Pa8 {
  bool qkv = true, online = true, want_oor = false;
  int mask = 0;  // 0 none, 1 NORM rows [mb, 1, S], 2 NORM square [1, S, S], 3 SPEC [tokens, S]
  Index batch = 1, nh = 1, nkv = 1, d = 1, dv = 1, bs = 1, blocks = 1, maxb = 1, S = 1, mb = 1;
  std::vector<Index> ctx, ql, qcu;  // context, query tokens and first token of each sequence
  std::vector<i8> q8, kc, vc;
  std::vector<half> qh, m, o;
  std::vector<float> kd, vd, ps, ln;
  std::vector<i32> ko, vo, table;
  P p;
  attnref::PagedAttentionInputs<i8, i8, half> in8;    // QKV_OFFLINE / QKV_ONLINE
  attnref::PagedAttentionInputs<half, i8, half> inh;  // DEQUANT_FUSION
  StridedView<half, 3> out;
  Index tokens() const { return qcu.back(); }
  template <class F>
  void each(F&& f) {  // f(the inputs in use)
    return qkv ? f(in8) : f(inh);
  }
};

void build(Pa8& c, R& r) {
  c.qkv = r.chance(0.6), c.online = c.qkv && r.chance(0.5);
  const bool spec = c.qkv && r.chance(0.3);
  c.batch = r.range(1, 3), c.nkv = r.range(1, 2), c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24), c.dv = r.range(1, 24), c.bs = r.range(1, 8);
  c.qcu.push_back(0);
  for (Index b = 0; b < c.batch; ++b) {
    c.ctx.push_back(r.range(0, 40));
    // Packed rows: a sequence with context length 0 takes no query row.
    c.ql.push_back(spec ? r.range(0, std::min<Index>(c.ctx.back(), 4)) : c.ctx.back() > 0 ? 1 : 0);
    c.qcu.push_back(c.qcu.back() + c.ql.back());
    c.maxb = std::max(c.maxb, (c.ctx.back() + c.bs - 1) / c.bs);
    c.S = std::max(c.S, c.ctx.back() + r.range(0, 2));
  }
  c.blocks = c.batch * c.maxb + r.range(1, 3);  // shuffled, a spare block or more
  std::vector<i32> ids(z(c.blocks));
  for (Index i = 0; i < c.blocks; ++i) ids[z(i)] = static_cast<i32>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(z(c.batch * c.maxb), -1);
  for (Index b = 0, next = 0; b < c.batch; ++b)
    for (Index j = 0; j * c.bs < c.ctx[z(b)]; ++j) c.table[z(b * c.maxb + j)] = ids[z(next++)];
  c.kc = i8s(r, c.blocks * c.bs * c.nkv * c.d);
  c.vc = i8s(r, c.blocks * c.bs * c.nkv * c.dv);
  auto& p = c.p;
  p.num_heads = static_cast<int>(c.nh);
  p.num_kv_heads = c.nkv == c.nh && r.chance(0.5) ? 0 : static_cast<int>(c.nkv);
  p.qk_scale = r.chance(0.5) ? 0.125f : static_cast<float>(1.0 / std::sqrt(double(c.d)));
  p.quant_block_size = r.chance(0.6) ? static_cast<int>(r.range(1, 8)) : 128;
  // Masks (-10000 holes): SPEC takes NORM square or SPEC; decode none or NORM rows, whose
  // columns past each context hold NaN (never read).
  c.mask = spec ? static_cast<int>(r.range(2, 3)) : r.chance(0.4) ? 1 : 0;
  if (c.mask == 1) c.mb = r.chance(0.5) ? 1 : c.batch;
  const Index rows = c.mask == 1 ? c.mb : c.mask == 2 ? c.S : c.tokens();
  for (Index i = 0; c.mask > 0 && i < rows * c.S; ++i) {
    const bool past = c.mask == 1 && c.mb > 1 && i % c.S >= c.ctx[z(i / c.S)];
    c.m.push_back(half(past ? kNaN : r.chance(0.2) ? -10000.0f : 0.0f));
  }
  p.mask_type = c.mask == 0   ? P::MaskType::Undefined
                : c.mask == 3 ? P::MaskType::Spec
                              : P::MaskType::Norm;
  if (spec) p.calc_type = P::CalcType::Spec;
  c.o.assign(z(c.tokens() * c.nh * c.dv), half(555.0f));
  c.out = StridedView<half, 3>(c.o.data(), {c.tokens(), c.nh, c.dv});
  if (c.qkv) {
    p.quant_type = c.online ? P::QuantType::QkvOnline : P::QuantType::QkvOffline;
    p.out_data_type = P::OutDataType::Float16;
    for (Index h = 0; h < c.nh; ++h) {  // the unit test's magnitudes
      c.kd.push_back((r.chance(0.3) ? -1.0f : 1.0f) * (1e-3f + 2e-3f * unit(r)));
      c.vd.push_back(2e-3f + 2e-2f * unit(r));
      if (!c.online) c.ps.push_back(20.0f + 107.0f * unit(r));
    }
    c.q8 = i8s(r, c.tokens() * c.nh * c.d, 41);
    c.in8.query = {c.q8.data(), {c.tokens(), c.nh, c.d}};
    if (spec) c.in8.q_seq_lens = c.ql;
  } else {
    p.quant_type = P::QuantType::DequantFusion;
    p.has_quant_offset = r.chance(0.5);
    for (Index i = 0; i < c.nkv * (c.d + c.dv); ++i) {  // per channel, 0.05 / 0.005 / 0.0005
      const Index ch = i < c.nkv * c.d ? i : i - c.nkv * c.d;
      (ch == i ? c.kd : c.vd).push_back((0.5f + unit(r)) * 0.05f * std::pow(0.1f, float(ch % 3)));
      if (p.has_quant_offset) (ch == i ? c.ko : c.vo).push_back(static_cast<i32>(r.range(-20, 20)));
    }
    for (Index i = 0; i < c.tokens() * c.nh * c.d; ++i) c.qh.push_back(half(r.normal()));
    c.inh.query = {c.qh.data(), {c.tokens(), c.nh, c.d}};
    if (r.chance(0.3)) {
      p.scale_type = P::ScaleType::LogN;
      for (Index b = 0; b < c.batch; ++b) c.ln.push_back(0.5f + unit(r));
      c.inh.log_n = vec(c.ln);
    }
  }
  c.each([&c](auto& in) {
    in.key_cache = {c.kc.data(), {c.blocks, c.bs, c.nkv, c.d}};
    in.value_cache = {c.vc.data(), {c.blocks, c.bs, c.nkv, c.dv}};
    in.block_tables = {c.table.data(), {c.batch, c.maxb}};
    in.context_lens = c.ctx;
    if (c.mask == 1) in.mask = {c.m.data(), {c.mb, 1, c.S}};
    if (c.mask == 2) in.mask = {c.m.data(), {1, c.S, c.S}};
    if (c.mask == 3) in.spec_mask = {c.m.data(), {c.tokens(), c.S}};
    in.k_descale = vec(c.kd), in.v_descale = vec(c.vd), in.p_scale = vec(c.ps);
    in.k_offset = vec(c.ko), in.v_offset = vec(c.vo);
  });
}

// The keys and values gathered through the table. QKV: within 2^-9 relative, the fp32
// accumulation bound and the row's near-tie slack (the unit test's rule; plus half fp16's
// subnormal step); DEQUANT_FUSION: the fp16 policy against the reference rounded to fp16.
std::string verify(const Pa8& c) {
  std::vector<int> seq;  // the sequence of each query token
  for (Index b = 0; b < c.batch; ++b) seq.insert(seq.end(), z(c.ql[z(b)]), static_cast<int>(b));
  const std::function<float(int, int)> mask = [&c, &seq](int x, int t) {
    const Index b = seq[z(x)];
    const Index row = c.mask == 1   ? (c.mb == 1 ? 0 : b)
                      : c.mask == 2 ? c.ctx[z(b)] - c.ql[z(b)] + x - c.qcu[z(b)]
                                    : x;
    return static_cast<float>(c.m[z(row * c.S + t)]);
  };
  std::vector<ref::Rows8> k(z(c.batch)), v(z(c.batch));
  for (Index b = 0; b < c.batch; ++b)
    for (Index t = 0; t < c.ctx[z(b)]; ++t) {
      const Index h0 = (c.table[z(b * c.maxb + t / c.bs)] * c.bs + t % c.bs) * c.nkv;
      k[z(b)].emplace_back(c.kc.begin() + h0 * c.d, c.kc.begin() + (h0 + c.nkv) * c.d);
      v[z(b)].emplace_back(c.vc.begin() + h0 * c.dv, c.vc.begin() + (h0 + c.nkv) * c.dv);
    }
  const int nh = static_cast<int>(c.nh), nkv = static_cast<int>(c.nkv);
  const int d = static_cast<int>(c.d), dv = static_cast<int>(c.dv);
  if (c.qkv) {
    ref::PagedQkv pr{nh, nkv, d, dv, c.p.qk_scale, c.kd, c.vd, c.ps, c.p.quant_block_size,
                     {}, 6e-6};
    if (c.mask) pr.mask = mask;
    ref::Rows8 q;
    for (Index x = 0; x < c.tokens(); ++x)
      q.emplace_back(c.q8.begin() + x * c.nh * c.d, c.q8.begin() + (x + 1) * c.nh * c.d);
    const ref::QkvResult w = ref::paged_qkv(pr, q, seq, k, v);
    for (size_t i = 0; i < c.o.size(); ++i) {
      const double got = static_cast<float>(c.o[i]);
      const double allowed =
          0x1p-9 * std::fabs(w.out[i]) + 1e-5 * w.mag[i] + w.slack[i / z(c.dv)] + 0x1p-25;
      if (!(std::fabs(got - w.out[i]) <= allowed)) return at(i, got, w.out[i]);
    }
    return "";
  }
  ref::PagedModes pr{nh, nkv, d, dv, c.p.qk_scale, {c.ln.begin(), c.ln.end()}, {}};
  if (c.mask) pr.bias = [&mask](int x, int, int t) { return static_cast<double>(mask(x, t)); };
  ref::Rows q(z(c.tokens()));
  std::vector<ref::Rows> kf(k.size()), vf(v.size());
  for (size_t i = 0; i < c.qh.size(); ++i) q[i / z(c.nh * c.d)].push_back(float(c.qh[i]));
  for (size_t b = 0; b < k.size(); ++b)
    for (size_t t = 0; t < k[b].size(); ++t) {
      kf[b].push_back(ref::dequant(k[b][t].data(), c.kd, c.ko));
      vf[b].push_back(ref::dequant(v[b][t].data(), c.vd, c.vo));
    }
  std::vector<double> want, got;
  for (double x : ref::paged_rows(pr, q, seq, kf, vf)) want.push_back(as_half(x));
  for (const half& x : c.o) got.push_back(static_cast<float>(x));
  return fuzz::compare(got, want, 1e-3);
}

using PP = fuzz::Perturbation<Pa8>;
using Ok = bool (*)(const Pa8&);
using Edit = void (*)(Pa8&, R&);
PP must(const char* n, Ok ok, Edit e) { return fuzz::edit<Pa8>(n, true, ok, e); }
PP must(const char* n, Edit e) { return fuzz::edit<Pa8>(n, true, nullptr, e); }
bool qkv(const Pa8& c) { return c.qkv; }
bool offline(const Pa8& c) { return c.qkv && !c.online; }
bool keys(const Pa8& c) { return *std::max_element(c.ctx.begin(), c.ctx.end()) > 0; }
bool rows(const Pa8& c) { return !c.o.empty(); }

const std::vector<PP>& perturbations() {
  static const std::vector<PP> list{
      must("block table entry out of range", keys,
           [](Pa8& c, R& r) {  // the last block of a sequence with keys: -1 or past numBlocks
             Index b = r.range(0, c.batch - 1);
             while (c.ctx[z(b)] == 0) b = (b + 1) % c.batch;
             c.table[z(b * c.maxb + (c.ctx[z(b)] - 1) / c.bs)] =
                 r.chance(0.5) ? -1 : static_cast<i32>(c.blocks + r.range(0, 3));
             c.want_oor = true;
           }),
      must("block_tables null",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.block_tables = {nullptr, in.block_tables.shape()}; });
           }),
      must("key_cache null",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.key_cache = {nullptr, in.key_cache.shape()}; });
           }),
      must("context_lens negative",
           [](Pa8& c, R& r) {
             const size_t b = z(r.range(0, c.batch - 1));
             c.each([b](auto& in) { in.context_lens[b] = -1; });
           }),
      must("query size overflows",
           [](Pa8& c, R&) {
             c.each([](auto& in) { in.query = {in.query.data(), {kHuge, kHuge, 1}, {0, 0, 1}}; });
           }),
      must("k_descale mis-sized",
           [](Pa8& c, R&) {
             c.kd.push_back(1.0f);
             c.each([&c](auto& in) { in.k_descale = vec(c.kd); });
           }),
      must("v_descale missing", [](Pa8& c, R&) { c.each([](auto& in) { in.v_descale = {}; }); }),
      must("a scale not finite",
           [](Pa8& c, R& r) {  // was accepted, giving NaN heads
             std::vector<float>& s = !c.ps.empty() && r.chance(0.3) ? c.ps
                                     : r.chance(0.5)                ? c.kd
                                                                    : c.vd;
             s[z(r.range(0, static_cast<Index>(s.size()) - 1))] = non_finite(r);
           }),
      must("p_scale against the mode",
           [](Pa8& c, R&) {  // given for online / dequant, missing for offline
             c.ps.assign(c.online || !c.qkv ? z(c.nh) : 0, 50.0f);
             c.each([&c](auto& in) { in.p_scale = vec(c.ps); });
           }),
      must("offsets against has_quant_offset",
           [](Pa8& c, R&) { c.p.has_quant_offset = c.qkv || c.ko.empty(); }),
      must("quant_type against the types",
           [](Pa8& c, R& r) {
             c.p.quant_type = static_cast<P::QuantType>(c.qkv ? r.range(0, 1) : r.range(2, 3));
             if (r.chance(0.2)) c.p.quant_type = static_cast<P::QuantType>(4);
           }),
      must("out_data_type mismatch", qkv,
           [](Pa8& c, R& r) {
             c.p.out_data_type =
                 r.chance(0.5) ? P::OutDataType::BFloat16 : P::OutDataType::Undefined;
           }),
      must("quant_block_size out of range",
           [](Pa8& c, R& r) { c.p.quant_block_size = r.chance(0.5) ? 0 : 1025; }),
      must("mask_type out of range",
           [](Pa8& c, R& r) { c.p.mask_type = static_cast<P::MaskType>(r.chance(0.5) ? 6 : -1); }),
      must("LogN or q_scale with an int8 query", qkv,
           [](Pa8& c, R& r) {
             c.p.q_scale = r.chance(0.5) ? 0.5f : 0.0f;
             if (c.p.q_scale == 0.0f) c.p.scale_type = P::ScaleType::LogN;
             c.ln.assign(z(c.batch), 1.0f);
             c.in8.log_n = vec(c.ln);
           }),
      must("out overlaps the query", rows,
           [](Pa8& c, R&) {
             if (c.qkv) {  // fp16 output over the int8 query
               c.q8.resize(std::max(c.q8.size(), 2 * c.o.size()));
               c.in8.query = {c.q8.data(), c.in8.query.shape()};
               c.out = {reinterpret_cast<half*>(c.q8.data()), c.out.shape()};
             } else {
               c.qh.resize(std::max(c.qh.size(), c.o.size()));
               c.inh.query = {c.qh.data(), c.inh.query.shape()};
               c.out = {c.qh.data(), c.out.shape()};
             }
           }),
      fuzz::edit<Pa8>("offline p_scale saturates P8", false, offline,
                      [](Pa8& c, R& r) { c.ps[z(r.range(0, c.nh - 1))] = 1000.0f; }),
  };
  return list;
}

void validate_only(Pa8& c) {
  c.each(
      [&](auto& in) { attnref::validate(c.p, in, attnref::PagedAttentionOutputs<half>{c.out}); });
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"paged_attention_int8", "paged_attention"},
      [seed](Pa8& c) {
        try {
          c.each([&](auto& in) {
            attnref::paged_attention(c.p, in, attnref::PagedAttentionOutputs<half>{c.out},
                                     {static_cast<int>(seed % 2 + 1)});
          });
        } catch (const std::invalid_argument& e) {  // a bad block table entry: out_of_range
          if (c.want_oor) throw std::runtime_error(std::string("not out_of_range: ") + e.what());
          throw;
        }
      },
      verify, &Pa8::q8, &Pa8::qh, &Pa8::kc, &Pa8::vc, &Pa8::o, &Pa8::table, &Pa8::m, &Pa8::kd,
      &Pa8::vd, &Pa8::ps, &Pa8::ko, &Pa8::vo, &Pa8::ln);
}

const fuzz::Register reg("paged_attention_int8", run);

}  // namespace fuzz_pa_int8
