#pragma once
// The adversarial input harness: per public entry point, a seeded generator of small random
// configurations, each either valid or carrying exactly one perturbation. Every call is
// classified:
//   accepted  - no exception; the result must equal the entry's reference (or obey its rule);
//   rejected  - std::invalid_argument / std::out_of_range whose message starts with
//               "attnref::", with every output and cache still holding its sentinel and every
//               input unchanged;
//   defect    - anything else: a valid case rejected, a must-reject case accepted, a wrong
//               result, a touched output, another exception type. (A crash or a sanitizer
//               report ends the run, which fails it as well.)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "support/bits.hpp"
#include "support/outcome.hpp"
#include "support/views.hpp"

namespace fuzz {

using Index = std::ptrdiff_t;

/// An extent whose products with any other overflow 64 bits (2^40 · 2^40 > 2^63).
constexpr Index kHuge = Index(1) << 40;

struct Rng {
  std::mt19937_64 g;
  explicit Rng(std::uint64_t seed) : g(seed) {}
  Index range(Index lo, Index hi) {  // inclusive
    return std::uniform_int_distribution<Index>(lo, hi)(g);
  }
  bool chance(double p) { return std::uniform_real_distribution<double>(0, 1)(g) < p; }
  float normal() { return std::normal_distribution<float>(0.0f, 1.0f)(g); }
  template <class T>
  std::vector<T> normals(Index n) {
    std::vector<T> x(static_cast<size_t>(n));
    for (T& e : x) e = T(normal());
    return x;
  }
};

/// One named perturbation of a valid configuration; `reject` says whether attnref must refuse
/// it (false: the input is unusual but defined, and the result is checked).
template <class Config>
struct Perturbation {
  const char* name;
  bool reject;
  std::function<bool(Config&, Rng&)> apply;  // false: not applicable to this configuration
};

struct Tally {
  long valid = 0, accepted = 0, rejected = 0, defects = 0;
};

struct Run {
  std::map<std::string, Tally> tally;
  /// --digest: per entry, a hash of every watched buffer (inputs, outputs, caches) of every
  /// accepted case after its call, so two builds can be compared bit for bit.
  std::map<std::string, std::uint64_t> digest;
  std::vector<std::string> defects;  // the first ones, for the report
  bool verbose = false;
};

/// Picks a perturbation (none with probability `p_valid`) and applies it; returns its index or
/// -1 for a valid case.
template <class Config>
int perturb(Config& c, Rng& rng, const std::vector<Perturbation<Config>>& list,
            double p_valid = 0.3) {
  if (list.empty() || rng.chance(p_valid)) return -1;
  for (int attempt = 0; attempt < 8; ++attempt) {
    const int i = static_cast<int>(rng.range(0, static_cast<Index>(list.size()) - 1));
    if (list[static_cast<size_t>(i)].apply(c, rng)) return i;
  }
  return -1;
}

/// What is wrong with a rejection ("" when nothing): a valid case rejected, a message that does
/// not start with "attnref::<op>: " (the operator called, not an inner function), or an output
/// written before the check.
inline std::string rejection_defect(const std::string& op, bool valid, const std::string& what,
                                    bool untouched) {
  if (valid) return "valid input rejected: " + what;
  if (what.rfind("attnref::" + op + ": ", 0) != 0) return "message names another function: " + what;
  if (!untouched) return "touched output on reject: " + what;
  return "";
}

/// Runs `call` and classifies the outcome (see the top of the file) under the label `entry`;
/// rejections must name `op`, the operator called. `untouched` tells whether every output /
/// cache / input still holds what it held before; `verify` returns "" when an accepted result is
/// right, else what is wrong.
template <class Call, class Untouched, class Verify>
bool classify(Run& run, const std::string& entry, const std::string& op, std::uint64_t seed,
              const char* perturbation, bool must_reject, Call&& call, Untouched&& untouched,
              Verify&& verify) {
  Tally& t = run.tally[entry];
  const bool valid = perturbation == nullptr;
  if (valid) ++t.valid;
  std::string defect, outcome = "accepted";  // outcome: for --verbose
  const std::string label = valid ? "valid" : perturbation;
  try {
    call();
    if (must_reject) {
      defect = "accepted a must-reject input";
    } else {
      defect = verify();
      if (defect.empty()) ++t.accepted;
    }
  } catch (const std::invalid_argument& e) {
    defect = rejection_defect(op, valid, e.what(), untouched());
    if (defect.empty()) ++t.rejected;
    outcome = e.what();
  } catch (const std::out_of_range& e) {
    defect = rejection_defect(op, valid, e.what(), untouched());
    if (defect.empty()) ++t.rejected;
    outcome = e.what();
  } catch (const std::exception& e) {
    defect = std::string("wrong exception type: ") + e.what();
  }
  if (!defect.empty()) {
    ++t.defects;
    if (run.defects.size() < 50)
      run.defects.push_back(entry + " seed " + std::to_string(seed) + " [" + label +
                            "]: " + defect);
  }
  if (run.verbose)
    std::printf("%s seed %llu [%s]: %s\n", entry.c_str(), static_cast<unsigned long long>(seed),
                label.c_str(), (defect.empty() ? "ok, " + outcome : defect).c_str());
  return defect.empty() && outcome == "accepted";
}

/// FNV-1a over the bytes of a buffer, folded into h.
inline void hash_bytes(std::uint64_t& h, const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
}
template <class T>
void hash_into(std::uint64_t& h, const std::vector<T>& x) {
  const std::uint64_t n = x.size();
  hash_bytes(h, &n, sizeof n);
  if (!x.empty()) hash_bytes(h, x.data(), x.size() * sizeof(T));
}

/// Bitwise equality of two buffers (NaN == NaN when the bits agree).
using support::same_bits;

/// "" when |got - want| <= tol · (1 + |want|) everywhere (NaN only where want is NaN).
inline std::string compare(const std::vector<double>& got, const std::vector<double>& want,
                           double tol) {
  if (got.size() != want.size()) return "size mismatch";
  for (size_t i = 0; i < got.size(); ++i) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    if (gn != wn || (!gn && std::fabs(got[i] - want[i]) > tol * (1.0 + std::fabs(want[i]))))
      return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]);
  }
  return "";
}

template <class Tuple, size_t... I>
bool same_bits_all(const Tuple& a, const Tuple& b, std::index_sequence<I...>) {
  return (same_bits(std::get<I>(a), std::get<I>(b)) && ...);
}

/// A fixed label for run_case; rejections must name the operator `op` (the label when null: an
/// entry per mode of one operator, e.g. "self_attention_decoder", sets op "self_attention").
struct Named {
  const char* name;
  const char* op = nullptr;
  template <class Config>
  std::string operator()(const Config&) const {
    return name;
  }
};

/// The operator a label's rejections must name.
template <class Label, class Config>
std::string op_of(const Label& label, const Config& c) {
  if constexpr (std::is_same_v<Label, Named>)
    if (label.op != nullptr) return label.op;
  return label(c);
}

/// True when the entry defines `void restride_inputs(Config&, support::Restrider&)` (found by
/// argument-dependent lookup in the entry's namespace): it moves every input view of the
/// configuration into a padded, spread-out copy.
template <class C, class = void>
struct Restridable : std::false_type {};
template <class C>
struct Restridable<C, std::void_t<decltype(restride_inputs(std::declval<C&>(),
                                                           std::declval<support::Restrider&>()))>>
    : std::true_type {};

/// True when the entry defines `void validate_only(Config&)` (found by argument-dependent lookup):
/// the operator's public validate() on the configuration's arguments.
template <class C, class = void>
struct Validatable : std::false_type {};
template <class C>
struct Validatable<C, std::void_t<decltype(validate_only(std::declval<C&>()))>> : std::true_type {};

/// Runs `call`; when `want_out_of_range` (the perturbation corrupts index data), an
/// std::invalid_argument becomes a defect (an exception of another type than the two classify()
/// accepts), so the harness sees index errors reported as std::out_of_range.
template <class F>
void call_expecting_range(bool want_out_of_range, F&& call) {
  try {
    call();
  } catch (const std::invalid_argument& e) {
    if (!want_out_of_range) throw;
    throw std::runtime_error(std::string("std::invalid_argument, not std::out_of_range: ") +
                             e.what());
  }
}

/// A defect found beside classify(), counted and reported the same way.
inline void add_defect(Run& run, const std::string& entry, std::uint64_t seed,
                       const std::string& label, const std::string& defect) {
  ++run.tally[entry].defects;
  if (run.defects.size() < 50)
    run.defects.push_back(entry + " seed " + std::to_string(seed) + " [" + label + "]: " + defect);
}

/// One case of an entry point: builds a configuration from the seed, applies one perturbation
/// of `list` (or none), snapshots the buffers `watched` names (inputs, outputs and caches), calls
/// the operator and classifies the outcome under the label `entry(c)`. A valid, accepted case of
/// a Restridable entry runs once more with strided copies of its inputs (label
/// "<entry> strided"): every watched buffer must come out with the same bits. For a Validatable
/// entry, validate() runs first: it must write no watched buffer and end as the call does (the
/// same exception type and message, or none).
template <class Config, class Label, class Call, class Verify, class... Buf>
void run_case(Run& run, std::uint64_t seed, const std::vector<Perturbation<Config>>& list,
              void (*build)(Config&, Rng&), Label entry, Call call, Verify verify,
              Buf Config::*... watched) {
  Rng r(seed);
  Config c;
  build(c, r);
  const int pi = perturb(c, r, list);
  const Perturbation<Config>* pert = pi < 0 ? nullptr : &list[static_cast<size_t>(pi)];
  const auto before = std::make_tuple((c.*watched)...);
  std::string validated, called;
  if constexpr (Validatable<Config>::value) {
    validated = support::outcome([&] { validate_only(c); });
    if (!same_bits_all(before, std::make_tuple((c.*watched)...), std::index_sequence_for<Buf...>{}))
      add_defect(run, entry(c), seed, pert ? pert->name : "valid", "validate() wrote a buffer");
  }
  const bool ok = classify(
      run, entry(c), op_of(entry, c), seed, pert ? pert->name : nullptr, pert && pert->reject,
      [&] {
        try {
          call(c);
        } catch (...) {
          called = support::outcome([] { throw; });
          throw;
        }
      },
      [&] {
        return same_bits_all(before, std::make_tuple((c.*watched)...),
                             std::index_sequence_for<Buf...>{});
      },
      [&] { return verify(c); });
  if (Validatable<Config>::value && validated != called)
    add_defect(run, entry(c), seed, pert ? pert->name : "valid",
               "validate() and the call disagree: \"" + validated + "\" vs \"" + called + "\"");
  if (ok) {
    std::uint64_t& h = run.digest.try_emplace(entry(c), 0xcbf29ce484222325ull).first->second;
    hash_bytes(h, &seed, sizeof seed);
    (hash_into(h, c.*watched), ...);
  }
  if constexpr (Restridable<Config>::value) {
    if (!ok || pert != nullptr) return;
    const auto first = std::make_tuple((c.*watched)...);
    std::tie((c.*watched)...) = before;  // same sizes: the vectors keep their storage
    support::Restrider strided;
    restride_inputs(c, strided);
    classify(
        run, entry(c) + " strided", op_of(entry, c), seed, nullptr, false, [&] { call(c); },
        [] { return true; },
        [&]() -> std::string {
          return same_bits_all(first, std::make_tuple((c.*watched)...),
                               std::index_sequence_for<Buf...>{})
                     ? ""
                     : "strided inputs changed the result bits";
        });
  }
}

/// A perturbation that applies `change` when `ok` (null: always) holds of the configuration.
template <class Config>
Perturbation<Config> edit(const char* name, bool reject, bool (*ok)(const Config&),
                          void (*change)(Config&, Rng&)) {
  return {name, reject, [ok, change](Config& c, Rng& r) {
            if (ok != nullptr && !ok(c)) return false;
            change(c, r);
            return true;
          }};
}

/// A paged K/V pool: len[b] random tokens of widths wk / wv per sequence in shuffled blocks of pbs
/// rows, NaN in every row no sequence owns (so reading one shows); table [B, mb] padded with -1
/// (mb: the longest sequence's blocks, sometimes one more); a spare block or two.
struct Pool {
  Index pbs = 1, mb = 0, nb = 0, wk = 1, wv = 1;
  std::vector<std::int32_t> table;
  std::vector<float> k, v;  // [nb, pbs, wk] / [nb, pbs, wv]
  /// The cache row of token t of sequence b.
  Index at(Index b, Index t) const {
    return table[static_cast<size_t>(b * mb + t / pbs)] * pbs + t % pbs;
  }
  /// The blocks a sequence of `len` tokens uses.
  Index blocks(Index len) const { return (len + pbs - 1) / pbs; }
  /// Token rows [0, len) of sequence b, each `width` wide, from k (or v) as doubles.
  std::vector<double> dense(Index b, Index len, bool values) const {
    const std::vector<float>& x = values ? v : k;
    const Index w = values ? wv : wk;
    std::vector<double> out;
    for (Index t = 0; t < len; ++t)
      out.insert(out.end(), x.begin() + at(b, t) * w, x.begin() + (at(b, t) + 1) * w);
    return out;
  }
};

inline void make_pool(Pool& p, Rng& r, const std::vector<Index>& len, Index pbs, Index wk,
                      Index wv) {
  p.pbs = pbs, p.wk = wk, p.wv = wv;
  Index used = 0;
  for (Index l : len) used += p.blocks(l), p.mb = std::max(p.mb, p.blocks(l));
  p.mb += r.range(0, 1);
  p.nb = used + r.range(0, 2);
  std::vector<std::int32_t> ids(static_cast<size_t>(p.nb));
  for (Index i = 0; i < p.nb; ++i) ids[static_cast<size_t>(i)] = static_cast<std::int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), r.g);
  p.table.assign(len.size() * static_cast<size_t>(p.mb), -1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.k.assign(static_cast<size_t>(p.nb * pbs * wk), nan);
  p.v.assign(static_cast<size_t>(p.nb * pbs * wv), nan);
  Index next = 0;
  for (size_t b = 0; b < len.size(); ++b)
    for (Index t = 0; t < len[b]; ++t) {
      if (t % pbs == 0)
        p.table[b * static_cast<size_t>(p.mb) + static_cast<size_t>(t / pbs)] =
            ids[static_cast<size_t>(next++)];
      const Index row = p.at(static_cast<Index>(b), t);
      for (Index e = 0; e < wk; ++e) p.k[static_cast<size_t>(row * wk + e)] = r.normal();
      for (Index e = 0; e < wv; ++e) p.v[static_cast<size_t>(row * wv + e)] = r.normal();
    }
}

/// A pool is watched whole by run_case.
inline bool same_bits(const Pool& a, const Pool& b) {
  return same_bits(a.table, b.table) && same_bits(a.k, b.k) && same_bits(a.v, b.v);
}
inline void hash_into(std::uint64_t& h, const Pool& p) {
  hash_into(h, p.table), hash_into(h, p.k), hash_into(h, p.v);
}

using Entry = std::function<void(Run&, std::uint64_t seed)>;

/// The entry points, registered by the entries_*.cpp files.
std::map<std::string, Entry>& registry();
/// Per entry, the divisor of --cases for entries whose cases cost many times the others' (an
/// entry absent here runs every case).
std::map<std::string, long>& case_divisor();

struct Register {
  Register(const char* name, Entry e, long divisor = 1) {
    registry()[name] = std::move(e);
    if (divisor > 1) case_divisor()[name] = divisor;
  }
};

}  // namespace fuzz
