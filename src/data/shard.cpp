// src/data/shard.cpp — FineWeb shard format (see dion/data/shard.h). POSIX open/pread.
#include "dion/data/shard.h"

#include <algorithm>
#include <array>
#include <memory>
#include <bit>
#include <cstring>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "file_util.h"

namespace dion::data {

static_assert(std::endian::native == std::endian::little,
              "the shard format is little-endian; this reader does not byte-swap");

namespace {

constexpr std::string_view kRedo =
    "delete it, then re-create it (dion-data prepare) or re-download it (dion-data download)";

// Opens `path` read-only (never blocking on a FIFO, refusing anything but a regular file);
// throws a DataError that says why not.
int open_shard(const std::filesystem::path& path, struct stat& st) {
  return detail::file_open_regular(path, "shard", st);
}

// Reads and checks the header and the size of the open shard `fd` (stat `st`).
ShardHeader read_header(int fd, const struct stat& st, const std::filesystem::path& path) {
  if (st.st_size < static_cast<off_t>(kShardHeaderBytes)) {
    throw DataError(
        fmt::format("shard {}: truncated: {} bytes, shorter than the {}-byte header "
                    "(an interrupted write or download); {}",
                    path, st.st_size, kShardHeaderBytes, kRedo));
  }
  std::array<char, kShardHeaderBytes> header{};
  size_t done = 0;
  while (done < kShardHeaderBytes) {
    ssize_t n = ::pread(fd, header.data() + done, kShardHeaderBytes - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw DataError(fmt::format("shard {}: cannot read the header: {}", path,
                                  n < 0 ? detail::errno_text(errno) : "unexpected end of file"));
    }
    done += static_cast<size_t>(n);
  }
  return shard_parse_header(std::string_view(header.data(), header.size()), st.st_size, path);
}

}  // namespace

ShardHeader shard_parse_header(std::string_view bytes, int64_t file_bytes, const std::filesystem::path& path) {
  if (bytes.size() < kShardHeaderBytes) {
    throw DataError(
        fmt::format("shard {}: truncated: {} bytes, shorter than the {}-byte header "
                    "(an interrupted write or download); {}",
                    path, bytes.size(), kShardHeaderBytes, kRedo));
  }
  auto int_at = [&](size_t i) {
    int32_t v;
    std::memcpy(&v, bytes.data() + 4 * i, sizeof(v));  // little-endian (static_assert above)
    return v;
  };
  ShardHeader h;
  h.magic = int_at(0);
  h.version = int_at(1);
  h.token_count = int_at(2);
  const int32_t tokenizer = int_at(3);
  h.file_bytes = file_bytes;
  if (h.magic != kShardMagic) {
    throw DataError(
        fmt::format("shard {}: bad magic {} (expected {}): not a FineWeb token shard "
                    "(wrong file, or a different format)",
                    path, h.magic, kShardMagic));
  }
  if (h.version != kShardVersion) {
    throw DataError(
        fmt::format("shard {}: unsupported version {} (this reader handles version {}: "
                    "uint16 GPT-2 tokens; llm.c's version 2 holds uint32 tokens)",
                    path, h.version, kShardVersion));
  }
  if (h.token_count < 0) {
    throw DataError(fmt::format("shard {}: corrupt header: negative token count {}; {}", path, h.token_count, kRedo));
  }
  if (tokenizer != static_cast<int32_t>(ShardTokenizer::GPT2) &&
      tokenizer != static_cast<int32_t>(ShardTokenizer::BYTES)) {
    throw DataError(
        fmt::format("shard {}: unknown tokenizer {} in header slot [3] (known: 0 = "
                    "gpt2, 1 = bytes): written by a newer dion-data, or corrupt; {}",
                    path, tokenizer, kRedo));
  }
  h.tokenizer = static_cast<ShardTokenizer>(tokenizer);
  const int64_t expected = shard_file_bytes(h.token_count);
  if (file_bytes >= 0 && file_bytes != expected) {
    throw DataError(
        fmt::format("shard {}: {} bytes, but its header says {} tokens, which take "
                    "1024 + 2*{} = {} bytes: the file is {} (an interrupted write or "
                    "download, or a corrupt header); {}",
                    path, file_bytes, h.token_count, h.token_count, expected,
                    file_bytes < expected ? "truncated" : "longer than its header says", kRedo));
  }
  return h;
}

ShardHeader shard_read_header(const std::filesystem::path& path) {
  struct stat st {};
  int fd = open_shard(path, st);
  try {
    ShardHeader h = read_header(fd, st, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

// ---------------------------------------------------------------------------- ShardFile

ShardFile ShardFile::open(const std::filesystem::path& path) {
  ShardFile f;
  f.path_ = path;
  struct stat st {};
  int fd = open_shard(path, st);
  try {
    f.header_ = read_header(fd, st, path);
    const auto count = static_cast<size_t>(f.header_.token_count);
    try {
      f.tokens_ = std::make_unique_for_overwrite<uint16_t[]>(count);
    } catch (const std::bad_alloc&) {
      throw DataError(
          fmt::format("shard {}: its {} tokens ({} MiB) do not fit in this process's memory (allocation failed; "
                      "see `ulimit -v` and free memory): cut the data into smaller shards (dion-data prepare "
                      "--shard-size; the reference's shards hold 100M tokens, 200 MB)",
                      path, f.header_.token_count, (count * sizeof(uint16_t)) >> 20));
    }
    auto* dst = reinterpret_cast<char*>(f.tokens_.get());
    const size_t bytes = count * sizeof(uint16_t);
    size_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(fd, dst + done, std::min<size_t>(bytes - done, 1 << 26),
                                static_cast<off_t>(kShardHeaderBytes + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        throw DataError(fmt::format("shard {}: read failed: {}", path, detail::errno_text(errno)));
      }
      if (n == 0) {
        throw DataError(
            fmt::format("shard {}: the file shrank to {} bytes while it was read (another program is "
                        "writing or replacing it?); read it again once that is done",
                        path, kShardHeaderBytes + done));
      }
      done += static_cast<size_t>(n);
    }
    struct stat after {};
    if (::fstat(fd, &after) == 0 && after.st_size != st.st_size) {
      throw DataError(
          fmt::format("shard {}: the file changed size ({} -> {} bytes) while it was read (another "
                      "program is writing or replacing it?); read it again once that is done",
                      path, st.st_size, after.st_size));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return f;
}

ShardFile::ShardFile(ShardFile&& other) noexcept = default;
ShardFile& ShardFile::operator=(ShardFile&& other) noexcept = default;
ShardFile::~ShardFile() = default;

std::span<const uint16_t> ShardFile::tokens() const {
  if (tokens_ == nullptr) return {};
  return {tokens_.get(), static_cast<size_t>(header_.token_count)};
}

const char* shard_tokenizer_name(ShardTokenizer t) { return t == ShardTokenizer::BYTES ? "bytes" : "gpt2"; }

uint32_t shard_tokenizer_vocab(ShardTokenizer t) { return t == ShardTokenizer::BYTES ? 257 : 50257; }

ShardTokenizer shard_tokenizer_parse(std::string_view name, std::string_view what) {
  if (name == "gpt2") return ShardTokenizer::GPT2;
  if (name == "byte" || name == "bytes") return ShardTokenizer::BYTES;
  throw DataError(
      fmt::format("{}: unknown tokenizer \"{}\"; valid: gpt2 (GPT-2 BPE, 50257 ids) "
                  "or byte (each byte one id, 257 ids with end-of-text)",
                  what, name));
}

void shard_check_tokens(const ShardFile& shard, uint32_t vocab_size) {
  const auto tokens = shard.tokens();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size) {
      throw DataError(
          fmt::format("shard {}: token {} at index {} is outside the vocabulary (ids "
                      "must be < {}): the shard is corrupt or was made with another "
                      "tokenizer",
                      shard.path(), tokens[i], i, vocab_size));
    }
  }
}

// ---------------------------------------------------------------------------- writing

std::filesystem::path shard_write_temp(const std::filesystem::path& path, std::span<const uint16_t> tokens,
                                       ShardTokenizer tokenizer) {
  if (tokens.size() > static_cast<size_t>(kShardMaxTokens)) {
    throw DataError(
        fmt::format("shard {}: {} tokens do not fit the int32 count of the header "
                    "(max {}); use a smaller shard size",
                    path, tokens.size(), kShardMaxTokens));
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = kShardMagic;
  header[1] = kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  header[3] = static_cast<int32_t>(tokenizer);
  std::filesystem::path tmp;
  int fd = detail::file_create_temp(path, tmp);
  try {
    detail::file_write_all(fd, header.data(), kShardHeaderBytes, tmp);
    detail::file_write_all(fd, tokens.data(), tokens.size_bytes(), tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  try {
    detail::file_sync_close(fd, tmp);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  return tmp;
}

void shard_write(const std::filesystem::path& path, std::span<const uint16_t> tokens, ShardTokenizer tokenizer) {
  const std::filesystem::path tmp = shard_write_temp(path, tokens, tokenizer);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw DataError(
        fmt::format("shard {}: cannot rename the finished temporary file into place: "
                    "{}",
                    path, detail::errno_text(err)));
  }
}

std::string shard_name(std::string_view prefix, std::string_view split, int64_t index) {
  return fmt::format("{}_{}_{:06d}.bin", prefix, split, index);
}

}  // namespace dion::data
