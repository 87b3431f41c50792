// attnref_fuzz [--cases N] [--seed S] [--entry NAME] [--verbose] [--digest]
// Runs N cases per entry point (case i of entry e uses seed S + i, so any case replays alone with
// --seed S+i --cases 1 --entry e) and prints a table of outcomes; exits 1 on any defect. An entry
// registered with a divisor d runs ceil(N / d) cases (its cases cost about d times the others').
// --digest also prints, per entry, a hash of every buffer of every accepted case after its call:
// two builds that print the same digests gave the same bits on every case.

#include <cstdio>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz.hpp"

namespace fuzz {
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> r;
  return r;
}
std::map<std::string, long>& case_divisor() {
  static std::map<std::string, long> d;
  return d;
}
}  // namespace fuzz

int main(int argc, char** argv) {
  long cases = 200;
  std::uint64_t seed = 1;
  std::string only;
  fuzz::Run run;
  bool digest = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cases" && i + 1 < argc) {
      cases = std::atol(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--entry" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--verbose") {
      run.verbose = true;
    } else if (a == "--digest") {
      digest = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--cases N] [--seed S] [--entry NAME] [--verbose] [--digest]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!only.empty() && !fuzz::registry().count(only)) {
    std::fprintf(stderr, "unknown entry %s; entries:", only.c_str());
    for (const auto& [name, e] : fuzz::registry()) std::fprintf(stderr, " %s", name.c_str());
    std::fprintf(stderr, "\n");
    return 2;
  }
  for (const auto& [name, entry] : fuzz::registry()) {
    if (!only.empty() && name != only) continue;
    const auto d = fuzz::case_divisor().find(name);
    const long n = d == fuzz::case_divisor().end() ? cases : (cases + d->second - 1) / d->second;
    for (long c = 0; c < n; ++c) entry(run, seed + static_cast<std::uint64_t>(c));
  }
  std::printf("%-28s %8s %8s %8s %8s %8s\n", "entry", "cases", "valid", "accepted", "rejected",
              "defects");
  long total = 0, defects = 0;
  for (const auto& [name, t] : run.tally) {
    const long n = t.accepted + t.rejected + t.defects;
    std::printf("%-28s %8ld %8ld %8ld %8ld %8ld\n", name.c_str(), n, t.valid, t.accepted,
                t.rejected, t.defects);
    total += n;
    defects += t.defects;
  }
  if (digest)
    for (const auto& [name, h] : run.digest)
      std::printf("digest %-28s %016llx\n", name.c_str(), static_cast<unsigned long long>(h));
  for (const std::string& d : run.defects) std::printf("DEFECT %s\n", d.c_str());
  std::printf("fuzz: %ld cases, %ld defects (seed %llu, %ld per entry)\n", total, defects,
              static_cast<unsigned long long>(seed), cases);
  return defects == 0 ? 0 : 1;
}
