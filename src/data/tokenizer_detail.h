// src/data/tokenizer_detail.h — what the GPT-2 tokenizer's sources share (private to src/data):
// the vocabulary Gpt2Tokenizer::Vocab (ids <-> bytes, the merge ranks, the compiled pattern), the
// per-object Workspace (match data, the per-piece cache, the merge's arrays), and the PCRE2
// error text. tokenizer.cpp builds the vocabulary; tokenizer_bpe.cpp encodes with it.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dion/data/error.h"
#include "dion/data/tokenizer.h"

namespace dion::data {

namespace detail {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using RankMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

constexpr uint32_t kNoRank = UINT32_MAX;
constexpr std::string_view kEndOfTextText = "<|endoftext|>";

// PCRE2's message for error `code`.
std::string pcre2_error_text(int code);

}  // namespace detail

struct Gpt2Tokenizer::Vocab {
  std::vector<std::string> id_to_bytes;  // [kVocabSize]
  detail::RankMap ranks;                 // token bytes -> id, without <|endoftext|>
  std::array<uint32_t, 256> byte_id{};   // single byte -> id
  pcre2_code* regex = nullptr;
  bool jit = false;

  Vocab() = default;
  Vocab(const Vocab&) = delete;
  Vocab& operator=(const Vocab&) = delete;
  ~Vocab() { pcre2_code_free(regex); }
};

// Per-object scratch: regex match data, the per-piece cache, the merge's arrays.
struct Gpt2Tokenizer::Workspace {
  static constexpr size_t kCacheMaxEntries = 1 << 16;
  static constexpr size_t kCacheMaxPieceBytes = 256;

  pcre2_match_data* match = nullptr;
  // piece bytes -> (offset, count) into cache_ids; cleared when it reaches kCacheMaxEntries.
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, detail::StringHash, std::equal_to<>> cache;
  std::vector<uint32_t> cache_ids;
  std::vector<uint32_t> next, prev, rank;           // [n] per part, indexed by start offset
  std::vector<std::pair<uint32_t, uint32_t>> heap;  // (rank, start offset), min-heap
  std::string sanitized;

  explicit Workspace(const pcre2_code* regex) : match(pcre2_match_data_create_from_pattern(regex, nullptr)) {
    if (match == nullptr) throw DataError("tokenizer: out of memory (pcre2 match data)");
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { pcre2_match_data_free(match); }
};

}  // namespace dion::data
