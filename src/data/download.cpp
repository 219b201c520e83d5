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

struct Attempt {
  // in
  CURL* curl = nullptr;
  fs::path part;
  std::string name;
  int64_t offset = 0;  // bytes already in .part when the attempt started (asked via Range)
  int number = 1;
  const DownloadOptions* options = nullptr;
  // state
  int fd = -1;
  bool decided = false;                        // first body byte seen: write or discard
  long status = 0;                             // of the response whose body we got
  int64_t range_start = -1, range_total = -1;  // Content-Range of the last response
  std::string error_body;                      // start of a non-2xx body, for the message
  std::string local_error;                     // a write failure (not retried)
  bool range_mismatch = false;                 // 206 for another range than we asked
  bool stopped = false;
  char curl_error[CURL_ERROR_SIZE] = {0};
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto* a = static_cast<Attempt*>(user);
  const std::string_view line(data, size * count);
  if (line.starts_with("HTTP/")) {  // a new response (after a redirect, say)
    a->range_start = a->range_total = -1;
  } else if (line.size() > 14 && strncasecmp(line.data(), "content-range:", 14) == 0) {
    long long start = -1, end = -1, total = -1;
    const std::string value(line.substr(14));
    if (std::sscanf(value.c_str(), " bytes %lld-%lld/%lld", &start, &end, &total) >= 2) {
      a->range_start = start;
      a->range_total = total;
    }
  }
  return size * count;
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
      flags |= O_APPEND;
    } else if (a->status == 200) {
      flags |= O_TRUNC;
      a->offset = 0;
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
  try {
    detail::file_write_all(a->fd, data, n, a->part);
  } catch (const DataError& e) {
    a->local_error = e.what();
    return 0;
  }
  return n;
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

int64_t file_size_or_zero(const fs::path& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

AttemptResult run_attempt(Attempt& a, const std::string& url) {
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return {Outcome::FAIL, "libcurl could not create a handle"};
  a.curl = curl;
  const std::string range = fmt::format("{}-", a.offset);
  const std::string no_proxy = no_proxy_list();
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 10L);
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_NOPROXY, no_proxy.c_str());
  curl_easy_setopt(curl, CURLOPT_USERAGENT, "dion-data/0.1 (libcurl)");
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, a.options->connect_timeout_s);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME, a.options->stall_timeout_s);
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, a.curl_error);
  if (a.offset > 0) curl_easy_setopt(curl, CURLOPT_RANGE, range.c_str());
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
  curl_easy_cleanup(curl);
  a.curl = nullptr;
  if (a.fd >= 0) {
    try {
      detail::file_sync_close(a.fd, a.part);
    } catch (const DataError& e) {
      if (a.local_error.empty()) a.local_error = e.what();
    }
    a.fd = -1;
  }

  if (rc == CURLE_OK && status == 200 && !a.decided) {  // an empty 200 body: an empty file
    a.offset = 0;
    if (::truncate(a.part.c_str(), 0) != 0 && errno != ENOENT) {
      a.local_error = fmt::format("cannot truncate {}: {}", a.part, detail::errno_text(errno));
    }
  }
  if (a.stopped) return {Outcome::FAIL, "interrupted"};
  if (!a.local_error.empty()) return {Outcome::FAIL, a.local_error};
  if (a.range_mismatch) {
    ::unlink(a.part.c_str());
    return {Outcome::RETRY, fmt::format("the server answered a Range request for bytes {}- with "
                                        "bytes {}-; restarting from byte 0",
                                        a.offset, a.range_start)};
  }
  if (rc != CURLE_OK) {
    const std::string what = fmt::format("{} ({})", curl_easy_strerror(rc), a.curl_error);
    const bool fatal = rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL ||
                       rc == CURLE_OUT_OF_MEMORY || rc == CURLE_FAILED_INIT;
    return {fatal ? Outcome::FAIL : Outcome::RETRY, what};
  }
  if (status == 416) {  // our .part already has every byte, or more than the file has
    std::string why;
    if (part_is_valid_shard(a.part, why)) return {Outcome::DONE, ""};
    ::unlink(a.part.c_str());
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
  std::string why;
  if (!part_is_valid_shard(a.part, why)) {
    ::unlink(a.part.c_str());
    return {Outcome::FAIL, fmt::format("the downloaded file is not a valid shard ({}); it was "
                                       "removed. Is --base-url right?",
                                       why)};
  }
  return {Outcome::DONE, ""};
}

}  // namespace

// ---------------------------------------------------------------------------- download_file

DownloadResult download_file(const std::string& name, const DownloadOptions& options) {
  curl_init_once();
  if (options.max_attempts < 1) {
    throw DataError(fmt::format("max attempts {} must be >= 1", options.max_attempts));
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

  result.resumed_from = file_size_or_zero(part);
  std::string last_error;
  double backoff = options.backoff_initial_s;
  for (int attempt = 1; attempt <= options.max_attempts; ++attempt) {
    Attempt a;
    a.part = part;
    a.name = name;
    a.offset = file_size_or_zero(part);
    a.number = attempt;
    a.options = &options;
    const AttemptResult r = run_attempt(a, url);
    result.attempts = attempt;
    if (r.outcome == Outcome::DONE) {
      if (::rename(part.c_str(), result.path.c_str()) != 0) {
        throw DataError(fmt::format("download {}: cannot rename {} into place: {}", name, part,
                                    detail::errno_text(errno)));
      }
      result.bytes = file_size_or_zero(result.path);
      return result;
    }
    if (r.outcome == Outcome::FAIL) {
      throw DataError(fmt::format("download {} from {}: {}{}", name, url, r.message,
                                  fs::exists(part) ? fmt::format(" (partial file {} kept: run "
                                                                 "again to resume)",
                                                                 part)
                                                   : ""));
    }
    last_error = r.message;
    if (attempt == options.max_attempts) break;
    // Back off, still answering Ctrl-C.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::duration<double>(std::min(backoff, options.backoff_max_s));
    while (std::chrono::steady_clock::now() < until) {
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
