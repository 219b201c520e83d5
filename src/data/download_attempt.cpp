// src/data/download_attempt.cpp — one attempt of a shard download with libcurl
// (download_attempt.h; download.cpp retries it).
//
// One attempt = one curl transfer into NAME.part: Range from the .part's size, the response code
// decides append (206) or restart (200). After the transfer the outcome is sorted into done,
// retry (network trouble, 408/429/5xx, short body, range mismatch) or fail (other HTTP errors,
// bad content, local write errors).
#include "download_attempt.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <mutex>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "file_util.h"

namespace dion::data::detail {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxHeaderBytes = 64 << 10;  // of one response's header lines

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
    a->bad_content = fmt::format("the server sent more than the {} bytes {}", limit,
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
        a->local_error = fmt::format("cannot open {} for writing: {}", a->part, detail::errno_text(errno));
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
    if (const char* v = std::getenv(var); v != nullptr && *v != '\0') list = std::string(v) + "," + list;
  }
  return list;
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

}  // namespace

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw DataError("download: libcurl failed to initialize");
    }
  });
}

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

AttemptResult run_attempt(Attempt& a, const std::string& url, std::optional<Clock::time_point> deadline) {
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
    const bool fatal = rc == CURLE_URL_MALFORMAT || rc == CURLE_UNSUPPORTED_PROTOCOL || rc == CURLE_FAILED_INIT;
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

}  // namespace dion::data::detail
