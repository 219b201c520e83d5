// src/data/shard_folder.cpp — list a folder's shard set and check that it is one set (see
// dion/data/shard_folder.h). Not the writer's side: that is shard_set.cpp.
#include "dion/data/shard_folder.h"

#include <algorithm>
#include <map>
#include <string>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "shard_set.h"

namespace dion::data {

namespace fs = std::filesystem;

namespace {

// The shard number of a valid name "P_SPLIT_NNNNNN.bin" (is_shard_name said yes).
int64_t shard_number(const std::string& name, size_t head_size) {
  const std::string digits = name.substr(head_size, name.size() - head_size - 4);
  if (digits.size() > 18) return INT64_MAX;  // cannot be one of ours; reported as a gap
  return std::stoll(digits);
}

}  // namespace

void shard_folder_check_swap(const fs::path& dir, std::string_view prefix_view) {
  const std::string prefix(prefix_view);
  const fs::path journal = detail::journal_path(dir, prefix);
  std::error_code ec;
  if (!fs::exists(journal, ec)) return;
  throw DataError(
      fmt::format("folder {}: a dion-data prepare has not finished swapping in its new {}_* shards (the journal {} "
                  "exists: the run was killed during the swap, or is swapping now), so the folder holds old and "
                  "new shards mixed and is not read. If no prepare is running, finish the swap with: dion-data "
                  "finish-swap {} --prefix {}",
                  dir, prefix, journal.filename().string(), dir.string(), prefix));
}

std::string shard_prefix_of(const fs::path& file) {
  const std::string name = file.filename().string();
  for (const std::string split : {"_val_", "_train_"}) {
    const size_t at = name.rfind(split);
    if (at == std::string::npos || at == 0) continue;
    const std::string prefix = name.substr(0, at);
    if (detail::is_shard_name(name, prefix)) return prefix;
  }
  return "";
}

std::string shard_folder_finish_swap(const fs::path& dir, std::string_view prefix) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw DataError(fmt::format("folder {}: not a folder", dir));
  detail::ShardSetWriter writer(dir, std::string(prefix));  // takes the lock and rolls the swap forward
  return writer.recovered();
}

ShardFolder shard_folder_read(const fs::path& dir, std::string_view prefix_view) {
  const std::string prefix(prefix_view);
  const std::string hint = fmt::format(
      "a folder must hold one set, as one dion-data prepare or download wrote it: "
      "{}_{{val,train}}_NNNNNN.bin numbered 0, 1, 2, ... without gaps, only the last shard of "
      "each split short; move the other files away, rerun the dion-data download that "
      "fetched them (it resumes and fills gaps), or prepare the folder again with --overwrite",
      prefix);
  struct Named {
    int64_t number;
    std::string split;
    fs::path path;
  };
  std::vector<Named> found;
  std::error_code ec;
  shard_folder_check_swap(dir, prefix);  // before listing, and after: a swap may start meanwhile
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    for (const std::string split : {"val", "train"}) {
      const std::string head = prefix + "_" + split + "_";
      if (!name.starts_with(head) || !name.ends_with(".bin")) continue;
      if (!detail::is_shard_name(name, prefix)) {
        throw DataError(
            fmt::format("folder {}: {} is not a shard name ({}_{}_NNNNNN.bin, six or "
                        "more digits); {}",
                        dir, name, prefix, split, hint));
      }
      found.push_back({shard_number(name, head.size()), split, entry.path()});
    }
  }
  if (ec) throw DataError(fmt::format("folder {}: cannot list it: {}", dir, ec.message()));
  shard_folder_check_swap(dir, prefix);
  std::sort(found.begin(), found.end(), [](const Named& a, const Named& b) {  // by number, then name: messages do not
    return a.number != b.number ? a.number < b.number                         // depend on the listing order
                                : a.path.filename() < b.path.filename();
  });

  for (size_t i = 0; i < found.size(); ++i) {
    const int64_t want = static_cast<int64_t>(i);
    if (i > 0 && found[i].number == found[i - 1].number) {
      throw DataError(fmt::format(
          "folder {}: {} and {} have the same shard number {}: shards "
          "of two sets are mixed; {}",
          dir, found[i - 1].path.filename().string(), found[i].path.filename().string(), found[i].number, hint));
    }
    if (found[i].number != want) {
      throw DataError(
          fmt::format("folder {}: no shard number {} ({}, {}); the set jumps to {}: a shard is missing, or "
                      "shards of two sets are mixed; {}",
                      dir, want, shard_name(prefix, "*", want),
                      i == 0 ? std::string("the set must start at 0")
                             : fmt::format("it would come after {}", found[i - 1].path.filename().string()),
                      found[i].path.filename().string(), hint));
    }
  }

  ShardFolder out;
  for (const Named& n : found) {
    (n.split == "val" ? out.val : out.train).push_back({n.path, shard_read_header(n.path)});
  }
  // One tokenizer for the whole set (header slot [3]): a byte shard among GPT-2 shards would
  // otherwise be read as GPT-2 ids.
  const std::vector<ShardFolderEntry>* all[] = {&out.val, &out.train};
  const ShardFolderEntry* first_any = nullptr;
  for (const auto* split : all) {
    for (const ShardFolderEntry& s : *split) {
      if (first_any == nullptr) first_any = &s;
      if (s.header.tokenizer != first_any->header.tokenizer) {
        throw DataError(
            fmt::format("folder {}: {} holds {} tokens but {} holds {} tokens (header slot [3]): a set has "
                        "one tokenizer, so these come from two sets; {}",
                        dir, first_any->path.filename().string(), shard_tokenizer_name(first_any->header.tokenizer),
                        s.path.filename().string(), shard_tokenizer_name(s.header.tokenizer), hint));
      }
    }
  }
  if (first_any != nullptr) out.tokenizer = first_any->header.tokenizer;
  for (const auto* split : all) {
    if (split->size() < 2) continue;
    const ShardFolderEntry& first = split->front();
    for (size_t i = 1; i < split->size(); ++i) {
      const ShardFolderEntry& s = (*split)[i];
      const bool last = i + 1 == split->size();
      if (last ? s.header.token_count <= first.header.token_count : s.header.token_count == first.header.token_count) {
        continue;
      }
      throw DataError(
          fmt::format("folder {}: {} holds {} tokens but {} holds {}: in one set every shard of a split but "
                      "the last holds the same number of tokens (--shard-size) and the last no more, so "
                      "these come from two sets; {}",
                      dir, first.path.filename().string(), first.header.token_count, s.path.filename().string(),
                      s.header.token_count, hint));
    }
  }
  return out;
}

}  // namespace dion::data
