// tests/consumer/other_targets.cpp — the installed dion::comm and dion::data, used once each.
//
// dion::comm: a one-process Group (Group::init_from_env without torchrun's variables) sums a
// tensor, which links the c10d-based group code against the consumer's LibTorch. dion::data:
// a FineWeb shard written and read back (shard.h). Kept apart from main.cpp so that main.cpp
// shows the train_mlp.cpp setup compiling with dion/dion.h alone.
#include <ATen/ops/arange.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

#include "dion/comm/group.h"
#include "dion/data/shard.h"

int check_other_targets() {
  dion::comm::Group world = dion::comm::Group::init_from_env();
  at::Tensor x = at::arange(4, at::kFloat);  // [4]
  world.all_reduce_(x);                      // one process: x unchanged
  if (world.size() != 1 || world.rank() != 0 || x[3].item<float>() != 3.0f) {
    std::printf("consumer: FAILED: dion::comm one-process group (size %d, rank %d)\n", world.size(), world.rank());
    return 1;
  }

  std::vector<uint16_t> tokens = {50256, 15496, 11, 995, 0};
  auto path = std::filesystem::temp_directory_path() / "dion_consumer_val_000000.bin";
  dion::data::shard_write(path, tokens);
  auto shard = dion::data::ShardFile::open(path);
  bool same = shard.header().token_count == int64_t(tokens.size()) &&
              std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()) == tokens;
  std::filesystem::remove(path);
  if (!same) {
    std::printf("consumer: FAILED: dion::data shard round trip\n");
    return 1;
  }
  std::printf("consumer: dion::comm and dion::data OK\n");
  return 0;
}
