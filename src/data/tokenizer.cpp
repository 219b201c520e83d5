// src/data/tokenizer.cpp — GPT-2 byte-level BPE (see dion/data/tokenizer.h for the contract).
//
// Layout: UTF-8 helpers, loading encoder.json + vocab.bpe, the pre-tokenization regex, the BPE
// merge, encode/decode. The merge follows tiktoken's _byte_pair_merge (rank of the concatenated
// pair, lowest first, leftmost on ties) but keeps the candidate pairs in a min-heap, so a long
// piece (a run of 100k spaces) costs O(n log n) instead of O(n^2).
#include "dion/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <functional>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <fmt/std.h>
#include <nlohmann/json.hpp>

#include "dion/data/error.h"
#include "file_util.h"

namespace dion::data {

namespace {

// ---------------------------------------------------------------------------- UTF-8

// Length of the well-formed UTF-8 sequence that starts at s[i] (1..4), or minus the length of
// the maximal ill-formed subpart there (the bytes Python's decoder turns into one U+FFFD).
int utf8_scan(const unsigned char* s, size_t n, size_t i) {
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
char32_t utf8_decode(const unsigned char* p, int len) {
  if (len == 1) return p[0];
  char32_t cp = p[0] & (0x7F >> len);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[k] & 0x3F);
  return cp;
}

// ---------------------------------------------------------------------------- vocabulary

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using RankMap = std::unordered_map<std::string, uint32_t, StringHash, std::equal_to<>>;

constexpr uint32_t kNoRank = UINT32_MAX;
constexpr std::string_view kEndOfTextText = "<|endoftext|>";

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

std::string pcre2_error_text(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

struct Gpt2Tokenizer::Vocab {
  std::vector<std::string> id_to_bytes;  // [kVocabSize]
  RankMap ranks;                         // token bytes -> id, without <|endoftext|>
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
  std::unordered_map<std::string, std::pair<uint32_t, uint32_t>, StringHash, std::equal_to<>> cache;
  std::vector<uint32_t> cache_ids;
  std::vector<uint32_t> next, prev, rank;           // [n] per part, indexed by start offset
  std::vector<std::pair<uint32_t, uint32_t>> heap;  // (rank, start offset), min-heap
  std::string sanitized;

  explicit Workspace(const pcre2_code* regex)
      : match(pcre2_match_data_create_from_pattern(regex, nullptr)) {
    if (match == nullptr) throw DataError("tokenizer: out of memory (pcre2 match data)");
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { pcre2_match_data_free(match); }
};

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
    throw DataError(
        fmt::format("GPT-2 encoder.json {}: not valid JSON: {}{}", encoder_json, e.what(), fix));
  }
  if (!enc.is_object() || enc.size() != kVocabSize) {
    throw DataError(fmt::format(
        "GPT-2 encoder.json {}: expected an object of {} tokens, found {}{}", encoder_json,
        kVocabSize, enc.is_object() ? std::to_string(enc.size()) : "no object", fix));
  }
  vocab->id_to_bytes.assign(kVocabSize, std::string());
  std::vector<bool> seen(kVocabSize, false);
  std::string bytes;
  for (const auto& [text, value] : enc.items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() >= kVocabSize) {
      throw DataError(
          fmt::format("GPT-2 encoder.json {}: token \"{}\" has id {}, expected an "
                      "integer in [0, {}){}",
                      encoder_json, text, value.dump(), kVocabSize, fix));
    }
    const auto id = value.get<uint32_t>();
    if (seen[id]) {
      throw DataError(
          fmt::format("GPT-2 encoder.json {}: id {} appears twice{}", encoder_json, id, fix));
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
    throw DataError(
        fmt::format("GPT-2 encoder.json {}: two tokens have the same bytes{}", encoder_json, fix));
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
    throw DataError(fmt::format("GPT-2 vocab.bpe {}: does not start with a \"#version\" line{}",
                                vocab_bpe, fix));
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
    throw DataError(fmt::format("GPT-2 vocab.bpe {}: has {} merges, expected {}{}", vocab_bpe,
                                next_id - 256, kEndOfText - 256, fix));
  }

  int err = 0;
  PCRE2_SIZE err_offset = 0;
  vocab->regex = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern), PCRE2_ZERO_TERMINATED,
                               PCRE2_UTF | PCRE2_UCP, &err, &err_offset, nullptr);
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

// ---------------------------------------------------------------------------- BPE

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
  const Vocab& v = *vocab_;
  Workspace& w = *work_;
  if (piece.size() == 1) {
    out.push_back(v.byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (auto it = v.ranks.find(piece); it != v.ranks.end()) {  // the whole piece is one token
    out.push_back(it->second);
    return;
  }
  if (auto it = w.cache.find(piece); it != w.cache.end()) {
    const auto [offset, count] = it->second;
    out.insert(out.end(), w.cache_ids.begin() + offset, w.cache_ids.begin() + offset + count);
    return;
  }

  // Parts are identified by their start offset; next[i] is the start of the part after i
  // (n at the end); rank[i] is the rank of part i joined with its successor (kNoRank if that
  // is not a token, or i is the last part or no longer a part).
  const auto n = static_cast<uint32_t>(piece.size());
  auto& next = w.next;
  auto& prev = w.prev;
  auto& rank = w.rank;
  auto& heap = w.heap;
  next.resize(n);
  prev.resize(n);
  rank.resize(n);
  heap.clear();
  auto pair_rank = [&](uint32_t i) -> uint32_t {
    uint32_t j = next[i];
    if (j >= n) return kNoRank;
    uint32_t end = next[j] - i;
    auto it = v.ranks.find(piece.substr(i, end));
    return it == v.ranks.end() ? kNoRank : it->second;
  };
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? kNoRank : i - 1;
  }
  for (uint32_t i = 0; i < n; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.emplace_back(rank[i], i);
  }
  const auto cmp = std::greater<std::pair<uint32_t, uint32_t>>();
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const auto [r, i] = heap.back();
    heap.pop_back();
    if (rank[i] != r) continue;  // stale: part i was merged away or its pair changed
    const uint32_t j = next[i];
    next[i] = next[j];
    if (next[i] < n) prev[next[i]] = i;
    rank[j] = kNoRank;
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) {
      heap.emplace_back(rank[i], i);
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
    if (prev[i] != kNoRank) {
      const uint32_t p = prev[i];
      rank[p] = pair_rank(p);
      if (rank[p] != kNoRank) {
        heap.emplace_back(rank[p], p);
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }

  // Every part is a single byte or the result of a merge, so it is always a token.
  if (n > Workspace::kCacheMaxPieceBytes) {  // rare (long runs): not worth caching
    for (uint32_t i = 0; i < n; i = next[i])
      out.push_back(v.ranks.find(piece.substr(i, next[i] - i))->second);
    return;
  }
  if (w.cache.size() >= Workspace::kCacheMaxEntries) {
    w.cache.clear();
    w.cache_ids.clear();
  }
  const auto offset = static_cast<uint32_t>(w.cache_ids.size());
  for (uint32_t i = 0; i < n; i = next[i]) {
    w.cache_ids.push_back(v.ranks.find(piece.substr(i, next[i] - i))->second);
  }
  const auto count = static_cast<uint32_t>(w.cache_ids.size()) - offset;
  w.cache.emplace(std::string(piece), std::make_pair(offset, count));
  out.insert(out.end(), w.cache_ids.begin() + offset, w.cache_ids.end());
}

// ---------------------------------------------------------------------------- encode / decode

void Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) {
  encode_ordinary(text, out, nullptr);
}

bool Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out,
                                    const std::function<bool()>& should_stop) {
  constexpr PCRE2_SIZE kStopCheckBytes = 1 << 20;
  const Vocab& v = *vocab_;
  Workspace& w = *work_;
  std::string_view s = text;
  if (!utf8_is_valid(text)) {
    w.sanitized = utf8_sanitize(text);
    s = w.sanitized;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  PCRE2_SIZE pos = 0, next_check = kStopCheckBytes;
  while (pos < s.size()) {
    if (should_stop && pos >= next_check) {
      if (should_stop()) return false;
      next_check = pos + kStopCheckBytes;
    }
    int rc =
        v.jit ? pcre2_jit_match(v.regex, subject, s.size(), pos, 0, w.match, nullptr)
              : pcre2_match(v.regex, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, w.match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: every character matches
    if (rc < 0) {
      throw DataError(
          fmt::format("tokenizer: PCRE2 match failed at byte {}: {}", pos, pcre2_error_text(rc)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(w.match);
    encode_piece(s.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1];
  }
  return true;
}

std::vector<uint32_t> Gpt2Tokenizer::encode_ordinary(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_ordinary(text, out);
  return out;
}

std::vector<uint32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(kEndOfTextText, pos);
    encode_ordinary(text.substr(pos, hit == std::string_view::npos ? hit : hit - pos), out);
    if (hit == std::string_view::npos) break;
    out.push_back(kEndOfText);
    pos = hit + kEndOfTextText.size();
  }
  return out;
}

std::string_view Gpt2Tokenizer::token_bytes(uint32_t id) const {
  if (id >= kVocabSize) {
    throw DataError(
        fmt::format("tokenizer: token id {} is not in the GPT-2 vocabulary (ids are "
                    "0..{})",
                    id, kVocabSize - 1));
  }
  return vocab_->id_to_bytes[id];
}

namespace {
template <typename Id>
std::string decode_ids(const Gpt2Tokenizer& tok, std::span<const Id> ids) {
  std::string out;
  for (Id id : ids) out += tok.token_bytes(id);
  return out;
}
}  // namespace

std::string Gpt2Tokenizer::decode(std::span<const uint32_t> ids) const {
  return decode_ids(*this, ids);
}
std::string Gpt2Tokenizer::decode(std::span<const uint16_t> ids) const {
  return decode_ids(*this, ids);
}

// ---------------------------------------------------------------------------- UTF-8 (public)

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
      throw DataError(fmt::format("token id {} is outside the byte vocabulary (ids must be < {}: "
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
