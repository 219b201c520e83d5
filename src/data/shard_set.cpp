// src/data/shard_set.cpp — lock, staging, journalled swap and recovery of prepare's output
// folder (see shard_set.h). Plain POSIX: flock, rename, fsync of the folder.
#include "shard_set.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <fcntl.h>
#include <set>
#include <sys/file.h>
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

constexpr std::string_view kJournalMagic = "dion-prepare-journal 1";

// fsync a folder so that the renames and unlinks in it are on disk.
void sync_dir(const fs::path& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the data itself was fsynced
  ::fsync(fd);
  ::close(fd);
}

std::string holder_text() {
  char host[256] = "?";
  ::gethostname(host, sizeof(host) - 1);
  const std::time_t now = std::time(nullptr);
  char when[64];
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  return fmt::format("pid {} on {} since {}", ::getpid(), host, when);
}

}  // namespace

bool is_shard_name(const std::string& name, const std::string& prefix) {
  for (const std::string split : {"_val_", "_train_"}) {
    const std::string head = prefix + split;
    if (!name.starts_with(head) || !name.ends_with(".bin")) continue;
    const std::string digits = name.substr(head.size(), name.size() - head.size() - 4);
    if (digits.size() >= 6 && std::all_of(digits.begin(), digits.end(), ::isdigit)) return true;
  }
  return false;
}

fs::path journal_path(const fs::path& dir, const std::string& prefix) {
  return dir / ("." + prefix + ".dion-prepare.journal");
}

ShardSetWriter::ShardSetWriter(fs::path dir, std::string prefix) : dir_(std::move(dir)), prefix_(std::move(prefix)) {
  const std::string base = "." + prefix_ + ".dion-prepare";
  staging_ = dir_ / (base + ".staging");
  journal_ = journal_path(dir_, prefix_);
  lock_path_ = dir_ / (base + ".lock");

  // The lock: flock on a file that is unlinked on release. A run that opened the file just
  // before another unlinked it would lock a dead inode, so check that the locked inode is
  // still the one at the path, and retry if not.
  for (int tries = 0;; ++tries) {
    int fd = ::open(lock_path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw DataError(fmt::format("output folder {}: cannot create the lock file {}: {}", dir_, lock_path_.filename(),
                                  errno_text(errno)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      std::string holder;
      if (err == EWOULDBLOCK) {
        char buf[512];
        const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
        holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("unknown");
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\r')) holder.pop_back();
      }
      ::close(fd);
      if (err == EWOULDBLOCK) {
        throw DataError(
            fmt::format("output folder {} is being written by another dion-data prepare with prefix "
                        "\"{}\" ({}): wait for it to finish, or choose another folder or --prefix",
                        dir_, prefix_, holder));
      }
      throw DataError(
          fmt::format("output folder {}: cannot lock {}: {} (a file system without "
                      "flock? write the shards to a local folder)",
                      dir_, lock_path_.filename(), errno_text(err)));
    }
    struct stat by_fd {
    }, by_path{};
    if (::fstat(fd, &by_fd) == 0 && ::stat(lock_path_.c_str(), &by_path) == 0 && by_fd.st_ino == by_path.st_ino &&
        by_fd.st_dev == by_path.st_dev) {
      lock_fd_ = fd;
      break;
    }
    ::close(fd);
    if (tries > 100) {
      throw DataError(
          fmt::format("output folder {}: cannot take the lock {} (it keeps being "
                      "replaced)",
                      dir_, lock_path_.filename()));
    }
  }
  try {
    const std::string who = holder_text() + "\n";
    if (::ftruncate(lock_fd_, 0) == 0) {
      (void)!::pwrite(lock_fd_, who.data(), who.size(), 0);
    }
    recover();
    existing_ = list_shards();
  } catch (...) {
    release_lock();
    throw;
  }
}

ShardSetWriter::~ShardSetWriter() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
  }
  release_lock();
}

void ShardSetWriter::release_lock() {
  if (lock_fd_ < 0) return;
  ::unlink(lock_path_.c_str());  // while still holding it: see the constructor
  ::close(lock_fd_);
  lock_fd_ = -1;
}

std::vector<fs::path> ShardSetWriter::list_shards() const {
  std::vector<fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (is_shard_name(entry.path().filename().string(), prefix_)) found.push_back(entry.path());
  }
  if (ec) throw DataError(fmt::format("output folder {}: cannot list it: {}", dir_, ec.message()));
  std::sort(found.begin(), found.end());
  return found;
}

void ShardSetWriter::recover() {
  std::error_code ec;
  if (fs::exists(journal_)) {
    // The commit point was passed: finish the swap the journal describes.
    const std::string text = file_read_all(journal_, "prepare journal");
    std::vector<std::string> fresh, old;
    size_t pos = 0;
    bool magic_ok = false;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(pos, end - pos);
      pos = end + 1;
      if (line == kJournalMagic) {
        magic_ok = true;
      } else if (line.starts_with("new ") && is_shard_name(line.substr(4), prefix_)) {
        fresh.push_back(line.substr(4));
      } else if (line.starts_with("old ") && is_shard_name(line.substr(4), prefix_)) {
        old.push_back(line.substr(4));
      } else if (!line.empty()) {
        magic_ok = false;
        break;
      }
    }
    if (!magic_ok) {
      throw DataError(
          fmt::format("output folder {}: the journal {} of an interrupted prepare is "
                      "damaged; remove it and the folder {}, check the shards, and "
                      "run again",
                      dir_, journal_.filename(), staging_.filename()));
    }
    for (const std::string& name : fresh) {
      const fs::path staged = staging_ / name;
      if (fs::exists(staged)) {
        if (::rename(staged.c_str(), (dir_ / name).c_str()) != 0) {
          throw DataError(
              fmt::format("output folder {}: cannot finish the interrupted swap "
                          "(rename {}): {}",
                          dir_, name, errno_text(errno)));
        }
        failpoint("prepare-swap");
      } else if (!fs::exists(dir_ / name)) {
        throw DataError(
            fmt::format("output folder {}: cannot finish the interrupted swap: the "
                        "new shard {} is neither staged nor in place; delete the "
                        "{} shards and prepare them again",
                        dir_, name, prefix_));
      }
    }
    const std::set<std::string> keep(fresh.begin(), fresh.end());
    for (const std::string& name : old) {
      if (keep.contains(name)) continue;
      ::unlink((dir_ / name).c_str());
      failpoint("prepare-remove");
    }
    sync_dir(dir_);
    fs::remove_all(staging_, ec);
    failpoint("prepare-cleanup");
    ::unlink(journal_.c_str());
    sync_dir(dir_);
    recovered_ = fmt::format(
        "finished the swap of an interrupted earlier run: {} new shards in place, old ones "
        "removed",
        fresh.size());
  } else if (fs::exists(staging_)) {
    // Interrupted before the commit point: the old set is intact; drop the staged one.
    fs::remove_all(staging_, ec);
    recovered_ =
        "removed the staged shards of an interrupted earlier run (the old set was "
        "never touched)";
  }
  // Temporaries of an interrupted shard write (older versions staged them in DIR itself).
  size_t stray = 0;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    const size_t tmp = name.find(".bin.tmp.");
    if (tmp != std::string::npos && is_shard_name(name.substr(0, tmp + 4), prefix_)) {
      std::error_code rm;
      if (fs::remove(entry.path(), rm)) ++stray;
    }
  }
  if (stray > 0) {
    recovered_ += fmt::format("{}removed {} temporary files of an interrupted earlier run",
                              recovered_.empty() ? "" : "; ", stray);
  }
}

fs::path ShardSetWriter::add(const std::string& split, int64_t index, std::span<const uint16_t> tokens,
                             ShardTokenizer tokenizer) {
  if (staged_.empty()) {
    std::error_code ec;
    fs::create_directory(staging_, ec);
    if (ec) {
      throw DataError(fmt::format("output folder {}: cannot create the staging folder {}: {}", dir_,
                                  staging_.filename(), ec.message()));
    }
  }
  const std::string name = shard_name(prefix_, split, index);
  shard_write(staging_ / name, tokens, tokenizer);
  staged_.push_back(name);
  failpoint("prepare-stage");
  return dir_ / name;
}

void ShardSetWriter::commit(bool replace_existing) {
  const std::vector<fs::path> now = list_shards();
  if (now != existing_) {
    throw DataError(
        fmt::format("output folder {}: its {}_{{val,train}}_*.bin shards changed while prepare ran ({} "
                    "at the start, {} now): another program wrote there, so the set would be mixed. "
                    "Nothing was replaced and the new shards were discarded; check the folder and run "
                    "again",
                    dir_, prefix_, existing_.size(), now.size()));
  }
  if (!replace_existing && !existing_.empty()) {
    throw DataError(fmt::format("output folder {} already has {} shards: pass --overwrite", dir_, existing_.size()));
  }
  sync_dir(staging_);
  // The commit point: the journal names the new set and the old one.
  std::string journal = std::string(kJournalMagic) + "\n";
  for (const std::string& name : staged_) journal += "new " + name + "\n";
  for (const fs::path& old : existing_) journal += "old " + old.filename().string() + "\n";
  fs::path tmp;
  int fd = file_create_temp(journal_, tmp);
  try {
    file_write_all(fd, journal.data(), journal.size(), tmp);
    file_sync_close(fd, tmp);
    fd = -1;
    if (::rename(tmp.c_str(), journal_.c_str()) != 0) {
      throw DataError(fmt::format("output folder {}: cannot write the journal {}: {}", dir_, journal_.filename(),
                                  errno_text(errno)));
    }
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  sync_dir(dir_);
  committed_ = true;  // from here on, the staged set is the truth (a rerun rolls forward)
  failpoint("prepare-journal");

  // The swap. An error from here on is finished by the next run or by `dion-data finish-swap`;
  // until the journal goes, readers refuse the folder.
  const std::string resume = "; `dion-data finish-swap " + dir_.string() + " --prefix " + prefix_ +
                             "` (or the next dion-data prepare on this folder) finishes the swap (the journal " +
                             journal_.filename().string() + " says how)";
  for (const std::string& name : staged_) {
    if (::rename((staging_ / name).c_str(), (dir_ / name).c_str()) != 0) {
      throw DataError(fmt::format("output {}: cannot rename the new shard into place: {}{}", dir_ / name,
                                  errno_text(errno), resume));
    }
    failpoint("prepare-swap");
  }
  const std::set<std::string> keep(staged_.begin(), staged_.end());
  for (const fs::path& old : existing_) {
    if (keep.contains(old.filename().string())) continue;
    if (::unlink(old.c_str()) != 0 && errno != ENOENT) {
      throw DataError(fmt::format("output {}: cannot remove the old shard: {}{}", old, errno_text(errno), resume));
    }
    failpoint("prepare-remove");
  }
  sync_dir(dir_);
  std::error_code ec;
  fs::remove_all(staging_, ec);
  failpoint("prepare-cleanup");
  ::unlink(journal_.c_str());  // the end of the swap: readers accept the folder again
  sync_dir(dir_);
}

}  // namespace dion::data::detail
