// dion/data/tokenizer.h — the GPT-2 byte-level BPE tokenizer, id-for-id equal to tiktoken's
// `gpt2` encoding; and ByteTokenizer, each byte one id (for models whose parameters should sit
// in the hidden matrices rather than a 50257-row embedding: bench/convergence.sh).
//
// ByteTokenizer: byte b -> id b (0..255), end-of-text -> 256; vocabulary 257. encode() is the
// identity on bytes (no UTF-8 handling: any bytes round-trip exactly); decode() maps 256 to the
// text "<|endoftext|>" as GPT-2's decode does. Shards record which tokenizer wrote them
// (shard.h, ShardTokenizer).
//
// What it does:
//   - loads the two files GPT-2 ships (encoder.json: token -> id, vocab.bpe: the merges) and
//     checks that they agree, as tiktoken's loader does;
//   - encode_ordinary(): splits text with the GPT-2 pre-tokenization pattern
//       's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//     (PCRE2, JIT-compiled; \s is spelled out as the Unicode White_Space set, as Rust's regex
//     reads it), then merges each piece by rank exactly as tiktoken does (lowest rank of the
//     concatenated pair first, leftmost on ties), with a per-piece cache;
//   - encode(): the same, but the literal text "<|endoftext|>" becomes token 50256;
//   - decode(): ids -> bytes.
//
// Invalid UTF-8: tiktoken encodes Python str, so bytes must first become a str. We encode what
// tiktoken sees after `bytes.decode("utf-8", errors="replace")`: every maximal ill-formed
// subsequence becomes U+FFFD (utf8_sanitize below). Valid input is untouched.
//
// What it does not do: other encodings (cl100k, o200k), training, normalization, or thread
// safety of one object. A Gpt2Tokenizer holds a cache and scratch space; give each thread its
// own copy (copies share the read-only vocabulary, so a copy is cheap and starts with an empty
// cache).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dion::data {

class Gpt2Tokenizer {
 public:
  static constexpr uint32_t kEndOfText = 50256;  // "<|endoftext|>"
  static constexpr uint32_t kVocabSize = 50257;  // 256 bytes + 50000 merges + <|endoftext|>

  // Loads <dir>/encoder.json and <dir>/vocab.bpe. Throws DataError naming the file on any
  // problem (missing, unreadable, malformed, the two files disagree).
  static Gpt2Tokenizer from_dir(const std::filesystem::path& dir);
  static Gpt2Tokenizer from_files(const std::filesystem::path& encoder_json, const std::filesystem::path& vocab_bpe);

  Gpt2Tokenizer(const Gpt2Tokenizer& other);  // shares the vocabulary, fresh cache
  Gpt2Tokenizer& operator=(const Gpt2Tokenizer& other);
  Gpt2Tokenizer(Gpt2Tokenizer&& other) noexcept;
  Gpt2Tokenizer& operator=(Gpt2Tokenizer&& other) noexcept;
  ~Gpt2Tokenizer();

  // Appends the ids of `text` (any bytes) to `out`. "<|endoftext|>" is ordinary text here.
  void encode_ordinary(std::string_view text, std::vector<uint32_t>& out);
  // The same, calling `should_stop` after about every 1 MiB of text; when it returns true the
  // encoding stops there and this returns false (`out` then holds the ids so far). For
  // cancelling a long document (Ctrl-C, SIGTERM) without waiting for its end.
  bool encode_ordinary(std::string_view text, std::vector<uint32_t>& out, const std::function<bool()>& should_stop);
  std::vector<uint32_t> encode_ordinary(std::string_view text);
  // As encode_ordinary, but each literal "<|endoftext|>" becomes kEndOfText.
  std::vector<uint32_t> encode(std::string_view text);

  // The bytes of the ids, concatenated (may be invalid UTF-8 when a multi-byte character is
  // split across ids). Throws DataError for an id >= vocab_size().
  std::string decode(std::span<const uint32_t> ids) const;
  std::string decode(std::span<const uint16_t> ids) const;
  // The bytes of one token. Throws DataError for an id >= vocab_size().
  std::string_view token_bytes(uint32_t id) const;
  uint32_t vocab_size() const { return kVocabSize; }

 private:
  struct Vocab;
  struct Workspace;
  explicit Gpt2Tokenizer(std::shared_ptr<const Vocab> vocab);
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out);

  std::shared_ptr<const Vocab> vocab_;
  std::unique_ptr<Workspace> work_;
};

class ByteTokenizer {
 public:
  static constexpr uint32_t kEndOfText = 256;
  static constexpr uint32_t kVocabSize = 257;

  // Appends one id per byte of `text`.
  static void encode_ordinary(std::string_view text, std::vector<uint32_t>& out);
  static std::vector<uint32_t> encode_ordinary(std::string_view text);
  // The bytes of the ids; 256 becomes "<|endoftext|>". Throws DataError for an id >= 257.
  static std::string decode(std::span<const uint32_t> ids);
  static std::string decode(std::span<const uint16_t> ids);
  static uint32_t vocab_size() { return kVocabSize; }
};

// True when `bytes` is well-formed UTF-8.
bool utf8_is_valid(std::string_view bytes);
// `bytes` with every maximal ill-formed subsequence replaced by U+FFFD (EF BF BD), the same
// result as Python's bytes.decode("utf-8", errors="replace").encode("utf-8").
std::string utf8_sanitize(std::string_view bytes);

}  // namespace dion::data
