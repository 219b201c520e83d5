// src/data/file_util.h — small file helpers shared by the data tools' sources (not installed,
// not public API): read a whole file, describe an errno, write a file under a temporary name.
//
// Every function throws DataError with the path and the system's reason; none retries.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace dion::data::detail {

// strerror(err) as a std::string.
std::string errno_text(int err);

// The whole content of `path`. `what` says what the file is for the error message, e.g.
// "GPT-2 encoder.json".
std::string file_read_all(const std::filesystem::path& path, std::string_view what);

// Creates a new, empty temporary file beside `final_path` ("<name>.tmp.XXXXXX"), returns its
// open descriptor and writes its path to `tmp_path`. The temporary name never ends in ".bin",
// so a half-written file is never taken for a shard.
int file_create_temp(const std::filesystem::path& final_path, std::filesystem::path& tmp_path);

// Writes all `size` bytes to `fd` (retrying short writes); `path` is for the error message.
void file_write_all(int fd, const void* data, size_t size, const std::filesystem::path& path);

// fsync + close `fd`; `path` is for the error message.
void file_sync_close(int fd, const std::filesystem::path& path);

}  // namespace dion::data::detail
