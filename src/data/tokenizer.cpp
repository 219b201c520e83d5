// src/data/tokenizer.cpp — the GPT-2 tokenizer's vocabulary (see dion/data/tokenizer.h for the
// contract): GPT-2's byte alphabet, encoder.json + vocab.bpe read and checked against each other
// as tiktoken does, the pre-tokenization pattern compiled, and the tokenizer's construction and
// copies. Encoding with it is tokenizer_bpe.cpp.
#include "dion/data/tokenizer.h"

#include <algorithm>
#include <array>
#include <utility>

#include <fmt/format.h>
#include <fmt/std.h>
#include <nlohmann/json.hpp>

#include "dion/data/error.h"
#include "file_util.h"
#include "tokenizer_detail.h"
#include "utf8.h"

namespace dion::data {

namespace detail {

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace detail

namespace {

using detail::kEndOfTextText;
using detail::pcre2_error_text;
using detail::utf8_decode;
using detail::utf8_scan;

// ---------------------------------------------------------------------------- byte alphabet

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes are
// shifted to U+0100.. in byte order. Returns code point -> byte (-1 if not a byte's stand-in)
// and the byte order tiktoken uses for ranks 0..255 (the printable ones first).
struct ByteAlphabet {
  std::array<int, 512> cp_to_byte;
  std::array<uint8_t, 256> rank_to_byte;
};

ByteAlphabet byte_alphabet() {
  ByteAlphabet a;
  a.cp_to_byte.fill(-1);
  auto printable = [](int b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
  };
  int rank = 0, shifted = 0;
  for (int b = 0; b < 256; ++b) {
    if (printable(b)) {
      a.cp_to_byte[b] = b;
      a.rank_to_byte[rank++] = static_cast<uint8_t>(b);
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!printable(b)) {
      a.cp_to_byte[256 + shifted++] = b;
      a.rank_to_byte[rank++] = static_cast<uint8_t>(b);
    }
  }
  return a;
}

// A token as written in encoder.json / vocab.bpe ("Ġthe") -> its bytes (" the"). Returns false
// if a character is not one of the 256 byte stand-ins.
bool gpt2_text_to_bytes(std::string_view text, const ByteAlphabet& alphabet, std::string& out) {
  out.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    int len = utf8_scan(p, text.size(), i);
    if (len < 0) return false;
    char32_t cp = utf8_decode(p + i, len);
    if (cp >= alphabet.cp_to_byte.size() || alphabet.cp_to_byte[cp] < 0) return false;
    out.push_back(static_cast<char>(alphabet.cp_to_byte[cp]));
    i += static_cast<size_t>(len);
  }
  return true;
}

// ---------------------------------------------------------------------------- pre-tokenization

// The GPT-2 pattern. tiktoken runs it with Rust's regex, where \s is the Unicode White_Space
// property; PCRE2's \s also matches U+180E, so the set is spelled out here.
#define DION_WS                                                                               \
  "\\x{9}-\\x{D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}" \
  "\\x{205F}\\x{3000}"
// clang-format off
constexpr const char* kGpt2Pattern =
    "'(?:[sdmt]|ll|ve|re)"
    "| ?\\p{L}+"
    "| ?\\p{N}+"
    "| ?[^" DION_WS "\\p{L}\\p{N}]+"
    "|[" DION_WS "]+(?![^" DION_WS "])"
    "|[" DION_WS "]+";
// clang-format on
#undef DION_WS

}  // namespace

// ---------------------------------------------------------------------------- loading

Gpt2Tokenizer Gpt2Tokenizer::from_dir(const std::filesystem::path& dir) {
  return from_files(dir / "encoder.json", dir / "vocab.bpe");
}

Gpt2Tokenizer Gpt2Tokenizer::from_files(const std::filesystem::path& encoder_json,
                                        const std::filesystem::path& vocab_bpe) {
  const std::string fix = " (use the GPT-2 files tiktoken's gpt2 encoding loads; see docs/data.md)";
  auto vocab = std::make_shared<Vocab>();
  const ByteAlphabet alphabet = byte_alphabet();

  // encoder.json: {"token text": id, ...}, 50257 entries, ids 0..50256.
  nlohmann::json enc;
  try {
    enc = nlohmann::json::parse(detail::file_read_all(encoder_json, "GPT-2 encoder.json"));
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("GPT-2 encoder.json {}: not valid JSON: {}{}", encoder_json, e.what(), fix));
  }
  if (!enc.is_object() || enc.size() != kVocabSize) {
    throw DataError(fmt::format("GPT-2 encoder.json {}: expected an object of {} tokens, found {}{}", encoder_json,
                                kVocabSize, enc.is_object() ? std::to_string(enc.size()) : "no object", fix));
  }
  vocab->id_to_bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  std::string bytes;
  for (const auto& [text, value] : enc.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 || value.get<int64_t>() >= kVocabSize) {
      throw DataError(
          fmt::format("GPT-2 encoder.json {}: token \"{}\" has id {}, expected an "
                      "integer in [0, {}){}",
                      encoder_json, text, value.dump(), kVocabSize, fix));
    }
    const auto id = value.get<uint32_t>();
    if (seen[id]) {
      throw DataError(fmt::format("GPT-2 encoder.json {}: id {} appears twice{}", encoder_json, id, fix));
    }
    seen[id] = true;
    if (text == kEndOfTextText) {
      if (id != kEndOfText) {
        throw DataError(
            fmt::format("GPT-2 encoder.json {}: <|endoftext|> has id {}, expected "
                        "{}{}",
                        encoder_json, id, kEndOfText, fix));
      }
      vocab->id_to_bytes[id] = std::string(kEndOfTextText);
      continue;
    }
    if (!gpt2_text_to_bytes(text, alphabet, bytes)) {
      throw DataError(
          fmt::format("GPT-2 encoder.json {}: token \"{}\" (id {}) uses a character "
                      "outside GPT-2's byte alphabet{}",
                      encoder_json, text, id, fix));
    }
    vocab->id_to_bytes[id] = bytes;
    vocab->ranks.emplace(bytes, id);
  }
  if (vocab->ranks.size() != kVocabSize - 1) {
    throw DataError(fmt::format("GPT-2 encoder.json {}: two tokens have the same bytes{}", encoder_json, fix));
  }

  // Ranks 0..255 are the single bytes in tiktoken's order; vocab.bpe line k (after the
  // "#version" line) is the merge whose result has rank 256 + k-1. Both must agree with
  // encoder.json, as tiktoken's data_gym_to_mergeable_bpe_ranks asserts.
  for (uint32_t r = 0; r < 256; ++r) {
    const std::string one(1, static_cast<char>(alphabet.rank_to_byte[r]));
    if (vocab->id_to_bytes[r] != one) {
      throw DataError(
          fmt::format("GPT-2 encoder.json {}: id {} should be the single byte 0x{:02X}"
                      "{}",
                      encoder_json, r, alphabet.rank_to_byte[r], fix));
    }
    vocab->byte_id[alphabet.rank_to_byte[r]] = r;
  }
  const std::string merges = detail::file_read_all(vocab_bpe, "GPT-2 vocab.bpe");
  size_t line_start = merges.find('\n');
  if (merges.rfind("#version", 0) != 0 || line_start == std::string::npos) {
    throw DataError(fmt::format("GPT-2 vocab.bpe {}: does not start with a \"#version\" line{}", vocab_bpe, fix));
  }
  ++line_start;
  uint32_t next_id = 256;
  size_t line_no = 2;
  std::string first, second;
  while (line_start < merges.size()) {
    size_t line_end = merges.find('\n', line_start);
    if (line_end == std::string::npos) line_end = merges.size();
    std::string_view line(merges.data() + line_start, line_end - line_start);
    if (!line.empty()) {
      size_t space = line.find(' ');
      if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos ||
          !gpt2_text_to_bytes(line.substr(0, space), alphabet, first) ||
          !gpt2_text_to_bytes(line.substr(space + 1), alphabet, second)) {
        throw DataError(
            fmt::format("GPT-2 vocab.bpe {}:{}: expected two GPT-2 tokens separated by "
                        "one space{}",
                        vocab_bpe, line_no, fix));
      }
      if (next_id >= kEndOfText || vocab->id_to_bytes[next_id] != first + second) {
        throw DataError(
            fmt::format("GPT-2 vocab.bpe {}:{}: merge \"{}\" does not make token {} of "
                        "encoder.json {}: the two files do not belong together{}",
                        vocab_bpe, line_no, line, next_id, encoder_json, fix));
      }
      ++next_id;
    }
    line_start = line_end + 1;
    ++line_no;
  }
  if (next_id != kEndOfText) {
    throw DataError(fmt::format("GPT-2 vocab.bpe {}: has {} merges, expected {}{}", vocab_bpe, next_id - 256,
                                kEndOfText - 256, fix));
  }

  int err = 0;
  PCRE2_SIZE err_offset = 0;
  vocab->regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP,
                               &err, &err_offset, nullptr);
  if (vocab->regex == nullptr) {
    throw DataError(
        fmt::format("tokenizer: the installed PCRE2 cannot compile the GPT-2 pattern "
                    "at offset {}: {} (PCRE2 needs UTF and Unicode property support)",
                    err_offset, pcre2_error_text(err)));
  }
  vocab->jit = pcre2_jit_compile(vocab->regex, PCRE2_JIT_COMPLETE) == 0;
  return Gpt2Tokenizer(std::move(vocab));
}

Gpt2Tokenizer::Gpt2Tokenizer(std::shared_ptr<const Vocab> vocab)
    : vocab_(std::move(vocab)), work_(std::make_unique<Workspace>(vocab_->regex)) {}

Gpt2Tokenizer::Gpt2Tokenizer(const Gpt2Tokenizer& other) : Gpt2Tokenizer(other.vocab_) {}

Gpt2Tokenizer& Gpt2Tokenizer::operator=(const Gpt2Tokenizer& other) {
  if (this != &other) {
    vocab_ = other.vocab_;
    work_ = std::make_unique<Workspace>(vocab_->regex);
  }
  return *this;
}

Gpt2Tokenizer::Gpt2Tokenizer(Gpt2Tokenizer&& other) noexcept = default;
Gpt2Tokenizer& Gpt2Tokenizer::operator=(Gpt2Tokenizer&& other) noexcept = default;
Gpt2Tokenizer::~Gpt2Tokenizer() = default;

}  // namespace dion::data
