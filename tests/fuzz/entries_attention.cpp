// Fuzz entry "attention": the engine's public entry point over padded BSND, packed TND and paged
// K/V, with causal modes, windows and boolean masks; checked against the naive reference.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"
#include "reference/naive_attention.hpp"

namespace fuzz_attention {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;

constexpr float kSentinel = 12345.0f;

struct Config {
  Index B = 1, N = 1, Nkv = 1, D = 1, Dv = 1, bs = 1, nblocks = 0, maxb = 0;
  int mode = 0;  // 0 padded BSND, 1 packed TND, 2 paged
  std::vector<Index> qlen, kvlen;
  std::vector<float> q, k, v, o, lse;
  std::vector<std::uint8_t> mask;
  std::vector<std::int32_t> table;
  attnref::AttentionInputs<float> in;
  attnref::AttentionParams p;
  attnref::AttentionOutputs<float> out;
  attnref::ExecConfig x;
  bool scale_rule = false;  // a huge scale: rows may be NaN (the overflow rule)
};

Index sum(const std::vector<Index>& x) {
  Index s = 0;
  for (Index e : x) s += e;
  return s;
}
Index max_of(const std::vector<Index>& x) {
  Index s = 0;
  for (Index e : x) s = std::max(s, e);
  return s;
}
std::vector<Index> cumulative(const std::vector<Index>& x) {
  std::vector<Index> cu{0};
  for (Index e : x) cu.push_back(cu.back() + e);
  return cu;
}

void build(Config& c, fuzz::Rng& r) {
  c.B = r.range(1, 3);
  c.Nkv = r.range(1, 3);
  c.N = c.Nkv * r.range(1, 3);
  c.D = r.range(1, 20);
  c.Dv = r.range(1, 20);
  c.mode = static_cast<int>(r.range(0, 2));
  for (Index b = 0; b < c.B; ++b) {
    c.qlen.push_back(r.range(c.mode == 2 ? 1 : 0, 6));
    c.kvlen.push_back(r.range(0, 30));
  }
  const Index Sq = c.mode == 1 ? sum(c.qlen) : max_of(c.qlen) + r.range(0, 1);
  const Index Skv = c.mode == 1 ? sum(c.kvlen) : max_of(c.kvlen) + r.range(0, 1);
  const Index qb = c.mode == 1 ? 1 : c.B;
  c.q = r.normals<float>(qb * Sq * c.N * c.D);
  c.o.assign(static_cast<size_t>(qb * Sq * c.N * c.Dv), kSentinel);
  c.lse.assign(static_cast<size_t>(qb * c.N * Sq), kSentinel);
  c.in.q = attnref::bsnd_view<const float>(c.q.data(), qb, Sq, c.N, c.D);
  c.out.o = attnref::bsnd_view(c.o.data(), qb, Sq, c.N, c.Dv);
  c.out.lse = StridedView<float, 3>(c.lse.data(), {qb, c.N, Sq});
  if (c.mode == 2) {
    c.bs = r.range(1, 8);
    for (Index l : c.kvlen) c.maxb = std::max(c.maxb, (l + c.bs - 1) / c.bs);
    c.maxb += 1;
    c.nblocks = c.B * c.maxb + 1;
    c.k = r.normals<float>(c.nblocks * c.bs * c.Nkv * c.D);
    c.v = r.normals<float>(c.nblocks * c.bs * c.Nkv * c.Dv);
    std::vector<std::int32_t> ids(static_cast<size_t>(c.nblocks));
    for (Index i = 0; i < c.nblocks; ++i)
      ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
    std::shuffle(ids.begin(), ids.end(), r.g);
    c.table.assign(static_cast<size_t>(c.B * c.maxb), -1);
    Index next = 0;
    for (Index b = 0; b < c.B; ++b)
      for (Index j = 0; j * c.bs < c.kvlen[static_cast<size_t>(b)]; ++j)
        c.table[static_cast<size_t>(b * c.maxb + j)] = ids[static_cast<size_t>(next++)];
    c.in.k = StridedView<const float, 4>(c.k.data(), {c.nblocks, c.bs, c.Nkv, c.D});
    c.in.v = StridedView<const float, 4>(c.v.data(), {c.nblocks, c.bs, c.Nkv, c.Dv});
    c.in.block_table = StridedView<const std::int32_t, 2>(c.table.data(), {c.B, c.maxb});
  } else {
    const Index kb = c.mode == 1 ? 1 : c.B;
    c.k = r.normals<float>(kb * Skv * c.Nkv * c.D);
    c.v = r.normals<float>(kb * Skv * c.Nkv * c.Dv);
    c.in.k = attnref::bsnd_view<const float>(c.k.data(), kb, Skv, c.Nkv, c.D);
    c.in.v = attnref::bsnd_view<const float>(c.v.data(), kb, Skv, c.Nkv, c.Dv);
  }
  if (c.mode == 1) {
    c.in.seq.q_cu = cumulative(c.qlen);
    c.in.seq.kv_cu = cumulative(c.kvlen);
  } else {
    c.in.seq.q = c.qlen;
    c.in.seq.kv = c.kvlen;
  }
  c.p.scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const int causal = static_cast<int>(r.range(0, 2));
  c.p.causal = causal == 0   ? attnref::CausalMode::None
               : causal == 1 ? attnref::CausalMode::TopLeft
                             : attnref::CausalMode::BottomRight;
  if (causal != 0 && r.chance(0.4)) c.p.window = r.range(1, 8);
  if (r.chance(0.3)) c.x.kv_tile = r.range(1, 16);
  if (r.chance(0.3)) c.x.kv_split = r.range(1, 12);
  c.x.threads = static_cast<int>(r.range(1, 2));
  if (c.mode != 1 && r.chance(0.3)) {
    const Index mq = max_of(c.qlen), mk = max_of(c.kvlen);
    c.mask.resize(static_cast<size_t>(c.B * mq * mk));
    for (auto& e : c.mask) e = r.chance(0.25) ? 1 : 0;
    c.in.mask_bool = StridedView<const std::uint8_t, 4>(c.mask.data(), {c.B, 1, mq, mk});
  }
}

// Sequence b's tokens as the reference wants them, read from the buffers by the layout built
// above (not through attnref's views).
std::vector<double> gather(const Config& c, const std::vector<float>& x, Index b, bool is_q,
                           Index width) {
  const Index len = is_q ? c.qlen[static_cast<size_t>(b)] : c.kvlen[static_cast<size_t>(b)];
  const Index heads = is_q ? c.N : c.Nkv;
  const Index row = heads * width;
  std::vector<double> out;
  for (Index t = 0; t < len; ++t) {
    Index base;
    if (!is_q && c.mode == 2) {
      const Index blk = c.table[static_cast<size_t>(b * c.maxb + t / c.bs)];
      base = (blk * c.bs + t % c.bs) * row;
    } else if (c.mode == 1) {
      base = (cumulative(is_q ? c.qlen : c.kvlen)[static_cast<size_t>(b)] + t) * row;
    } else {
      const Index S = is_q ? c.in.q.size(1) : c.in.k.size(1);
      base = (b * S + t) * row;
    }
    for (Index e = 0; e < row; ++e) out.push_back(x[static_cast<size_t>(base + e)]);
  }
  return out;
}

std::string verify(const Config& c) {
  ref::Problem pr;
  pr.num_heads = static_cast<int>(c.N);
  pr.num_kv_heads = static_cast<int>(c.Nkv);
  pr.head_size = static_cast<int>(c.D);
  pr.v_head_size = static_cast<int>(c.Dv);
  for (Index b = 0; b < c.B; ++b) {
    pr.q_len.push_back(static_cast<int>(c.qlen[static_cast<size_t>(b)]));
    pr.kv_len.push_back(static_cast<int>(c.kvlen[static_cast<size_t>(b)]));
  }
  pr.scale = c.p.scale;
  pr.causal = c.p.causal == attnref::CausalMode::None      ? ref::Causal::kNone
              : c.p.causal == attnref::CausalMode::TopLeft ? ref::Causal::kTopLeft
                                                           : ref::Causal::kBottomRight;
  pr.window = static_cast<int>(c.p.window);
  if (!c.mask.empty()) {
    const Index mq = c.in.mask_bool.size(2), mk = c.in.mask_bool.size(3);
    pr.hidden = [&c, mq, mk](int b, int, int i, int j) {
      return c.mask[static_cast<size_t>((b * mq + i) * mk + j)] != 0;
    };
  }
  ref::Seqs q, k, v;
  for (Index b = 0; b < c.B; ++b) {
    q.push_back(gather(c, c.q, b, true, c.D));
    k.push_back(gather(c, c.k, b, false, c.D));
    v.push_back(gather(c, c.v, b, false, c.Dv));
  }
  const ref::Result want = ref::attention(pr, q, k, v);
  const Index S = c.in.q.size(1);
  const std::vector<Index> qcu = cumulative(c.qlen);
  for (Index b = 0; b < c.B; ++b) {
    const Index len = c.qlen[static_cast<size_t>(b)];
    for (Index i = 0; i < (c.mode == 1 ? len : S); ++i) {
      const Index tok = c.mode == 1 ? qcu[static_cast<size_t>(b)] + i : b * S + i;  // output row
      for (Index h = 0; h < c.N; ++h) {
        const float* row = &c.o[static_cast<size_t>((tok * c.N + h) * c.Dv)];
        if (i >= len) {  // padding rows are never written
          for (Index e = 0; e < c.Dv; ++e)
            if (row[e] != kSentinel) return "padding row written";
          continue;
        }
        std::vector<double> got(row, row + c.Dv), exp_row;
        for (Index e = 0; e < c.Dv; ++e)
          exp_row.push_back(
              want.o[static_cast<size_t>(b)][static_cast<size_t>((i * c.N + h) * c.Dv + e)]);
        if (c.scale_rule && std::isnan(got[0])) continue;
        const std::string m = fuzz::compare(got, exp_row, 2e-4);
        if (!m.empty()) return "o[" + std::to_string(b) + "][" + std::to_string(i) + "]: " + m;
      }
    }
  }
  return "";
}

using P = fuzz::Perturbation<Config>;

const std::vector<P>& perturbations() {
  static const std::vector<P> list{
      {"q.shape negative", true,
       [](Config& c, fuzz::Rng&) {
         auto s = c.in.q.shape();
         s[1] = -1;
         c.in.q = StridedView<const float, 4>(c.q.data(), s, c.in.q.strides());
         return true;
       }},
      {"k.shape overflows", true,
       [](Config& c, fuzz::Rng&) {
         c.in.k =
             StridedView<const float, 4>(c.k.data(), {kHuge, kHuge, c.Nkv, c.D}, {0, 0, c.D, 1});
         return true;
       }},
      {"v null data", true,
       [](Config& c, fuzz::Rng&) {
         if (c.in.v.numel() == 0) return false;
         c.in.v = StridedView<const float, 4>(nullptr, c.in.v.shape(), c.in.v.strides());
         return true;
       }},
      {"o.shape mismatch", true,
       [](Config& c, fuzz::Rng&) {
         if (c.Dv < 2) return false;
         auto s = c.out.o.shape();
         s[3] -= 1;
         c.out.o = StridedView<float, 4>(c.o.data(), s, c.out.o.strides());
         return true;
       }},
      {"seq.kv past the extent", true,
       [](Config& c, fuzz::Rng& r) {
         if (c.mode == 1) return false;
         const Index b = r.range(0, c.B - 1);
         c.in.seq.kv[static_cast<size_t>(b)] = c.mode == 2 ? c.maxb * c.bs + 1 : c.in.k.size(1) + 1;
         return true;
       }},
      {"seq.q negative", true,
       [](Config& c, fuzz::Rng& r) {
         if (c.mode == 1) return false;
         c.in.seq.q[static_cast<size_t>(r.range(0, c.B - 1))] = -1;
         return true;
       }},
      {"q_cu past the tokens", true,
       [](Config& c, fuzz::Rng&) {
         if (c.mode != 1) return false;
         c.in.seq.q_cu.back() = c.in.q.size(1) + 1;
         return true;
       }},
      {"kv_cu decreasing", true,
       [](Config& c, fuzz::Rng&) {
         if (c.mode != 1 || c.B < 2 || c.in.seq.kv_cu[1] == 0) return false;
         c.in.seq.kv_cu[1] = c.in.seq.kv_cu[2] + 1;
         return true;
       }},
      {"block table entry out of range", true,
       [](Config& c, fuzz::Rng& r) {
         if (c.mode != 2) return false;
         const Index b = r.range(0, c.B - 1);
         if (c.kvlen[static_cast<size_t>(b)] == 0) return false;
         c.table[static_cast<size_t>(b * c.maxb)] =
             r.chance(0.5) ? -1 : static_cast<std::int32_t>(c.nblocks + r.range(0, 3));
         return true;
       }},
      {"block table null", true,
       [](Config& c, fuzz::Rng&) {
         if (c.mode != 2) return false;
         c.in.block_table = StridedView<const std::int32_t, 2>(nullptr, {c.B, c.maxb});
         return true;
       }},
      {"block table span overflows", true,
       [](Config& c, fuzz::Rng&) {
         if (c.mode != 2) return false;
         c.in.block_table =
             StridedView<const std::int32_t, 2>(c.table.data(), {c.B, kHuge}, {0, kHuge});
         return true;
       }},
      {"scale NaN", true,
       [](Config& c, fuzz::Rng&) {
         c.p.scale = std::numeric_limits<double>::quiet_NaN();
         return true;
       }},
      {"window without causal", true,
       [](Config& c, fuzz::Rng&) {
         c.p.causal = attnref::CausalMode::None;
         c.p.window = 3;
         return true;
       }},
      {"negative window", true,
       [](Config& c, fuzz::Rng&) {
         c.p.window = -1;
         return true;
       }},
      {"negative tiles or threads", true,
       [](Config& c, fuzz::Rng& r) {
         if (r.chance(0.5))
           c.x.threads = -1;
         else
           c.x.kv_tile = -4;
         return true;
       }},
      {"mask narrower than the keys", true,
       [](Config& c, fuzz::Rng&) {
         if (c.mask.empty() || c.in.mask_bool.size(3) == 0) return false;
         auto s = c.in.mask_bool.shape();
         s[3] -= 1;
         c.in.mask_bool =
             StridedView<const std::uint8_t, 4>(c.mask.data(), s, c.in.mask_bool.strides());
         return true;
       }},
      {"o overlaps k", true,
       [](Config& c, fuzz::Rng&) {
         if (c.k.size() < c.o.size() || c.o.empty() || c.in.k.numel() == 0) return false;
         c.out.o = StridedView<float, 4>(c.k.data(), c.out.o.shape(), c.out.o.strides());
         return true;
       }},
      {"huge scale", false,
       [](Config& c, fuzz::Rng& r) {
         const double s[] = {1e30, -1e30, 1e38, -1e38, 1e300, -1e300};
         c.p.scale = s[r.range(0, 5)];
         c.scale_rule = true;
         return true;
       }},
      {"tiles longer than every sequence", false,
       [](Config& c, fuzz::Rng& r) {
         const Index big[] = {1000, Index{1} << 40, std::numeric_limits<Index>::max()};
         c.x.q_tile = big[r.range(0, 2)];
         c.x.kv_tile = big[r.range(0, 2)];
         c.x.kv_split = big[r.range(0, 2)];
         return true;
       }},
  };
  return list;
}

void validate_only(Config& c) { attnref::validate(c.in, c.p, c.out, c.x); }

void run(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, perturbations(), build, fuzz::Named{"attention"},
      [](Config& c) { attnref::attention(c.in, c.p, c.out, c.x); }, verify, &Config::q, &Config::k,
      &Config::v, &Config::o, &Config::lse, &Config::mask, &Config::table);
}

const fuzz::Register reg("attention", run);

}  // namespace fuzz_attention
