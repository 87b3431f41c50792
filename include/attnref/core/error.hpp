#pragma once
/// One way to report bad input.
///
/// Every public function validates its arguments before writing any output and throws
///   std::invalid_argument  for inconsistent shapes, sizes, parameters and feature combinations;
///   std::out_of_range      for index data (block tables, slot mappings, ...) pointing outside its
///                          target.
/// The message always reads
///   "attnref::<function>: <argument> <what>: expected <x>, got <y>".

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attnref::detail {

template <class T>
inline void append(std::ostringstream& os, const T& value) {
  os << value;
}

/// The error context: while a CallerScope is alive on this thread, every rejection is reported
/// under the name of the outermost public operator that opened one, with the inner function in
/// parentheses: "attnref::nsa_decode_step: key.shape mismatch (in nsa_selected_attention_infer):
/// expected ..". An operator that calls other operators (or the engine) opens one, so a user
/// always reads the name of the function they called.
class CallerScope {
 public:
  explicit CallerScope(const char* function) : outer_(slot() == nullptr) {
    if (outer_) slot() = function;
  }
  ~CallerScope() {
    if (outer_) slot() = nullptr;
  }
  CallerScope(const CallerScope&) = delete;
  CallerScope& operator=(const CallerScope&) = delete;

  /// The outermost operator of this thread's current call (null outside any).
  static const char* caller() { return slot(); }

 private:
  static const char*& slot() {
    static thread_local const char* name = nullptr;
    return name;
  }
  bool outer_;
};

/// Builds the canonical message and throws `Exception` with it.
template <class Exception, class Expected, class Got>
[[noreturn]] inline void raise(std::string_view function, std::string_view argument,
                               std::string_view what, const Expected& expected, const Got& got) {
  std::ostringstream os;
  const char* caller = CallerScope::caller();
  if (caller != nullptr && function != caller)
    os << "attnref::" << caller << ": " << argument << ' ' << what << " (in " << function
       << "): expected ";
  else
    os << "attnref::" << function << ": " << argument << ' ' << what << ": expected ";
  append(os, expected);
  os << ", got ";
  append(os, got);
  throw Exception(os.str());
}

/// a * b, or std::invalid_argument naming `function` / `argument` when the product of these two
/// sizes does not fit in a signed 64-bit integer (every size product goes through here or
/// checked_add, so a huge shape is a rejection, never signed overflow).
inline std::int64_t checked_mul(std::string_view function, std::string_view argument,
                                std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) {
    std::ostringstream got;
    got << a << " * " << b;
    raise<std::invalid_argument>(function, argument, "size overflows", "a product below 2^63",
                                 got.str());
  }
  return r;
}

/// a + b, or std::invalid_argument naming `function` / `argument` on signed 64-bit overflow.
inline std::int64_t checked_add(std::string_view function, std::string_view argument,
                                std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) {
    std::ostringstream got;
    got << a << " + " << b;
    raise<std::invalid_argument>(function, argument, "size overflows", "a sum below 2^63",
                                 got.str());
  }
  return r;
}

/// An enum parameter outside [lo, hi] throws std::invalid_argument naming `function` / `field`.
template <class E>
inline void check_enum(std::string_view function, std::string_view field, E value, int lo, int hi) {
  const int v = static_cast<int>(value);
  if (v < lo || v > hi)
    raise<std::invalid_argument>(function, field, "out of range",
                                 "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]", v);
}

}  // namespace attnref::detail

/// ATTNREF_CHECK(cond, std::invalid_argument, "attention", "q.shape[2]", "mismatch", 8, 7)
/// throws `Exception` with the canonical message when `cond` is false.
#define ATTNREF_CHECK(cond, Exception, function, argument, what, expected, got)                \
  do {                                                                                         \
    if (!(cond)) ::attnref::detail::raise<Exception>(function, argument, what, expected, got); \
  } while (false)

/// ATTNREF_NOT_IMPLEMENTED(cond, "paged_attention", "params.input_layout", "BNSD") throws
/// std::invalid_argument "...: <argument> not implemented yet: expected what this version
/// implements, got <got>" when `cond` is false: a documented vendor feature attnref lacks.
#define ATTNREF_NOT_IMPLEMENTED(cond, function, argument, got)                          \
  ATTNREF_CHECK(cond, std::invalid_argument, function, argument, "not implemented yet", \
                "what this version implements", got)
