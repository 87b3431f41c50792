// Fuzz entries "reshape_and_cache" (ND and NZ caches) and "paged_attention" (ATB decode over a
// shuffled block pool: BSND or BNSD caches, compressType KVHEAD / KVHEAD_ROPE, packed rows of the
// sequences with keys), each against a plain-loop expectation written here.

#include <attnref/attnref.hpp>
#include <limits>

#include "fuzz/fuzz.hpp"

namespace fuzz_paged {

using attnref::StridedView;
using fuzz::Index;
using fuzz::kHuge;

// ---- ReshapeAndCache ----------------------------------------------------------------------

struct Rac {
  bool nz = false;
  Index tokens = 0, heads = 1, dk = 1, dv = 1, blocks = 1, bs = 1;
  std::vector<float> key, value, kc, vc;
  std::vector<std::int32_t> slots;
  attnref::ReshapeAndCacheInputs<float> in;
  StridedView<float, 4> kview, vview;
};

void build(Rac& c, fuzz::Rng& r) {
  c.nz = r.chance(0.4);
  c.tokens = r.range(0, 10);
  c.heads = r.range(1, 3);
  c.blocks = r.range(1, 5);
  if (c.nz) {  // C0 = 8 floats: kvHead * headSize a multiple of 8, blockSize a multiple of 16
    c.dk = 8 * r.range(1, 2);
    c.dv = 8 * r.range(1, 2);
    c.bs = 16 * r.range(1, 2);
  } else {
    c.dk = r.range(1, 16);
    c.dv = r.range(1, 16);
    c.bs = r.range(1, 8);
  }
  c.key = r.normals<float>(c.tokens * c.heads * c.dk);
  c.value = r.normals<float>(c.tokens * c.heads * c.dv);
  c.kc = r.normals<float>(c.blocks * c.bs * c.heads * c.dk);
  c.vc = r.normals<float>(c.blocks * c.bs * c.heads * c.dv);
  for (Index i = 0; i < c.tokens; ++i)
    c.slots.push_back(
        static_cast<std::int32_t>(r.chance(0.15) ? -1 : r.range(0, c.blocks * c.bs - 1)));
  c.in.key = StridedView<const float, 3>(c.key.data(), {c.tokens, c.heads, c.dk});
  c.in.value = StridedView<const float, 3>(c.value.data(), {c.tokens, c.heads, c.dv});
  c.in.slot_mapping = StridedView<const std::int32_t, 1>(c.slots.data(), {c.tokens});
  if (c.nz) {
    c.kview = StridedView<float, 4>(c.kc.data(), {c.blocks, c.heads * c.dk / 8, c.bs, 8});
    c.vview = StridedView<float, 4>(c.vc.data(), {c.blocks, c.heads * c.dv / 8, c.bs, 8});
  } else {
    c.kview = StridedView<float, 4>(c.kc.data(), {c.blocks, c.bs, c.heads, c.dk});
    c.vview = StridedView<float, 4>(c.vc.data(), {c.blocks, c.bs, c.heads, c.dv});
  }
}

// Where element e of head h of a token in `slot` lives in a cache of width d.
Index cache_at(const Rac& c, Index slot, Index h, Index e, Index d) {
  const Index blk = slot / c.bs, row = slot % c.bs;
  if (!c.nz) return ((blk * c.bs + row) * c.heads + h) * d + e;
  const Index x = h * d + e;  // FRACTAL_NZ: chunk x / 8 of the block, row, lane x % 8
  return ((blk * (c.heads * d / 8) + x / 8) * c.bs + row) * 8 + x % 8;
}

using PR = fuzz::Perturbation<Rac>;

const std::vector<PR>& rac_perturbations() {
  static const std::vector<PR> list{
      {"slot out of range", true,
       [](Rac& c, fuzz::Rng& r) {
         if (c.tokens == 0) return false;
         c.slots[static_cast<size_t>(r.range(0, c.tokens - 1))] =
             static_cast<std::int32_t>(c.blocks * c.bs + r.range(0, 5));
         return true;
       }},
      {"slot_mapping null", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.tokens == 0) return false;
         c.in.slot_mapping = StridedView<const std::int32_t, 1>(nullptr, {c.tokens});
         return true;
       }},
      {"key null", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.tokens == 0) return false;
         c.in.key = StridedView<const float, 3>(nullptr, c.in.key.shape());
         return true;
       }},
      {"numTokens negative", true,
       [](Rac& c, fuzz::Rng&) {
         c.in.key = StridedView<const float, 3>(c.key.data(), {-2, c.heads, c.dk},
                                                {c.heads * c.dk, c.dk, 1});
         c.in.slot_mapping = StridedView<const std::int32_t, 1>(c.slots.data(), {-2}, {1});
         return true;
       }},
      {"slot_mapping length mismatch", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.tokens == 0) return false;
         c.in.slot_mapping = StridedView<const std::int32_t, 1>(c.slots.data(), {c.tokens - 1});
         return true;
       }},
      {"value heads mismatch", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.heads < 2) return false;
         c.in.value = StridedView<const float, 3>(c.value.data(), {c.tokens, c.heads - 1, c.dv});
         return true;
       }},
      {"value without value cache", true,
       [](Rac& c, fuzz::Rng&) {
         c.vview = {};
         return true;
       }},
      {"cache size overflows", true,
       [](Rac& c, fuzz::Rng&) {
         auto s = c.kview.shape();
         s[0] = kHuge;
         s[c.nz ? 2 : 1] = kHuge;
         c.kview = StridedView<float, 4>(c.kc.data(), s, {0, 0, 0, 1});
         return true;
       }},
      {"caches overlap", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.kc.size() < c.vc.size() || c.vc.empty()) return false;
         c.vview = StridedView<float, 4>(c.kc.data(), c.vview.shape(), c.vview.strides());
         return true;
       }},
      {"cache overlaps the key", true,
       [](Rac& c, fuzz::Rng&) {
         if (c.key.size() < c.kc.size() || c.in.key.numel() == 0) return false;
         c.kview = StridedView<float, 4>(const_cast<float*>(c.key.data()), c.kview.shape(),
                                         c.kview.strides());
         return true;
       }},
      {"NZ block size not a multiple of 16", true,
       [](Rac& c, fuzz::Rng&) {
         if (!c.nz) return false;
         auto s = c.kview.shape();
         s[2] = 8;
         c.kview = StridedView<float, 4>(c.kc.data(), s);
         return true;
       }},
  };
  return list;
}

// The expected caches: the old contents with each token's rows copied in token order (a later
// token naming the same slot wins).
std::string verify_rac(const Rac& c, const std::vector<float>& kc0, const std::vector<float>& vc0) {
  auto kw = kc0, vw = vc0;
  for (Index i = 0; i < c.tokens; ++i) {
    const Index s = c.slots[static_cast<size_t>(i)];
    if (s < 0) continue;
    for (Index h = 0; h < c.heads; ++h) {
      for (Index e = 0; e < c.dk; ++e)
        kw[static_cast<size_t>(cache_at(c, s, h, e, c.dk))] =
            c.key[static_cast<size_t>((i * c.heads + h) * c.dk + e)];
      for (Index e = 0; e < c.dv; ++e)
        vw[static_cast<size_t>(cache_at(c, s, h, e, c.dv))] =
            c.value[static_cast<size_t>((i * c.heads + h) * c.dv + e)];
    }
  }
  return fuzz::same_bits(c.kc, kw) && fuzz::same_bits(c.vc, vw)
             ? std::string()
             : std::string("cache contents differ from the token-order copy");
}

void run_rac(fuzz::Run& run, std::uint64_t seed) {
  std::vector<float> kc0, vc0;  // the caches as built, for the expectation
  fuzz::run_case(
      run, seed, rac_perturbations(), build,
      [](const Rac& c) { return std::string(c.nz ? "reshape_and_cache_nz" : "reshape_and_cache"); },
      [&](Rac& c) {
        kc0 = c.kc;
        vc0 = c.vc;
        if (c.nz)
          attnref::reshape_and_cache_nz(c.in, c.kview, c.vview);
        else
          attnref::reshape_and_cache(c.in, c.kview, c.vview);
      },
      [&](const Rac& c) { return verify_rac(c, kc0, vc0); }, &Rac::key, &Rac::value, &Rac::kc,
      &Rac::vc, &Rac::slots);
}

const fuzz::Register reg_rac("reshape_and_cache", run_rac);

// ---- PagedAttention -----------------------------------------------------------------------
// Four forms: BSND caches, BNSD caches ([numBlocks, kvHeads, blockSize, D]), compressType KVHEAD
// and KVHEAD_ROPE (every (token, kv head) pair a sequence of its own over one-head caches; ROPE
// with a razor offset per cache slot). Contexts of length 0 take no query row (rows packed over
// the sequences with keys; compressType: the trailing pair rows stay untouched), sometimes with
// batchRunStatus 0 on them.

using PA = attnref::PagedAttentionParams;

struct Pa {
  int form = 0;  // 0 BSND, 1 BNSD, 2 KVHEAD, 3 KVHEAD_ROPE
  Index batch = 1, tokens = 1, nh = 1, nkv = 1, d = 1, dv = 1, bs = 1, blocks = 1, maxb = 1;
  Index ch = 1;  // the caches' kv heads (1 with compressType)
  std::vector<float> q, kc, vc, o, razor;
  std::vector<std::int32_t> table;
  PA p;
  attnref::PagedAttentionInputs<float> in;
  StridedView<float, 3> out;
  bool compress() const { return form >= 2; }
  Index rows() const { return compress() ? tokens * nkv : tokens; }  // the engine's rows
  Index row_heads() const { return compress() ? nh / nkv : nh; }
};

// Element e of kv head h of key row `row` (block * bs + offset) in a cache of width w.
Index pa_at(const Pa& c, Index row, Index h, Index e, Index w) {
  if (c.form != 1) return (row * c.ch + h) * w + e;
  return (((row / c.bs) * c.ch + h) * c.bs + row % c.bs) * w + e;  // BNSD
}

void build(Pa& c, fuzz::Rng& r) {
  c.form = static_cast<int>(r.range(0, 3));
  c.nkv = r.range(1, 3);
  c.nh = c.nkv * r.range(1, 3);
  c.d = r.range(1, 24);
  c.dv = c.form == 1 ? c.d : r.range(1, 24);
  c.bs = r.range(1, 8);
  c.ch = c.compress() ? 1 : c.nkv;
  const Index sequences = c.compress() ? (c.tokens = r.range(1, 3)) * c.nkv : r.range(1, 4);
  c.batch = sequences;
  for (Index b = 0; b < c.batch; ++b)
    c.in.context_lens.push_back(r.chance(0.25) ? 0 : r.range(1, 40));
  Index active = 0;
  for (Index l : c.in.context_lens) {
    c.maxb = std::max(c.maxb, (l + c.bs - 1) / c.bs);
    active += l > 0 ? 1 : 0;
  }
  if (!c.compress()) c.tokens = active;  // packed: one row per sequence with keys
  c.blocks = c.batch * c.maxb + 2;
  c.q = r.normals<float>(c.tokens * c.nh * c.d);
  c.kc = r.normals<float>(c.blocks * c.bs * c.ch * c.d);
  c.vc = r.normals<float>(c.blocks * c.bs * c.ch * c.dv);
  c.o.assign(static_cast<size_t>(c.tokens * c.nh * c.dv), 777.0f);
  std::vector<std::int32_t> ids(static_cast<size_t>(c.blocks));
  for (Index i = 0; i < c.blocks; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  c.table.assign(static_cast<size_t>(c.batch * c.maxb), -1);
  Index next = 0;
  for (Index b = 0; b < c.batch; ++b)
    for (Index j = 0; j * c.bs < c.in.context_lens[static_cast<size_t>(b)]; ++j)
      c.table[static_cast<size_t>(b * c.maxb + j)] = ids[static_cast<size_t>(next++)];
  c.p.num_heads = static_cast<std::int32_t>(c.nh);
  c.p.num_kv_heads = static_cast<std::int32_t>(c.nkv);
  c.p.qk_scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)));
  c.p.input_layout = c.form == 1 ? PA::InputLayout::BNSD : PA::InputLayout::BSND;
  c.p.compress_type = c.form == 2   ? PA::CompressType::KvHead
                      : c.form == 3 ? PA::CompressType::KvHeadRope
                                    : PA::CompressType::Undefined;
  if (c.form != 3 && r.chance(0.3)) {  // batchRunStatus: 0 only where the context is 0
    c.p.batch_run_status_enable = true;
    for (Index l : c.in.context_lens)
      c.in.batch_run_status.push_back(l == 0 && r.chance(0.7) ? 0 : 1);
  }
  if (c.form == 3) {
    c.razor.assign(static_cast<size_t>(c.blocks * c.bs), 0.0f);
    for (float& x : c.razor)
      if (r.chance(0.8)) x = 20.0f * static_cast<float>(r.range(0, 1000)) / 1000.0f;
    c.in.razor_offset = StridedView<const float, 2>(c.razor.data(), {c.blocks, c.bs});
  }
  c.in.query = StridedView<const float, 3>(c.q.data(), {c.tokens, c.nh, c.d});
  if (c.form == 1) {
    c.in.key_cache = StridedView<const float, 4>(c.kc.data(), {c.blocks, c.ch, c.bs, c.d});
    c.in.value_cache = StridedView<const float, 4>(c.vc.data(), {c.blocks, c.ch, c.bs, c.dv});
  } else {
    c.in.key_cache = StridedView<const float, 4>(c.kc.data(), {c.blocks, c.bs, c.ch, c.d});
    c.in.value_cache = StridedView<const float, 4>(c.vc.data(), {c.blocks, c.bs, c.ch, c.dv});
  }
  c.in.block_tables = StridedView<const std::int32_t, 2>(c.table.data(), {c.batch, c.maxb});
  c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
}

std::string verify_pa(const Pa& c) {
  // Each sequence with keys reads the next packed row of `row_heads` query heads (a token, or a
  // (token, kv head) pair) and writes the same row of out; rows past the packed ones keep 777.
  const Index H = c.row_heads(), G = H / c.ch;
  std::vector<double> want(c.o.size(), 777.0), got(c.o.begin(), c.o.end());
  Index x = 0;
  for (Index b = 0; b < c.batch; ++b) {
    const Index len = c.in.context_lens[static_cast<size_t>(b)];
    if (len == 0) continue;
    for (Index h = 0; h < H; ++h) {
      std::vector<double> s(static_cast<size_t>(len));
      double mx = -INFINITY, sum = 0.0;
      for (Index t = 0; t < len; ++t) {
        const Index row = c.table[static_cast<size_t>(b * c.maxb + t / c.bs)] * c.bs + t % c.bs;
        double dot = 0.0;
        for (Index e = 0; e < c.d; ++e)
          dot += static_cast<double>(c.q[static_cast<size_t>((x * H + h) * c.d + e)]) *
                 c.kc[static_cast<size_t>(pa_at(c, row, h / G, e, c.d))];
        if (c.form == 3) dot += c.razor[static_cast<size_t>(row)];
        s[static_cast<size_t>(t)] = dot * c.p.qk_scale;
        mx = std::max(mx, s[static_cast<size_t>(t)]);
      }
      for (double& v : s) sum += (v = std::exp(v - mx));
      for (Index e = 0; e < c.dv; ++e) {
        double acc = 0.0;
        for (Index t = 0; t < len; ++t) {
          const Index row = c.table[static_cast<size_t>(b * c.maxb + t / c.bs)] * c.bs + t % c.bs;
          acc += s[static_cast<size_t>(t)] / sum *
                 c.vc[static_cast<size_t>(pa_at(c, row, h / G, e, c.dv))];
        }
        want[static_cast<size_t>((x * H + h) * c.dv + e)] = acc;
      }
    }
    ++x;
  }
  return fuzz::compare(got, want, 2e-4);
}

using PP = fuzz::Perturbation<Pa>;

bool pa_bnsd(const Pa& c) { return c.form == 1; }
bool pa_compress(const Pa& c) { return c.compress(); }
bool pa_rope(const Pa& c) { return c.form == 3; }
bool pa_has_zero(const Pa& c) {
  return std::count(c.in.context_lens.begin(), c.in.context_lens.end(), 0) > 0;
}

const std::vector<PP>& pa_perturbations() {
  static const std::vector<PP> list{
      {"block table entry out of range", true,
       [](Pa& c, fuzz::Rng& r) {
         const Index b = r.range(0, c.batch - 1);
         if (c.in.context_lens[static_cast<size_t>(b)] == 0) return false;
         c.table[static_cast<size_t>(b * c.maxb)] =
             r.chance(0.5) ? -1 : static_cast<std::int32_t>(c.blocks + r.range(0, 4));
         return true;
       }},
      {"block_tables null", true,
       [](Pa& c, fuzz::Rng&) {
         c.in.block_tables = StridedView<const std::int32_t, 2>(nullptr, {c.batch, c.maxb});
         return true;
       }},
      {"block_tables span overflows", true,
       [](Pa& c, fuzz::Rng&) {
         c.in.block_tables =
             StridedView<const std::int32_t, 2>(c.table.data(), {c.batch, kHuge}, {0, kHuge});
         return true;
       }},
      {"context_lens negative", true,
       [](Pa& c, fuzz::Rng& r) {
         c.in.context_lens[static_cast<size_t>(r.range(0, c.batch - 1))] = -1;
         return true;
       }},
      {"context_lens past the table", true,
       [](Pa& c, fuzz::Rng& r) {
         c.in.context_lens[static_cast<size_t>(r.range(0, c.batch - 1))] = c.maxb * c.bs + 1;
         return true;
       }},
      {"context_lens missing", true,
       [](Pa& c, fuzz::Rng&) {
         c.in.context_lens.clear();
         return true;
       }},
      {"num_heads mismatch", true,
       [](Pa& c, fuzz::Rng&) {
         c.p.num_heads += static_cast<std::int32_t>(c.nkv);
         return true;
       }},
      {"num_kv_heads not dividing", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.nh < 2 || c.nh % (c.nh - 1) == 0) return false;
         c.p.num_kv_heads = static_cast<std::int32_t>(c.nh - 1);
         return true;
       }},
      {"out shape mismatch", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.dv < 2) return false;
         c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh, c.dv - 1});
         return true;
       }},
      {"query null", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.tokens == 0) return false;
         c.in.query = StridedView<const float, 3>(nullptr, {c.tokens, c.nh, c.d});
         return true;
       }},
      {"key cache head size mismatch", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.d < 2) return false;
         auto s = c.in.key_cache.shape();
         s[3] = c.d - 1;
         c.in.key_cache = StridedView<const float, 4>(c.kc.data(), s);
         return true;
       }},
      {"Norm mask missing", true,
       [](Pa& c, fuzz::Rng&) {
         c.p.mask_type = PA::MaskType::Norm;
         return true;
       }},
      {"qk_scale NaN", true,
       [](Pa& c, fuzz::Rng&) {
         c.p.qk_scale = std::numeric_limits<float>::quiet_NaN();
         return true;
       }},
      {"out overlaps the query", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.q.size() < c.o.size() || c.o.empty()) return false;
         c.out = StridedView<float, 3>(c.q.data(), {c.tokens, c.nh, c.dv});
         return true;
       }},
      {"query rows not packed (one per sequence)", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.compress() || !pa_has_zero(c)) return false;
         c.tokens = c.batch;
         c.q.resize(static_cast<size_t>(c.tokens * c.nh * c.d), 0.5f);
         c.o.resize(static_cast<size_t>(c.tokens * c.nh * c.dv), 777.0f);
         c.in.query = StridedView<const float, 3>(c.q.data(), {c.tokens, c.nh, c.d});
         c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
         return true;
       }},
      {"batchRunStatus 0 on a sequence with keys", true,
       [](Pa& c, fuzz::Rng&) {
         if (c.form == 3 || c.in.context_lens[0] == 0) return false;
         c.p.batch_run_status_enable = true;
         c.in.batch_run_status.assign(static_cast<size_t>(c.batch), 1);
         c.in.batch_run_status[0] = 0;
         return true;
       }},
      fuzz::edit<Pa>("BNSD with Spec, LogN or quantization", true, pa_bnsd,
                     [](Pa& c, fuzz::Rng& r) {
                       const Index k = r.range(0, 2);
                       if (k == 0) c.p.calc_type = PA::CalcType::Spec;
                       if (k == 1) c.p.scale_type = PA::ScaleType::LogN;
                       if (k == 2) c.p.quant_type = PA::QuantType::DequantFusion;
                     }),
      fuzz::edit<Pa>("BNSD value head size != head size", true, pa_bnsd,
                     [](Pa& c, fuzz::Rng&) {
                       c.dv = c.d + 1;
                       c.vc.resize(static_cast<size_t>(c.blocks * c.bs * c.ch * c.dv));
                       c.in.value_cache =
                           StridedView<const float, 4>(c.vc.data(), {c.blocks, c.ch, c.bs, c.dv});
                       c.o.resize(static_cast<size_t>(c.tokens * c.nh * c.dv), 777.0f);
                       c.out = StridedView<float, 3>(c.o.data(), {c.tokens, c.nh, c.dv});
                     }),
      fuzz::edit<Pa>("compress with Spec, LogN, BNSD or num_kv_heads 0", true, pa_compress,
                     [](Pa& c, fuzz::Rng& r) {
                       const Index k = r.range(0, 3);
                       if (k == 0) c.p.calc_type = PA::CalcType::Spec;
                       if (k == 1) c.p.scale_type = PA::ScaleType::LogN;
                       if (k == 2) c.p.input_layout = PA::InputLayout::BNSD;
                       if (k == 3) c.p.num_kv_heads = 0;
                     }),
      fuzz::edit<Pa>("compress context_lens not one per pair", true, pa_compress,
                     [](Pa& c, fuzz::Rng&) {
                       c.in.context_lens.push_back(0);
                       c.table.resize(c.table.size() + static_cast<size_t>(c.maxb), -1);
                       c.in.block_tables = StridedView<const std::int32_t, 2>(
                           c.table.data(), {c.batch + 1, c.maxb});
                     }),
      fuzz::edit<Pa>(
          "compress query rows not reshapeable", true,
          [](const Pa& c) { return c.compress() && c.tokens > 1 && c.nkv > 1; },
          [](Pa& c, fuzz::Rng&) {  // a padded token stride
            c.q.resize(static_cast<size_t>(c.tokens * (c.nh * c.d + 1)), 0.5f);
            c.in.query = StridedView<const float, 3>(c.q.data(), {c.tokens, c.nh, c.d},
                                                     {c.nh * c.d + 1, c.d, 1});
          }),
      fuzz::edit<Pa>("KVHEAD_ROPE with a mask or batchRunStatus", true, pa_rope,
                     [](Pa& c, fuzz::Rng& r) {
                       if (r.chance(0.5)) {
                         c.p.mask_type = PA::MaskType::Alibi;
                       } else {
                         c.p.batch_run_status_enable = true;
                         c.in.batch_run_status.assign(static_cast<size_t>(c.batch), 1);
                       }
                     }),
      fuzz::edit<Pa>("razor_offset missing or mis-shaped", true, pa_rope,
                     [](Pa& c, fuzz::Rng& r) {
                       c.in.razor_offset =
                           r.chance(0.5)
                               ? StridedView<const float, 2>{}
                               : StridedView<const float, 2>(c.razor.data(), {c.blocks - 1, c.bs});
                     }),
      fuzz::edit<Pa>(
          "razor_offset without KVHEAD_ROPE", true, [](const Pa& c) { return c.form != 3; },
          [](Pa& c, fuzz::Rng&) {
            c.razor.assign(static_cast<size_t>(c.blocks * c.bs), 1.0f);
            c.in.razor_offset = StridedView<const float, 2>(c.razor.data(), {c.blocks, c.bs});
          }),
  };
  return list;
}

void validate_only(Pa& c) {
  attnref::validate(c.p, c.in, attnref::PagedAttentionOutputs<float>{c.out});
}

void run_pa(fuzz::Run& run, std::uint64_t seed) {
  fuzz::run_case(
      run, seed, pa_perturbations(), build, fuzz::Named{"paged_attention"},
      [seed](Pa& c) {
        attnref::paged_attention(c.p, c.in, attnref::PagedAttentionOutputs<float>{c.out},
                                 {static_cast<int>(seed % 2 + 1)});
      },
      verify_pa, &Pa::q, &Pa::kc, &Pa::vc, &Pa::o, &Pa::table, &Pa::razor);
}

const fuzz::Register reg_pa("paged_attention", run_pa);

}  // namespace fuzz_paged
