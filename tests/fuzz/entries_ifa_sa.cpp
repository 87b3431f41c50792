// Fuzz entries "incre_flash_attention" (contiguous fp16 K/V in BSH / BSND / BNSD, one tensor or
// one per batch) and "self_attention" (ATB PA_ENCODER, fp32 high precision, no mask or the
// causal mask), against the naive reference.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace fuzz_ifa_sa {

using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;

// ---- IncreFlashAttention ------------------------------------------------------------------

struct Ifa {
  std::string layout;
  bool list = false;  // one tensor per batch
  Index B = 1, S = 1, N = 1, KVN = 1, D = 1;
  std::vector<Index> kv_len;
  std::vector<half> q, k, v, o;
  attnref::IncreFlashAttentionParams p;
  attnref::IncreFlashAttentionInputs<half> in;
  StridedView<half> out;
};

std::vector<Index> shape(const std::string& layout, Index B, Index S, Index n, Index d) {
  if (layout == "BSH") return {B, S, n * d};
  if (layout == "BNSD") return {B, n, S, d};
  return {B, S, n, d};
}

Index offset(const Ifa& c, Index b, Index s, Index h, Index e, Index S, Index n) {
  if (c.layout == "BNSD") return ((b * n + h) * S + s) * c.D + e;
  return ((b * S + s) * n + h) * c.D + e;
}

void build(Ifa& c, fuzz::Rng& r) {
  const char* layouts[] = {"BSH", "BSND", "BNSD"};
  c.layout = layouts[r.range(0, 2)];
  c.list = r.chance(0.3);
  c.B = r.range(1, 3);
  c.KVN = r.range(1, 2);
  c.N = c.KVN * r.range(1, 3);
  c.D = r.range(1, 24);
  c.S = r.range(1, 24);
  c.q.resize(static_cast<size_t>(c.B * c.N * c.D));
  for (half& e : c.q) e = half(r.normal());
  c.k.resize(static_cast<size_t>(c.B * c.S * c.KVN * c.D));
  c.v.resize(c.k.size());
  for (half& e : c.k) e = half(r.normal());
  for (half& e : c.v) e = half(r.normal());
  c.o.assign(c.q.size(), half(444.0f));
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.KVN;
  c.p.input_layout = c.layout;
  c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
  c.in.query = StridedView<const half>(c.q.data(), shape(c.layout, c.B, 1, c.N, c.D));
  c.out = StridedView<half>(c.o.data(), c.in.query.shape());
  if (c.list) {
    for (Index b = 0; b < c.B; ++b) {
      const Index at = b * c.S * c.KVN * c.D;
      c.in.key.emplace_back(c.k.data() + at, shape(c.layout, 1, c.S, c.KVN, c.D));
      c.in.value.emplace_back(c.v.data() + at, shape(c.layout, 1, c.S, c.KVN, c.D));
    }
  } else {
    c.in.key.emplace_back(c.k.data(), shape(c.layout, c.B, c.S, c.KVN, c.D));
    c.in.value.emplace_back(c.v.data(), shape(c.layout, c.B, c.S, c.KVN, c.D));
  }
  c.kv_len.assign(static_cast<size_t>(c.B), c.S);
  if (r.chance(0.5))
    for (Index b = 0; b < c.B; ++b) {
      c.kv_len[static_cast<size_t>(b)] = r.range(0, c.S);
      c.in.actual_seq_lengths.push_back(c.kv_len[static_cast<size_t>(b)]);
    }
}

std::string verify_ifa(const Ifa& c) {
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.KVN);
  pr.head_size = pr.v_head_size = static_cast<int>(c.D);
  pr.scale = c.p.scale_value;
  ref::Seqs q, k, v;
  for (Index b = 0; b < c.B; ++b) {
    pr.q_len.push_back(1);
    pr.kv_len.push_back(static_cast<int>(c.kv_len[static_cast<size_t>(b)]));
    q.emplace_back();
    k.emplace_back();
    v.emplace_back();
    for (Index h = 0; h < c.N; ++h)
      for (Index e = 0; e < c.D; ++e)
        q.back().push_back(
            static_cast<float>(c.q[static_cast<size_t>(offset(c, b, 0, h, e, 1, c.N))]));
    for (Index s = 0; s < c.kv_len[static_cast<size_t>(b)]; ++s)
      for (Index h = 0; h < c.KVN; ++h)
        for (Index e = 0; e < c.D; ++e) {
          const size_t at = static_cast<size_t>(offset(c, b, s, h, e, c.S, c.KVN));
          k.back().push_back(static_cast<float>(c.k[at]));
          v.back().push_back(static_cast<float>(c.v[at]));
        }
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  std::vector<double> got, w;
  for (Index b = 0; b < c.B; ++b)
    for (Index h = 0; h < c.N; ++h)
      for (Index e = 0; e < c.D; ++e) {
        got.push_back(static_cast<float>(c.o[static_cast<size_t>(offset(c, b, 0, h, e, 1, c.N))]));
        w.push_back(want.o[static_cast<size_t>(b)][static_cast<size_t>(h * c.D + e)]);
      }
  return fuzz::compare(got, w, 3e-3);
}

using PI = fuzz::Perturbation<Ifa>;

const std::vector<PI>& ifa_perturbations() {
  static const std::vector<PI> list{
      {"query sequence not 1", true,
       [](Ifa& c, fuzz::Rng&) {
         if (c.layout == "BNSD") return false;
         c.in.query = support::resized(c.in.query, 1, 2);
         c.q.resize(c.q.size() * 2, half(0.0f));
         c.in.query = support::with_data(c.in.query, c.q.data());
         return true;
       }},
      {"key / value lists of different lengths", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.value.push_back(c.in.value.back());
         return true;
       }},
      {"value null", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.value[0] = support::with_data(c.in.value[0], nullptr);
         return true;
       }},
      {"key dim negative", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.key[0] = support::resized(c.in.key[0], 0, -1);
         return true;
       }},
      {"key size overflows", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.key[0] = support::resized(c.in.key[0], 0, kHuge);
         c.in.key[0] = support::resized(c.in.key[0], 1, kHuge);
         return true;
       }},
      {"actual_seq_lengths past S", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.actual_seq_lengths.assign(static_cast<size_t>(c.B), c.S + 1);
         return true;
       }},
      {"actual_seq_lengths negative", true,
       [](Ifa& c, fuzz::Rng&) {
         c.in.actual_seq_lengths.assign(static_cast<size_t>(c.B), -1);
         return true;
       }},
      {"num_heads not a multiple of num_key_value_heads", true,
       [](Ifa& c, fuzz::Rng&) {
         if (c.N < 2 || c.N % (c.N - 1) == 0) return false;
         c.p.num_key_value_heads = c.N - 1;
         return true;
       }},
      {"inner_precise out of range", true,
       [](Ifa& c, fuzz::Rng&) {
         c.p.inner_precise = 2;
         return true;
       }},
      {"unknown layout", true,
       [](Ifa& c, fuzz::Rng&) {
         c.p.input_layout = "TND";
         return true;
       }},
      {"block table without block size", true,
       [](Ifa& c, fuzz::Rng&) {
         static const std::int32_t t[1] = {0};
         c.in.block_table = StridedView<const std::int32_t>(t, {1, 1});
         return true;
       }},
      {"output shape mismatch", true,
       [](Ifa& c, fuzz::Rng&) {
         c.out = support::resized(c.out, c.out.rank() - 1, c.out.shape().back() + 1);
         c.o.resize(c.o.size() * 2, half(444.0f));
         c.out = support::with_data(c.out, c.o.data());
         return true;
       }},
      {"atten_mask narrower than the keys", true,
       [](Ifa& c, fuzz::Rng&) {
         static const std::uint8_t m[64] = {};
         Index longest = 0;
         for (Index l : c.kv_len) longest = std::max(longest, l);
         if (longest < 2) return false;  // a [B, 1] mask covers the keys then
         c.in.atten_mask = StridedView<const std::uint8_t>(m, {c.B, 1});
         return true;
       }},
  };
  return list;
}

void restride_inputs(Ifa& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Ifa& c) {
  attnref::validate(c.p, c.in, attnref::IncreFlashAttentionOutputs<half>{c.out});
}

void run_ifa(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, ifa_perturbations(), build, fuzz::Named{"incre_flash_attention"},
      [seed](Ifa& c) {
        attnref::incre_flash_attention(c.p, c.in, attnref::IncreFlashAttentionOutputs<half>{c.out},
                                       {static_cast<int>(seed % 2 + 1)});
      },
      verify_ifa, &Ifa::q, &Ifa::k, &Ifa::v, &Ifa::o);
}

const fuzz::Register reg_ifa("incre_flash_attention", run_ifa);

// ---- ATB SelfAttention PA_ENCODER ----------------------------------------------------------

struct Sa {
  Index batch = 1, nh = 1, nkv = 1, d = 1, dv = 1, tokens = 0;
  bool causal = false;
  std::vector<Index> seq;
  std::vector<float> q, k, v, o;
  attnref::SelfAttentionParams p;
  attnref::SelfAttentionInputs<float> in;
  StridedView<float, 3> out;
};

void build(Sa& c, fuzz::Rng& r) {
  using P = attnref::SelfAttentionParams;
  c.batch = r.range(1, 3);
  c.nkv = r.range(1, 3);
  c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24);
  c.dv = r.range(1, 24);
  for (Index b = 0; b < c.batch; ++b) c.seq.push_back(r.range(1, 9));
  for (Index l : c.seq) c.tokens += l;
  c.q = r.normals<float>(c.tokens * c.nh * c.d);
  c.k = r.normals<float>(c.tokens * c.nkv * c.d);
  c.v = r.normals<float>(c.tokens * c.nkv * c.dv);
  c.o.assign(static_cast<size_t>(c.tokens * c.nh * c.dv), 222.0f);
  c.causal = r.chance(0.5);
  c.p.num_heads = static_cast<int>(c.nh);
  c.p.num_kv_heads = static_cast<int>(c.nkv);
  c.p.calc_type = P::CalcType::PaEncoder;
  c.p.kernel_type = P::KernelType::HighPrecision;
  c.p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  c.p.mask_type = c.causal ? P::MaskType::CausalMask : P::MaskType::Undefined;
  c.in.query = StridedView<const float, 3>(c.q.data(), {c.tokens, c.nh, c.d});
  c.in.key = StridedView<const float, 3>(c.k.data(), {c.tokens, c.nkv, c.d});
  c.in.value = StridedView<const float, 3>(c.v.data(), {c.tokens, c.nkv, c.dv});
  c.in.seq_len = c.seq;
  c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
}

std::string verify_sa(const Sa& c) {
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.nh);
  pr.num_kv_heads = static_cast<int>(c.nkv);
  pr.head_size = static_cast<int>(c.d);
  pr.v_head_size = static_cast<int>(c.dv);
  pr.scale = c.p.qk_scale;
  pr.causal = c.causal ? ref::Causal::kTopLeft : ref::Causal::kNone;
  ref::Seqs q, k, v;
  Index t0 = 0;
  for (Index l : c.seq) {
    pr.q_len.push_back(static_cast<int>(l));
    pr.kv_len.push_back(static_cast<int>(l));
    q.emplace_back(c.q.begin() + t0 * c.nh * c.d, c.q.begin() + (t0 + l) * c.nh * c.d);
    k.emplace_back(c.k.begin() + t0 * c.nkv * c.d, c.k.begin() + (t0 + l) * c.nkv * c.d);
    v.emplace_back(c.v.begin() + t0 * c.nkv * c.dv, c.v.begin() + (t0 + l) * c.nkv * c.dv);
    t0 += l;
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  std::vector<double> w, got(c.o.begin(), c.o.end());
  for (const auto& s : want.o) w.insert(w.end(), s.begin(), s.end());
  return fuzz::compare(got, w, 2e-4);
}

using PS = fuzz::Perturbation<Sa>;

const std::vector<PS>& sa_perturbations() {
  using P = attnref::SelfAttentionParams;
  static const std::vector<PS> list{
      {"seq_len past the tokens", true,
       [](Sa& c, fuzz::Rng&) {
         c.in.seq_len.back() += 1;
         return true;
       }},
      {"seq_len negative", true,
       [](Sa& c, fuzz::Rng&) {
         c.in.seq_len[0] = -1;
         return true;
       }},
      {"num_heads mismatch", true,
       [](Sa& c, fuzz::Rng&) {
         c.p.num_heads = static_cast<int>(c.nh + c.nkv);
         return true;
       }},
      {"key null", true,
       [](Sa& c, fuzz::Rng&) {
         c.in.key = StridedView<const float, 3>(nullptr, {c.tokens, c.nkv, c.d});
         return true;
       }},
      {"value size overflows", true,
       [](Sa& c, fuzz::Rng&) {
         c.in.value = StridedView<const float, 3>(c.v.data(), {kHuge, kHuge, c.dv}, {0, 0, 1});
         return true;
       }},
      {"out heads mismatch", true,
       [](Sa& c, fuzz::Rng&) {
         if (c.nh < 2) return false;
         c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh - 1, c.dv});
         return true;
       }},
      {"Norm mask missing", true,
       [](Sa& c, fuzz::Rng&) {
         c.p.mask_type = P::MaskType::Norm;
         return true;
       }},
      {"qk_scale NaN", true,
       [](Sa& c, fuzz::Rng&) {
         c.p.qk_scale = std::numeric_limits<float>::quiet_NaN();
         return true;
       }},
      {"logN with the default kernel", true,
       [](Sa& c, fuzz::Rng&) {
         c.p.scale_type = P::ScaleType::LogN;
         c.p.kernel_type = P::KernelType::Default;
         return true;
       }},
      {"out overlaps the value", true,
       [](Sa& c, fuzz::Rng&) {
         if (c.v.size() < c.o.size()) return false;
         c.out = StridedView<float, 3>(c.v.data(), {c.tokens, c.nh, c.dv});
         return true;
       }},
  };
  return list;
}

void validate_only(Sa& c) {
  attnref::validate(c.p, c.in, attnref::SelfAttentionOutputs<float>{c.out});
}

void run_sa(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, sa_perturbations(), build, fuzz::Named{"self_attention"},
      [seed](Sa& c) {
        attnref::self_attention(c.p, c.in, attnref::SelfAttentionOutputs<float>{c.out},
                                {static_cast<int>(seed % 2 + 1)});
      },
      verify_sa, &Sa::q, &Sa::k, &Sa::v, &Sa::o);
}

const fuzz::Register reg_sa("self_attention", run_sa);

}  // namespace fuzz_ifa_sa

// ---- NsaCompress ---------------------------------------------------------------------------

namespace fuzz_nsa_compress {

using attnref::StridedView;
using fuzz::Index;

struct Nc {
  Index T = 0, N = 1, D = 1, l = 1, d = 1;
  std::vector<std::int64_t> cu;
  std::vector<float> x, w, o;
  attnref::NsaCompressParams p;
  StridedView<const float> input, weight;
  StridedView<float> out;
};

Index count(Index len, Index l, Index d) { return len < l ? 0 : (len - l) / d + 1; }

void build(Nc& c, fuzz::Rng& r) {
  c.p.strict = false;
  c.d = r.range(1, 6);
  c.l = c.d + r.range(0, 6);
  c.N = r.range(1, 3);
  c.D = r.range(1, 16);
  const Index B = r.range(1, 3);
  Index total = 0;
  for (Index b = 0; b < B; ++b) {
    const Index len = r.range(0, 30);
    c.T += len;
    c.cu.push_back(c.T);
    total += count(len, c.l, c.d);
  }
  c.x = r.normals<float>(c.T * c.N * c.D);
  c.w = r.normals<float>(c.l * c.N);
  c.o.assign(static_cast<size_t>(total * c.N * c.D), 111.0f);
  c.p.compress_block_size = c.l;
  c.p.compress_stride = c.d;
  c.input = StridedView<const float>(c.x.data(), {c.T, c.N, c.D});
  c.weight = StridedView<const float>(c.w.data(), {c.l, c.N});
  c.out = StridedView<float>(c.o.data(), {total, c.N, c.D});
}

std::string verify_nc(const Nc& c) {
  std::vector<double> want;
  Index start = 0;
  for (std::int64_t end : c.cu) {
    for (Index i = 0; i < count(end - start, c.l, c.d); ++i)
      for (Index n = 0; n < c.N; ++n)
        for (Index e = 0; e < c.D; ++e) {
          double acc = 0;
          for (Index j = 0; j < c.l; ++j)
            acc += double(c.w[static_cast<size_t>(j * c.N + n)]) *
                   c.x[static_cast<size_t>(((start + i * c.d + j) * c.N + n) * c.D + e)];
          want.push_back(acc);
        }
    start = end;
  }
  return fuzz::compare(std::vector<double>(c.o.begin(), c.o.end()), want, 1e-5);
}

using PN = fuzz::Perturbation<Nc>;

const std::vector<PN>& perturbations() {
  static const std::vector<PN> list{
      {"weight shape mismatch", true,
       [](Nc& c, fuzz::Rng&) {
         c.weight = support::reshaped(c.weight, {c.l + 1, c.N});
         c.w.resize(c.w.size() + static_cast<size_t>(c.N));
         c.weight = support::with_data(c.weight, c.w.data());
         return true;
       }},
      {"act_seq_len not cumulative", true,
       [](Nc& c, fuzz::Rng&) {
         if (c.cu.size() < 2 || c.cu[0] == 0) return false;
         c.cu[1] = c.cu[0] - 1;
         return true;
       }},
      {"act_seq_len short of the tokens", true,
       [](Nc& c, fuzz::Rng&) {
         if (c.T == 0) return false;
         c.cu.back() -= 1;
         return true;
       }},
      {"act_seq_len empty", true,
       [](Nc& c, fuzz::Rng&) {
         c.cu.clear();
         return true;
       }},
      {"stride above the block size", true,
       [](Nc& c, fuzz::Rng&) {
         c.p.compress_stride = c.l + 1;
         return true;
       }},
      {"input null", true,
       [](Nc& c, fuzz::Rng&) {
         if (c.T == 0) return false;
         c.input = support::with_data(c.input, nullptr);
         return true;
       }},
      {"input size overflows", true,
       [](Nc& c, fuzz::Rng&) {
         c.input = support::reshaped(c.input, {fuzz::kHuge, fuzz::kHuge, c.D});
         return true;
       }},
      {"output rows mismatch", true,
       [](Nc& c, fuzz::Rng&) {
         c.out = support::resized(c.out, 0, c.out.size(0) + (1));
         c.o.resize(c.o.size() + static_cast<size_t>(c.N * c.D), 111.0f);
         c.out = support::with_data(c.out, c.o.data());
         return true;
       }},
      {"output overlaps the input", true,
       [](Nc& c, fuzz::Rng&) {
         if (c.o.empty() || c.x.size() < c.o.size()) return false;
         c.out = support::with_data(c.out, c.x.data());
         return true;
       }},
  };
  return list;
}

void restride_inputs(Nc& c, support::Restrider& r) {
  r("input", c.input);
  r("weight", c.weight);
}

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"nsa_compress"},
      [](Nc& c) { attnref::nsa_compress(c.p, c.input, c.weight, c.cu, c.out); }, verify_nc, &Nc::x,
      &Nc::w, &Nc::o);
}

const fuzz::Register reg("nsa_compress", run);

}  // namespace fuzz_nsa_compress
