// dion/errors.h — the exception types the library throws.
//
// They mirror the Python exceptions the reference raises, so that the Python module can map
// them one to one: ValueError (a bad value), TypeError (a bad kind of argument),
// NotImplementedError (a valid request the algorithm does not support). Every message names
// the group index, the option and the value, or the parameter and its shape.
#pragma once

#include <stdexcept>
#include <string>

namespace dion {

struct ValueError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct TypeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};
struct NotImplementedError : std::logic_error {
  using std::logic_error::logic_error;
};

inline std::string message_of(const std::string& what) {
  std::string out = what;
  for (const char* tail : {"Exception raised from ", "\nframe #0: "}) {  // c10's backtraces
    const std::size_t at = out.find(tail);
    if (at != std::string::npos) out.erase(at);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}
inline std::string message_of(const std::exception& e) { return message_of(std::string(e.what())); }

}  // namespace dion
