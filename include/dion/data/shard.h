// dion/data/shard.h — the FineWeb token shard format (llm.c / modded-nanogpt / microsoft/dion's
// data/fineweb.py): write, check and read.
//
// Format (little-endian):
//   bytes 0..1023   256 int32 header: [0] magic 20240520, [1] version 1, [2] token count N,
//                   the rest zero (ignored on read)
//   bytes 1024..    N uint16 GPT-2 token ids
// A shard is valid only if its size is exactly 1024 + 2*N bytes.
//
// Names are PREFIX_{val,train}_NNNNNN.bin (six digits); the trainer globs
// fineweb_train_*.bin / fineweb_val_*.bin.
//
// What it does not do: choose which shard a rank reads (the trainer does), or other token widths
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
inline constexpr int64_t kShardMaxTokens = INT32_MAX;  // the count is an int32

struct ShardHeader {
  int32_t magic = kShardMagic;
  int32_t version = kShardVersion;
  int64_t token_count = 0;
  int64_t file_bytes = 0;  // the size on disk, checked == 1024 + 2 * token_count
};

// The size of a shard of `token_count` tokens: 1024 + 2 * token_count.
inline constexpr int64_t shard_file_bytes(int64_t token_count) {
  return static_cast<int64_t>(kShardHeaderBytes) + 2 * token_count;
}
inline constexpr int64_t kShardMaxFileBytes = shard_file_bytes(kShardMaxTokens);

// Parses and checks the first 1024 bytes of a shard (`bytes`, at least that long): magic,
// version, count >= 0, and — when file_bytes >= 0 — that the file has exactly
// 1024 + 2*count bytes. `path` is for the message. Throws DataError as shard_read_header does.
ShardHeader shard_parse_header(std::string_view bytes, int64_t file_bytes,
                               const std::filesystem::path& path);

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
// Throws DataError (and removes the temporary) if the write fails or there are too many tokens.
std::filesystem::path shard_write_temp(const std::filesystem::path& path,
                                       std::span<const uint16_t> tokens);

// shard_write_temp + rename: `path` either appears complete or not at all.
void shard_write(const std::filesystem::path& path, std::span<const uint16_t> tokens);

// "PREFIX_SPLIT_NNNNNN.bin", e.g. shard_name("fineweb", "val", 0) = "fineweb_val_000000.bin".
std::string shard_name(std::string_view prefix, std::string_view split, int64_t index);

}  // namespace dion::data
