// src/data/file_util.cpp — see file_util.h. Plain POSIX calls; no buffering beyond the kernel's.
#include "file_util.h"

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"

namespace dion::data::detail {

std::string errno_text(int err) { return std::strerror(err); }

std::string file_type_text(unsigned mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISREG(mode)) return "a regular file";
  return "not a regular file";
}

int file_open_regular(const std::filesystem::path& path, std::string_view what, struct stat& st) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    throw DataError(fmt::format("{} {}: cannot open: {}", what, path, errno_text(errno)));
  }
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw DataError(fmt::format("{} {}: cannot stat: {}", what, path, errno_text(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(fmt::format("{} {}: not a regular file (it is {})", what, path, file_type_text(st.st_mode)));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

std::string file_read_all(const std::filesystem::path& path, std::string_view what) {
  struct stat st {};
  int fd = file_open_regular(path, what, st);
  std::string data;
  data.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::read(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      throw DataError(fmt::format("{} {}: read failed: {}", what, path, errno_text(err)));
    }
    if (n == 0) break;  // the file shrank while we read it
    done += static_cast<size_t>(n);
  }
  data.resize(done);
  ::close(fd);
  return data;
}

int file_create_temp(const std::filesystem::path& final_path, std::filesystem::path& tmp_path) {
  std::string templ = final_path.string() + ".tmp.XXXXXX";
  int fd = ::mkostemp(templ.data(), O_CLOEXEC);
  if (fd < 0) {
    throw DataError(
        fmt::format("{}: cannot create a temporary file beside it: {} (is the folder "
                    "there and writable?)",
                    final_path, errno_text(errno)));
  }
  // mkostemp creates 0600; a finished shard should be readable like any file the user writes
  // (0666 less the umask), e.g. by a training job running as another user.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::fchmod(fd, 0666 & ~mask);
  tmp_path = templ;
  return fd;
}

void file_write_all(int fd, const void* data, size_t size, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw DataError(write_error_text(path, errno));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void file_sync_close(int fd, const std::filesystem::path& path) {
  int rc = ::fsync(fd);
  int err = errno;
  if (::close(fd) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  if (rc != 0) throw DataError(write_error_text(path, err));
}

std::string write_error_text(const std::filesystem::path& path, int err) {
  std::string hint;
  if (err == ENOSPC || err == EDQUOT) hint = " (the disk or your quota is full: free space)";
  if (err == EFBIG) {
    hint =
        " (the file would pass the file size limit: see `ulimit -f`, or use a smaller "
        "--shard-size)";
  }
  return fmt::format("{}: write failed: {}{}", path, errno_text(err), hint);
}

void failpoint(std::string_view name) {
  static const std::string spec = [] {
    const char* v = std::getenv("DION_FAILPOINT");
    return std::string(v != nullptr ? v : "");
  }();
  if (spec.empty()) return;
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos || std::string_view(spec).substr(0, colon) != name) return;
  static std::atomic<long> hits{0};
  if (++hits == std::atol(spec.c_str() + colon + 1)) ::raise(SIGKILL);
}

}  // namespace dion::data::detail
