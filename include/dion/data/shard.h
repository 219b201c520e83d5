// dion/data/shard.h — the FineWeb token shard format (llm.c / modded-nanogpt / microsoft/dion's
// data/fineweb.py): write, check and read.
//
// Format (little-endian):
//   bytes 0..1023   256 int32 header: [0] magic 20240520, [1] version 1, [2] token count N,
//                   [3] tokenizer (0: GPT-2 BPE, vocabulary 50257; 1: bytes, vocabulary 257),
//                   the rest zero (ignored on read)
//   bytes 1024..    N uint16 token ids
// The tokenizer slot: the reference, llm.c and modded-nanogpt write zeros after [2] and never
// read them, so 0 must mean GPT-2 (every FineWeb shard ever written is read as it was) and a
// byte shard still loads in the reference's loader (its tokens are just small ids). A slot in
// the header, not a sidecar file: the vocabulary then travels with each shard (a copied or
// downloaded shard cannot lose it) and a set of shards mixing tokenizers is caught per file
// (shard_folder_read). Any other value is refused, naming the file and the values known.
// A shard is valid only if its size is exactly 1024 + 2*N bytes.
//
// Names are PREFIX_{val,train}_NNNNNN.bin (six digits); the trainer globs
// fineweb_train_*.bin / fineweb_val_*.bin.
//
// What it does not do: decode tokens (tokenizer.h), choose which shard a rank reads (the trainer does), or other token widths
// (llm.c's version 2 with uint32 tokens is refused with a message saying so).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace dion::data {

inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderInts = 256;
inline constexpr size_t kShardHeaderBytes = kShardHeaderInts * sizeof(int32_t);  // 1024
inline constexpr int64_t kShardMaxTokens = INT32_MAX;                            // the count is an int32

// Header slot [3]: which tokenizer wrote the tokens (see the top of this file).
enum class ShardTokenizer : int32_t { GPT2 = 0, BYTES = 1 };

// "gpt2" / "bytes".
const char* shard_tokenizer_name(ShardTokenizer t);
// The vocabulary of `t`: 50257 (GPT-2) or 257 (bytes 0..255 + end-of-text 256).
uint32_t shard_tokenizer_vocab(ShardTokenizer t);
// "gpt2" -> GPT2, "byte" or "bytes" -> BYTES; anything else throws DataError naming `what`
// (e.g. "--tokenizer") and the valid names.
ShardTokenizer shard_tokenizer_parse(std::string_view name, std::string_view what);

struct ShardHeader {
  int32_t magic = kShardMagic;
  int32_t version = kShardVersion;
  int64_t token_count = 0;
  ShardTokenizer tokenizer = ShardTokenizer::GPT2;  // header slot [3]
  int64_t file_bytes = 0;                           // the size on disk, checked == 1024 + 2 * token_count
};

// The size of a shard of `token_count` tokens: 1024 + 2 * token_count.
inline constexpr int64_t shard_file_bytes(int64_t token_count) {
  return static_cast<int64_t>(kShardHeaderBytes) + 2 * token_count;
}
inline constexpr int64_t kShardMaxFileBytes = shard_file_bytes(kShardMaxTokens);

// Parses and checks the first 1024 bytes of a shard (`bytes`, at least that long): magic,
// version, count >= 0, a known tokenizer, and — when file_bytes >= 0 — that the file has exactly
// 1024 + 2*count bytes. `path` is for the message. Throws DataError as shard_read_header does.
ShardHeader shard_parse_header(std::string_view bytes, int64_t file_bytes, const std::filesystem::path& path);

// Reads and checks the header of `path` and its size. Throws DataError naming the file and what
// is wrong: unreadable, shorter than the header, bad magic, unsupported version, negative count,
// size != 1024 + 2*count (a truncated or half-downloaded file).
ShardHeader shard_read_header(const std::filesystem::path& path);

// A shard read into memory. Opening checks the header and size (shard_read_header), then reads
// every token with pread (not mmap: a file truncated or replaced while mapped would kill the
// process with SIGBUS); a file that shrinks or changes size during the read is an error naming
// it. Move-only. The reference's loader also reads a whole shard at once (_load_data_shard).
class ShardFile {
 public:
  static ShardFile open(const std::filesystem::path& path);

  ShardFile(ShardFile&& other) noexcept;
  ShardFile& operator=(ShardFile&& other) noexcept;
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;
  ~ShardFile();

  const std::filesystem::path& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  std::span<const uint16_t> tokens() const;  // [N]

 private:
  ShardFile() = default;
  std::filesystem::path path_;
  ShardHeader header_;
  std::unique_ptr<uint16_t[]> tokens_;  // [token_count]
};

// Throws DataError naming the file, the first offending index and value if a token of `shard`
// is >= vocab_size.
void shard_check_tokens(const ShardFile& shard, uint32_t vocab_size);

// Writes `tokens` as a shard under a temporary name beside `path` (never ending in ".bin"),
// fsyncs it and returns the temporary path; the caller renames it into place (or removes it).
// `tokenizer` goes into header slot [3]. Throws DataError (and removes the temporary) if the
// write fails or there are too many tokens.
std::filesystem::path shard_write_temp(const std::filesystem::path& path, std::span<const uint16_t> tokens,
                                       ShardTokenizer tokenizer = ShardTokenizer::GPT2);

// shard_write_temp + rename: `path` either appears complete or not at all.
void shard_write(const std::filesystem::path& path, std::span<const uint16_t> tokens,
                 ShardTokenizer tokenizer = ShardTokenizer::GPT2);

// "PREFIX_SPLIT_NNNNNN.bin", e.g. shard_name("fineweb", "val", 0) = "fineweb_val_000000.bin".
std::string shard_name(std::string_view prefix, std::string_view split, int64_t index);

}  // namespace dion::data
