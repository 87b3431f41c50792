// Independent reference of DeepSeek sparse attention: see dsa.hpp.

#include "reference/dsa.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>

namespace ref::dsa {

namespace {
std::size_t at(long i) { return static_cast<std::size_t>(i); }
}  // namespace

long visible(const Shape& sh, const Batch& b, int i) {
  if (!sh.causal) return b.kv_len;
  const long l = b.kv_len - b.q_len + i + 1;
  return l < 0 ? 0 : l;
}

std::vector<double> indexer_scores(const Shape& sh, const Batch& b) {
  const int G = sh.N1 / sh.N2;
  std::vector<double> out(at(long{b.q_len} * sh.N2 * b.kv_len), NAN);
  for (int i = 0; i < b.q_len; ++i)
    for (int g = 0; g < sh.N2; ++g)
      for (long s = 0; s < visible(sh, b, i); ++s) {
        double total = 0.0;
        for (int j = 0; j < G; ++j) {
          const int h = g * G + j;
          double dot = 0.0;
          for (int x = 0; x < sh.D; ++x)
            dot += b.q[at((long{i} * sh.N1 + h) * sh.D + x)] * b.k[at((s * sh.N2 + g) * sh.D + x)];
          total += b.w[at(long{i} * sh.N1 + h)] * std::max(0.0, dot);
        }
        out[at((long{i} * sh.N2 + g) * b.kv_len + s)] = total;
      }
  return out;
}

namespace {

// x rounded to fp16 (nearest even; overflow to inf), exactly, from the bits of the double.
double fp16(double x) {
  if (std::isnan(x) || x == 0.0) return x;
  const double a = std::fabs(x);
  if (a >= 65520.0) return std::copysign(INFINITY, x);
  int e = 0;
  std::frexp(a, &e);                                          // a = m * 2^e, m in [0.5, 1)
  const double ulp = std::ldexp(1.0, std::max(e - 11, -24));  // 11 bits; subnormals 2^-24
  const double q = a / ulp, f = std::floor(q);
  double r = q - f > 0.5 || (q - f == 0.5 && std::fmod(f, 2.0) != 0.0) ? f + 1 : f;
  return std::copysign(r * ulp, x);
}

// The top `count` of row[0, n) by descending score, ties to the lower index, -1 after.
void top(const double* row, long n, long count, std::int32_t* out) {
  std::vector<long> keys(at(n));
  std::iota(keys.begin(), keys.end(), 0L);
  std::stable_sort(keys.begin(), keys.end(), [&](long x, long y) { return row[x] > row[y]; });
  for (long e = 0; e < count; ++e) out[e] = e < n ? static_cast<std::int32_t>(keys[at(e)]) : -1;
}

}  // namespace

std::vector<std::int32_t> quant_indexer_topk(const Shape& sh, const Batch& b,
                                             const std::vector<double>& qs,
                                             const std::vector<double>& ks, long count) {
  const int G = sh.N1 / sh.N2;
  std::vector<std::int32_t> out(at(long{b.q_len} * sh.N2 * count), -1);
  for (int i = 0; i < b.q_len; ++i)
    for (int g = 0; g < sh.N2; ++g) {
      const long n = visible(sh, b, i);
      std::vector<double> row(at(n), 0.0);
      for (long s = 0; s < n; ++s) {
        double total = 0.0;
        for (int j = 0; j < G; ++j) {
          const int h = g * G + j;
          double dot = 0.0;
          for (int x = 0; x < sh.D; ++x)
            dot += b.q[at((long{i} * sh.N1 + h) * sh.D + x)] * b.k[at((s * sh.N2 + g) * sh.D + x)];
          const long wi = long{i} * sh.N1 + h;
          total += fp16(b.w[at(wi)] * qs[at(wi)]) * fp16(std::max(0.0, dot) / 1024.0);
        }
        row[at(s)] = total * ks[at(s * sh.N2 + g)];
      }
      top(row.data(), n, count, out.data() + (long{i} * sh.N2 + g) * count);
    }
  return out;
}

std::vector<std::int32_t> indexer_topk(const Shape& sh, const Batch& b, long count) {
  const std::vector<double> score = indexer_scores(sh, b);
  std::vector<std::int32_t> out(at(long{b.q_len} * sh.N2 * count), -1);
  for (int i = 0; i < b.q_len; ++i)
    for (int g = 0; g < sh.N2; ++g) {
      const double* row = score.data() + (long{i} * sh.N2 + g) * b.kv_len;
      std::vector<long> keys(at(visible(sh, b, i)));
      std::iota(keys.begin(), keys.end(), 0L);
      std::stable_sort(keys.begin(), keys.end(),
                       [&](long x, long y) { return row[x] > row[y]; });  // stable: lower first
      for (long e = 0; e < count && e < static_cast<long>(keys.size()); ++e)
        out[at((long{i} * sh.N2 + g) * count + e)] = static_cast<std::int32_t>(keys[at(e)]);
    }
  return out;
}

std::vector<double> sparse_attention(const Shape& sh, const Batch& b, long K, long sbs,
                                     double scale) {
  const int G = sh.N1 / sh.N2;
  std::vector<double> out(at(long{b.q_len} * sh.N1 * sh.D), 0.0);
  for (int i = 0; i < b.q_len; ++i)
    for (int g = 0; g < sh.N2; ++g) {
      // The keys, a token once per slot that reaches it: slots [0, min(K, ceil(lim / sbs))),
      // stopping at the first -1, blocks clipped to lim.
      const long lim = visible(sh, b, i);
      const long slots = std::min(K, (lim + sbs - 1) / sbs);
      std::vector<long> keys;
      for (long e = 0; e < slots; ++e) {
        const long j = b.idx[at((long{i} * sh.N2 + g) * K + e)];
        if (j == -1) break;
        for (long s = j * sbs; s < (j + 1) * sbs && s < lim; ++s) keys.push_back(s);
      }
      if (keys.empty()) continue;
      for (int jh = 0; jh < G; ++jh) {
        const int h = g * G + jh;
        std::vector<double> sc;
        double mx = -INFINITY;
        for (long s : keys) {
          double dot = 0.0;
          for (int x = 0; x < sh.D; ++x)
            dot += b.q[at((long{i} * sh.N1 + h) * sh.D + x)] * b.k[at((s * sh.N2 + g) * sh.D + x)];
          for (int x = 0; x < sh.Dr; ++x)
            dot +=
                b.qr[at((long{i} * sh.N1 + h) * sh.Dr + x)] * b.kr[at((s * sh.N2 + g) * sh.Dr + x)];
          sc.push_back(scale * dot);
          mx = std::max(mx, scale * dot);
        }
        double den = 0.0;
        for (double x : sc) den += std::exp(x - mx);
        double* o = out.data() + (long{i} * sh.N1 + h) * sh.D;
        for (std::size_t e = 0; e < keys.size(); ++e) {
          const double p = std::exp(sc[e] - mx) / den;
          for (int x = 0; x < sh.D; ++x) o[x] += p * b.v[at((keys[e] * sh.N2 + g) * sh.D + x)];
        }
      }
    }
  return out;
}

}  // namespace ref::dsa
