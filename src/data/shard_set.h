// src/data/shard_set.h — the output folder of one `prepare` run (not installed, not public API):
// a lock against a second writer, the new shards staged beside the old set, and a journalled
// swap that a rerun completes after a crash.
//
// Files in the output folder DIR, for prefix P (all hidden, so never read as input or shards):
//   DIR/.P.dion-prepare.lock      flock()ed for the whole run; holds "pid N on HOST since T"
//   DIR/.P.dion-prepare.staging/  the new shards, under their final names, until the swap
//   DIR/.P.dion-prepare.journal   written (atomically) once the whole new set is staged: the
//                                 commit point. It lists the new and the old shard names.
// The swap renames every staged shard into DIR (replacing an old shard of the same name in one
// step), then removes the old shards the new set does not have, then the staging folder and the
// journal. Before the journal exists the old set is untouched; after it, the complete new set
// exists on disk and the next run (any `prepare` on DIR with prefix P) rolls the swap forward
// before doing anything else. A crash before the journal leaves a staging folder that the next
// run removes.
//
// Readers never use a half-swapped folder: from the journal's rename until its removal (the last
// step of a swap, or of the next run's roll-forward) shard_folder_read and `dion-data inspect`
// refuse DIR for prefix P, naming `dion-data finish-swap` (dion/data/shard_folder.h).
//
// What it does not do: lock across machines where flock() does not reach (some network file
// systems: the lock then fails with a message).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "dion/data/shard.h"

namespace dion::data::detail {

class ShardSetWriter {
 public:
  // Takes the lock (throws DataError naming the holder if another run has it), completes or
  // removes what an interrupted earlier run left, and lists the existing P_{val,train}_*.bin.
  ShardSetWriter(std::filesystem::path dir, std::string prefix);
  ~ShardSetWriter();  // removes the staging folder unless committed; releases the lock
  ShardSetWriter(const ShardSetWriter&) = delete;
  ShardSetWriter& operator=(const ShardSetWriter&) = delete;

  // The P_{val,train}_*.bin shards in DIR when the writer was made, sorted.
  const std::vector<std::filesystem::path>& existing() const { return existing_; }
  // What recovery did ("" if nothing was left over), for the caller to report.
  const std::string& recovered() const { return recovered_; }

  // Writes a shard into the staging folder; returns its final path in DIR.
  std::filesystem::path add(const std::string& split, int64_t index, std::span<const uint16_t> tokens,
                            ShardTokenizer tokenizer = ShardTokenizer::GPT2);

  // Swaps the staged set in. `replace_existing`: the old set goes; otherwise there must be
  // none. Throws DataError (and leaves the old set) if DIR's shard set changed since the writer
  // was made, i.e. something other than this run wrote shards there.
  void commit(bool replace_existing);

 private:
  std::vector<std::filesystem::path> list_shards() const;
  void recover();
  void release_lock();

  std::filesystem::path dir_, staging_, journal_, lock_path_;
  std::string prefix_;
  int lock_fd_ = -1;
  bool committed_ = false;
  std::vector<std::filesystem::path> existing_;
  std::vector<std::string> staged_;  // file names in staging_
  std::string recovered_;
};

// DIR/.P.dion-prepare.journal: present exactly while a swap for prefix P is unfinished.
std::filesystem::path journal_path(const std::filesystem::path& dir, const std::string& prefix);

// True for "P_val_NNNNNN.bin" / "P_train_NNNNNN.bin" (six or more digits).
bool is_shard_name(const std::string& name, const std::string& prefix);

}  // namespace dion::data::detail
