#pragma once
// The outcome of a call as one comparable string: "" when it returns, else the exception's type
// and message (validate() and its operator must agree on both).

#include <stdexcept>
#include <string>

namespace support {

template <class F>
std::string outcome(F&& f) {
  try {
    f();
  } catch (const std::out_of_range& e) {
    return std::string("std::out_of_range: ") + e.what();
  } catch (const std::invalid_argument& e) {
    return std::string("std::invalid_argument: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other exception: ") + e.what();
  }
  return "";
}

}  // namespace support
