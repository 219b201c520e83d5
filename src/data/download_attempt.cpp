// src/data/download.cpp — resumable, verified shard downloads with libcurl
// (see dion/data/download.h for the contract).
//
// One attempt = one curl transfer into NAME.part: Range from the .part's size, the response code
// decides append (206) or restart (200). After the transfer the outcome is sorted into done,
// retry (network trouble, 408/429/5xx, short body, range mismatch) or fail (other HTTP errors,
// bad content, local write errors).
#include "dion/data/download.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <mutex>
#include <optional>
#include <strings.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <curl/curl.h>
#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "file_util.h"

namespace dion::data {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------- datasets

const std::vector<DatasetInfo>& download_datasets() {
  // Repo ids, prefixes and chunk counts from the reference's data/cached_*.py.
  static const std::vector<DatasetInfo> datasets = {
      {"fineweb10B", "kjj0/fineweb10B-gpt2", "fineweb", 103},
      {"fineweb100B", "kjj0/fineweb100B-gpt2", "fineweb", 1030},
      {"finewebedu10B", "kjj0/finewebedu10B-gpt2", "finewebedu", 99},
  };
  return datasets;
}

const DatasetInfo& download_dataset(const std::string& name) {
  std::string known;
  for (const DatasetInfo& d : download_datasets()) {
    if (d.name == name) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  throw DataError(fmt::format("unknown dataset \"{}\" (known: {})", name, known));
}

std::string download_default_base_url(const DatasetInfo& dataset) {
  return "https://huggingface.co/datasets/" + dataset.repo_id + "/resolve/main";
}

std::vector<std::string> download_file_names(const DatasetInfo& dataset, int chunks) {
  if (chunks < 0 || chunks > dataset.train_chunks) {
    throw DataError(fmt::format("{} has {} train chunks; asked for {}", dataset.name,
                                dataset.train_chunks, chunks));
  }
  std::vector<std::string> names{shard_name(dataset.file_prefix, "val", 0)};
  for (int i = 1; i <= chunks; ++i) names.push_back(shard_name(dataset.file_prefix, "train", i));
  return names;
}

// ---------------------------------------------------------------------------- one attempt

namespace {

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw DataError("download: libcurl failed to initialize");
    }
  });
}

constexpr size_t kMaxHeaderBytes = 64 << 10;  // of one response's header lines

using Clock = std::chrono::steady_clock;

struct Attempt {
  // in
  CURL* curl = nullptr;
  fs::path part, validator_path;
  std::string name;
  int64_t offset = 0;          // bytes already in .part when the attempt started (asked via Range)
  std::string if_range;        // the validator sent with If-Range ("" = none)
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
  std::string error_body;                      // start of a non-2xx body, for the message
  std::string local_error;                     // a write failure (not retried)
  std::string bad_content;                     // the body is not the shard it must be (fail)
  bool range_mismatch = false;                 // 206 for another range than we asked
  bool validator_mismatch = false;             // 206 whose ETag is not the .part's
  bool stopped = false;
  int64_t written = 0;      // bytes of the file in .part (offset + this attempt's)
  std::string head;         // the file's first bytes, up to the 1024-byte header
  int64_t expected = -1;    // 1024 + 2*count once the header is known
  char curl_error[CURL_ERROR_SIZE] = {0};
};

std::string trim(std::string_view v) {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == '\r' || v.back() == '\n' || v.back() == ' ')) v.remove_suffix(1);
  return std::string(v);
}

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect, say)
    a->range_start = a->range_total = -1;
    a->etag.clear();
    a->last_modified.clear();
    a->header_bytes = 0;
  }
  a->header_bytes += line.size();
  if (a->header_bytes > kMaxHeaderBytes) {
    a->header_too_big = true;
    return 0;  // aborts the transfer
  }
  if (line.size() > 14 && strncasecmp(line.data(), "content-range:", 14) == 0) {
    long long start = -1, end = -1, total = -1;
    const std::string value(line.substr(14));
    if (std::sscanf(value.c_str(), " bytes %lld-%lld/%lld", &start, &end, &total) >= 2) {
      a->range_start = start;
      a->range_total = total;
    }
  } else if (line.size() > 5 && strncasecmp(line.data(), "etag:", 5) == 0) {
    a->etag = trim(line.substr(5));
  } else if (line.size() > 14 && strncasecmp(line.data(), "last-modified:", 14) == 0) {
    a->last_modified = trim(line.substr(14));
  }
  return size * count;
}

// Records what the response that starts a .part says about the file's version: a strong ETag,
// else Last-Modified, else nothing (then a resume cannot be checked).
bool write_validator(const Attempt& a, std::string& error) {
  std::string text = "none\n";
  if (!a.etag.empty() && !a.etag.starts_with("W/")) {
    text = "etag " + a.etag + "\n";
  } else if (!a.last_modified.empty()) {
    text = "last-modified " + a.last_modified + "\n";
  }
  int fd = ::open(a.validator_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    error = fmt::format("cannot write {}: {}", a.validator_path, detail::errno_text(errno));
    return false;
  }
  try {
    detail::file_write_all(fd, text.data(), text.size(), a.validator_path);
  } catch (const DataError& e) {
    ::close(fd);
    error = e.what();
    return false;
  }
  ::close(fd);
  return true;
}

// Appends body bytes to the .part within the size the file must have, learning that size from
// the shard header as soon as its 1024 bytes are in. Returns false to abort.
bool write_body(Attempt* a, const char* data, size_t n) {
  if (a->expected < 0 && a->head.size() < kShardHeaderBytes) {
    a->head.append(data, std::min(n, kShardHeaderBytes - a->head.size()));
    if (a->head.size() == kShardHeaderBytes) {
      try {
        a->expected = shard_file_bytes(shard_parse_header(a->head, -1, a->part).token_count);
      } catch (const DataError& e) {
        a->bad_content = e.what();
        return false;
      }
    }
  }
  const int64_t limit = a->expected >= 0 ? a->expected : kShardMaxFileBytes;
  size_t take = n;
  if (a->written + static_cast<int64_t>(n) > limit) take = static_cast<size_t>(limit - a->written);
  try {
    detail::file_write_all(a->fd, data, take, a->part);
  } catch (const DataError& e) {
    a->local_error = e.what();
    return false;
  }
  a->written += static_cast<int64_t>(take);
  if (take < n) {
    a->bad_content = fmt::format(
        "the server sent more than the {} bytes {}", limit,
        a->expected >= 0 ? "its shard header allows (1024 + 2 x count)" : "a shard can have");
    return false;
  }
  return true;
}

// The first body byte decides where the body goes: 206 for our range -> append to .part,
// 200 -> restart .part from empty, anything else -> keep a little for the error message.
size_t on_body(char* data, size_t size, size_t count, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const size_t n = size * count;
  if (!a->decided) {
    a->decided = true;
    curl_easy_getinfo(a->curl, CURLINFO_RESPONSE_CODE, &a->status);
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    if (a->status == 206) {
      if (a->range_start != a->offset) {
        a->range_mismatch = true;
        return 0;  // aborts the transfer (CURLE_WRITE_ERROR)
      }
      if (a->if_range_is_etag && !a->etag.empty() && a->etag != a->if_range) {
        a->validator_mismatch = true;
        return 0;
      }
      flags |= O_APPEND;
      a->written = a->offset;
    } else if (a->status == 200) {
      flags |= O_TRUNC;
      a->offset = 0;
      a->written = 0;
      a->head.clear();
      if (!write_validator(*a, a->local_error)) return 0;
    }
    if (a->status == 200 || a->status == 206) {
      a->fd = ::open(a->part.c_str(), flags, 0644);
      if (a->fd < 0) {
        a->local_error =
            fmt::format("cannot open {} for writing: {}", a->part, detail::errno_text(errno));
        return 0;
      }
    }
  }
  if (a->fd < 0) {
    a->error_body.append(data, std::min(n, 300 - std::min<size_t>(300, a->error_body.size())));
    return n;
  }
  return write_body(a, data, n) ? n : 0;
}

int on_progress(void* user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t, curl_off_t) {
  auto* a = static_cast<Attempt*>(user);
  const DownloadOptions& o = *a->options;
  if (o.should_stop && o.should_stop()) {
    a->stopped = true;
    return 1;
  }
  if (o.on_progress && (a->status == 200 || a->status == 206 || !a->decided)) {
    const int64_t base = a->decided ? a->offset : 0;
    o.on_progress({a->name, base + dlnow, dltotal > 0 ? base + dltotal : 0, a->number});
  }
  return 0;
}

// The loopback addresses are never sent through a proxy (the tests' local server must not be).
std::string no_proxy_list() {
  std::string list = "127.0.0.1,localhost,::1";
  for (const char* var : {"no_proxy", "NO_PROXY"}) {
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0')
      list = std::string(v) + "," + list;
  }
  return list;
}

enum class Outcome { DONE, RETRY, FAIL };

struct AttemptResult {
  Outcome outcome;
  std::string message;  // why, for RETRY and FAIL
};

bool part_is_valid_shard(const fs::path& part, std::string& why) {
  try {
    shard_read_header(part);
    return true;
  } catch (const DataError& e) {
    why = e.what();
    return false;
  }
}

// The header and size, then every token < vocab_size (as inspect checks).
bool part_is_valid_shard(const fs::path& part, uint32_t vocab_size, std::string& why) {
  try {
    const ShardFile shard = ShardFile::open(part);
    shard_check_tokens(shard, vocab_size);
    return true;
  } catch (const DataError& e) {
    why = e.what();
    return false;
  }
}

void remove_part(const Attempt& a) {
  ::unlink(a.part.c_str());
  ::unlink(a.validator_path.c_str());
}

int64_t file_size_or_zero(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

// Removes the .part (it is not the file) and says why.
AttemptResult not_a_shard(const Attempt& a, const std::string& why) {
  remove_part(a);
  return {Outcome::FAIL, fmt::format("the downloaded file is not a valid shard ({}); it was "
                                     "removed. Is --base-url right?",
                                     why)};
}

// The last check of a .part with every byte: header, size, and every token < vocab_size.
AttemptResult check_complete_part(const Attempt& a) {
  std::string why;
  if (part_is_valid_shard(a.part, a.options->vocab_size, why)) return {Outcome::DONE, ""};
  return not_a_shard(a, why);
}

AttemptResult run_attempt(Attempt& a, const std::string& url,
                          std::optional<Clock::time_point> deadline) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return {Outcome::FAIL, "libcurl could not create a handle"};
  a.curl = curl;
  const std::string range = fmt::format("{}-", a.offset);
  const std::string no_proxy = no_proxy_list();
  curl_slist* headers = nullptr;
  if (a.offset > 0 && !a.if_range.empty()) {
    headers = curl_slist_append(headers, ("If-Range: " + a.if_range).c_str());
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, no_proxy.c_str());
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "dion-data/0.1 (libcurl)");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, a.options->connect_timeout_s);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, a.options->min_speed_bytes_per_s);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, a.options->stall_timeout_s);
  curl_easy_setopt(curl, CURLOPT_MAXFILESIZE_LARGE, static_cast<curl_off_t>(kShardMaxFileBytes));
  if (deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(std::max<int64_t>(1, left.count())));
  }
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, a.curl_error);
  if (a.offset > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
  if (headers != nullptr) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(curl, CURLOPT_HEADERDATA, &a);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &a);
  curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &a);
  curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);

  const CURLcode rc = curl_easy_perform(curl);
  long status = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
  curl_off_t content_length = -1;
  curl_easy_getinfo(curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &content_length);
  const char* effective = nullptr;
  curl_easy_getinfo(curl, CURLINFO_EFFECTIVE_URL, &effective);
  const std::string last_url = effective != nullptr ? effective : url;
  curl_easy_cleanup(curl);
  curl_slist_free_all(headers);
  a.curl = nullptr;
  if (a.fd >= 0) {
    try {
      detail::file_sync_close(a.fd, a.part);
    } catch (const DataError& e) {
      if (a.local_error.empty()) a.local_error = e.what();
    }
    a.fd = -1;
  }

  if (a.stopped) return {Outcome::FAIL, "interrupted"};
  if (!a.local_error.empty()) return {Outcome::FAIL, a.local_error};
  if (!a.bad_content.empty()) return not_a_shard(a, a.bad_content);
  if (a.header_too_big) {
    return {Outcome::FAIL, fmt::format("the response headers from {} are larger than {} kB: not "
                                       "a file server dion-data understands (is --base-url "
                                       "right?)",
                                       last_url, kMaxHeaderBytes >> 10)};
  }
  if (a.range_mismatch) {
    remove_part(a);
    return {Outcome::RETRY, fmt::format("the server answered a Range request for bytes {}- with "
                                        "bytes {}-; restarting from byte 0",
                                        a.offset, a.range_start)};
  }
  if (a.validator_mismatch) {
    remove_part(a);
    return {Outcome::RETRY, fmt::format("the file changed on the server since the partial file "
                                        "was begun (ETag {} now, {} then); restarting from "
                                        "byte 0",
                                        a.etag, a.if_range)};
  }
  if (rc != CURLE_OK) {
    const std::string what = fmt::format("{} ({})", curl_easy_strerror(rc), a.curl_error);
    if (rc == CURLE_TOO_MANY_REDIRECTS) {
      return {Outcome::FAIL, fmt::format("a redirect loop: more than 10 redirects, the last to "
                                         "{} (is --base-url right?)",
                                         last_url)};
    }
    if (rc == CURLE_OUT_OF_MEMORY) {
      return {Outcome::FAIL, fmt::format("the response from {} could not be read: a header line "
                                         "longer than libcurl's 100 kB limit, or out of memory "
                                         "(is --base-url right?)",
                                         last_url)};
    }
    if (rc == CURLE_FILESIZE_EXCEEDED) {
      return {Outcome::FAIL, fmt::format("the server announces {} bytes, more than a shard can "
                                         "have ({}): not a shard (is --base-url right?)",
                                         content_length, kShardMaxFileBytes)};
    }
    if (rc == CURLE_OPERATION_TIMEDOUT && deadline && Clock::now() >= *deadline) {
      return {Outcome::FAIL, fmt::format("the deadline of {:g} s for this file passed ({}); a "
                                         "rerun resumes the partial file (--deadline sets it)",
                                         a.options->deadline_s, what)};
    }
    const bool fatal = rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL ||
                       rc == CURLE_FAILED_INIT;
    return {fatal ? Outcome::FAIL : Outcome::RETRY, what};
  }
  if (status == 200 && !a.decided) {  // an empty body
    remove_part(a);
    return {Outcome::FAIL, fmt::format("the server sent an empty file (HTTP 200, 0 bytes) from {}: "
                                       "not a shard (is --base-url right?)",
                                       last_url)};
  }
  if (status == 416) {  // our .part already has every byte, or more than the file has
    std::string why;
    if (part_is_valid_shard(a.part, why)) return check_complete_part(a);
    remove_part(a);
    return {Outcome::RETRY,
            "HTTP 416 (range not satisfiable) for a .part that is not a valid "
            "shard; restarting from byte 0"};
  }
  if (status != 200 && status != 206) {
    const std::string what = fmt::format("HTTP {}{}{}", status, a.error_body.empty() ? "" : ": ",
                                         a.error_body.substr(0, a.error_body.find('\n')));
    const bool transient = status == 408 || status == 429 || status >= 500;
    return {transient ? Outcome::RETRY : Outcome::FAIL, what};
  }
  // 200/206: is every byte there?
  int64_t expected = -1;
  if (status == 206 && a.range_total >= 0) {
    expected = a.range_total;
  } else if (content_length >= 0) {
    expected = a.offset + content_length;
  }
  const int64_t have = file_size_or_zero(a.part);
  if (expected >= 0 && have != expected) {
    return {Outcome::RETRY, fmt::format("received {} of {} bytes", have, expected)};
  }
  return check_complete_part(a);
}

// The validator recorded for `part` by the response that began it: "etag X",
// "last-modified X" or "none". Returns false if there is no record.
bool read_validator(const fs::path& path, std::string& value, bool& is_etag) {
  std::string text;
  try {
    text = detail::file_read_all(path, "download validator");
  } catch (const DataError&) {
    return false;
  }
  text = trim(text);
  value.clear();
  is_etag = false;
  if (text.starts_with("etag ")) {
    value = text.substr(5);
    is_etag = true;
  } else if (text.starts_with("last-modified ")) {
    value = text.substr(14);
  } else if (text != "none") {
    return false;
  }
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------- download_file

DownloadResult download_file(const std::string& name, const DownloadOptions& options) {
  curl_init_once();
  if (options.max_attempts < 1) {
    throw DataError(fmt::format("max attempts {} must be >= 1", options.max_attempts));
  }
  if (!(options.deadline_s >= 0) || options.min_speed_bytes_per_s < 0 ||
      options.stall_timeout_s < 0) {
    throw DataError(fmt::format("download options: deadline {} s, minimum speed {} B/s and "
                                "stall time {} s must be >= 0",
                                options.deadline_s, options.min_speed_bytes_per_s,
                                options.stall_timeout_s));
  }
  std::string base = options.base_url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  const std::string url = base + "/" + name;
  DownloadResult result;
  result.path = options.dir / name;
  const fs::path part = options.dir / (name + ".part");

  std::error_code ec;
  fs::create_directories(options.dir, ec);
  if (ec || !fs::is_directory(options.dir)) {
    throw DataError(fmt::format("download folder {}: cannot create it: {}", options.dir,
                                ec ? ec.message() : "a file of that name exists"));
  }
  if (fs::exists(result.path)) {
    std::string why;
    if (!part_is_valid_shard(result.path, why)) {
      throw DataError(
          fmt::format("{} is already there but is not a valid shard ({}): delete it "
                      "and run again",
                      result.path, why));
    }
    result.bytes = file_size_or_zero(result.path);
    result.already_present = true;
    return result;
  }

  const fs::path validator = options.dir / (name + ".part.validator");
  std::optional<Clock::time_point> deadline;
  if (options.deadline_s > 0) {
    deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(options.deadline_s));
  }
  const std::string kept = " (partial file {} kept: run again to resume)";
  result.resumed_from = file_size_or_zero(part);
  std::string last_error;
  double backoff = options.backoff_initial_s;
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    Attempt a;
    a.part = part;
    a.validator_path = validator;
    a.name = name;
    a.offset = file_size_or_zero(part);
    if (a.offset > 0 && !read_validator(validator, a.if_range, a.if_range_is_etag)) {
      // Nothing says which version of the file the .part holds: do not trust it.
      ::unlink(part.c_str());
      a.offset = 0;
      if (attempt == 1) result.resumed_from = 0;
    }
    if (a.offset > 0) {
      // The header of a resumed .part bounds what may follow it.
      std::string head = detail::file_read_all(part, "partial download").substr(0, kShardHeaderBytes);
      a.written = a.offset;
      if (head.size() == kShardHeaderBytes) {
        try {
          a.expected = shard_file_bytes(shard_parse_header(head, -1, part).token_count);
        } catch (const DataError&) {
          ::unlink(part.c_str());  // not a shard's beginning: start over
          a.offset = a.written = 0;
          head.clear();
        }
      }
      a.head = head;
    }
    a.number = attempt;
    a.options = &options;
    const AttemptResult r = run_attempt(a, url, deadline);
    result.attempts = attempt;
    if (r.outcome == Outcome::DONE) {
      if (::rename(part.c_str(), result.path.c_str()) != 0) {
        throw DataError(fmt::format("download {}: cannot rename {} into place: {}", name, part,
                                    detail::errno_text(errno)));
      }
      ::unlink(validator.c_str());
      result.bytes = file_size_or_zero(result.path);
      return result;
    }
    if (r.outcome == Outcome::FAIL) {
      throw DataError(fmt::format("download {} from {}: {}{}", name, url, r.message,
                                  fs::exists(part) ? fmt::format(fmt::runtime(kept), part) : ""));
    }
    last_error = r.message;
    if (attempt == options.max_attempts) break;
    // Back off, still answering Ctrl-C, never past the deadline.
    auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(std::min(backoff, options.backoff_max_s)));
    if (deadline && until >= *deadline) {
      throw DataError(fmt::format("download {} from {}: the deadline of {:g} s for this file "
                                  "passes before the next attempt; last error: {}{}",
                                  name, url, options.deadline_s, last_error,
                                  fs::exists(part) ? fmt::format(fmt::runtime(kept), part) : ""));
    }
    while (Clock::now() < until) {
      if (options.should_stop && options.should_stop()) {
        throw DataError(
            fmt::format("download {}: interrupted (partial file {} kept: run again "
                        "to resume)",
                        name, part));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    backoff *= 2;
  }
  throw DataError(fmt::format("download {} from {}: gave up after {} attempts; last error: {}.{}",
                              name, url, options.max_attempts, last_error,
                              fs::exists(part) ? fmt::format(" The partial file {} is kept: run "
                                                             "again to resume.",
                                                             part)
                                               : ""));
}

}  // namespace dion::data
