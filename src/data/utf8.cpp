// src/data/utf8.cpp — utf8_is_valid and utf8_sanitize (dion/data/tokenizer.h): the check the
// tokenizer runs on every text, and the U+FFFD replacement of ill-formed bytes, as Python's
// decode("utf-8", errors="replace").
#include <string>
#include <string_view>

#include "dion/data/tokenizer.h"
#include "utf8.h"

namespace dion::data {

using detail::utf8_scan;

bool utf8_is_valid(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    int len = utf8_scan(p, n, i);
    if (len < 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::string utf8_sanitize(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  const size_t n = bytes.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    int len = utf8_scan(p, n, i);
    if (len > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      i += static_cast<size_t>(-len);
    }
  }
  return out;
}

}  // namespace dion::data
