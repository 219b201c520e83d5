// dion/data/download.h — fetch the pre-tokenized FineWeb shards that the reference's
// data/cached_fineweb10B.py, cached_fineweb100B.py and cached_finewebedu10B.py fetch from the
// Hugging Face hub, over HTTP(S) with libcurl.
//
// What it does, per file:
//   - skips a file already complete in the folder (its header and size check out);
//   - downloads into NAME.part, resuming an existing .part with an HTTP Range request sent with
//     If-Range: the ETag (or Last-Modified) of the response that began the .part, kept in
//     NAME.part.validator. A server whose file changed since answers 200 and the .part restarts
//     from byte 0; so does a .part without its validator (nothing says what it holds); a 206
//     whose ETag differs from the recorded one is dropped and restarted;
//   - retries network errors, HTTP 408/429/5xx, cut connections and transfers slower than
//     `min_speed_bytes_per_s` over `stall_timeout_s` with exponential backoff, at most
//     `max_attempts` times per file, all within `deadline_s`; other HTTP errors (404, 403), a
//     redirect loop, oversized response headers and an empty body fail at once;
//   - bounds what is written by the size the file must have: 1024 + 2*count once the shard
//     header has arrived (a body running past it is refused at that byte), and the most a shard
//     can hold before that;
//   - verifies the size against Content-Length / Content-Range, the shard header (magic,
//     version, size == 1024 + 2*count) and every token (< `vocab_size`, as inspect does), and
//     only then renames NAME.part to NAME.
// A failed download leaves at most NAME.part (+ .validator), which never looks like a shard; a
// verification failure removes it.
//
// What it does not do: authenticate (these datasets are public), check a hash (the hub's
// resolve URLs give none for these files), or download in parallel.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace dion::data {

struct DatasetInfo {
  std::string name;         // our name: "fineweb10B", "fineweb100B", "finewebedu10B"
  std::string repo_id;      // hub dataset repo, e.g. "kjj0/fineweb10B-gpt2"
  std::string file_prefix;  // "fineweb" or "finewebedu"
  int train_chunks = 0;     // the full dataset: chunks of 100M tokens after the val shard
};

// The datasets the reference can fetch.
const std::vector<DatasetInfo>& download_datasets();
// The dataset called `name`; throws DataError listing the known names otherwise.
const DatasetInfo& download_dataset(const std::string& name);
// "https://huggingface.co/datasets/<repo_id>/resolve/main".
std::string download_default_base_url(const DatasetInfo& dataset);
// PREFIX_val_000000.bin, then PREFIX_train_000001.bin .. PREFIX_train_<chunks>.bin.
std::vector<std::string> download_file_names(const DatasetInfo& dataset, int chunks);

struct DownloadProgress {
  std::string name;
  int64_t bytes_done = 0;   // of this file, including a resumed .part
  int64_t bytes_total = 0;  // 0 while unknown
  int attempt = 1;
};

struct DownloadOptions {
  std::string base_url;  // the file's URL is base_url + "/" + name
  std::filesystem::path dir;
  int max_attempts = 6;            // per file
  double backoff_initial_s = 1.0;  // wait before the 2nd attempt; doubles each time
  double backoff_max_s = 30.0;
  long connect_timeout_s = 30;
  // An attempt receiving less than min_speed_bytes_per_s on average over stall_timeout_s
  // seconds is aborted and retried (a server trickling bytes cannot hold us forever).
  long min_speed_bytes_per_s = 1000;
  long stall_timeout_s = 60;
  // Every attempt and backoff of one file ends by this many seconds after the file's first
  // attempt began; then download_file fails. 0 = no deadline.
  double deadline_s = 4 * 3600;
  uint32_t vocab_size = 50257;                               // tokens must be below this (GPT-2)
  std::function<void(const DownloadProgress&)> on_progress;  // often, from the transfer
  std::function<bool()> should_stop;                         // true aborts (Ctrl-C); the .part is kept
};

struct DownloadResult {
  std::filesystem::path path;
  int64_t bytes = 0;
  int attempts = 0;          // 0 if the file was already there
  int64_t resumed_from = 0;  // bytes of .part found when the first attempt started
  bool already_present = false;
};

// Downloads one file; throws DataError naming the file and URL when it cannot.
DownloadResult download_file(const std::string& name, const DownloadOptions& options);

}  // namespace dion::data
