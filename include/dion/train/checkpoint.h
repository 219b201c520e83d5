// dion/train/checkpoint.h — training checkpoints: write them so that a kill at any moment
// leaves the last complete one usable, find the newest, read them back.
//
// Layout (docs/train.md "Checkpoints"):
//   CHECKPOINT_DIR/step_00000100/      one complete checkpoint (after training step 100)
//       meta.json      format, version, step, tokens, elapsed time, best val loss, loader
//                      position (global: data-parallel rank 0's), layout (dp, fs, tp, world size),
//                      every parameter's name, global shape, dtype and sharded dims (fs_dim,
//                      tp_dim; dion/train/parallel.h), and the resolved config (YAML text)
//     one process (world size 1):
//       model.pt       torch::serialize archive: parameter name -> tensor (whole, CPU)
//       optimizer.pt   torch::serialize archive written by dion::Optimizer::save
//       rng.pt         torch::serialize archive: "cpu" (and "cuda") generator states
//     a parallel run: the same three per rank, rank_RRRRR.model.pt (this rank's parameter
//       parts), rank_RRRRR.optimizer.pt (its optimizer state, with global shapes and offsets),
//       rank_RRRRR.rng.pt
//   CHECKPOINT_DIR/tmp.*/              a checkpoint being written (ignored, removed later)
// A checkpoint is written into tmp.* (every file fsynced), renamed to step_N (atomic), the
// folder fsynced; only then are older step_* folders removed. So at any instant the newest
// step_* folder is complete. In a parallel run: barrier; rank 0 makes the temp folder; barrier;
// every rank writes and fsyncs its files; barrier; rank 0 alone writes meta.json and renames
// (the commit); barrier. A rank killed anywhere before the commit leaves no step_N folder (the
// others fail at the next barrier), so the previous checkpoint stays the newest complete one.
//
// Resharding: a checkpoint written at one layout loads at any other (world size, dp / fs / tp
// split): the model's tensors are reassembled from the saved parts and cut to this rank's part;
// the optimizer reads every saved rank's state (dion::Optimizer::load cuts its slices).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "dion/optim/optimizer.h"
#include "dion/train/gpt.h"
#include "dion/train/loader.h"

namespace dion::train {

inline constexpr int kCheckpointVersion = 1;

// A problem with a checkpoint on disk. Exit code 1.
class CheckpointError : public std::runtime_error {
 public:
  explicit CheckpointError(const std::string& message) : std::runtime_error(message) {}
};

struct TrainState {
  int64_t step = -1;        // the last training step done (-1: none)
  int64_t tokens = 0;       // training tokens so far
  double elapsed_s = 0;     // wall time of the run so far (all invocations)
  double best_val_loss = 0; // 0 with best_val_step == -1: no validation yet
  int64_t best_val_step = -1;
  LoaderPosition loader;
};

class Parallel;  // dion/train/parallel.h

// Writes a checkpoint of `state` (see the top of this file). Returns its folder. With a
// Parallel of more than one process: collective, every rank calls it.
std::filesystem::path checkpoint_save(const std::filesystem::path& dir, GPT& model, const dion::Optimizer& optimizer,
                                      const TrainState& state, const std::string& config_yaml,
                                      Parallel* parallel = nullptr);

// The newest complete checkpoint folder in `dir`, if any.
std::optional<std::filesystem::path> checkpoint_find_latest(const std::filesystem::path& dir);

// Reads meta.json. Throws CheckpointError naming the file.
struct CheckpointMeta {
  TrainState state;
  std::string config_yaml;
  GPTConfig model;
};
CheckpointMeta checkpoint_read_meta(const std::filesystem::path& ckpt);

// A checkpoint folder (holding meta.json) as given, or a checkpoint_dir's newest one; throws
// CheckpointError naming `path` when it is neither (what `sample` and `export` accept).
std::filesystem::path checkpoint_resolve(const std::filesystem::path& path);

// Loads the model's parameters (global shapes checked against meta.json's), and, when given,
// the optimizer and RNG states, whatever the layout the checkpoint was written at. With a
// Parallel, `model`'s parameters are this rank's parts (Parallel::shard_model); without, whole.
// Throws CheckpointError naming the file and the tensor.
void checkpoint_load_model(const std::filesystem::path& ckpt, GPT& model, const Parallel* parallel = nullptr);
void checkpoint_load_training(const std::filesystem::path& ckpt, dion::Optimizer& optimizer);

}  // namespace dion::train
