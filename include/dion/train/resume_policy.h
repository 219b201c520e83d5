// dion/train/resume_policy.h — what a resumed run may change: each config key's rule, checked
// against the checkpoint's saved config BEFORE any step (docs/train.md "Resuming: what may
// change").
//
//   std::vector<std::string> lines = resume_check(config, meta, ckpt, data_fingerprint(config));
//
// Policies:
//   MUST_MATCH  the saved state means something else under another value (the model's shape,
//               sequence_length, batch_size: the loader position and token count, the optimizer
//               and the options its state depends on, the training data, debug's synthetic data
//               and seed): a different value is a ConfigError naming the key, both values and
//               what to do.
//   LOGGED      allowed, one line says so ("num_iterations 40 -> 80"): the schedule and the
//               hyperparameters of the steps still to come (lr, num_iterations, warmup, ...),
//               the device and the compute dtype.
//   LAYOUT      dp_size, fs_size, tp_size: allowed (the checkpoint is resharded), one line
//               ("resuming at another layout: dp 1 x fs 2 x tp 1 -> dp 2 x fs 1 x tp 1 (resharded)").
//   FREE        no effect on the state (logging, checkpointing, paths, timeouts): silent.
// The rule is part of the key's row in src/train/config_keys.cpp (with, for MUST_MATCH, what the
// saved state depends on): a key cannot be declared without one.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dion/train/config.h"

namespace dion::train {

struct CheckpointMeta;  // dion/train/checkpoint.h

enum class ResumePolicy { MUST_MATCH, LOGGED, LAYOUT, FREE };

// The policy of a key; nullopt for a name that is not a key.
std::optional<ResumePolicy> resume_policy(const std::string& key);

// Compares `config` with the checkpoint's saved config and data fingerprint. Throws ConfigError
// for a MUST_MATCH key (or the data) that differs; returns the log lines of the allowed changes.
std::vector<std::string> resume_check(const Config& config, const CheckpointMeta& meta,
                                      const std::filesystem::path& ckpt, const std::string& data_fingerprint);

// The training data's identity: debug mode's synthetic tokens and seed, or the train shards'
// count and a CRC-32 over each one's name, size and first 64 KiB ("12 train shards, crc32
// 1a2b3c4d"). Moving the folder keeps it; another data set or another tokenization changes it.
std::string data_fingerprint(const Config& config);

}  // namespace dion::train
