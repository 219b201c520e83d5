// dion/train/checkpoint.h — training checkpoints: write them so that a kill at any moment
// leaves the last complete one usable, find the newest, read them back.
//
// Layout (docs/train.md "Checkpoints"):
//   CHECKPOINT_DIR/step_00000100/      one complete checkpoint (after training step 100)
//       meta.json      format, version, step, tokens, elapsed time, best val loss, loader
//                      position (global: data-parallel rank 0's), layout (dp, fs, tp, world size),
//                      every parameter's name, global shape, dtype and sharded dims (fs_dim,
//                      tp_dim; dion/train/parallel.h), the training data's fingerprint and the
//                      resolved config (YAML text)
//     one process (world size 1):
//       model.pt       torch::serialize archive: parameter name -> tensor (whole, CPU)
//       optimizer.pt   torch::serialize archive written by dion::Optimizer::save
//       rng.pt         torch::serialize archive: "cpu" (and "cuda") generator states
//     a parallel run: the same three per rank, rank_RRRRR.model.pt (this rank's parameter
//       parts), rank_RRRRR.optimizer.pt (its optimizer state, with global shapes and offsets),
//       rank_RRRRR.rng.pt
//       manifest.json  written LAST: every other file's size and CRC-32 (checkpoint_files.h)
//   CHECKPOINT_DIR/tmp.*/              a checkpoint being written (removed after the next commit)
//
// Writing: into tmp.* (every file fsynced, checksummed as it is written), manifest.json last,
// renamed to step_N (atomic; an existing step_N is swapped out atomically), the folder fsynced.
// So at any instant the newest complete step_* is whole. In a parallel run every rank writes its
// files, then the ranks exchange an ok flag and their files' checksums (one all_gather): a rank
// whose write failed (disk full, EFBIG, EACCES) makes every rank fail with CheckpointError, the
// temp folder removed, the previous checkpoints untouched; a killed rank makes the others fail
// within comm_timeout_s. Only rank 0 writes meta.json and manifest.json and renames (the commit).
// Before writing, the free space of checkpoint_dir is compared with the size of the newest
// checkpoint (an estimate without one): too little is a CheckpointError naming both.
//
// Rotation: after a commit, only tmp.* leftovers and older step_* folders that are good are
// removed: ones this process wrote or verified (still holding their manifest's files and
// sizes), any other after a full verification. A newer step_* folder, or one that is not good,
// is never removed (a note names it); one in the way of a new checkpoint of its step is moved
// aside to step_N.replaced-PID-TIME.
//
// Reading: checkpoint_read_meta / checkpoint_choose verify the WHOLE checkpoint before anything
// is loaded: manifest.json present, every file it lists with its size and CRC-32, no file
// missing or extra (exports, *.safetensors, are allowed), the file set the layout needs, and
// meta.json's values sane (step >= 0 and below the checkpoint's own num_iterations, tokens =
// (step + 1) x batch_size x sequence_length, ...). The load functions then check each file's
// bytes again as they read them. A version-1 checkpoint (before checksums, no manifest.json) is
// still read, with a warning: its files cannot be verified.
//
// Resharding: a checkpoint written at one layout loads at any other (world size, dp / fs / tp
// split): the model's tensors are reassembled from the saved parts and cut to this rank's part;
// the optimizer reads every saved rank's state (dion::Optimizer::load cuts its slices).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dion/optim/optimizer.h"
#include "dion/train/gpt.h"
#include "dion/train/loader.h"

namespace dion::train {

// 2: manifest.json with every file's size and CRC-32, meta.json "data_fingerprint". 1 (read
// with a warning): no manifest.
inline constexpr int kCheckpointVersion = 2;

// A problem with a checkpoint on disk. Exit code 1.
class CheckpointError : public std::runtime_error {
 public:
  explicit CheckpointError(const std::string& message) : std::runtime_error(message) {}
};

struct TrainState {
  int64_t step = -1;         // the last training step done (-1: none)
  int64_t tokens = 0;        // training tokens so far
  double elapsed_s = 0;      // wall time of the run so far (all invocations)
  double best_val_loss = 0;  // 0 with best_val_step == -1: no validation yet
  int64_t best_val_step = -1;
  LoaderPosition loader;
};

class Parallel;  // dion/train/parallel.h

// Writes a checkpoint of `state` (see the top of this file). Returns its folder. With a
// Parallel of more than one process: collective, every rank calls it; every rank throws
// CheckpointError if any rank's write failed. `data_fingerprint`: the training data's identity
// (resume_policy.h), kept in meta.json.
std::filesystem::path checkpoint_save(const std::filesystem::path& dir, GPT& model, const dion::Optimizer& optimizer,
                                      const TrainState& state, const std::string& config_yaml,
                                      Parallel* parallel = nullptr, const std::string& data_fingerprint = "");

// At start-up, before any training step: throws CheckpointError naming key 'checkpoint_dir' when
// `dir` cannot hold checkpoints — it (or a parent) is a file, or the folder (or, when it does not
// exist yet, its nearest existing parent) does not take a new file (read-only, no permission).
// Creates nothing: a probe file is made and removed.
void checkpoint_dir_check_writable(const std::filesystem::path& dir);

// The newest step_* folder in `dir`, complete or not (nullopt: none).
std::optional<std::filesystem::path> checkpoint_find_latest(const std::filesystem::path& dir);

struct CheckpointMeta {
  TrainState state;
  std::string config_yaml;
  GPTConfig model;
  std::string data_fingerprint;  // "" in a version-1 checkpoint
  int version = kCheckpointVersion;
  int64_t dp_size = 1, fs_size = 1, tp_size = 1;  // the layout it was written at
};

// "" when `ckpt` is a complete good checkpoint (every check at the top of this file, checksums
// included), else what is wrong, naming the file (and the key).
std::string checkpoint_problem(const std::filesystem::path& ckpt);

// Verifies the whole checkpoint (checkpoint_problem), then reads meta.json. Throws
// CheckpointError naming the folder and what is wrong. A version-1 checkpoint: a warning line on
// stderr.
CheckpointMeta checkpoint_read_meta(const std::filesystem::path& ckpt);

// The checkpoint a run resumes from: the newest step_* folder of `dir` if it is good. When it is
// not: CheckpointError naming it and what is wrong (nothing loaded, nothing removed), unless
// `fallback` (the resume_fallback key): then the newest good one, the bad ones newer than it in
// `skipped`. `chosen` empty: nothing to resume from.
struct CheckpointChoice {
  std::optional<std::filesystem::path> chosen;
  std::optional<CheckpointMeta> meta;
  std::vector<std::pair<std::filesystem::path, std::string>> skipped;  // folder, what is wrong
};
CheckpointChoice checkpoint_choose(const std::filesystem::path& dir, bool fallback);

// A checkpoint folder (holding meta.json) as given, or a checkpoint_dir's newest step_* folder;
// throws CheckpointError naming `path` when it is neither (what `sample` and `export` accept).
// (checkpoint_read_meta then verifies it.)
std::filesystem::path checkpoint_resolve(const std::filesystem::path& path);

// Loads the model's parameters (global shapes checked against meta.json's), and, when given,
// the optimizer and RNG states, whatever the layout the checkpoint was written at. With a
// Parallel, `model`'s parameters are this rank's parts (Parallel::shard_model); without, whole.
// Every file's bytes are checked against manifest.json as they are read. Throws CheckpointError
// naming the file and the tensor.
void checkpoint_load_model(const std::filesystem::path& ckpt, GPT& model, const Parallel* parallel = nullptr);
void checkpoint_load_training(const std::filesystem::path& ckpt, dion::Optimizer& optimizer);

}  // namespace dion::train
