// src/data/download_attempt.h — one attempt of a shard download (private to src/data): the
// state of one curl transfer into NAME.part, and its outcome, for download.cpp's retry loop.
//
// An attempt asks for the bytes from the .part's size on (Range, If-Range with the validator the
// response that began the .part recorded), appends a 206 for that range or restarts on a 200,
// bounds the body by the shard header's size, and sorts the result into done, retry or fail.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include <curl/curl.h>

#include "dion/data/download.h"

namespace dion::data::detail {

using Clock = std::chrono::steady_clock;

// One curl transfer: what download_file fills in ("in"), then what the callbacks learn.
struct Attempt {
  // in
  CURL* curl = nullptr;
  std::filesystem::path part, validator_path;
  std::string name;
  int64_t offset = 0;    // bytes already in .part when the attempt started (asked via Range)
  std::string if_range;  // the validator sent with If-Range ("" = none)
  bool if_range_is_etag = false;
  int number = 1;
  const DownloadOptions* options = nullptr;
  // state
  int fd = -1;
  bool decided = false;                        // first body byte seen: write or discard
  long status = 0;                             // of the response whose body we got
  int64_t range_start = -1, range_total = -1;  // Content-Range of the last response
  std::string etag, last_modified;             // of the last response
  size_t header_bytes = 0;                     // of the last response
  bool header_too_big = false;
  std::string error_body;           // start of a non-2xx body, for the message
  std::string local_error;          // a write failure (not retried)
  std::string bad_content;          // the body is not the shard it must be (fail)
  bool range_mismatch = false;      // 206 for another range than we asked
  bool validator_mismatch = false;  // 206 whose ETag is not the .part's
  bool stopped = false;
  int64_t written = 0;    // bytes of the file in .part (offset + this attempt's)
  std::string head;       // the file's first bytes, up to the 1024-byte header
  int64_t expected = -1;  // 1024 + 2*count once the header is known
  char curl_error[CURL_ERROR_SIZE] = {0};
};

enum class Outcome { DONE, RETRY, FAIL };

struct AttemptResult {
  Outcome outcome;
  std::string message;  // why, for RETRY and FAIL
};

// curl_global_init, once per process (throws DataError if libcurl cannot start).
void curl_init_once();

// Runs attempt `a` for `url` until the body ends, the server fails, or `deadline` passes. A
// .part that is not the shard is removed (FAIL); one whose range or version does not match is
// removed (RETRY); a complete one is checked token by token (DONE).
AttemptResult run_attempt(Attempt& a, const std::string& url, std::optional<Clock::time_point> deadline);

// The validator recorded for a .part by the response that began it: "etag X",
// "last-modified X" or "none". Returns false if there is no record.
bool read_validator(const std::filesystem::path& path, std::string& value, bool& is_etag);

// The shard header of `part` and the file's size agree; else false with the reason in `why`.
bool part_is_valid_shard(const std::filesystem::path& part, std::string& why);

// The size of the file at `p`, 0 if there is none.
int64_t file_size_or_zero(const std::filesystem::path& p);

}  // namespace dion::data::detail
