#pragma once
/// One way to report bad input.
///
/// Every public function validates its arguments before writing any output and throws
///   std::invalid_argument  for inconsistent shapes, sizes, parameters and feature combinations;
///   std::out_of_range      for index data (block tables, slot mappings, ...) pointing outside its
///                          target.
/// The message always reads
///   "attnref::<function>: <argument> <what>: expected <x>, got <y>".

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attnref::detail {

template <class T>
inline void append(std::ostringstream& os, const T& value) {
  os << value;
}

/// Builds the canonical message and throws `Exception` with it.
template <class Exception, class Expected, class Got>
[[noreturn]] inline void raise(std::string_view function, std::string_view argument,
                               std::string_view what, const Expected& expected, const Got& got) {
  std::ostringstream os;
  os << "attnref::" << function << ": " << argument << ' ' << what << ": expected ";
  append(os, expected);
  os << ", got ";
  append(os, got);
  throw Exception(os.str());
}

}  // namespace attnref::detail

/// ATTNREF_CHECK(cond, std::invalid_argument, "attention", "q.shape[2]", "mismatch", 8, 7)
/// throws `Exception` with the canonical message when `cond` is false.
#define ATTNREF_CHECK(cond, Exception, function, argument, what, expected, got)                \
  do {                                                                                         \
    if (!(cond)) ::attnref::detail::raise<Exception>(function, argument, what, expected, got); \
  } while (false)
