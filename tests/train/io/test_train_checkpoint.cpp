// tests/train/io/test_train_checkpoint.cpp — checkpoints that cannot lie: dion-train's
// checkpoints are verified whole before anything is loaded, bad ones are named and never
// removed, a failed write leaves the previous checkpoint and a clear error, and a resumed run
// may change only what does not change the meaning of the saved state.
//
// - A 512-byte overwrite in model.pt, optimizer.pt, rng.pt or meta.json: resume, export and
//   sample refuse, naming the file and the CRC-32, before any step and without writing.
// - A truncated, missing or extra file, a missing manifest.json: named.
// - The only checkpoint minus meta.json: exit 1 naming it, nothing removed; resume_fallback
//   true starts over and keeps the bad folder (a note names it). A bad newest checkpoint beside
//   a good older one: exit 1 naming it; with resume_fallback, the older one resumes and the run
//   equals the uninterrupted one bit for bit.
// - meta.json edited by hand (the manifest made to agree): step 10^12 / -5, tokens: CheckpointError
//   naming meta.json and the key. A checkpoint past num_iterations: a clear error; at its end:
//   "done", the checkpoint not rewritten.
// - Disk full (RLIMIT_FSIZE: EFBIG without root; and a tmpfs where this process may mount one):
//   exit 1 naming the file and the cause, no tmp.* left, the previous checkpoint verifies, and
//   the run resumed afterwards equals the uninterrupted one.
// - sequence_length, optimizer, batch_size, the data set: a ConfigError naming the key and both
//   values before any step; num_iterations and lr: allowed, one line says so.
// - Every config key's row states its resume rule; a version-1 checkpoint loads with a warning.
#include <gtest/gtest.h>

#include <sys/mount.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dion/train/checkpoint.h"
#include "dion/train/checkpoint_files.h"
#include "dion/train/config.h"
#include "dion/train/fs_util.h"
#include "dion/train/resume_policy.h"
#include "train_test_util.h"
#include "../../../src/train/config_keys.h"  // the key table: each row's resume rule

namespace dion::train {
namespace {

namespace fs = std::filesystem;
using test::ProcResult;
using test::run_train;
using test::TempDir;

// EXPECT that `text` holds (or lacks) `part`, printing the text when not.
#define EXPECT_HAS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing: " << (part) << "\nin:\n" << (text)
#define EXPECT_LACKS(text, part) \
  EXPECT_EQ(std::string(text).find(part), std::string::npos) << "unexpected: " << (part) << "\nin:\n" << (text)

constexpr int64_t kSteps = 6;

// test_run.cpp's tiny model, 6 steps.
std::vector<std::string> tiny(const fs::path& data, const fs::path& run_dir, const fs::path& ck) {
  // clang-format off
  return {"--data_dir", data.string(), "--run_dir", run_dir.string(), "--checkpoint_dir", ck.string(),
          "--model_dim", "64", "--n_layer", "2", "--n_head", "2", "--sequence_length", "32", "--batch_size", "4",
          "--device_batch_size", "2", "--val_tokens", "256", "--val_loss_every", "3", "--warmup_ratio", "0",
          "--warmdown_ratio", "0.2", "--dtype", "fp32", "--optimizer", "dion2", "--scalar_opt", "adamw",
          "--lr", "0.02", "--log_every", "1", "--num_iterations", std::to_string(kSteps)};
  // clang-format on
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A copy of a checkpoint folder (plain files; std::filesystem's copy is avoided, see fs_util.h).
void copy_folder(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) spit(to / e.path().filename(), slurp(e.path()));
}

std::map<std::string, std::string> folder_bytes(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = slurp(e.path());
  return out;
}

// 512 bytes in the middle of `file` inverted.
void overwrite_512(const fs::path& file) {
  std::string b = slurp(file);
  ASSERT_GT(b.size(), 600u) << file;
  const size_t at = b.size() / 2 - 256;
  for (size_t i = at; i < at + 512; ++i) b[i] = char(~b[i]);
  spit(file, b);
}

// manifest.json made to agree with `name`'s bytes (a consistent hand edit).
void reseal(const fs::path& ckpt, const std::string& name) {
  Manifest m = *manifest_read(ckpt);
  m.files[name] = file_digest(ckpt / name);
  fs::remove(ckpt / kManifestFile);
  manifest_write(ckpt, m);
}

void expect_clean_error(const ProcResult& r, int code) {
  EXPECT_EQ(r.exit_code, code) << r.output;
  EXPECT_LACKS(r.output, "terminate called");
  EXPECT_LACKS(r.output, "frame #");  // a c10::Error backtrace
  EXPECT_LACKS(r.output, "Exception raised from");
}

void expect_same_losses(const fs::path& a, const fs::path& b) {
  const auto ra = test::read_metrics(a), rb = test::read_metrics(b);
  ASSERT_EQ(ra.size(), rb.size()) << a << " vs " << b;
  ASSERT_FALSE(ra.empty());
  for (size_t i = 0; i < ra.size(); ++i) {
    EXPECT_EQ(ra[i].kind, rb[i].kind) << i;
    EXPECT_EQ(ra[i].step, rb[i].step) << i;
    EXPECT_EQ(ra[i].loss, rb[i].loss) << ra[i].kind << " step " << ra[i].step;  // bit for bit (CPU)
    EXPECT_EQ(ra[i].tokens, rb[i].tokens) << i;
  }
}

class TrainCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<TempDir>("ckpt");
    test::shakespeare_shards(data(), 100000);
  }
  fs::path data() const { return *tmp_ / "shards"; }
  fs::path ck() const { return *tmp_ / "ck"; }
  fs::path step(int64_t s) const {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(s));
    return ck() / name;
  }
  std::vector<std::string> args(const std::string& run = "run") const { return tiny(data(), *tmp_ / run, ck()); }
  // Steps 0..2 then a checkpoint (step_00000002), as a stopped run leaves it.
  fs::path first_part() {
    ProcResult r = run_train(args() + std::vector<std::string>{"--stop_after", "3"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(checkpoint_problem(step(2)), "");
    return step(2);
  }
  // The uninterrupted run's metrics.jsonl.
  fs::path reference() {
    TempDir* t = tmp_.get();
    ProcResult r = run_train(tiny(data(), *t / "ref_run", *t / "ref_ck"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return *t / "ref_run" / "metrics.jsonl";
  }
  std::unique_ptr<TempDir> tmp_;
};

TEST_F(TrainCheckpoint, CorruptBytesInAnyFileAreFoundBeforeAnythingIsLoaded) {
  const fs::path good = first_part();
  const fs::path pristine = *tmp_ / "pristine";
  copy_folder(good, pristine);
  for (const char* name : {"model.pt", "optimizer.pt", "rng.pt", "meta.json"}) {
    SCOPED_TRACE(name);
    remove_tree(good);
    copy_folder(pristine, good);
    overwrite_512(good / name);
    const auto before = folder_bytes(good);
    const std::string run = std::string("attempt_") + name;
    ProcResult r = run_train(args(run));
    expect_clean_error(r, 1);
    EXPECT_HAS(r.output, (good / name).string());
    EXPECT_HAS(r.output, "CRC-32");
    EXPECT_HAS(r.output, "Nothing was loaded and nothing removed");
    EXPECT_FALSE(fs::exists(*tmp_ / run / "metrics.jsonl")) << "a step ran";
    EXPECT_EQ(folder_bytes(good), before) << "the checkpoint was changed";
    for (const char* tool : {"export", "sample"}) {
      ProcResult t = run_train({tool, "--checkpoint", ck().string()});
      expect_clean_error(t, 1);
      EXPECT_HAS(t.output, (good / name).string()) << tool;
      EXPECT_HAS(t.output, "CRC-32") << tool;
    }
    EXPECT_FALSE(fs::exists(good / "model.safetensors"));
  }
  // The pristine copy itself is good: export reads it.
  ProcResult e = run_train({"export", "--checkpoint", pristine.string()});
  EXPECT_EQ(e.exit_code, 0) << e.output;
  EXPECT_EQ(checkpoint_problem(pristine), "") << "an export beside the files is allowed";
}

TEST_F(TrainCheckpoint, TruncatedMissingAndExtraFilesAreNamed) {
  const fs::path good = first_part();
  const fs::path pristine = *tmp_ / "pristine";
  copy_folder(good, pristine);
  struct Case {
    const char* what;
    std::function<void()> damage;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"truncated optimizer.pt",
       [&] {
         const std::string b = slurp(good / "optimizer.pt");
         spit(good / "optimizer.pt", b.substr(0, b.size() / 3));
       },
       {"optimizer.pt' has", "truncated"}},
      {"missing rng.pt", [&] { fs::remove(good / "rng.pt"); }, {"rng.pt' is missing"}},
      {"extra truncated file",
       [&] { spit(good / "model.pt.1", slurp(good / "model.pt").substr(0, 1000)); },
       {"model.pt.1' is not listed in", "manifest.json"}},
      {"missing manifest.json", [&] { fs::remove(good / "manifest.json"); }, {"no manifest.json"}},
      {"missing meta.json", [&] { fs::remove(good / "meta.json"); }, {"meta.json' is missing"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    remove_tree(good);
    copy_folder(pristine, good);
    c.damage();
    ProcResult r = run_train(args("attempt"));
    expect_clean_error(r, 1);
    EXPECT_HAS(r.output, "step_00000002 is not a complete good checkpoint");
    for (const std::string& m : c.message) EXPECT_HAS(r.output, m);
    EXPECT_FALSE(fs::exists(*tmp_ / "attempt" / "metrics.jsonl"));
    EXPECT_NE(checkpoint_problem(good), "");
  }
}

TEST_F(TrainCheckpoint, OnlyCheckpointWithoutMetaStopsTheRunAndIsNeverRemoved) {
  const fs::path bad = first_part();
  fs::remove(bad / "meta.json");
  const auto before = folder_bytes(bad);
  ProcResult r = run_train(args("attempt"));  // was: started over at step 0, then deleted it
  expect_clean_error(r, 1);
  EXPECT_HAS(r.output, bad.filename().string());
  EXPECT_HAS(r.output, "meta.json");
  EXPECT_HAS(r.output, "--resume_fallback true");
  EXPECT_EQ(folder_bytes(bad), before);
  // resume_fallback: no good checkpoint, so it starts over; its saves (steps 3 and 5) are newer
  // than the bad step_2, which stays, named in a note.
  ProcResult f =
      run_train(args("fallback") + std::vector<std::string>{"--resume_fallback", "true", "--checkpoint_freq", "3"});
  EXPECT_EQ(f.exit_code, 0) << f.output;
  EXPECT_HAS(f.output, "resume_fallback: skipped " + bad.string());
  EXPECT_HAS(f.output, "starting over at step 0");
  EXPECT_HAS(f.output, "note: kept " + bad.string());
  EXPECT_EQ(folder_bytes(bad), before) << "the bad folder was changed";
  EXPECT_EQ(checkpoint_problem(step(5)), "");
  EXPECT_FALSE(fs::exists(step(3))) << "the good older checkpoint is rotated away";
}

TEST_F(TrainCheckpoint, FallbackResumesTheNewestGoodCheckpointAndEqualsTheUninterruptedRun) {
  const fs::path ref = reference();
  const fs::path two = first_part();
  copy_folder(two, *tmp_ / "keep2");
  ProcResult r = run_train(args() + std::vector<std::string>{"--stop_after", "2"});  // steps 3, 4
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_FALSE(fs::exists(two));
  copy_folder(*tmp_ / "keep2", two);
  const fs::path four = step(4);
  overwrite_512(four / "model.pt");
  // The same step saved again over a bad folder moves it aside instead of removing it.
  ProcResult no = run_train(args());
  expect_clean_error(no, 1);
  EXPECT_HAS(no.output, "newest checkpoint step_00000004 is not a complete good checkpoint");
  EXPECT_HAS(no.output, "(1 older step_* folder(s) here)");
  ProcResult yes = run_train(args() + std::vector<std::string>{"--resume_fallback", "true", "--checkpoint_freq", "2"});
  ASSERT_EQ(yes.exit_code, 0) << yes.output;
  EXPECT_HAS(yes.output, "resume_fallback: skipped " + four.string());
  EXPECT_HAS(yes.output, "resumed from " + two.string());
  EXPECT_HAS(yes.output, "note: moved " + four.string() + " aside");
  expect_same_losses(ref, *tmp_ / "run" / "metrics.jsonl");
  int aside = 0;
  for (const auto& e : fs::directory_iterator(ck()))
    aside += e.path().filename().string().rfind("step_00000004.replaced-", 0) == 0;
  EXPECT_EQ(aside, 1) << "the bad step_4 is kept aside";
  EXPECT_FALSE(fs::exists(two)) << "the good older checkpoints are rotated away";
  EXPECT_FALSE(fs::exists(four));
  EXPECT_EQ(checkpoint_problem(step(5)), "");
}

TEST_F(TrainCheckpoint, HandEditedMetaValuesAreRefusedNamingTheKey) {
  const fs::path good = first_part();
  const std::string original = slurp(good / "meta.json");
  const std::string manifest = slurp(good / "manifest.json");
  struct Case {
    const char* key;
    nlohmann::json value;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{{"step", int64_t(1000000000000), "key 'step': value 1000000000000 is invalid"},
                                         {"step", -5, "key 'step': value -5 is invalid"},
                                         {"tokens", 7, "key 'tokens': value 7 is invalid"},
                                         {"best_val_step", 99, "key 'best_val_step'"}}) {
    SCOPED_TRACE(std::string(c.key) + " " + c.value.dump());
    nlohmann::json meta = nlohmann::json::parse(original);
    meta[c.key] = c.value;
    spit(good / "meta.json", meta.dump(2));
    spit(good / "manifest.json", manifest);
    ProcResult unsealed = run_train(args("attempt"));  // the checksum finds any edit
    expect_clean_error(unsealed, 1);
    EXPECT_HAS(unsealed.output, (good / "meta.json").string() + "'");  // its size or its CRC-32
    EXPECT_HAS(unsealed.output, "manifest.json");
    EXPECT_HAS(unsealed.output, "not a complete good checkpoint");
    reseal(good, "meta.json");  // an edit that also fixed the manifest: the values are checked
    ProcResult r = run_train(args("attempt"));
    expect_clean_error(r, 1);
    EXPECT_HAS(r.output, (good / "meta.json").string());
    EXPECT_HAS(r.output, c.message);
    EXPECT_FALSE(fs::exists(*tmp_ / "attempt" / "metrics.jsonl"));
  }
}

TEST_F(TrainCheckpoint, PastNumIterationsIsAnErrorAndAtTheEndIsDone) {
  ProcResult full = run_train(args());
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const fs::path last = step(kSteps - 1);
  ASSERT_EQ(checkpoint_problem(last), "");
  const auto before = folder_bytes(last);
  ProcResult fewer = run_train(args("fewer") + std::vector<std::string>{"--num_iterations", "4"});
  expect_clean_error(fewer, 1);
  EXPECT_HAS(fewer.output, "is at step 5, past num_iterations 4");
  EXPECT_HAS(fewer.output, "raise --num_iterations above 6");
  EXPECT_FALSE(fs::exists(*tmp_ / "fewer" / "metrics.jsonl"));
  ProcResult again = run_train(args("again"));
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_HAS(again.output, "every training step is done");
  EXPECT_HAS(again.output, "done: 6 steps");
  EXPECT_EQ(folder_bytes(last), before) << "the finished checkpoint was written again";
  ProcResult more = run_train(args("more") + std::vector<std::string>{"--num_iterations", "8"});
  EXPECT_EQ(more.exit_code, 0) << more.output;
  EXPECT_HAS(more.output, "with changed keys: num_iterations 6 -> 8");
  EXPECT_EQ(checkpoint_problem(step(7)), "");
}

// The checkpoint folder's entries.
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST_F(TrainCheckpoint, DiskFullLeavesThePreviousCheckpointAndAClearError) {
  const fs::path ref = reference();
  const fs::path two = first_part();
  const auto before = folder_bytes(two);
  // RLIMIT_FSIZE 2 MB: model.pt (about 26 MB) fails with EFBIG at the next save (step 3). Every
  // rerun fails the same clean way.
  for (int attempt = 0; attempt < 2; ++attempt) {
    ProcResult r = test::run_train_limited(args() + std::vector<std::string>{"--checkpoint_freq", "1"}, 2 << 20);
    expect_clean_error(r, 1);
    EXPECT_HAS(r.output, "checkpoint step_00000003 could not be written");
    EXPECT_HAS(r.output, "model.pt' failed after");
    EXPECT_HAS(r.output, "File too large");
    EXPECT_HAS(r.output, "the newest earlier checkpoint, " + two.string() + ", is untouched");
    EXPECT_HAS(r.output, "a checkpoint needs about");
    EXPECT_EQ(entries(ck()), std::vector<std::string>{"step_00000002"}) << "a tmp.* folder was left";
    EXPECT_EQ(folder_bytes(two), before);
    EXPECT_EQ(checkpoint_problem(two), "");
  }
  // With the space back, the run resumes and equals the uninterrupted one.
  ProcResult r = run_train(args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_losses(ref, *tmp_ / "run" / "metrics.jsonl");

  // A real full file system where this process may mount a tmpfs (root): room for one
  // checkpoint and a half, so the second save is refused by the free-space check before any
  // byte is written, and the first stays.
  const int64_t size =
      int64_t(fs::file_size(step(kSteps - 1) / "model.pt") + fs::file_size(step(kSteps - 1) / "optimizer.pt"));
  const fs::path mnt = *tmp_ / "tmpfs";
  fs::create_directories(mnt);
  const std::string opts = "size=" + std::to_string(size * 3 / 2);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, opts.c_str()) != 0) {
    std::printf("no tmpfs (mount: %s): the RLIMIT_FSIZE case above is the disk-full test here\n", std::strerror(errno));
    return;
  }
  const fs::path tck = mnt / "ck";
  ProcResult t = run_train(tiny(data(), *tmp_ / "trun", tck) + std::vector<std::string>{"--checkpoint_freq", "2"});
  expect_clean_error(t, 1);
  EXPECT_HAS(t.output, "not enough space to write checkpoint step_00000004");
  EXPECT_HAS(t.output, "the size of the newest checkpoint, step_00000002");
  EXPECT_EQ(entries(tck), std::vector<std::string>{"step_00000002"});
  EXPECT_EQ(checkpoint_problem(tck / "step_00000002"), "");
  ::umount(mnt.c_str());
}

TEST_F(TrainCheckpoint, KeysThatChangeTheSavedStateAreRefusedBeforeAnyStep) {
  first_part();
  const auto before = folder_bytes(step(2));
  TempDir other("other_shards");
  test::shakespeare_shards(other.path(), 50000);
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {{"--sequence_length", "16"},
       {"key 'sequence_length': this run has '16'", "written with '32'", "--sequence_length 32"}},
      {{"--optimizer", "muon"}, {"key 'optimizer': this run has 'muon'", "written with 'dion2'"}},
      {{"--batch_size", "8"}, {"key 'batch_size': this run has '8'", "written with '4'"}},
      {{"--model_dim", "128"}, {"key 'model_dim'"}},
      {{"--data_dir", other.path().string()}, {"the training data differs", "train shards, crc32"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args[0]);
    ProcResult r = run_train(args("attempt") + c.args);
    expect_clean_error(r, 2);
    for (const std::string& m : c.message) EXPECT_HAS(r.output, m);
    EXPECT_HAS(r.output, step(2).string());
    EXPECT_FALSE(fs::exists(*tmp_ / "attempt" / "metrics.jsonl")) << "a step ran";
  }
  EXPECT_EQ(folder_bytes(step(2)), before);
  // Moving the same data elsewhere is fine; lr and num_iterations may change, with a line.
  TempDir moved("moved_shards");
  copy_folder(data(), moved.path());
  ProcResult ok = run_train(args() + std::vector<std::string>{"--data_dir", moved.path().string(), "--lr", "0.01",
                                                              "--num_iterations", "8", "--stop_after", "1"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_HAS(ok.output, "resuming step_00000002 with changed keys: num_iterations 6 -> 8, lr 0.02 -> 0.01");
}

// A newer step_* folder than the one being saved is never removed (resume false: a new run in
// the folder of a finished one); the next resume takes the newest.
TEST_F(TrainCheckpoint, NewerFoldersAreNeverRemovedBySaves) {
  ProcResult full = run_train(args());
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const auto before = folder_bytes(step(5));
  ProcResult again = run_train(args("again") + std::vector<std::string>{"--resume", "false", "--stop_after", "3"});
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_EQ(entries(ck()), (std::vector<std::string>{"step_00000002", "step_00000005"}));
  EXPECT_EQ(folder_bytes(step(5)), before);
  ProcResult resumed = run_train(args("resumed"));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_HAS(resumed.output, "resumed from " + step(5).string());
}

TEST(TrainCheckpointPolicy, EveryConfigKeyHasAResumePolicy) {
  const auto items = config_items(Config{});
  ASSERT_GT(items.size(), 40u);
  for (const auto& [key, value] : items)
    EXPECT_TRUE(resume_policy(key).has_value()) << "key '" << key << "' has no row";
  EXPECT_EQ(resume_policy("sequence_length"), ResumePolicy::MUST_MATCH);
  EXPECT_EQ(resume_policy("num_iterations"), ResumePolicy::LOGGED);
  EXPECT_EQ(resume_policy("fs_size"), ResumePolicy::LAYOUT);
  EXPECT_FALSE(resume_policy("no_such_key").has_value());
}

// The rule is part of each key's row (config_keys.cpp): a MUST_MATCH row says what the saved state
// depends on (the refusal names it), LAYOUT is the three layout sizes and ep_size.
TEST(TrainCheckpointPolicy, EveryKeyRowStatesASensibleRule) {
  for (const config_detail::Key& k : config_detail::keys()) {
    SCOPED_TRACE(k.name);
    ASSERT_NE(k.resume.why, nullptr);
    if (k.resume.policy == ResumePolicy::MUST_MATCH) {
      EXPECT_GT(std::string(k.resume.why).size(), 10u) << "a MUST_MATCH row says what the saved state depends on";
    }
    if (k.resume.policy == ResumePolicy::LAYOUT) {
      EXPECT_TRUE(std::string(k.name).ends_with("_size")) << "LAYOUT is for the layout's sizes";
    }
    EXPECT_EQ(resume_policy(k.name), k.resume.policy);
  }
}

TEST_F(TrainCheckpoint, VersionOneCheckpointLoadsWithAWarning) {
  const fs::path ref = reference();
  const fs::path two = first_part();
  nlohmann::json meta = nlohmann::json::parse(slurp(two / "meta.json"));
  meta["version"] = 1;
  meta.erase("data_fingerprint");
  spit(two / "meta.json", meta.dump(2));
  fs::remove(two / "manifest.json");
  ProcResult r = run_train(args());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_HAS(r.output, "is a version-1 checkpoint (written before checksums");
  expect_same_losses(ref, *tmp_ / "run" / "metrics.jsonl");
  EXPECT_EQ(checkpoint_problem(step(5)), "");
}

}  // namespace
}  // namespace dion::train
