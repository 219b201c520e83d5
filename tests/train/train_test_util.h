// tests/train/train_test_util.h — what the dion-train tests share: running the dion-train binary
// as a subprocess, temporary folders, Tiny Shakespeare shards made with the dion_data library,
// and reading metrics.jsonl.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace dion::train {
// Command lines are built by appending: base + {"--key", "value"} (later_wins below).
inline std::vector<std::string> operator+(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}
}  // namespace dion::train

namespace dion::train::test {

std::filesystem::path source_dir();

// A fresh folder under the system temp dir, removed with its contents on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag);
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct ProcResult {
  int exit_code = -1;
  std::string output;  // stdout + stderr
};
// dion-train refuses a key given twice; the tests build a base command line and override keys
// by appending, so the helpers below first keep only the last of each key ("--key value" or
// "--key=value"), where it stands. Other words stay as they are.
std::vector<std::string> later_wins(const std::vector<std::string>& args);

// Runs build/dion-train with `args` (no shell), later_wins applied; waits.
ProcResult run_train(const std::vector<std::string>& args);
// Starts build/dion-train with `args`, stdout and stderr to `output`; returns the pid (-1 on
// failure) without waiting. `fsize_limit` > 0: the child's RLIMIT_FSIZE (`ulimit -f`, bytes), so
// that a write past it fails with EFBIG (dion-train ignores SIGXFSZ): a full disk without root.
int spawn_train(const std::vector<std::string>& args, const std::filesystem::path& output, int64_t fsize_limit = 0);
// run_train with RLIMIT_FSIZE `fsize_limit` bytes.
ProcResult run_train_limited(const std::vector<std::string>& args, int64_t fsize_limit);

// Runs `world` copies of build/dion-train with `args` as the ranks of one job: each gets
// torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT,
// OMP_NUM_THREADS=1); waits for all (killing every rank still running after `deadline_s`,
// exit_code -1).
struct RankOptions {
  int deadline_s = 120;
  std::vector<std::string> rank0_extra;  // appended to rank 0's arguments only
  int kill_rank = -1;                    // >= 0: SIGKILL this rank once kill_when(rank 0's output)
  std::function<bool(const std::string&)> kill_when;
  int fsize_limit_rank = -1;  // >= 0: this rank runs under RLIMIT_FSIZE fsize_limit bytes
  int64_t fsize_limit = 0;
};
std::vector<ProcResult> run_train_ranks(int world, const std::vector<std::string>& args,
                                        const RankOptions& options = {});

// Tokenizes the committed Tiny Shakespeare into `dir` with `shard_size`-token shards (the first
// is val, the rest train), once per process per (dir); returns dir.
std::filesystem::path shakespeare_shards(const std::filesystem::path& dir, int64_t shard_size = 100000);

// The committed GPT-2 files.
std::filesystem::path gpt2_dir();

struct Record {
  std::string kind;
  int64_t step = 0;
  double loss = 0;  // train: loss; val: val_loss
  double lr = 0;
  int64_t tokens = 0;
  double grad_norm = 0;  // train: the global gradient norm (NaN: null or absent)
  bool skipped = false;  // train: a non-finite step that was skipped
};
std::vector<Record> read_metrics(const std::filesystem::path& file);

// True when the folder holds no entries (or does not exist).
bool is_empty_or_missing(const std::filesystem::path& dir);

// The parallel tests' tiny run: 2 layers, 64 wide, T 64, a global batch of 4 sequences in
// micro-batches of 1, Muon + AdamW at lr 0.02, fp32, every step logged; `steps` steps.
std::vector<std::string> tiny_parallel_run(const std::filesystem::path& data, const std::filesystem::path& run_dir,
                                           int steps);
// --dp_size dp --fs_size fs --tp_size tp
std::vector<std::string> layout_flags(int dp, int fs, int tp);

// The parallel layouts' equality with one process (docs/distributed.md): the relative loss
// difference at train step 0, at train step 1, and at every later record (the fp32 sums' order
// differs across layouts and the steps amplify it).
inline constexpr double kStep0Tol = 1e-6, kStep1Tol = 1e-5, kTol = 3e-4;
// Every rank exited 0 (else its output in the failure).
void expect_all_ok(const std::vector<ProcResult>& rs);
// Every record of `got` against the record of the same kind and step of `ref`, within the
// tolerances above; prints the largest relative difference under `what`.
void expect_close(const std::vector<Record>& ref, const std::vector<Record>& got, const std::string& what);

}  // namespace dion::train::test
