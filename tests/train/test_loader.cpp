// tests/train/test_loader.cpp — the train data's order (key data_seed, ShardLoader::start_at_seed):
// seed 0 keeps the reference's first batch; another seed moves the first batch to an offset drawn
// from it (the same seed, the same offset; a batch is the tokens at that offset), inside the shard;
// data-parallel ranks keep cutting one global stream (rank 1's rows follow rank 0's); a resumed
// run keeps its checkpoint's position; dion-train's first loss moves with data_seed and repeats.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dion/train/loader.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

namespace fs = std::filesystem;
using test::ProcResult;
using test::run_train;
using test::TempDir;

const fs::path& shards() {
  static TempDir dir("loader");
  static const fs::path p = test::shakespeare_shards(dir.path(), 100000);
  return p;
}

bool same(const Batch& a, const Batch& b) { return a.x.equal(b.x) && a.y.equal(b.y); }

TEST(DataSeed, ZeroKeepsTheReferencesFirstBatch) {
  ShardLoader plain(shards(), "train", 4, 32), seeded(shards(), "train", 4, 32);
  seeded.start_at_seed(0);
  EXPECT_EQ(seeded.position().offset, 0);
  EXPECT_TRUE(same(plain.next(), seeded.next()));
}

TEST(DataSeed, ASeedDrawsAnOffsetInsideTheShardAndRepeats) {
  ShardLoader base(shards(), "train", 4, 32);
  const int64_t shard0 = 100000;  // shakespeare_shards: full train shards of 100000 tokens
  std::vector<int64_t> offsets;
  for (uint64_t seed : {1, 2, 3, 1}) {
    ShardLoader l(shards(), "train", 4, 32);
    l.start_at_seed(seed);
    const LoaderPosition p = l.position();
    EXPECT_EQ(p.shard, 0);
    EXPECT_GT(p.offset, 0) << "seed " << seed;
    EXPECT_LE(p.offset + 4 * 32 + 1, shard0) << "seed " << seed;
    offsets.push_back(p.offset);
    // The batch is the tokens at that offset: a loader restored there reads the same.
    base.restore(p);
    EXPECT_TRUE(same(l.next(), base.next())) << "seed " << seed;
  }
  EXPECT_NE(offsets[0], offsets[1]);
  EXPECT_NE(offsets[1], offsets[2]);
  EXPECT_EQ(offsets[0], offsets[3]);  // the same seed, the same place
}

TEST(DataSeed, RanksCutOneGlobalStream) {
  // Two ranks of B 2 read what one rank of B 4 reads: rows 0-1 rank 0's, rows 2-3 rank 1's.
  ShardLoader one(shards(), "train", 4, 32), r0(shards(), "train", 2, 32, 0, 2), r1(shards(), "train", 2, 32, 1, 2);
  for (ShardLoader* l : {&one, &r0, &r1}) l->start_at_seed(9);
  EXPECT_EQ(r0.position().offset, one.position().offset);
  EXPECT_EQ(r1.position().offset, one.position().offset);  // positions are global (rank 0's)
  for (int step = 0; step < 3; ++step) {
    const Batch a = one.next(), b0 = r0.next(), b1 = r1.next();
    EXPECT_TRUE(a.x.slice(0, 0, 2).equal(b0.x)) << step;
    EXPECT_TRUE(a.x.slice(0, 2, 4).equal(b1.x)) << step;
  }
}

std::vector<std::string> tiny(const fs::path& run_dir, int steps) {
  // clang-format off
  return {"--data_dir", shards().string(), "--run_dir", run_dir.string(), "--model_dim", "32", "--n_layer", "1",
          "--n_head", "2", "--sequence_length", "16", "--batch_size", "2", "--device_batch_size", "2",
          "--val_tokens", "64", "--num_iterations", std::to_string(steps), "--val_loss_every", "0",
          "--dtype", "fp32", "--optimizer", "dion2", "--scalar_opt", "adamw", "--lr", "0.02", "--log_every", "1"};
  // clang-format on
}

std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> out;
  for (const test::Record& r : test::read_metrics(run_dir / "metrics.jsonl"))
    if (r.kind == "train") out.push_back(r.loss);
  return out;
}

TEST(DataSeed, DionTrainsFirstLossMovesWithTheSeedAndRepeats) {
  TempDir tmp("dataseed");
  for (const char* name : {"s0", "s5a", "s5b", "s6"}) {
    const std::string seed = name[1] == '0' ? "0" : std::string(1, name[1]);
    ProcResult r = run_train(tiny(tmp / name, 2) + std::vector<std::string>{"--data_seed", seed});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  const auto s0 = losses(tmp / "s0"), s5a = losses(tmp / "s5a"), s5b = losses(tmp / "s5b"), s6 = losses(tmp / "s6");
  ASSERT_EQ(s0.size(), 2u);
  EXPECT_EQ(s5a, s5b);  // bit for bit: the same seed, the same batches
  EXPECT_NE(s0[0], s5a[0]);
  EXPECT_NE(s5a[0], s6[0]);
}

TEST(DataSeed, AResumedRunReadsOnFromItsCheckpoint) {
  // 4 steps at data_seed 5 in one go, and 2 + 2 with a checkpoint between: the same losses. The
  // resumed half is given data_seed 7: the checkpoint's position wins (the key is FREE on resume).
  TempDir tmp("dataseed_resume");
  const std::vector<std::string> seed5{"--data_seed", "5"};
  ASSERT_EQ(run_train(tiny(tmp / "whole", 4) + seed5).exit_code, 0);
  const std::vector<std::string> ck{"--checkpoint_dir", (tmp / "ck").string()};
  ProcResult first = run_train(tiny(tmp / "split", 4) + seed5 + ck + std::vector<std::string>{"--stop_after", "2"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ProcResult second = run_train(tiny(tmp / "split", 4) + ck + std::vector<std::string>{"--data_seed", "7"});
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto whole = losses(tmp / "whole"), split = losses(tmp / "split");
  ASSERT_EQ(whole.size(), 4u);
  ASSERT_EQ(split.size(), 4u) << second.output;
  EXPECT_EQ(whole, split);
}

}  // namespace
}  // namespace dion::train
