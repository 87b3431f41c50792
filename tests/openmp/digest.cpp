// Prints a digest of attention outputs on fixed inputs. Built twice, with and without OpenMP;
// ctest checks that both print the same digest (the library gives identical bits either way).

#include <attnref/attnref.hpp>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

std::uint64_t fnv1a(const void* data, std::size_t bytes, std::uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

template <class T>
std::uint64_t run(attnref::Index sq, attnref::Index skv, attnref::CausalMode causal,
                  std::uint64_t h) {
  using attnref::Index;
  const Index B = 2, N = 8, Nkv = 2, D = 40;
  std::vector<T> q(static_cast<size_t>(B * sq * N * D)), k(static_cast<size_t>(B * skv * Nkv * D));
  std::vector<T> v(k.size()), o(q.size());
  std::uint32_t state = 12345;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (auto& x : q) x = T(next());
  for (auto& x : k) x = T(next());
  for (auto& x : v) x = T(next());
  attnref::AttentionInputs<T> in{attnref::bsnd_view<const T>(q.data(), B, sq, N, D),
                                 attnref::bsnd_view<const T>(k.data(), B, skv, Nkv, D),
                                 attnref::bsnd_view<const T>(v.data(), B, skv, Nkv, D)};
  in.seq.kv = {skv, skv / 2 + 1};
  std::vector<float> lse(static_cast<size_t>(B * N * sq));
  attnref::AttentionOutputs<T> out{attnref::bsnd_view(o.data(), B, sq, N, D)};
  out.lse = attnref::StridedView<float, 3>(lse.data(), {B, N, sq});
  attnref::AttentionParams p;
  p.scale = 0.15;
  p.causal = causal;
  attnref::ExecConfig x;
  x.threads = 2;
  x.kv_split = 64;
  attnref::attention(in, p, out, x);
  h = fnv1a(o.data(), o.size() * sizeof(T), h);
  return fnv1a(lse.data(), lse.size() * sizeof(float), h);
}

}  // namespace

int main() {
  std::uint64_t h = 1469598103934665603ull;
  h = run<float>(70, 90, attnref::CausalMode::BottomRight, h);  // prefill
  h = run<float>(1, 700, attnref::CausalMode::None, h);         // decode, split-KV
  h = run<attnref::half>(33, 300, attnref::CausalMode::TopLeft, h);
  h = run<attnref::bfloat16>(1, 500, attnref::CausalMode::None, h);
  std::printf("%016llx\n", static_cast<unsigned long long>(h));
  return 0;
}
