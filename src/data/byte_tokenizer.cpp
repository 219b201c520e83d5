// src/data/byte_tokenizer.cpp — ByteTokenizer (dion/data/tokenizer.h): each byte is its own
// token (ids 0..255), end-of-text is 256.
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dion/data/error.h"
#include "dion/data/tokenizer.h"

namespace dion::data {

// ---------------------------------------------------------------------------- ByteTokenizer

void ByteTokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) {
  out.reserve(out.size() + text.size());
  for (char c : text) out.push_back(static_cast<unsigned char>(c));
}

std::vector<uint32_t> ByteTokenizer::encode_ordinary(std::string_view text) {
  std::vector<uint32_t> out;
  encode_ordinary(text, out);
  return out;
}

namespace {
template <typename Id>
std::string byte_decode(std::span<const Id> ids) {
  std::string out;
  out.reserve(ids.size());
  for (Id id : ids) {
    if (id < 256) {
      out.push_back(static_cast<char>(id));
    } else if (id == ByteTokenizer::kEndOfText) {
      out += "<|endoftext|>";
    } else {
      throw DataError(
          fmt::format("token id {} is outside the byte vocabulary (ids must be < {}: "
                      "bytes 0..255 and end-of-text 256)",
                      static_cast<uint32_t>(id), ByteTokenizer::kVocabSize));
    }
  }
  return out;
}
}  // namespace

std::string ByteTokenizer::decode(std::span<const uint32_t> ids) { return byte_decode(ids); }
std::string ByteTokenizer::decode(std::span<const uint16_t> ids) { return byte_decode(ids); }

}  // namespace dion::data
