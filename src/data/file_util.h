// src/data/file_util.h — small file helpers shared by the data tools' sources (not installed,
// not public API): read a whole file, describe an errno, write a file under a temporary name,
// and a failure-injection hook for the crash tests.
//
// Every function throws DataError with the path and the system's reason; none retries.
#pragma once

#include <filesystem>
#include <sys/stat.h>
#include <string>
#include <string_view>

namespace dion::data::detail {

// strerror(err) as a std::string.
std::string errno_text(int err);

// The whole content of `path`. `what` says what the file is for the error message, e.g.
// "GPT-2 encoder.json". Only a regular file is read: a FIFO, device or folder is refused without
// blocking (the open is non-blocking, then the type is checked).
std::string file_read_all(const std::filesystem::path& path, std::string_view what);

// open(path, O_RDONLY) that never blocks on a FIFO and refuses anything but a regular file:
// throws DataError "<what> <path>: ..." (cannot open / not a regular file (a FIFO) ...).
// Returns the descriptor (blocking mode restored) and fills `st`.
int file_open_regular(const std::filesystem::path& path, std::string_view what, struct stat& st);

// "a directory", "a FIFO (named pipe)", "a character device", ... for `mode`.
std::string file_type_text(unsigned mode);

// Creates a new, empty temporary file beside `final_path` ("<name>.tmp.XXXXXX"), returns its
// open descriptor and writes its path to `tmp_path`. The temporary name never ends in ".bin",
// so a half-written file is never taken for a shard.
int file_create_temp(const std::filesystem::path& final_path, std::filesystem::path& tmp_path);

// Writes all `size` bytes to `fd` (retrying short writes); `path` is for the error message.
void file_write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

// fsync + close `fd`; `path` is for the error message.
void file_sync_close(int fd, const std::filesystem::path& path);

// The message for a failed write of `path` with errno `err`: names disk full (ENOSPC) and the
// file size limit (EFBIG, `ulimit -f`) in words.
std::string write_error_text(const std::filesystem::path& path, int err);

// Test hook for the crash tests: when $DION_FAILPOINT is "NAME:N", the N-th call of
// failpoint(NAME) in this process kills it with SIGKILL, as kill -9 or a power cut would.
// Does nothing otherwise (one getenv at the first call).
void failpoint(std::string_view name);

}  // namespace dion::data::detail
