// tests/train/test_run.cpp — the dion-train program end to end, as a subprocess, on the
// committed Tiny Shakespeare (tokenized into a temporary folder by the dion_data library).
//
// - A tiny GPT's loss on a 4096-token slice of the text falls below the slice's unigram entropy
//   (the best a model that ignores context achieves) within 30 steps.
// - Stopping and resuming, and kill -9 at a random moment then resuming, give metrics equal BIT
//   FOR BIT to the uninterrupted run's (CPU).
// - Bad configs, bad shards, a missing data folder: a message naming the problem, a non-zero
//   exit (2 for configuration, 1 for data), and nothing written.
// - Step lines count from 0 as train.py does: the train and val lines and metrics.jsonl agree.
// - debug mode trains on synthetic tokens; `sample` generates from a checkpoint; `plot` without
//   its script says so.
// - `export` writes the checkpoint's weights as safetensors equal to model.pt's; the run's
//   TensorBoard file holds one record per metrics.jsonl value.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <thread>

#include <ATen/Context.h>

#include "dion/data/shard.h"
#include "dion/train/checkpoint.h"
#include "dion/train/gpt.h"
#include "dion/train/safetensors.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

namespace fs = std::filesystem;
using test::ProcResult;
using test::run_train;
using test::TempDir;

// The tiny model every run here trains: 2 layers, 64 wide, T 32, 4 sequences a step in 2
// accumulation steps (the 50304 x 64 lm_head dominates the cost: ~0.8 GFLOP a step).
std::vector<std::string> tiny_args(const fs::path& data, const fs::path& run_dir) {
  // clang-format off
  return {"--data_dir", data.string(), "--run_dir", run_dir.string(), "--model_dim", "64", "--n_layer", "2",
          "--n_head", "2", "--sequence_length", "32", "--batch_size", "4", "--device_batch_size", "2",
          "--val_tokens", "256", "--warmup_ratio", "0", "--warmdown_ratio", "0.2", "--dtype", "fp32",
          "--optimizer", "dion2", "--scalar_opt", "adamw", "--lr", "0.02", "--log_every", "10"};
  // clang-format on
}

class TrainRun : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir("shards");
    test::shakespeare_shards(data_->path(), 100000);
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static fs::path data() { return data_->path(); }
  static TempDir* data_;
};
TempDir* TrainRun::data_ = nullptr;

// H = -sum p log p (nats) of the token frequencies of a shard.
double unigram_entropy(const fs::path& shard) {
  data::ShardFile f = data::ShardFile::open(shard);
  std::map<uint16_t, int64_t> counts;
  for (uint16_t t : f.tokens()) ++counts[t];
  const double n = double(f.tokens().size());
  double h = 0;
  for (const auto& [tok, c] : counts) h -= double(c) / n * std::log(double(c) / n);
  return h;
}

TEST_F(TrainRun, LossFallsBelowTheUnigramEntropy) {
  // The data: the first 4096 tokens of Tiny Shakespeare, as both the train and the val shard
  // (32 steps of 128 tokens make an epoch). A model that only learned token frequencies can at
  // best reach the unigram entropy H of these tokens; going below it means using the context.
  TempDir run("run"), small("small");
  std::vector<uint16_t> tokens;
  {
    data::ShardFile val = data::ShardFile::open(data() / "fineweb_val_000000.bin");
    tokens.assign(val.tokens().begin(), val.tokens().begin() + 4096);
  }
  data::shard_write(small / "fineweb_val_000000.bin", tokens);
  data::shard_write(small / "fineweb_train_000001.bin", tokens);
  const double h = unigram_entropy(small / "fineweb_val_000000.bin");
  ProcResult r = run_train(tiny_args(small.path(), run.path()) +
                           std::vector<std::string>{"--num_iterations", "30", "--val_loss_every", "15", "--batch_size",
                                                    "4", "--device_batch_size", "4", "--lr", "0.03", "--warmdown_ratio",
                                                    "0.3", "--val_tokens", "1024"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto records = test::read_metrics(run / "metrics.jsonl");
  ASSERT_FALSE(records.empty());
  const test::Record& last = records.back();
  ASSERT_EQ(last.kind, "val");
  ASSERT_EQ(last.step, 30);
  const double first_val = records.front().loss;
  std::printf("unigram entropy of the tokens %.4f nats; val loss %.4f at step 0 -> %.4f at step 30\n", h, first_val,
              last.loss);
  EXPECT_GT(first_val, h);
  EXPECT_LT(last.loss, h);
  // The run folder: the resolved config and one train record per step.
  EXPECT_TRUE(fs::exists(run / "config.yaml"));
  int train_records = 0;
  for (const auto& rec : records) train_records += rec.kind == "train";
  EXPECT_EQ(train_records, 30);
}

// The main job's config (scripts/run.sh) as it is, on byte shards of Tiny Shakespeare (the first
// 10% val, as run.sh cuts them, here by bytes), shortened to 40 steps (its schedule with them):
// the val loss falls from the uniform level to below the byte unigram entropy of the val text
// (3.3 nats), so the model reads its context within seconds. The whole run is in the README.
TEST_F(TrainRun, TheMainJobsByteConfigGoesBelowTheUnigramEntropyInItsFirstSteps) {
  TempDir run("main_job"), bytes("main_job_bytes");
  std::ifstream in(test::source_dir() / "data/tinyshakespeare/input.txt", std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 1000000u);
  const size_t cut = text.size() / 10;
  std::vector<uint16_t> val(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(cut));
  std::vector<uint16_t> train(text.begin() + static_cast<std::ptrdiff_t>(cut), text.end());
  for (auto* part : {&val, &train})
    for (uint16_t& t : *part) t = static_cast<uint16_t>(static_cast<unsigned char>(t));
  data::shard_write(bytes / "fineweb_val_000000.bin", val, data::ShardTokenizer::BYTES);
  data::shard_write(bytes / "fineweb_train_000001.bin", train, data::ShardTokenizer::BYTES);
  const double h = unigram_entropy(bytes / "fineweb_val_000000.bin");
  ProcResult r = run_train({"--config", (test::source_dir() / "configs/shakespeare_bytes_dion2.yaml").string(),
                            "--data_dir", bytes.path().string(), "--run_dir", run.path().string(), "--checkpoint_dir",
                            (run / "ck").string(), "--num_iterations", "40", "--val_loss_every", "40", "--val_tokens",
                            "8192"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto records = test::read_metrics(run / "metrics.jsonl");
  std::vector<test::Record> vals;
  for (const auto& rec : records)
    if (rec.kind == "val") vals.push_back(rec);
  ASSERT_EQ(vals.size(), 2u) << r.output;  // steps 0 and 40
  std::printf("byte unigram entropy %.4f nats; val loss %.4f at step 0 -> %.4f at step %lld\n", h, vals[0].loss,
              vals[1].loss, static_cast<long long>(vals[1].step));
  EXPECT_GT(vals[0].loss, 5.0);  // about ln(320) = 5.77 before training
  EXPECT_LT(vals[1].loss, h - 0.3);
}

void expect_same_metrics(const fs::path& a, const fs::path& b) {
  std::ifstream fa(a), fb(b);
  std::string la, lb;
  int n = 0;
  while (std::getline(fa, la)) {
    ASSERT_TRUE(std::getline(fb, lb)) << "line " << n << " missing in " << b;
    // Compare everything but the wall-clock fields.
    auto strip = [](std::string s) {
      for (const char* key : {"\"tokens_per_s\"", "\"ms_per_step\"", "\"time_s\"", "\"fwd_bwd_ms\""}) {
        const size_t at = s.find(key);
        if (at != std::string::npos) s.erase(at, s.find_first_of(",}", at) - at);
      }
      return s;
    };
    EXPECT_EQ(strip(la), strip(lb)) << "line " << n;
    ++n;
  }
  EXPECT_FALSE(std::getline(fb, lb)) << "extra lines in " << b;
  EXPECT_GT(n, 0);
}

TEST_F(TrainRun, StopAndResumeEqualsTheUninterruptedRunBitForBit) {
  // dion: random Q and sketches from the saved RNG; muon with QK-clip: the clipped weights are
  // the checkpoint's (the per-step maxima start afresh every step, resumed or not).
  for (const char* optimizer : {"dion2", "dion", "muon"}) {
    SCOPED_TRACE(optimizer);
    TempDir a("full"), b("resumed");
    std::vector<std::string> common = {"--num_iterations",  "10", "--val_loss_every", "4",
                                       "--checkpoint_freq", "3",  "--optimizer",      optimizer};
    if (std::string(optimizer) == "muon") common = common + std::vector<std::string>{"--qk_norm", "false", "--qk_clip_tau", "3"};
    ProcResult full = run_train(tiny_args(data(), a / "run") + common +
                                std::vector<std::string>{"--checkpoint_dir", (a / "ck").string()});
    ASSERT_EQ(full.exit_code, 0) << full.output;
    if (std::string(optimizer) == "muon") {  // the clip acted: some heads went above tau 3
      EXPECT_NE(full.output.find("QK-clip at tau 3: "), std::string::npos) << full.output;
      EXPECT_EQ(full.output.find("QK-clip at tau 3: 0 head"), std::string::npos) << full.output;
    }
    const std::vector<std::string> part =
        tiny_args(data(), b / "run") + common +
        std::vector<std::string>{"--checkpoint_dir", (b / "ck").string(), "--stop_after", "5"};
    ProcResult first = run_train(part);
    ASSERT_EQ(first.exit_code, 0) << first.output;
    EXPECT_NE(first.output.find("stopped after 5 steps"), std::string::npos) << first.output;
    ProcResult second = run_train(part);  // steps 5..9
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;
    expect_same_metrics(a / "run/metrics.jsonl", b / "run/metrics.jsonl");
    // The final checkpoints hold the same weights.
    ASSERT_TRUE(fs::exists(a / "ck/step_00000009/model.pt"));
    ASSERT_TRUE(fs::exists(b / "ck/step_00000009/model.pt"));
  }
}

TEST_F(TrainRun, KillDashNineThenResumeEqualsTheUninterruptedRun) {
  TempDir a("full"), b("killed");
  const std::vector<std::string> common = {"--num_iterations", "16", "--val_loss_every", "5", "--checkpoint_freq", "2"};
  ProcResult full = run_train(tiny_args(data(), a / "run") + common +
                              std::vector<std::string>{"--checkpoint_dir", (a / "ck").string()});
  ASSERT_EQ(full.exit_code, 0) << full.output;

  const std::vector<std::string> args =
      tiny_args(data(), b / "run") + common + std::vector<std::string>{"--checkpoint_dir", (b / "ck").string()};
  const pid_t pid = test::spawn_train(args, b / "killed.log");
  ASSERT_GT(pid, 0);
  // Kill it once a checkpoint beyond the first exists (or whenever it is writing one).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline && !fs::exists(b / "ck/step_00000004")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ProcResult resumed = run_train(args);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_metrics(a / "run/metrics.jsonl", b / "run/metrics.jsonl");
  // Only the newest checkpoint is kept, and no temporary folder is left.
  int entries = 0;
  for (const auto& e : fs::directory_iterator(b / "ck")) {
    ++entries;
    EXPECT_EQ(e.path().filename().string(), "step_00000015");
  }
  EXPECT_EQ(entries, 1);
}

// ---------------------------------------------------------------------------- bad input

TEST_F(TrainRun, BadConfigsFailWithTheKeyAndWriteNothing) {
  TempDir tmp("bad");
  const fs::path run = tmp / "run", ck = tmp / "ck";
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--learning_rate", "0.1"}, "unknown key 'learning_rate'"},
      {{"--lr", "abc"}, "key 'lr': value 'abc' is not a number"},
      {{"--batch_size", "10", "--device_batch_size", "4"},
       "key 'batch_size': value 10 is not divisible by device_batch_size 4"},
      {{"--model_dim", "60", "--n_head", "8"}, "key 'model_dim': value 60 is not divisible by n_head 8"},
      {{"--dp_size", "2"}, "dp_size 2 x fs_size 1 x tp_size 1 = 2, but WORLD_SIZE is 1"},
      {{"--optimizer", "sgd"},
       "key 'optimizer': value 'sgd' is invalid; valid: one of: muon, normuon, dion2, nordion2, dion3, dion, adamw, "
       "lion"},
      {{"--ortho_path", "fastest"}, "key 'ortho_path': value 'fastest' is invalid; valid: one of: exact, fast"},
      {{"--qr_method", "cqr"},
       "key 'qr_method': value 'cqr' is not implemented in dion-train (the reference "
       "train.py accepts it); the nearest supported choice is 'rcqr'"},
      {{"--lr", "0.01", "0.7"}, "unexpected argument '0.7'"},
      {{"--run_dir", (tmp / "run2").string(), "stray"}, "unexpected argument 'stray'"},
      {{"--warmup_ratio", "0.7", "--warmdown_ratio", "0.7"}, "= 1.4 > 1: the warmup and the warmdown would overlap"},
      // Sizes against the data (the val shard holds 100000 tokens, the train shards ~238000):
      // --val_tokens 1.28e12 used to run a validation of 2e10 batches.
      {{"--val_tokens", "1280000000000"},
       "key 'val_tokens': value 1280000000000 is more than the 100000 tokens of the val shards"},
      {{"--batch_size", "10000"},
       "keys 'batch_size' 10000 x 'sequence_length' 32 = 320000 tokens per step, more than the"},
      // A model that cannot fit: named at start-up (it was c10's allocator text and a backtrace).
      {{"--model_dim", "4000000", "--n_head", "2"}, "keys 'model_dim' 4000000, 'n_layer' 2, 'vocab_size' 50304"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.message);
    ProcResult r =
        run_train(tiny_args(data(), run) + std::vector<std::string>{"--checkpoint_dir", ck.string()} + c.args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("dion-train: error:"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("frame #"), std::string::npos) << r.output;  // no C++ backtrace
    EXPECT_FALSE(fs::exists(run));
    EXPECT_FALSE(fs::exists(tmp / "run2"));
    EXPECT_FALSE(fs::exists(ck));
  }
  // A bad YAML file names the file.
  {
    std::ofstream f(tmp / "bad.yaml");
    f << "model_dim: 64\nn_layer: [1, 2]\n";
  }
  ProcResult r = run_train({"--config", (tmp / "bad.yaml").string(), "--run_dir", run.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bad.yaml: key 'n_layer'"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run));
}

// A checkpoint folder that cannot hold checkpoints is refused at start-up, before any training
// step and before the run folder is written (it was found only at the first save).
TEST_F(TrainRun, UnwritableCheckpointDirIsRefusedAtStartUp) {
  TempDir tmp("badck");
  const fs::path run = tmp / "run", file = tmp / "a_file";
  std::ofstream(file) << "not a folder";
  struct Case {
    std::string dir;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {file.string(), {"key 'checkpoint_dir'", "is a file, not a folder"}},
      {(file / "sub").string(), {"key 'checkpoint_dir'", "is a file, not a folder"}},
      // /proc takes no new file, even for root (a read-only folder does not stop root).
      {"/proc/dion_train_checkpoints", {"key 'checkpoint_dir'", "cannot create a file in /proc"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir);
    const ProcResult r = run_train(tiny_args(data(), run) +
                                   std::vector<std::string>{"--checkpoint_dir", c.dir, "--num_iterations", "3"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    for (const std::string& m : c.message) EXPECT_NE(r.output.find(m), std::string::npos) << m << "\n" << r.output;
    EXPECT_EQ(r.output.find("step 0/"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(run));
  }
}

// bf16 on a CPU whose bf16 GEMMs are not native (emulated here with oneDNN capped at AVX2, as
// an AVX2-only CPU): named once at start-up with the switch that avoids it; MFU never above 100%.
TEST_F(TrainRun, SlowBf16OnThisCpuIsNamedAndMfuStaysAtMost100) {
  TempDir tmp("bf16");
  ::setenv("ONEDNN_MAX_CPU_ISA", "AVX2", 1);
  const ProcResult r = run_train(tiny_args(data(), tmp / "run") +
                                 std::vector<std::string>{"--dtype", "bf16", "--num_iterations", "2", "--log_every",
                                                          "1", "--model_dim", "32", "--n_layer", "1"});
  ::unsetenv("ONEDNN_MAX_CPU_ISA");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("note: dtype bf16 on this CPU is slow"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("--dtype fp32"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("measured: fp32 matmul"), std::string::npos) << r.output;
  const std::regex mfu("MFU ([0-9.]+)%");
  int lines = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), mfu); it != std::sregex_iterator(); ++it) {
    EXPECT_LE(std::stod((*it)[1].str()), 100.0) << r.output;
    ++lines;
  }
  EXPECT_GE(lines, 2) << r.output;
}

TEST_F(TrainRun, BadShardsAndMissingDataFailAndWriteNothing) {
  TempDir tmp("badshards");
  const fs::path run = tmp / "run";
  // Missing folder.
  ProcResult r = run_train(tiny_args(tmp / "nowhere", run) + std::vector<std::string>{"--num_iterations", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is not a folder"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run));
  // Folder without shards.
  fs::create_directories(tmp / "empty");
  r = run_train(tiny_args(tmp / "empty", run) + std::vector<std::string>{"--num_iterations", "2"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("no fineweb_train_*.bin shards"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(run));
  // A truncated train shard (copied from a good one, cut short) and one with a bad magic.
  for (const char* what : {"truncated", "magic"}) {
    SCOPED_TRACE(what);
    const fs::path d = tmp / what;
    fs::create_directories(d);
    fs::copy_file(data() / "fineweb_val_000000.bin", d / "fineweb_val_000000.bin");
    fs::copy_file(data() / "fineweb_train_000001.bin", d / "fineweb_train_000001.bin");
    fs::copy_file(data() / "fineweb_train_000002.bin", d / "fineweb_train_000002.bin");
    const fs::path bad = d / "fineweb_train_000002.bin";
    if (std::string(what) == "truncated") {
      fs::resize_file(bad, fs::file_size(bad) - 100);
    } else {
      std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
      const int32_t magic = 12345;
      f.write(reinterpret_cast<const char*>(&magic), 4);
    }
    r = run_train(tiny_args(d, run) + std::vector<std::string>{"--num_iterations", "2"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find("fineweb_train_000002.bin"), std::string::npos) << r.output;
    EXPECT_FALSE(fs::exists(run));
  }
}

// ---------------------------------------------------------------------------- the other modes

// A data folder that is already inconsistent (shards of two prepare runs, a missing shard) is
// refused before anything is written, naming the files (the rules: dion/data/shard_folder.h).
TEST_F(TrainRun, InconsistentShardFolderIsRefusedNamingTheFiles) {
  TempDir tmp("mixedshards");
  const fs::path run = tmp / "run";
  struct Case {
    const char* name;
    std::vector<std::pair<std::string, std::string>> files;  // fixture shard -> name in the folder
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"two corpora",
       {{"fineweb_val_000000.bin", "fineweb_val_000000.bin"},
        {"fineweb_train_000001.bin", "fineweb_train_000001.bin"},
        {"fineweb_val_000000.bin", "fineweb_val_000001.bin"}},
       {"fineweb_train_000001.bin and fineweb_val_000001.bin have the same shard number 1"}},
      {"gap",
       {{"fineweb_val_000000.bin", "fineweb_val_000000.bin"},
        {"fineweb_train_000001.bin", "fineweb_train_000001.bin"},
        {"fineweb_train_000002.bin", "fineweb_train_000003.bin"}},
       {"no shard number 2", "fineweb_train_000003.bin"}},
      // A consistent-looking set whose swap is unfinished (dion-data prepare killed mid-swap:
      // the journal is there): the loader refuses it (tests/data/test_prepare_safety.cpp
      // kills the swap at each of its steps).
      {"half swapped",
       {{"fineweb_val_000000.bin", "fineweb_val_000000.bin"},
        {"fineweb_train_000001.bin", "fineweb_train_000001.bin"},
        {"fineweb_train_000001.bin", ".fineweb.dion-prepare.journal"}},
       {"has not finished swapping", "dion-data finish-swap"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path d = tmp / c.name;
    fs::create_directories(d);
    for (const auto& [from, to] : c.files) fs::copy_file(data() / from, d / to);
    const ProcResult r = run_train(tiny_args(d, run) + std::vector<std::string>{"--num_iterations", "2"});
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(d.string()), std::string::npos) << r.output;
    for (const std::string& m : c.message) EXPECT_NE(r.output.find(m), std::string::npos) << m << "\n" << r.output;
    EXPECT_FALSE(fs::exists(run));
  }
}

// `dion-train --help` lists every flag the program takes: the keys (TrainConfig.HelpNamesEveryKey
// checks them in the parser's help) and the launcher's flags, which the launcher takes out before
// the keys are parsed (Launch.EveryLauncherFlagIsParsedAndInTheHelp).
TEST_F(TrainRun, HelpListsTheLauncherFlagsToo) {
  const ProcResult r = run_train({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag : {"--nproc N", "--nproc_per_node N", "--nnodes M", "--node_rank K", "--master_addr HOST",
                           "--master_port P", "--max_restarts R", "--standalone", "--config", "--lr"})
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag << " not in:\n" << r.output;
}

TEST_F(TrainRun, DebugModeTrainsOnSyntheticTokensWithoutData) {
  TempDir tmp("debug");
  ProcResult r = run_train({"--debug", "--data_dir", (tmp / "no_data").string(), "--run_dir", (tmp / "run").string(),
                            "--model_dim", "32", "--n_layer", "1", "--n_head", "2", "--sequence_length", "16",
                            "--val_tokens", "64", "--optimizer", "muon", "--scalar_opt", "lion"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("synthetic"), std::string::npos) << r.output;
  // device auto (the default) says what it chose.
  EXPECT_NE(r.output.find(at::globalContext().hasCUDA()
                              ? "muon on cuda (bf16) (device auto: a CUDA device is present; --device cpu trains on "
                                "the CPU)"
                              : "muon on cpu (fp32) (device auto: no CUDA device here)"),
            std::string::npos)
      << r.output;
  const auto records = test::read_metrics(tmp / "run/metrics.jsonl");
  int train = 0;
  for (const auto& rec : records) train += rec.kind == "train";
  EXPECT_EQ(train, 20);  // the reference's debug mode: 20 steps
  EXPECT_EQ(records.back().tokens, 20 * 2 * 16);
}

// train.py numbers its steps from 0 (`for step in range(start_step, num_iterations + 1)`: the
// validation of step s runs before step s trains; its debug lines print `Step {step}`). Before,
// train lines printed step + 1 and validation lines step, so "step 5" named two different points.
// Every printed line is checked against metrics.jsonl's record of the same kind and step, and the
// order against train.py's: val 0, train 0..4, val 5, train 5.., train N-1, val N.
TEST_F(TrainRun, StepLinesCountFromZeroAsTheReference) {
  TempDir tmp("numbering");
  ProcResult r = run_train({"--debug", "--data_dir", (tmp / "no_data").string(), "--run_dir", (tmp / "run").string(),
                            "--model_dim", "32", "--n_layer", "1", "--n_head", "2", "--sequence_length", "16",
                            "--val_tokens", "32", "--val_loss_every", "5", "--log_every", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::map<std::pair<std::string, int64_t>, double> metrics;
  for (const auto& rec : test::read_metrics(tmp / "run/metrics.jsonl")) metrics[{rec.kind, rec.step}] = rec.loss;
  const std::regex line(R"(^step (\d+)/20 \| (loss|val_loss) ([0-9.]+))",
                        std::regex::ECMAScript | std::regex::multiline);
  std::vector<std::string> order;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), line), end; it != end; ++it) {
    const int64_t step = std::stoll((*it)[1]);
    const std::string kind = (*it)[2] == "loss" ? "train" : "val";
    order.push_back(kind + " " + std::to_string(step));
    const auto m = metrics.find({kind, step});
    ASSERT_NE(m, metrics.end()) << it->str() << ": no " << kind << " record of step " << step << " in metrics.jsonl";
    EXPECT_NEAR(std::stod((*it)[3]), m->second, 5e-5) << it->str();  // printed with 4 decimals
  }
  std::vector<std::string> expected;
  for (int64_t s = 0; s <= 20; ++s) {
    if (s % 5 == 0) expected.push_back("val " + std::to_string(s));
    if (s < 20) expected.push_back("train " + std::to_string(s));
  }
  EXPECT_EQ(order, expected) << r.output;
}

TEST_F(TrainRun, SampleGeneratesFromACheckpoint) {
  TempDir tmp("sample");
  ProcResult r =
      run_train(tiny_args(data(), tmp / "run") +
                std::vector<std::string>{"--num_iterations", "3", "--checkpoint_dir", (tmp / "ck").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> args = {
      "sample", "--checkpoint", (tmp / "ck").string(),    "--prompt", "ROMEO:", "--max_tokens", "12", "--seed",
      "7",      "--tokenizer",  test::gpt2_dir().string()};
  ProcResult s1 = run_train(args), s2 = run_train(args);
  ASSERT_EQ(s1.exit_code, 0) << s1.output;
  EXPECT_EQ(s1.output.rfind("ROMEO:", 0), 0u) << s1.output;
  EXPECT_EQ(s1.output, s2.output);  // same seed, same text
  ProcResult bad = run_train({"sample", "--checkpoint", (tmp / "nothing").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("nothing"), std::string::npos) << bad.output;
}

// The TFRecord frames of a TensorBoard event file: u64 length, u32 crc, data, u32 crc.
int64_t count_tfrecords(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  int64_t n = 0;
  uint64_t len = 0;
  while (f.read(reinterpret_cast<char*>(&len), 8)) {
    f.seekg(int64_t(len) + 8, std::ios::cur);
    if (!f) return -1;  // a truncated frame
    ++n;
  }
  return n;
}

TEST_F(TrainRun, ExportWritesTheCheckpointsWeightsAndTensorBoardHasEveryMetric) {
  TempDir tmp("export");
  ProcResult r =
      run_train(tiny_args(data(), tmp / "run") +
                std::vector<std::string>{"--num_iterations", "3", "--checkpoint_dir", (tmp / "ck").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  ProcResult e = run_train({"export", "--checkpoint", (tmp / "ck").string(), "-o", (tmp / "w.safetensors").string()});
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const SafeTensorsFile file = load_safetensors((tmp / "w.safetensors").string());
  const fs::path ckpt = checkpoint_resolve(tmp / "ck");
  GPT model(checkpoint_read_meta(ckpt).model);
  checkpoint_load_model(ckpt, model);
  size_t n = 0;
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(file.has(item.key())) << item.key();
    EXPECT_TRUE(at::equal(file.at(item.key()), item.value().detach())) << item.key();
    ++n;
  }
  EXPECT_EQ(file.tensors.size(), n);
  EXPECT_EQ(file.metadata.at("n_layer"), "2");
  ProcResult bad = run_train({"export", "--checkpoint", (tmp / "nothing").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.output.find("nothing"), std::string::npos) << bad.output;

  // TensorBoard: the file_version record, then 4 scalars per train step (loss, lr, grad_norm,
  // tokens_per_s) and 1 per validation.
  std::vector<fs::path> events;
  for (const auto& entry : fs::directory_iterator(tmp / "run" / "tb")) events.push_back(entry.path());
  ASSERT_EQ(events.size(), 1u);
  int64_t train = 0, val = 0;
  for (const test::Record& rec : test::read_metrics(tmp / "run" / "metrics.jsonl")) (rec.kind == "val" ? val : train)++;
  EXPECT_GT(train, 0);
  EXPECT_EQ(count_tfrecords(events[0]), 1 + 4 * train + val);
}

TEST_F(TrainRun, PlotWithoutItsScriptSaysWhere) {
  ::setenv("DION_TRAIN_PLOT_SCRIPT", "/nonexistent/plot.py", 1);
  ProcResult r = run_train({"plot", "runs/x", "-o", "x.png"});
  ::unsetenv("DION_TRAIN_PLOT_SCRIPT");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/plot.py' is missing"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dion::train
