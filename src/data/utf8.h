// src/data/utf8.h — the UTF-8 scanner the tokenizer's sources share (private to src/data): the
// length of the sequence at a position (well-formed or the maximal ill-formed subpart Python's
// decoder replaces by one U+FFFD), and the code point of a well-formed one. Inline: the
// validity check and the token alphabet call them per byte.
#pragma once

#include <cstddef>

namespace dion::data::detail {

// Length of the well-formed UTF-8 sequence that starts at s[i] (1..4), or minus the length of
// the maximal ill-formed subpart there (the bytes Python's decoder turns into one U+FFFD).
inline int utf8_scan(const unsigned char* s, size_t n, size_t i) {
  unsigned char c = s[i];
  if (c < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c == 0xE0) {
    need = 2, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    need = 2;
  } else if (c == 0xED) {
    need = 2, hi = 0x9F;  // no surrogates
  } else if (c == 0xF0) {
    need = 3, lo = 0x90;
  } else if (c >= 0xF1 && c <= 0xF3) {
    need = 3;
  } else if (c == 0xF4) {
    need = 3, hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // 80..C1, F5..FF can never start a character
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return -k;
    unsigned char b = s[i + k];
    if (b < lo || b > hi) return -k;
    lo = 0x80, hi = 0xBF;
  }
  return need + 1;
}

// The code point of the well-formed sequence of `len` bytes at p.
inline char32_t utf8_decode(const unsigned char* p, int len) {
  if (len == 1) return p[0];
  char32_t cp = p[0] & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return cp;
}

}  // namespace dion::data::detail
