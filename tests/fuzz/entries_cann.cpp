// Fuzz entries "prompt_flash_attention" (BSH / BSND / BNSD / TND, fp16, actual lengths, GQA)
// against the naive reference, and "mla_decode" (the absorbed latent attention over a shuffled
// paged cache). "incre_flash_attention" is in entries_ifa_sa.cpp.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/naive_attention.hpp"
#include "support/views.hpp"

namespace fuzz_cann {

using attnref::half;
using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;

std::vector<half> halves(fuzz::Rng& r, Index n) {
  std::vector<half> x(static_cast<size_t>(n));
  for (half& e : x) e = half(r.normal());
  return x;
}

// ---- PromptFlashAttention -----------------------------------------------------------------

struct Pfa {
  std::string layout;
  Index B = 1, S1 = 1, S2 = 1, N = 1, KVN = 1, D = 1, Dv = 1;
  std::vector<Index> q_len, kv_len;  // per batch
  std::vector<half> q, k, v, o;
  std::vector<std::uint8_t> mask;
  attnref::PromptFlashAttentionParams p;
  attnref::PromptFlashAttentionInputs<half> in;
  StridedView<half> out;
};

// The vendor shape of a (B, S, heads, width) tensor in the layout (TND: S = total tokens).
std::vector<Index> shape(const std::string& layout, Index B, Index S, Index n, Index w) {
  if (layout == "BSH") return {B, S, n * w};
  if (layout == "BNSD") return {B, n, S, w};
  if (layout == "TND") return {S, n, w};
  return {B, S, n, w};
}

// Offset of element (b, s, h, e) in that layout (TND: s is the global token).
Index offset(const Pfa& c, Index b, Index s, Index h, Index e, Index S, Index n, Index w) {
  if (c.layout == "BNSD") return ((b * n + h) * S + s) * w + e;
  if (c.layout == "TND") return (s * n + h) * w + e;
  return ((b * S + s) * n + h) * w + e;
}

void build(Pfa& c, fuzz::Rng& r) {
  const char* layouts[] = {"BSH", "BSND", "BNSD", "TND"};
  c.layout = layouts[r.range(0, 3)];
  const bool tnd = c.layout == "TND";
  c.B = r.range(1, 3);
  c.KVN = r.range(1, 2);
  c.N = c.KVN * r.range(1, 3);
  c.D = r.range(1, 24);
  c.Dv = c.layout == "BSH" ? c.D : r.range(1, 24);  // BSH: H = N * D for q, k and v alike
  for (Index b = 0; b < c.B; ++b) {
    c.q_len.push_back(r.range(tnd ? 0 : 1, 6));
    c.kv_len.push_back(r.range(tnd ? 0 : 1, 20));
  }
  Index sq = 0, skv = 0;
  for (Index b = 0; b < c.B; ++b) {
    sq = tnd ? sq + c.q_len[static_cast<size_t>(b)] : std::max(sq, c.q_len[static_cast<size_t>(b)]);
    skv = tnd ? skv + c.kv_len[static_cast<size_t>(b)]
              : std::max(skv, c.kv_len[static_cast<size_t>(b)]);
  }
  c.S1 = tnd ? sq : sq + r.range(0, 1);
  c.S2 = tnd ? skv : skv + r.range(0, 1);
  const Index bb = tnd ? 1 : c.B;
  c.q = halves(r, bb * c.S1 * c.N * c.D);
  c.k = halves(r, bb * c.S2 * c.KVN * c.D);
  c.v = halves(r, bb * c.S2 * c.KVN * c.Dv);
  c.o.assign(static_cast<size_t>(bb * c.S1 * c.N * c.Dv), half(555.0f));
  c.p.num_heads = c.N;
  c.p.num_key_value_heads = c.KVN;
  c.p.input_layout = c.layout;
  c.p.scale_value = 1.0 / std::sqrt(static_cast<double>(c.D));
  c.in.query = StridedView<const half>(c.q.data(), shape(c.layout, c.B, c.S1, c.N, c.D));
  c.in.key = StridedView<const half>(c.k.data(), shape(c.layout, c.B, c.S2, c.KVN, c.D));
  c.in.value = StridedView<const half>(c.v.data(), shape(c.layout, c.B, c.S2, c.KVN, c.Dv));
  c.out = StridedView<half>(c.o.data(), shape(c.layout, c.B, c.S1, c.N, c.Dv));
  if (tnd || r.chance(0.5)) {
    std::int64_t qa = 0, ka = 0;
    for (Index b = 0; b < c.B; ++b) {
      qa = tnd ? qa + c.q_len[static_cast<size_t>(b)] : c.q_len[static_cast<size_t>(b)];
      ka = tnd ? ka + c.kv_len[static_cast<size_t>(b)] : c.kv_len[static_cast<size_t>(b)];
      c.in.actual_seq_lengths.push_back(qa);
      c.in.actual_seq_lengths_kv.push_back(ka);
    }
  } else {  // no lengths: every batch spans the extents
    c.q_len.assign(static_cast<size_t>(c.B), c.S1);
    c.kv_len.assign(static_cast<size_t>(c.B), c.S2);
  }
}

std::string verify_pfa(const Pfa& c) {
  const bool tnd = c.layout == "TND";
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.KVN);
  pr.head_size = static_cast<int>(c.D);
  pr.v_head_size = static_cast<int>(c.Dv);
  pr.scale = c.p.scale_value;
  ref::Seqs q, k, v;
  Index q0 = 0, k0 = 0;
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[static_cast<size_t>(b)], lk = c.kv_len[static_cast<size_t>(b)];
    pr.q_len.push_back(static_cast<int>(lq));
    pr.kv_len.push_back(static_cast<int>(lk));
    q.emplace_back();
    k.emplace_back();
    v.emplace_back();
    for (Index s = 0; s < lq; ++s)
      for (Index h = 0; h < c.N; ++h)
        for (Index e = 0; e < c.D; ++e)
          q.back().push_back(static_cast<float>(
              c.q[static_cast<size_t>(offset(c, b, (tnd ? q0 : 0) + s, h, e, c.S1, c.N, c.D))]));
    for (Index s = 0; s < lk; ++s)
      for (Index h = 0; h < c.KVN; ++h) {
        for (Index e = 0; e < c.D; ++e)
          k.back().push_back(static_cast<float>(
              c.k[static_cast<size_t>(offset(c, b, (tnd ? k0 : 0) + s, h, e, c.S2, c.KVN, c.D))]));
        for (Index e = 0; e < c.Dv; ++e)
          v.back().push_back(static_cast<float>(
              c.v[static_cast<size_t>(offset(c, b, (tnd ? k0 : 0) + s, h, e, c.S2, c.KVN, c.Dv))]));
      }
    q0 += lq;
    k0 += lk;
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  q0 = 0;
  for (Index b = 0; b < c.B; ++b) {
    const Index lq = c.q_len[static_cast<size_t>(b)];
    for (Index s = 0; s < (tnd ? lq : c.S1); ++s)
      for (Index h = 0; h < c.N; ++h) {
        std::vector<double> got, w;
        for (Index e = 0; e < c.Dv; ++e) {
          got.push_back(static_cast<float>(
              c.o[static_cast<size_t>(offset(c, b, (tnd ? q0 : 0) + s, h, e, c.S1, c.N, c.Dv))]));
          // rows past a batch's length are 0 (the vendor's padded rows)
          w.push_back(
              s < lq ? want.o[static_cast<size_t>(b)][static_cast<size_t>((s * c.N + h) * c.Dv + e)]
                     : 0.0);
        }
        const std::string m = fuzz::compare(got, w, 3e-3);
        if (!m.empty())
          return "batch " + std::to_string(b) + " row " + std::to_string(s) + ": " + m;
      }
    q0 += lq;
  }
  return "";
}

using PP = fuzz::Perturbation<Pfa>;

const std::vector<PP>& pfa_perturbations() {
  static const std::vector<PP> list{
      {"query dim negative", true,
       [](Pfa& c, fuzz::Rng&) {
         c.in.query = support::resized(c.in.query, 0, -c.in.query.size(0) - 1);
         return true;
       }},
      {"atten_mask size overflows", true,
       [](Pfa& c, fuzz::Rng&) {
         c.mask.assign(1, 0);
         c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {kHuge, kHuge});
         return true;
       }},
      {"atten_mask rank 4 with S1 of 1", true,
       [](Pfa& c, fuzz::Rng&) {  // [1, 1, 1, S2] covers one query row only
         if (c.S1 < 2 || c.layout == "TND") return false;
         c.mask.assign(static_cast<size_t>(c.S2), 0);
         c.in.atten_mask = StridedView<const std::uint8_t>(c.mask.data(), {1, 1, 1, c.S2});
         return true;
       }},
      {"key null", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.k.empty()) return false;
         c.in.key = support::with_data(c.in.key, nullptr);
         return true;
       }},
      {"unknown layout", true,
       [](Pfa& c, fuzz::Rng&) {
         c.p.input_layout = "SBH";
         return true;
       }},
      {"num_heads mismatch", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.layout == "BSH") return false;  // BSH: another head count is another D
         c.p.num_heads = c.N + c.KVN;
         return true;
       }},
      {"num_key_value_heads not dividing", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.N < 2 || c.N % (c.N - 1) == 0) return false;
         c.p.num_key_value_heads = c.N - 1;
         return true;
       }},
      {"sparse_mode out of range", true,
       [](Pfa& c, fuzz::Rng& r) {
         c.p.sparse_mode = r.chance(0.5) ? 5 : -1;
         return true;
       }},
      {"inner_precise out of range", true,
       [](Pfa& c, fuzz::Rng&) {
         c.p.inner_precise = 4;
         return true;
       }},
      {"scale_value NaN", true,
       [](Pfa& c, fuzz::Rng&) {
         c.p.scale_value = std::numeric_limits<double>::quiet_NaN();
         return true;
       }},
      {"actual_seq_lengths past S1", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.in.actual_seq_lengths.empty() || c.layout == "TND") return false;
         c.in.actual_seq_lengths[0] = c.S1 + 1;
         return true;
       }},
      {"actual_seq_lengths negative", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.in.actual_seq_lengths.empty()) return false;
         c.in.actual_seq_lengths_kv[0] = -3;
         return true;
       }},
      {"output shape mismatch", true,
       [](Pfa& c, fuzz::Rng&) {
         c.out = support::resized(c.out, c.out.rank() - 1, c.out.shape().back() + 1);
         c.o.resize(c.o.size() * 2, half(555.0f));  // room for the claimed shape
         c.out = support::with_data(c.out, c.o.data());
         return true;
       }},
      {"value batch mismatch", true,
       [](Pfa& c, fuzz::Rng&) {
         if (c.layout == "TND" || c.B < 2) return false;
         c.in.value = support::resized(c.in.value, 0, c.B - 1);
         return true;
       }},
  };
  return list;
}

void restride_inputs(Pfa& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Pfa& c) {
  attnref::validate(c.p, c.in, attnref::PromptFlashAttentionOutputs<half>{c.out});
}

void run_pfa(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, pfa_perturbations(), build, fuzz::Named{"prompt_flash_attention"},
      [seed](Pfa& c) {
        attnref::prompt_flash_attention(c.p, c.in,
                                        attnref::PromptFlashAttentionOutputs<half>{c.out},
                                        {static_cast<int>(seed % 2 + 1)});
      },
      verify_pfa, &Pfa::q, &Pfa::k, &Pfa::v, &Pfa::o, &Pfa::mask);
}

const fuzz::Register reg_pfa("prompt_flash_attention", run_pfa);

// ---- MLA decode ---------------------------------------------------------------------------

struct Mla {
  Index B = 1, H = 1, C = 1, R = 0, bs = 1, blocks = 1, maxb = 1;
  std::vector<float> q, cache, o;
  std::vector<std::int32_t> table;
  attnref::MlaDecodeParams p;
  attnref::MlaDecodeInputs<float> in;
  StridedView<float> out;
};

void build(Mla& c, fuzz::Rng& r) {
  c.B = r.range(1, 3);
  c.H = r.range(1, 4);
  c.C = r.range(1, 24);
  c.R = r.range(0, 8);
  c.bs = r.range(1, 8);
  for (Index b = 0; b < c.B; ++b) c.in.context_lens.push_back(r.range(0, 30));
  for (Index l : c.in.context_lens) c.maxb = std::max(c.maxb, (l + c.bs - 1) / c.bs);
  c.blocks = c.B * c.maxb + 1;
  const Index W = c.C + c.R;
  c.q = r.normals<float>(c.B * c.H * W);
  c.cache = r.normals<float>(c.blocks * c.bs * W);
  c.o.assign(static_cast<size_t>(c.B * c.H * c.C), 333.0f);
  std::vector<std::int32_t> ids(static_cast<size_t>(c.blocks));
  for (Index i = 0; i < c.blocks; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(static_cast<size_t>(c.B * c.maxb), -1);
  Index next = 0;
  for (Index b = 0; b < c.B; ++b)
    for (Index j = 0; j * c.bs < c.in.context_lens[static_cast<size_t>(b)]; ++j)
      c.table[static_cast<size_t>(b * c.maxb + j)] = ids[static_cast<size_t>(next++)];
  c.p.kv_lora_rank = c.C;
  c.p.rope_dim = c.R;
  c.p.scale = 1.0 / std::sqrt(static_cast<double>(W));
  c.in.q = StridedView<const float>(c.q.data(), {c.B, c.H, W});
  c.in.kv_cache = StridedView<const float>(c.cache.data(), {c.blocks, c.bs, 1, W});
  c.in.block_table = StridedView<const std::int32_t>(c.table.data(), {c.B, c.maxb});
  c.out = StridedView<float>(c.o.data(), {c.B, c.H, c.C});
}

std::string verify_mla(const Mla& c) {  // one latent kv head: K = the whole row, V = its first C
  const Index W = c.C + c.R;
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.H);
  pr.head_size = static_cast<int>(W);
  pr.v_head_size = static_cast<int>(c.C);
  pr.scale = c.p.scale;
  ref::Seqs q, k, v;
  for (Index b = 0; b < c.B; ++b) {
    const Index len = c.in.context_lens[static_cast<size_t>(b)];
    pr.q_len.push_back(1);
    pr.kv_len.push_back(static_cast<int>(len));
    q.emplace_back(c.q.begin() + b * c.H * W, c.q.begin() + (b + 1) * c.H * W);
    k.emplace_back();
    v.emplace_back();
    for (Index t = 0; t < len; ++t) {
      const auto row = c.cache.begin() +
                       (c.table[static_cast<size_t>(b * c.maxb + t / c.bs)] * c.bs + t % c.bs) * W;
      k.back().insert(k.back().end(), row, row + W);
      v.back().insert(v.back().end(), row, row + c.C);
    }
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  std::vector<double> w, got(c.o.begin(), c.o.end());
  for (const auto& s : want.o) w.insert(w.end(), s.begin(), s.end());
  return fuzz::compare(got, w, 2e-4);
}

using PM = fuzz::Perturbation<Mla>;

const std::vector<PM>& mla_perturbations() {
  static const std::vector<PM> list{
      {"kv_cache null", true,
       [](Mla& c, fuzz::Rng&) {
         c.in.kv_cache = support::with_data(c.in.kv_cache, nullptr);
         return true;
       }},
      {"block table entry out of range", true,
       [](Mla& c, fuzz::Rng& r) {
         const Index b = r.range(0, c.B - 1);
         if (c.in.context_lens[static_cast<size_t>(b)] == 0) return false;
         c.table[static_cast<size_t>(b * c.maxb)] =
             r.chance(0.5) ? -1 : static_cast<std::int32_t>(c.blocks);
         return true;
       }},
      {"context_lens past the table", true,
       [](Mla& c, fuzz::Rng&) {
         c.in.context_lens[0] = c.maxb * c.bs + 1;
         return true;
       }},
      {"kv_lora_rank + rope_dim overflows", true,
       [](Mla& c, fuzz::Rng&) {
         c.p.kv_lora_rank = std::numeric_limits<Index>::max() - 1;
         return true;
       }},
      {"rope_dim negative", true,
       [](Mla& c, fuzz::Rng&) {
         c.p.rope_dim = -1;
         return true;
       }},
      {"block table size overflows", true,
       [](Mla& c, fuzz::Rng&) {
         c.in.block_table = support::reshaped(c.in.block_table, {c.B, Index(1) << 61});
         return true;
       }},
      {"out shape mismatch", true,
       [](Mla& c, fuzz::Rng&) {
         if (c.C < 2) return false;
         c.out = support::reshaped(c.out, {c.B, c.H, c.C - 1});
         return true;
       }},
      {"scale NaN", true,
       [](Mla& c, fuzz::Rng&) {
         c.p.scale = std::numeric_limits<double>::quiet_NaN();
         return true;
       }},
  };
  return list;
}

void restride_inputs(Mla& c, support::Restrider& r) { c.in.for_each_view(r); }

void validate_only(Mla& c) {
  attnref::validate(c.p, c.in, attnref::MlaDecodeOutputs<float>{c.out});
}

void run_mla(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, mla_perturbations(), build, fuzz::Named{"mla_decode"},
      [seed](Mla& c) { attnref::mla_decode(c.p, c.in, {c.out}, {static_cast<int>(seed % 2 + 1)}); },
      verify_mla, &Mla::q, &Mla::cache, &Mla::o, &Mla::table);
}

const fuzz::Register reg_mla("mla_decode", run_mla);

}  // namespace fuzz_cann
