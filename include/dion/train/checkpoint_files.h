// dion/train/checkpoint_files.h — the bytes of a checkpoint's files: written through a
// checksumming writer, read back whole and checked against the manifest (docs/train.md
// "Checkpoints").
//
//   FileDigest d = write_file_checked(path, [&](const Sink& sink) { archive.save_to(sink); });
//   manifest_write(folder, {{"model.pt", d}, ...});          // manifest.json, fsynced
//   std::optional<Manifest> m = manifest_read(folder);       // nullopt: no manifest.json
//   std::string bytes = read_file_checked(folder / "model.pt", m->files.at("model.pt"));
//
// The checksum is CRC-32 (zlib's crc32, the polynomial of gzip and PNG). Why CRC-32: it is there
// to catch corruption (a torn write, a flipped or overwritten byte, a truncated or swapped file),
// not an attacker; it finds every burst error of up to 32 bits and any other damage with
// probability 1 - 2^-32, runs at memory speed, and zlib is a well-kept Debian library
// (zlib1g-dev) that every LibTorch install already carries. Each file's size is recorded too.
//
// Errors: CheckpointError (dion/train/checkpoint.h) naming the file and what is wrong; a failed
// write names the errno text (ENOSPC, EFBIG, EACCES, ...).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>

namespace dion::train {

inline constexpr const char* kManifestFile = "manifest.json";

struct FileDigest {
  int64_t size = 0;
  uint32_t crc32 = 0;
  bool operator==(const FileDigest&) const = default;
};

// What a writer hands its bytes to (torch's OutputArchive::save_to calls it so). It always
// returns the count it was given: after a failed write it drops the bytes, and
// write_file_checked reports the failure once the producer is done (torch's zip writer turns a
// short count into an exception thrown from its destructor: std::terminate).
using Sink = std::function<size_t(const void*, size_t)>;

// Creates `path` (O_EXCL), lets `produce` write into it through a Sink that checksums the bytes
// as they go, fsyncs and closes it. On any failure the partial file is removed and
// CheckpointError names the path and the cause (the errno text of the failed write, or the
// producer's exception text without a C++ backtrace).
FileDigest write_file_checked(const std::filesystem::path& path, const std::function<void(const Sink&)>& produce);

// The whole file, after checking its size and CRC-32 against `want` (CheckpointError naming the
// file and both values otherwise).
std::string read_file_checked(const std::filesystem::path& path, const FileDigest& want);

// Size and CRC-32 of a file as it is on disk.
FileDigest file_digest(const std::filesystem::path& path);

// manifest.json: {"format": "dion-train checkpoint manifest", "version": N,
//                 "files": {"NAME": {"size": S, "crc32": "8 hex digits"}, ...}}
struct Manifest {
  int version = 0;
  std::map<std::string, FileDigest> files;
};
void manifest_write(const std::filesystem::path& folder, const Manifest& manifest);
// nullopt when the folder has no manifest.json; CheckpointError when it is malformed.
std::optional<Manifest> manifest_read(const std::filesystem::path& folder);

// The text of an exception for a user: c10::Error's what_without_backtrace() (its what() carries
// a C++ backtrace), else what().
std::string error_text(const std::exception& e);

}  // namespace dion::train
