// src/train/io/checkpoint_files.cpp — checksummed writes and checked reads of checkpoint files,
// manifest.json (checkpoint_files.h).
#include "dion/train/checkpoint_files.h"

#include <c10/util/Exception.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dion/train/checkpoint.h"

namespace dion::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {  // zlib's crc32 takes a uInt length
    const uInt chunk = uInt(std::min<size_t>(n, 1u << 30));
    crc = uint32_t(::crc32(crc, p, chunk));
    p += chunk;
    n -= chunk;
  }
  return crc;
}

std::string errno_text(int err) {
  std::string text = std::strerror(err);
  if (err == EFBIG) text += " (the file would pass the file size limit: see `ulimit -f`)";
  if (err == ENOSPC || err == EDQUOT) text += " (the file system is full)";
  return text;
}

std::string hex32(uint32_t v) { return fmt::format("{:08x}", v); }

}  // namespace

std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

FileDigest write_file_checked(const fs::path& path, const std::function<void(const Sink&)>& produce) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw CheckpointError(fmt::format("cannot create '{}': {}", path.string(), errno_text(errno)));
  FileDigest d;
  d.crc32 = crc_update(0, nullptr, 0);
  int write_errno = 0;
  // After a failed write the sink still reports every byte as taken (and drops the rest):
  // torch's PyTorchStreamWriter checks the count and throws, then its destructor, finishing the
  // zip archive during the unwinding, checks its position again and throws a second c10::Error
  // out of a destructor: std::terminate ("terminate called after throwing an instance of
  // 'c10::Error' ... unexpected pos", exit 134). The failure is reported below instead.
  const Sink sink = [&](const void* data, size_t n) -> size_t {
    if (write_errno) return n;
    const char* p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::write(fd, p + done, n - done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        write_errno = w < 0 ? errno : ENOSPC;
        break;
      }
      done += size_t(w);
    }
    d.crc32 = crc_update(d.crc32, p, done);
    d.size += int64_t(done);
    return n;
  };
  std::string failure;
  try {
    produce(sink);
    if (!write_errno && ::fsync(fd) != 0) write_errno = errno;
  } catch (const std::exception& e) {
    failure = error_text(e);
  }
  if (::close(fd) != 0 && !write_errno && failure.empty()) write_errno = errno;
  if (write_errno || !failure.empty()) {
    ::unlink(path.c_str());
    throw CheckpointError(fmt::format("writing '{}' failed after {} bytes: {}", path.string(), d.size,
                                      write_errno ? errno_text(write_errno) : failure));
  }
  return d;
}

FileDigest file_digest(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("cannot open '{}': {}", path.string(), std::strerror(errno)));
  FileDigest d;
  d.crc32 = crc_update(0, nullptr, 0);
  std::string buf(1 << 20, '\0');
  for (;;) {
    const ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int err = errno;
      ::close(fd);
      throw CheckpointError(fmt::format("cannot read '{}': {}", path.string(), std::strerror(err)));
    }
    if (r == 0) break;
    d.crc32 = crc_update(d.crc32, buf.data(), size_t(r));
    d.size += r;
  }
  ::close(fd);
  return d;
}

std::string read_file_checked(const fs::path& path, const FileDigest& want) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError(fmt::format("cannot open '{}' (listed in {})", path.string(), kManifestFile));
  std::ostringstream ss;
  ss << f.rdbuf();
  std::string bytes = std::move(ss).str();
  if (int64_t(bytes.size()) != want.size)
    throw CheckpointError(fmt::format("'{}' has {} bytes, {} says {}: the file is truncated or was replaced",
                                      path.string(), bytes.size(), kManifestFile, want.size));
  const uint32_t crc = crc_update(crc_update(0, nullptr, 0), bytes.data(), bytes.size());
  if (crc != want.crc32)
    throw CheckpointError(
        fmt::format("'{}': CRC-32 {} but {} says {}: the file is corrupt (changed since it was "
                    "written)",
                    path.string(), hex32(crc), kManifestFile, hex32(want.crc32)));
  return bytes;
}

void manifest_write(const fs::path& folder, const Manifest& m) {
  json files = json::object();
  for (const auto& [name, d] : m.files) files[name] = {{"size", d.size}, {"crc32", hex32(d.crc32)}};
  const std::string text = json{{"format", "dion-train checkpoint manifest"},
                                {"version", m.version},
                                {"checksum", "CRC-32 (zlib crc32) of each file's bytes"},
                                {"files", files}}
                               .dump(2) +
                           "\n";
  write_file_checked(folder / kManifestFile, [&](const Sink& sink) {
    if (sink(text.data(), text.size()) != text.size()) return;
  });
}

std::optional<Manifest> manifest_read(const fs::path& folder) {
  const fs::path file = folder / kManifestFile;
  std::error_code ec;
  if (!fs::exists(file, ec)) return std::nullopt;
  std::ifstream f(file);
  if (!f) throw CheckpointError(fmt::format("cannot open '{}'", file.string()));
  Manifest m;
  try {
    const json j = json::parse(f);
    if (j.at("format") != "dion-train checkpoint manifest")
      throw CheckpointError(
          fmt::format("'{}': format {} is not 'dion-train checkpoint manifest'", file.string(), j.at("format").dump()));
    m.version = j.at("version").get<int>();
    for (const auto& [name, e] : j.at("files").items()) {
      FileDigest d;
      d.size = e.at("size").get<int64_t>();
      const std::string hex = e.at("crc32").get<std::string>();
      size_t used = 0;
      const unsigned long v = hex.size() == 8 ? std::stoul(hex, &used, 16) : 0;
      if (hex.size() != 8 || used != 8 || d.size < 0)
        throw CheckpointError(
            fmt::format("'{}': file '{}': size {} / crc32 '{}' is not valid (a size >= 0 and 8 hex "
                        "digits)",
                        file.string(), name, d.size, hex));
      d.crc32 = uint32_t(v);
      m.files[name] = d;
    }
  } catch (const json::exception& e) {
    throw CheckpointError(fmt::format("'{}' is malformed (cut short or edited?): {}", file.string(), e.what()));
  } catch (const std::invalid_argument&) {
    throw CheckpointError(fmt::format("'{}': a crc32 value is not hexadecimal", file.string()));
  }
  return m;
}

}  // namespace dion::train
