#pragma once
// Test-case harness: random data for a spec, packed into any layout and dtype, run through
// attnref::attention, unpacked into the reference's per-sequence arrays.

#include <algorithm>
#include <attnref/attnref.hpp>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reference/naive_attention.hpp"
#include "support/compare.hpp"

namespace support {

using attnref::Index;

enum class Dtype { F32, F64, F16, BF16 };
// Paged: q / o as BSND, k / v in a block pool [blocks, block_size, heads, dim] addressed through
// a shuffled block table (-1 padding, poisoned spare blocks).
enum class Lay { BSND, BNSD, TND, Padded, Paged };
enum class MaskKind { None, Bool, BoolPerHead, Additive };

inline const char* name(Dtype t) {
  switch (t) {
    case Dtype::F32:
      return "f32";
    case Dtype::F64:
      return "f64";
    case Dtype::F16:
      return "f16";
    case Dtype::BF16:
      return "bf16";
  }
  return "?";
}
inline const char* name(Lay l) {
  switch (l) {
    case Lay::BSND:
      return "BSND";
    case Lay::BNSD:
      return "BNSD";
    case Lay::TND:
      return "TND";
    case Lay::Padded:
      return "Padded";
    case Lay::Paged:
      return "Paged";
  }
  return "?";
}
inline const char* name(MaskKind m) {
  switch (m) {
    case MaskKind::None:
      return "NoMask";
    case MaskKind::Bool:
      return "Bool";
    case MaskKind::BoolPerHead:
      return "BoolPerHead";
    case MaskKind::Additive:
      return "Additive";
  }
  return "?";
}
inline const char* name(ref::Causal c) {
  switch (c) {
    case ref::Causal::kNone:
      return "Dense";
    case ref::Causal::kTopLeft:
      return "CausalTL";
    case ref::Causal::kBottomRight:
      return "CausalBR";
  }
  return "?";
}

struct Spec {
  int nq = 4, nkv = 2, d = 16, dv = 16;
  std::vector<int> q_len{5}, kv_len{5};
  Lay layout = Lay::BSND;
  ref::Causal causal = ref::Causal::kNone;
  int window = 0;  // sliding window (with a causal mode)
  MaskKind mask = MaskKind::None;
  unsigned seed = 1;
  int threads = 1;
  Index q_tile = 0, kv_tile = 0, kv_split = 0;
  bool want_probs = false;
  double scale = 0;     // 0: 1/sqrt(d)
  int block_size = 16;  // Lay::Paged

  int batch() const { return static_cast<int>(q_len.size()); }
  int max_q() const {
    int m = 0;
    for (int x : q_len) m = std::max(m, x);
    return m;
  }
  int max_kv() const {
    int m = 0;
    for (int x : kv_len) m = std::max(m, x);
    return m;
  }
};

template <class T>
double round_to(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(static_cast<float>(T(static_cast<float>(x))));
}

/// Reference problem + data (values already rounded to the storage type T).
struct Data {
  ref::Problem pr;
  ref::Seqs q, k, v;
  std::vector<std::uint8_t> mbool;  // [B][mh][maxq][maxkv]
  std::vector<float> madd;          // [B][1][maxq][maxkv]
  int mask_heads = 1;
};

template <class T>
Data make_data(const Spec& s) {
  std::mt19937 rng(s.seed);
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(0.0, 1.0);
  Data d;
  d.pr.num_heads = s.nq;
  d.pr.num_kv_heads = s.nkv;
  d.pr.head_size = s.d;
  d.pr.v_head_size = s.dv;
  d.pr.q_len = s.q_len;
  d.pr.kv_len = s.kv_len;
  d.pr.scale = s.scale != 0 ? s.scale : 1.0 / std::sqrt(static_cast<double>(s.d));
  d.pr.causal = s.causal;
  d.pr.window = s.window;
  const int B = s.batch();
  auto fill = [&](ref::Seqs& x, const std::vector<int>& len, int heads, int dim) {
    x.resize(B);
    for (int b = 0; b < B; ++b) {
      x[b].resize(static_cast<size_t>(len[b]) * heads * dim);
      for (double& e : x[b]) e = round_to<T>(nd(rng));
    }
  };
  fill(d.q, s.q_len, s.nq, s.d);
  fill(d.k, s.kv_len, s.nkv, s.d);
  fill(d.v, s.kv_len, s.nkv, s.dv);
  const int mq = s.max_q(), mkv = s.max_kv();
  if (s.mask == MaskKind::Bool || s.mask == MaskKind::BoolPerHead) {
    d.mask_heads = s.mask == MaskKind::BoolPerHead ? s.nq : 1;
    d.mbool.resize(static_cast<size_t>(B) * d.mask_heads * mq * mkv);
    for (auto& m : d.mbool) m = ud(rng) < 0.3 ? 1 : 0;
  }
  if (s.mask == MaskKind::Additive) {
    d.madd.resize(static_cast<size_t>(B) * mq * mkv);
    for (auto& m : d.madd)
      m = ud(rng) < 0.2 ? -std::numeric_limits<float>::infinity()
                        : static_cast<float>(4.0 * ud(rng) - 2.0);
  }
  return d;
}

/// Binds the mask lambdas to `d`'s own arrays (call after `d` has its final address).
inline void bind_masks(Data& d, const Spec& s) {
  const int mq = s.max_q(), mkv = s.max_kv();
  if (!d.mbool.empty()) {
    const int mh = d.mask_heads;
    const std::vector<std::uint8_t>* mb = &d.mbool;
    d.pr.hidden = [mb, mh, mq, mkv](int b, int h, int i, int j) {
      const int hh = mh == 1 ? 0 : h;
      return (*mb)[((static_cast<size_t>(b) * mh + hh) * mq + i) * mkv + j] != 0;
    };
  }
  if (!d.madd.empty()) {
    const std::vector<float>* ma = &d.madd;
    d.pr.bias = [ma, mq, mkv](int b, int, int i, int j) {
      return static_cast<double>((*ma)[(static_cast<size_t>(b) * mq + i) * mkv + j]);
    };
  }
}

/// A tensor packed in one of the test layouts; unused padding holds NaN (or a huge value) so a
/// kernel that reads it is caught.
template <class T>
struct Packed {
  std::vector<T> buf;
  attnref::StridedView<T, 4> view;
  std::vector<Index> cu;  // TND only
  Lay layout;
  Index at(int b, int i, int h, int d) const {
    if (layout == Lay::TND) return view.offset(0, cu[b] + i, h, d);
    return view.offset(b, i, h, d);
  }
};

template <class T>
T poison() {
  if constexpr (std::is_same_v<T, attnref::half> || std::is_same_v<T, attnref::bfloat16>)
    return T(std::numeric_limits<float>::quiet_NaN());
  else
    return std::numeric_limits<T>::quiet_NaN();
}

template <class T>
Packed<T> pack_layout(Lay layout, const std::vector<int>& len, int heads, int dim) {
  Packed<T> p;
  p.layout = layout;
  const int B = static_cast<int>(len.size());
  int maxs = 0, total = 0;
  for (int l : len) {
    maxs = std::max(maxs, l);
    total += l;
  }
  switch (layout) {
    case Lay::Paged:  // q / o of the paged layout are BSND
    case Lay::BSND:
      p.buf.assign(static_cast<size_t>(B) * maxs * heads * dim, poison<T>());
      p.view = attnref::bsnd_view(p.buf.data(), B, maxs, heads, dim);
      break;
    case Lay::BNSD:
      p.buf.assign(static_cast<size_t>(B) * maxs * heads * dim, poison<T>());
      p.view = attnref::bnsd_view(p.buf.data(), B, heads, maxs, dim);
      break;
    case Lay::TND:
      p.buf.assign(static_cast<size_t>(std::max(total, 0)) * heads * dim + 1, poison<T>());
      p.view = attnref::tnd_view(p.buf.data(), total, heads, dim);
      p.cu.assign(1, 0);
      for (int l : len) p.cu.push_back(p.cu.back() + l);
      break;
    case Lay::Padded: {
      const Index hs = dim + 3, ts = heads * hs + 5, bs = maxs * ts + 7;
      p.buf.assign(static_cast<size_t>(B * bs + 1), poison<T>());
      p.view = attnref::StridedView<T, 4>(p.buf.data(), {B, maxs, heads, dim}, {bs, ts, hs, 1});
      break;
    }
  }
  return p;
}

template <class T>
T from_double(double x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return T(static_cast<float>(x));
}

template <class T>
Packed<T> pack(Lay layout, const ref::Seqs& x, const std::vector<int>& len, int heads, int dim) {
  Packed<T> p = pack_layout<T>(layout, len, heads, dim);
  for (int b = 0; b < static_cast<int>(len.size()); ++b)
    for (int i = 0; i < len[b]; ++i)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < dim; ++d)
          p.buf[static_cast<size_t>(p.at(b, i, h, d))] =
              from_double<T>(x[b][(static_cast<size_t>(i) * heads + h) * dim + d]);
  return p;
}

/// K and V of every sequence in block pools, blocks handed out in a shuffled order; two spare
/// blocks and the unused rows of last blocks hold NaN; table entries past the last block are -1.
template <class T>
struct PagedKv {
  std::vector<T> kbuf, vbuf;
  attnref::StridedView<T, 4> k, v;
  std::vector<std::int32_t> table;
  Index max_blocks = 0;
};

template <class T>
PagedKv<T> pack_paged(const Spec& s, const ref::Seqs& k, const ref::Seqs& v) {
  PagedKv<T> p;
  const int B = s.batch(), bs = s.block_size;
  Index total = 2;
  for (int l : s.kv_len) {
    const Index n = (l + bs - 1) / bs;
    total += n;
    p.max_blocks = std::max(p.max_blocks, n);
  }
  p.max_blocks += 1;  // always some -1 padding
  std::vector<std::int32_t> ids(static_cast<size_t>(total));
  for (Index i = 0; i < total; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::mt19937 rng(s.seed + 77);
  std::shuffle(ids.begin(), ids.end(), rng);
  p.kbuf.assign(static_cast<size_t>(total * bs * s.nkv * s.d), poison<T>());
  p.vbuf.assign(static_cast<size_t>(total * bs * s.nkv * s.dv), poison<T>());
  p.k = attnref::StridedView<T, 4>(p.kbuf.data(), {total, bs, s.nkv, s.d});
  p.v = attnref::StridedView<T, 4>(p.vbuf.data(), {total, bs, s.nkv, s.dv});
  p.table.assign(static_cast<size_t>(B * p.max_blocks), -1);
  size_t next = 0;
  for (int b = 0; b < B; ++b) {
    const int n = (s.kv_len[b] + bs - 1) / bs;
    for (int j = 0; j < n; ++j) p.table[static_cast<size_t>(b * p.max_blocks + j)] = ids[next++];
    for (int t = 0; t < s.kv_len[b]; ++t) {
      const Index blk = p.table[static_cast<size_t>(b * p.max_blocks + t / bs)];
      for (int h = 0; h < s.nkv; ++h) {
        for (int e = 0; e < s.d; ++e)
          p.k(blk, t % bs, h, e) =
              from_double<T>(k[b][(static_cast<size_t>(t) * s.nkv + h) * s.d + e]);
        for (int e = 0; e < s.dv; ++e)
          p.v(blk, t % bs, h, e) =
              from_double<T>(v[b][(static_cast<size_t>(t) * s.nkv + h) * s.dv + e]);
      }
    }
  }
  return p;
}

template <class T>
double to_double(T x) {
  if constexpr (std::is_same_v<T, double>)
    return x;
  else
    return static_cast<double>(static_cast<float>(x));
}

/// Library results unpacked into the reference's shapes.
struct LibResult {
  ref::Seqs o, lse, p;
};

template <class T, class Acc = std::conditional_t<std::is_same_v<T, double>, double, float>>
LibResult run_lib(const Spec& s, const Data& d, Packed<T>* keep_o = nullptr) {
  const int B = s.batch();
  const bool paged = s.layout == Lay::Paged;
  const Lay ql = paged ? Lay::BSND : s.layout;
  auto q = pack<T>(ql, d.q, s.q_len, s.nq, s.d);
  auto k = pack<T>(ql, paged ? ref::Seqs(B) : d.k, paged ? std::vector<int>(B, 0) : s.kv_len, s.nkv,
                   s.d);
  auto v = pack<T>(ql, paged ? ref::Seqs(B) : d.v, paged ? std::vector<int>(B, 0) : s.kv_len, s.nkv,
                   s.dv);
  auto o = pack_layout<T>(ql, s.q_len, s.nq, s.dv);
  PagedKv<T> pkv;
  attnref::AttentionInputs<T> in{q.view, k.view, v.view};
  if (paged) {
    pkv = pack_paged<T>(s, d.k, d.v);
    in.k = pkv.k;
    in.v = pkv.v;
    in.block_table =
        attnref::StridedView<const std::int32_t, 2>(pkv.table.data(), {B, pkv.max_blocks});
  }
  if (s.layout == Lay::TND) {
    in.seq.q_cu = q.cu;
    in.seq.kv_cu = k.cu;
  } else {
    in.seq.q.assign(s.q_len.begin(), s.q_len.end());
    in.seq.kv.assign(s.kv_len.begin(), s.kv_len.end());
  }
  const int mq = s.max_q(), mkv = s.max_kv();
  if (!d.mbool.empty())
    in.mask_bool =
        attnref::StridedView<const std::uint8_t, 4>(d.mbool.data(), {B, d.mask_heads, mq, mkv});
  if (!d.madd.empty())
    in.mask_add = attnref::StridedView<const float, 4>(d.madd.data(), {B, 1, mq, mkv});
  attnref::AttentionParams p;
  p.scale = d.pr.scale;
  p.causal = s.causal == ref::Causal::kNone      ? attnref::CausalMode::None
             : s.causal == ref::Causal::kTopLeft ? attnref::CausalMode::TopLeft
                                                 : attnref::CausalMode::BottomRight;
  p.window = s.window;
  attnref::ExecConfig x;
  x.threads = s.threads;
  x.q_tile = s.q_tile;
  x.kv_tile = s.kv_tile;
  x.kv_split = s.kv_split;
  const Index vb = o.view.size(0), vs = o.view.size(1);
  std::vector<Acc> lse(static_cast<size_t>(vb * s.nq * vs), Acc(-12345));
  std::vector<Acc> probs;
  attnref::AttentionOutputs<T, Acc> out{o.view};
  out.lse = attnref::StridedView<Acc, 3>(lse.data(), {vb, s.nq, vs});
  if (s.want_probs) {
    probs.assign(static_cast<size_t>(vb * s.nq * vs * mkv), Acc(-1));
    out.probs = attnref::StridedView<Acc, 4>(probs.data(), {vb, s.nq, vs, mkv});
  }
  attnref::attention<Acc>(in, p, out, x);

  LibResult r;
  r.o.resize(B);
  r.lse.resize(B);
  r.p.resize(B);
  for (int b = 0; b < B; ++b) {
    const int sq = s.q_len[b], skv = s.kv_len[b];
    const Index qb = s.layout == Lay::TND ? 0 : b;
    const Index q0 = s.layout == Lay::TND ? o.cu[b] : 0;
    r.o[b].resize(static_cast<size_t>(sq) * s.nq * s.dv);
    r.lse[b].resize(static_cast<size_t>(s.nq) * sq);
    if (s.want_probs) r.p[b].resize(static_cast<size_t>(s.nq) * sq * skv);
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < s.nq; ++h) {
        for (int e = 0; e < s.dv; ++e)
          r.o[b][(static_cast<size_t>(i) * s.nq + h) * s.dv + e] =
              to_double(o.buf[static_cast<size_t>(o.at(b, i, h, e))]);
        r.lse[b][static_cast<size_t>(h) * sq + i] =
            static_cast<double>(lse[static_cast<size_t>((qb * s.nq + h) * vs + q0 + i)]);
        if (s.want_probs)
          for (int j = 0; j < skv; ++j)
            r.p[b][(static_cast<size_t>(h) * sq + i) * skv + j] = static_cast<double>(
                probs[static_cast<size_t>(((qb * s.nq + h) * vs + q0 + i) * mkv + j)]);
      }
  }
  if (keep_o) *keep_o = std::move(o);
  return r;
}

inline std::vector<double> flat(const ref::Seqs& x) {
  std::vector<double> f;
  for (const auto& s : x) f.insert(f.end(), s.begin(), s.end());
  return f;
}

/// "b=.. i=.. h=.. d=.." for a flat index into flat(o).
inline Where o_where(const Spec& s) {
  return [s](std::size_t idx) {
    for (int b = 0; b < s.batch(); ++b) {
      const std::size_t n = static_cast<std::size_t>(s.q_len[b]) * s.nq * s.dv;
      if (idx < n) {
        const std::size_t i = idx / (s.nq * s.dv), h = idx / s.dv % s.nq, e = idx % s.dv;
        return "o(b=" + std::to_string(b) + ", i=" + std::to_string(i) +
               ", h=" + std::to_string(h) + ", d=" + std::to_string(e) + ")";
      }
      idx -= n;
    }
    return std::string("?");
  };
}

/// Runs the library and the reference on the same data and checks o and lse.
template <class T>
::testing::AssertionResult check_against_reference(const Spec& s) {
  Data d = make_data<T>(s);
  bind_masks(d, s);
  const ref::Result want = ref::attention(d.pr, d.q, d.k, d.v);
  const LibResult got = run_lib<T>(s, d);
  auto r = all_close(flat(want.o), flat(got.o), tolerance(kind_of<T>()), o_where(s));
  if (!r) return r << " [o]";
  const Tolerance lt = kind_of<T>() == Kind::F64 ? Tolerance{1e-11, 1e-11} : Tolerance{1e-4, 1e-5};
  r = all_close(flat(want.lse), flat(got.lse), lt);
  if (!r) return r << " [lse]";
  if (s.want_probs) {
    r = all_close(flat(want.p), flat(got.p),
                  kind_of<T>() == Kind::F64 ? lt : Tolerance{1e-5, 1e-4});
    if (!r) return r << " [probs]";
  }
  return ::testing::AssertionSuccess();
}

}  // namespace support
