// dion/data/shard_folder.h — read the shard set of a folder (what the trainer's loader reads) and
// check that it is ONE set, as `dion-data prepare` or `dion-data download` wrote it.
//
// A consistent set for prefix P in folder DIR:
//   - every file P_val_*.bin / P_train_*.bin is named P_{val,train}_NNNNNN.bin (six or more
//     digits): a "P_train_000001 (copy).bin" would otherwise be read as part of the set;
//   - shard numbers form one sequence 0, 1, ..., N-1 over both splits (prepare numbers shards in
//     the order they fill up; download writes val_000000, train_000001, ...): no number twice
//     (val_000001 beside train_000001, or train_000001 beside train_0000001), no gap;
//   - in each split every shard but the last (highest-numbered) holds the same number of tokens
//     and the last no more: prepare cuts a split into shards of exactly --shard-size tokens, so a
//     short shard before the last one is the end of another run's set;
//   - every header is valid (shard_read_header) and every shard has the same tokenizer (header
//     slot [3]: GPT-2 or bytes).
// Shards from two corpora that happen to share one shard size and numbering cannot be told apart
// (a shard header carries no corpus id); the lock in `prepare` keeps two runs from writing them.
//
// A folder whose swap is unfinished (a `dion-data prepare --overwrite` killed while swapping its
// new set in, or swapping now: its journal DIR/.P.dion-prepare.journal exists) holds old and new
// shards mixed: it is refused, with the command that finishes the swap.
//
// What it does not do: read or check the tokens (ShardFile / shard_check_tokens do, lazily).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "dion/data/shard.h"

namespace dion::data {

struct ShardFolderEntry {
  std::filesystem::path path;
  ShardHeader header;
};

struct ShardFolder {
  std::vector<ShardFolderEntry> val, train;         // each sorted by shard number
  ShardTokenizer tokenizer = ShardTokenizer::GPT2;  // of every shard (GPT2 when there are none)
};

// Lists and checks the P_{val,train}_*.bin shards of `dir` (see above). Throws DataError naming
// the folder, the offending files and what a consistent set is. An empty folder is not an error
// here (both lists empty): the caller says what it needed.
ShardFolder shard_folder_read(const std::filesystem::path& dir, std::string_view prefix);

// Throws DataError when a swap of prefix `prefix` into `dir` is unfinished (see above), naming
// the journal and `dion-data finish-swap DIR --prefix P`. shard_folder_read calls it before and
// after listing; a reader of single shard files calls it for each file's folder and prefix.
void shard_folder_check_swap(const std::filesystem::path& dir, std::string_view prefix);

// The prefix P of a shard file name "P_{val,train}_NNNNNN.bin", or "" for another name.
std::string shard_prefix_of(const std::filesystem::path& file);

// Finishes a swap that an interrupted `dion-data prepare` left in `dir` for `prefix` (takes the
// prepare lock, as a prepare run would; refuses while one runs). Returns what it did, "" when
// there was nothing to finish.
std::string shard_folder_finish_swap(const std::filesystem::path& dir, std::string_view prefix);

}  // namespace dion::data
