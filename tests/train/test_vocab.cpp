// tests/train/test_vocab.cpp — key vocab_size against the data's tokenizer: byte shards train
// with vocab_size 320 (and the model has 320 rows), a GPT-2 set with vocab_size 320 is refused
// at start-up naming the key, the data and the value to use (before anything is written), and
// `sample` decodes a byte-level run's checkpoint with the byte tokenizer.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "dion/data/prepare.h"
#include "dion/data/shard.h"
#include "dion/train/checkpoint.h"
#include "dion/train/config.h"
#include "dion/train/loader.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

namespace fs = std::filesystem;
using test::ProcResult;
using test::run_train;
using test::TempDir;

std::vector<std::string> tiny(const fs::path& data, const fs::path& run_dir) {
  // clang-format off
  return {"--data_dir", data.string(), "--run_dir", run_dir.string(), "--model_dim", "32", "--n_layer", "1",
          "--n_head", "2", "--sequence_length", "16", "--batch_size", "2", "--device_batch_size", "2",
          "--val_tokens", "64", "--num_iterations", "3", "--val_loss_every", "0", "--dtype", "fp32",
          "--optimizer", "dion2", "--scalar_opt", "adamw", "--lr", "0.02", "--log_every", "1"};
  // clang-format on
}

// Byte shards of the first 20 kB of Tiny Shakespeare (prepare_shards_bytes, val fraction 0.2).
void byte_shards(const fs::path& dir) {
  TempDir in("text");
  {
    std::ifstream f(test::source_dir() / "data" / "tinyshakespeare" / "input.txt", std::ios::binary);
    std::string text(20000, '\0');
    f.read(text.data(), static_cast<std::streamsize>(text.size()));
    std::ofstream(in / "a.txt", std::ios::binary) << text;
  }
  auto source = data::document_source_open({(in / "a.txt").string()}, "\n\n");
  data::PrepareOptions o;
  o.output_dir = dir;
  o.val_fraction = 0.2;
  data::prepare_shards_bytes(*source, o);
}

TEST(Vocab, RoundUpAndDefault) {
  EXPECT_EQ(vocab_round_up(257), 320);
  EXPECT_EQ(vocab_round_up(50257), 50304);  // the reference's padded GPT-2 vocabulary
  EXPECT_EQ(vocab_round_up(320), 320);
  EXPECT_EQ(Config{}.vocab_size, 50304);
}

TEST(Vocab, ByteShardsTrainAndSampleDecodesBytes) {
  TempDir data("bytes"), run("run");
  byte_shards(data.path());
  const fs::path ck = run / "ck";
  ProcResult r = run_train(tiny(data.path(), run / "r") +
                           std::vector<std::string>{"--vocab_size", "320", "--checkpoint_dir", ck.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const CheckpointMeta meta = checkpoint_read_meta(checkpoint_resolve(ck));
  EXPECT_EQ(meta.model.vocab_size, 320);
  EXPECT_NE(meta.config_yaml.find("vocab_size: 320"), std::string::npos) << meta.config_yaml;
  // sample: the run's data_dir says bytes; the prompt is encoded and the output decoded as bytes.
  ProcResult s = run_train({"sample", "--checkpoint", ck.string(), "--prompt", "ROMEO:", "--max_tokens", "8"});
  ASSERT_EQ(s.exit_code, 0) << s.output;
  EXPECT_NE(s.output.find("tokenizer byte, from the shards of the run's data_dir"), std::string::npos) << s.output;
  EXPECT_NE(s.output.find("ROMEO:"), std::string::npos) << s.output;
  // Without the data (moved away), the model's vocabulary 320 < 50257 still says bytes.
  fs::rename(data.path(), data.path().string() + ".gone");
  ProcResult s2 = run_train({"sample", "--checkpoint", ck.string(), "--max_tokens", "4"});
  fs::rename(data.path().string() + ".gone", data.path());
  ASSERT_EQ(s2.exit_code, 0) << s2.output;
  EXPECT_NE(s2.output.find("tokenizer byte, from the model's vocab_size 320"), std::string::npos) << s2.output;
}

TEST(Vocab, ByteShardsWithTheDefaultVocabTrain) {
  TempDir data("bytes"), run("run");
  byte_shards(data.path());
  ProcResult r = run_train(tiny(data.path(), run / "r") + std::vector<std::string>{"--num_iterations", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;  // 50304 rows for 257 ids: wasteful, but valid
}

TEST(Vocab, Gpt2ShardsWithASmallVocabAreRefused) {
  TempDir data("gpt2"), run("run");
  test::shakespeare_shards(data.path(), 100000);
  ProcResult r = run_train(tiny(data.path(), run / "r") + std::vector<std::string>{"--vocab_size", "320"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (const std::string& part :
       std::vector<std::string>{"key 'vocab_size': value 320", data.path().string(), "gpt2", "50257", "use 50304"})
    EXPECT_NE(r.output.find(part), std::string::npos) << "'" << part << "' not in:\n" << r.output;
  EXPECT_TRUE(test::is_empty_or_missing(run / "r")) << "a refused run wrote its run_dir";
}

TEST(Vocab, BadValueNamesTheKey) {
  TempDir data("bytes"), run("run");
  ProcResult r = run_train(tiny(data.path(), run / "r") + std::vector<std::string>{"--vocab_size", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("vocab_size"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dion::train
