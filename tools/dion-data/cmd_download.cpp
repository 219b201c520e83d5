// tools/dion-data/cmd_download.cpp — `dion-data download`: the reference's cached FineWeb
// shards (data/cached_fineweb10B.py and friends), resumable and verified.
// Flags and printing only; the work is dion::data::download_file (dion/data/download.h).
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <fmt/std.h>

#include "cli.h"
#include "dion/data/download.h"
#include "progress.h"

namespace dion::cli {

namespace {

struct DownloadArgs {
  std::string dataset = "fineweb10B";
  int chunks = -1;
  std::string dir;
  std::string base_url;
  int attempts = 6;
  double backoff = 1.0;
  long min_speed = 1000;
  long stall_time = 60;
  double deadline = 4 * 3600;
  bool quiet = false;
};

void run_download(const DownloadArgs& args) {
  const data::DatasetInfo& dataset = data::download_dataset(args.dataset);
  const int chunks = args.chunks < 0 ? dataset.train_chunks : args.chunks;
  const std::vector<std::string> names = data::download_file_names(dataset, chunks);

  data::DownloadOptions options;
  options.base_url = args.base_url.empty() ? data::download_default_base_url(dataset) : args.base_url;
  options.dir = args.dir.empty() ? "data/" + dataset.name : args.dir;
  options.max_attempts = args.attempts;
  options.backoff_initial_s = args.backoff;
  options.min_speed_bytes_per_s = args.min_speed;
  options.stall_timeout_s = args.stall_time;
  options.deadline_s = args.deadline;
  options.should_stop = stop_requested;

  ProgressLine progress(!args.quiet);
  size_t index = 0;
  const auto start = std::chrono::steady_clock::now();
  auto file_start = start;
  options.on_progress = [&](const data::DownloadProgress& p) {
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - file_start).count();
    std::string text =
        fmt::format("{}/{} {}: {}", index + 1, names.size(), p.name, human_bytes(static_cast<double>(p.bytes_done)));
    if (p.bytes_total > 0) text += " of " + human_bytes(static_cast<double>(p.bytes_total));
    if (secs > 0.5) text += fmt::format(", {}/s", human_bytes(static_cast<double>(p.bytes_done) / secs));
    if (p.attempt > 1) text += fmt::format(" (attempt {})", p.attempt);
    progress.update(p.bytes_total > 0 ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : -1,
                    text);
  };

  if (!args.quiet) {
    std::fprintf(stderr, "dion-data download: %s (%zu files) from %s to %s\n", dataset.name.c_str(), names.size(),
                 options.base_url.c_str(), options.dir.c_str());
  }
  int64_t fetched = 0, present = 0;
  for (index = 0; index < names.size(); ++index) {
    file_start = std::chrono::steady_clock::now();
    const data::DownloadResult r = data::download_file(names[index], options);
    progress.finish();
    if (r.already_present) {
      ++present;
    } else {
      ++fetched;
      if (!args.quiet) {
        std::string note = human_bytes(static_cast<double>(r.bytes));
        if (r.resumed_from > 0) {
          note += " (resumed at " + human_bytes(static_cast<double>(r.resumed_from)) + ")";
        }
        std::fprintf(stderr, "  %s  %s\n", r.path.c_str(), note.c_str());
      }
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "dion-data download: %lld downloaded, %lld already present, in %.1f s\n",
               static_cast<long long>(fetched), static_cast<long long>(present), secs);
}

}  // namespace

void register_download(CLI::App& app) {
  auto args = std::make_shared<DownloadArgs>();
  std::string names;
  for (const auto& d : data::download_datasets()) {
    names += fmt::format("{}{} ({}, {} train chunks)", names.empty() ? "" : ", ", d.name, d.repo_id, d.train_chunks);
  }
  CLI::App* cmd =
      app.add_subcommand("download",
                         "Download the pre-tokenized FineWeb shards the reference's data/cached_*.py fetch: the val "
                         "shard 000000 and train chunks 1..N (100M tokens each). Resumes NAME.part files with HTTP "
                         "Range + If-Range, retries with backoff (slow transfers too) within a per-file deadline, "
                         "verifies each file's size, header and tokens, skips complete files.");
  std::vector<std::string> known;
  for (const auto& d : data::download_datasets()) known.push_back(d.name);
  // An unknown name is a bad command line (exit 2, docs/data.md), named with the valid ones.
  cmd->add_option("--dataset", args->dataset, "One of: " + names)
      ->capture_default_str()
      ->check(CLI::Validator(
          [known](std::string& v) -> std::string {
            for (const std::string& k : known)
              if (v == k) return "";
            std::string valid;
            for (const std::string& k : known) valid += (valid.empty() ? "" : ", ") + k;
            return "unknown dataset \"" + v + "\"; valid: " + valid;
          },
          "DATASET"));
  cmd->add_option("--chunks", args->chunks, "Train chunks to fetch (default: all)")->check(CLI::NonNegativeNumber);
  cmd->add_option("-o,--dir", args->dir, "Destination folder (default: data/<dataset>)");
  cmd->add_option("--base-url", args->base_url,
                  "Where the files are (default: https://huggingface.co/datasets/<repo>/resolve/main)");
  cmd->add_option("--attempts", args->attempts, "Attempts per file before giving up")
      ->capture_default_str()
      ->check(CLI::Range(1, 100));
  cmd->add_option("--backoff", args->backoff,
                  "Seconds to wait before the 2nd attempt (doubles, "
                  "max 30)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--min-speed", args->min_speed,
                  "Bytes per second an attempt must average over --stall-time, else it is "
                  "aborted and retried (0 = no limit)")
      ->capture_default_str()
      ->check(CLI::Range(0L, 1L << 40));
  cmd->add_option("--stall-time", args->stall_time, "Seconds over which --min-speed is measured")
      ->capture_default_str()
      ->check(CLI::Range(1L, 86400L));
  cmd->add_option("--deadline", args->deadline,
                  "Seconds one file may take, all attempts and waits included (0 = none); a "
                  "rerun resumes")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1e7));
  cmd->add_flag("-q,--quiet", args->quiet, "No progress line");
  cmd->callback([args] { run_download(*args); });
}

}  // namespace dion::cli
