// src/train/io/checkpoint_detail.h — what the files of checkpoint.h share (private to
// src/train/io): checkpoint_common.cpp (names and files of a checkpoint folder, reading an
// archive checked against the manifest, the folders known good), checkpoint_write.cpp (save,
// commit, rotation), checkpoint_verify.cpp (the whole check, choosing one), checkpoint_load.cpp
// (resharding loads).
#pragma once

#include <c10/util/ArrayRef.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dion/train/checkpoint.h"

namespace dion::train::detail {

void fsync_path(const std::filesystem::path& p);  // throws CheckpointError when it cannot be opened
std::string shape_text(c10::IntArrayRef sizes);   // "4x8"
std::string step_name(int64_t step);              // "step_00000100"
bool is_step_dir(const std::filesystem::path& p, int64_t* step);
// The step_* folders of `dir`, newest first.
std::vector<std::pair<int64_t, std::filesystem::path>> step_dirs(const std::filesystem::path& dir);
// The files of one rank: "model.pt" for one process, "rank_00003.model.pt" in a parallel run.
std::string rank_file(int world, int rank, const char* what);
inline constexpr const char* kRankFiles[] = {"model", "optimizer", "rng"};
// Every file a checkpoint written by `world` processes holds besides manifest.json.
std::set<std::string> expected_files(int world);
// An archive from a checkpoint file: its bytes checked against the manifest (version 1: as is).
torch::serialize::InputArchive open_archive(const std::filesystem::path& ckpt, const std::string& name);
// Exports (`dion-train export` writes CKPT/model.safetensors, atomically through a temp file)
// may sit in a checkpoint folder without being part of it.
bool is_export(const std::string& name);
// The folders this process wrote or verified whole: rotation removes them after the cheap
// structure check; any other folder is verified whole (checksums) before it may be removed.
void remember_good(const std::filesystem::path& p);
bool known_good(const std::filesystem::path& p);
// The whole check of checkpoint.h; `out` gets meta.json's values when it passes ("": good).
std::string verify(const std::filesystem::path& ckpt, CheckpointMeta* out);

}  // namespace dion::train::detail
