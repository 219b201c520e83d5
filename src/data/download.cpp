// src/data/download.cpp — resumable, verified shard downloads (see dion/data/download.h for
// the contract): the dataset table, and download_file's attempts with backoff and a deadline
// (one attempt, the curl transfer, is download_attempt.cpp).
#include "dion/data/download.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "download_attempt.h"
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
    throw DataError(fmt::format("{} has {} train chunks; asked for {}", dataset.name, dataset.train_chunks, chunks));
  }
  std::vector<std::string> names{shard_name(dataset.file_prefix, "val", 0)};
  for (int i = 1; i <= chunks; ++i) names.push_back(shard_name(dataset.file_prefix, "train", i));
  return names;
}

// ---------------------------------------------------------------------------- download_file

using detail::Attempt;
using detail::AttemptResult;
using detail::Clock;
using detail::file_size_or_zero;
using detail::Outcome;
using detail::part_is_valid_shard;
using detail::read_validator;
using detail::run_attempt;

DownloadResult download_file(const std::string& name, const DownloadOptions& options) {
  detail::curl_init_once();
  if (options.max_attempts < 1) {
    throw DataError(fmt::format("max attempts {} must be >= 1", options.max_attempts));
  }
  if (!(options.deadline_s >= 0) || options.min_speed_bytes_per_s < 0 || options.stall_timeout_s < 0) {
    throw DataError(
        fmt::format("download options: deadline {} s, minimum speed {} B/s and "
                    "stall time {} s must be >= 0",
                    options.deadline_s, options.min_speed_bytes_per_s, options.stall_timeout_s));
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
    deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options.deadline_s));
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
        throw DataError(
            fmt::format("download {}: cannot rename {} into place: {}", name, part, detail::errno_text(errno)));
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
      throw DataError(fmt::format(
          "download {} from {}: the deadline of {:g} s for this file "
          "passes before the next attempt; last error: {}{}",
          name, url, options.deadline_s, last_error, fs::exists(part) ? fmt::format(fmt::runtime(kept), part) : ""));
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
  throw DataError(fmt::format("download {} from {}: gave up after {} attempts; last error: {}.{}", name, url,
                              options.max_attempts, last_error,
                              fs::exists(part) ? fmt::format(" The partial file {} is kept: run "
                                                             "again to resume.",
                                                             part)
                                               : ""));
}

}  // namespace dion::data
