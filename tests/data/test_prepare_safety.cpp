// tests/data/test_prepare_safety.cpp — prepare and the shard reader under hostile but
// realistic conditions (docs/errors.md): kill -9 during an --overwrite, two runs on
// one folder, its own shards among the inputs, a FIFO, a shard truncated while read, the file
// size limit, SIGTERM inside a long document, /dev/zero, NaN options, bad flags.
//
// Crashes are injected with the DION_FAILPOINT hook (src/data/file_util.h): the tool kills
// itself with SIGKILL at a named point, exactly as kill -9 would, so the tests are
// deterministic.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <csignal>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include "dion/data/error.h"
#include "dion/data/prepare.h"
#include "dion/data/shard.h"
#include "dion/data/shard_folder.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::DataError;

std::string gpt2_dir() { return data_file("gpt2").string(); }

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "\"" << p << "\" not in:\n" << text;
}

// The GPT-2 files must be there (data/gpt2): a missing one fails the test, naming it.
#define DION_REQUIRE_GPT2() (void)gpt2_tokenizer()

// A corpus of `docs` small documents separated by "@@" whose text depends on `seed`.
std::string corpus(int docs, int seed) {
  std::string text;
  for (int i = 0; i < docs; ++i) {
    text += "Corpus " + std::to_string(seed) + " document " + std::to_string(i) + ": ";
    for (int j = 0; j <= (i + seed) % 5; ++j) text += "words and more words, line " + std::to_string(j) + ". ";
    text += "@@";
  }
  return text;
}

// name -> bytes of every file in `dir`, hidden ones included.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    files[e.path().filename().string()] = e.is_directory() ? "<dir>" : read_file(e.path());
  }
  return files;
}

std::vector<std::string> prepare_args(const fs::path& input, const fs::path& out,
                                      const std::vector<std::string>& extra = {}) {
  std::vector<std::string> a = {"prepare",      input.string(), "-o",          out.string(), "--tokenizer", gpt2_dir(),
                                "--shard-size", "50",           "--delimiter", "@@",         "-q"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// The shards prepare makes from `text` (in a folder of its own), for comparing.
std::map<std::string, std::string> expected_set(const std::string& text) {
  TempDir in, out;
  write_file(in / "t.txt", text);
  const RunResult r = run_dion_data(prepare_args(in / "t.txt", out.path()));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return snapshot(out.path());
}

// ---------------------------------------------------------------------------- data loss

TEST(PrepareSafety, KillDuringStagingLeavesTheOldSetAndTheRerunCleansUp) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  write_file(in / "a.txt", corpus(40, 1));
  write_file(in / "b.txt", corpus(30, 2));
  ASSERT_EQ(run_dion_data(prepare_args(in / "a.txt", out.path())).exit_code, 0);
  const auto old_set = snapshot(out.path());
  ASSERT_GT(old_set.size(), 3u);

  // kill -9 after the 3rd new shard is staged.
  RunOptions crash;
  crash.env = {"DION_FAILPOINT=prepare-stage:3"};
  const RunResult killed = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}), crash);
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  auto after = snapshot(out.path());
  EXPECT_TRUE(after.contains(".fineweb.dion-prepare.staging"));
  for (const auto& [name, bytes] : old_set) EXPECT_EQ(after[name], bytes) << name;  // untouched

  const RunResult rerun = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}));
  ASSERT_EQ(rerun.exit_code, 0) << rerun.err;
  expect_contains(rerun.err, {"removed the staged shards of an interrupted earlier run"});
  EXPECT_EQ(snapshot(out.path()), expected_set(corpus(30, 2)));  // nothing else is left
}

TEST(PrepareSafety, KillDuringTheSwapIsFinishedByTheNextRun) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  write_file(in / "a.txt", corpus(60, 1));  // more shards than the new set: some must go
  write_file(in / "b.txt", corpus(20, 2));
  write_file(out / "notes.txt", "keep me");
  ASSERT_EQ(run_dion_data(prepare_args(in / "a.txt", out.path())).exit_code, 0);
  const auto new_set = expected_set(corpus(20, 2));

  RunOptions crash;
  crash.env = {"DION_FAILPOINT=prepare-swap:2"};  // after 2 of the renames
  const RunResult killed = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}), crash);
  ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
  // The complete new set is on disk: in place or still staged, and the journal says so.
  const auto mid = snapshot(out.path());
  EXPECT_TRUE(mid.contains(".fineweb.dion-prepare.journal"));
  for (const auto& [name, bytes] : new_set) {
    const fs::path staged = out / ".fineweb.dion-prepare.staging" / name;
    EXPECT_TRUE(fs::exists(staged) ? read_file(staged) == bytes : mid.at(name) == bytes) << name;
  }

  // Any later prepare on the folder finishes the swap first (this one then refuses: no
  // --overwrite), leaving exactly the new set.
  const RunResult next = run_dion_data(prepare_args(in / "a.txt", out.path()));
  EXPECT_EQ(next.exit_code, 1);
  expect_contains(next.err, {"finished the swap of an interrupted earlier run", "already has"});
  auto final_set = new_set;
  final_set["notes.txt"] = "keep me";
  EXPECT_EQ(snapshot(out.path()), final_set);
}

// A swap killed at each of its steps (after the journal, after every rename, after every removal
// of an old shard, after the staging folder goes): every reader refuses the folder, naming
// `dion-data finish-swap`, until that command (itself killed once half-way) finishes the swap;
// then the folder holds exactly the new set. The regression: a folder of 339 old and 677 partly
// renamed new shards was trained on without a word.
TEST(PrepareSafety, NoReaderUsesAFolderWhoseSwapIsUnfinished) {
  DION_REQUIRE_GPT2();
  TempDir in;
  write_file(in / "a.txt", corpus(60, 1));  // the old set: more shards than the new one
  write_file(in / "b.txt", corpus(20, 2));
  const auto old_set = expected_set(corpus(60, 1)), new_set = expected_set(corpus(20, 2));
  size_t removed = 0;
  for (const auto& [name, bytes] : old_set) removed += new_set.contains(name) ? 0 : 1;
  ASSERT_GT(new_set.size(), 2u);
  ASSERT_GT(removed, 1u);
  std::vector<std::string> points = {"prepare-journal:1", "prepare-cleanup:1"};
  for (size_t i = 1; i <= new_set.size(); ++i) points.push_back("prepare-swap:" + std::to_string(i));
  for (size_t i = 1; i <= removed; ++i) points.push_back("prepare-remove:" + std::to_string(i));
  for (const std::string& point : points) {
    SCOPED_TRACE(point);
    TempDir out;
    ASSERT_EQ(run_dion_data(prepare_args(in / "a.txt", out.path())).exit_code, 0);
    RunOptions crash;
    crash.env = {"DION_FAILPOINT=" + point};
    const RunResult killed = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}), crash);
    ASSERT_EQ(killed.exit_code, 128 + SIGKILL) << killed.err;
    ASSERT_TRUE(fs::exists(out / ".fineweb.dion-prepare.journal"));
    // The trainer's loader (and dion-train's sample, resume) read through shard_folder_read.
    try {
      data::shard_folder_read(out.path(), "fineweb");
      ADD_FAILURE() << "a half-swapped folder was read";
    } catch (const DataError& e) {
      expect_contains(e.what(), {"has not finished swapping", ".fineweb.dion-prepare.journal",
                                 "dion-data finish-swap " + out.path().string() + " --prefix fineweb"});
    }
    const RunResult inspect = run_dion_data({"inspect", (out / "fineweb_val_000000.bin").string()});
    EXPECT_EQ(inspect.exit_code, 1);
    expect_contains(inspect.err, {"has not finished swapping", "dion-data finish-swap"});
    if (point == "prepare-swap:1") {  // the finish itself killed after one rename: still refused
      RunOptions again;
      again.env = {"DION_FAILPOINT=prepare-swap:1"};
      EXPECT_EQ(run_dion_data({"finish-swap", out.path().string()}, again).exit_code, 128 + SIGKILL);
      EXPECT_THROW(data::shard_folder_read(out.path(), "fineweb"), DataError);
    }
    const RunResult finish = run_dion_data({"finish-swap", out.path().string()});
    ASSERT_EQ(finish.exit_code, 0) << finish.err;
    expect_contains(finish.out, {"finished the swap of an interrupted earlier run"});
    EXPECT_EQ(snapshot(out.path()), new_set);
    EXPECT_EQ(data::shard_folder_read(out.path(), "fineweb").train.size() + 1, new_set.size());
    const RunResult nothing = run_dion_data({"finish-swap", out.path().string()});
    EXPECT_EQ(nothing.exit_code, 0);
    expect_contains(nothing.out, {"nothing to do"});
  }
}

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DION_HAS_ASAN_FEATURE 1
#endif
#endif
#ifndef DION_HAS_ASAN_FEATURE
#define DION_HAS_ASAN_FEATURE 0
#endif

// A shard of the largest size the header allows (2^31 - 1 tokens, 4 GB; sparse here, so no
// disk is used) read where it does not fit in memory: a message naming the file, its size and
// what to do, not a bare std::bad_alloc.
TEST(PrepareSafety, AShardTooLargeForMemoryIsNamed) {
#if defined(__SANITIZE_ADDRESS__) || DION_HAS_ASAN_FEATURE
  // ASan reserves terabytes of shadow address space at start: under `ulimit -v` the sanitized
  // dion-data cannot start at all (scripts/sanitize.sh). The plain build runs this test.
  GTEST_SKIP() << "ulimit -v and AddressSanitizer's shadow memory do not mix";
#endif
  TempDir dir;
  const fs::path big = dir / "fineweb_train_000001.bin";
  std::string header(1024, '\0');
  const int32_t fields[4] = {data::kShardMagic, data::kShardVersion, 2147483647, 0};
  std::memcpy(header.data(), fields, sizeof(fields));
  write_file(big, header);
  fs::resize_file(big, 1024 + 2 * int64_t{2147483647});
  RunOptions limited;
  limited.shell_prefix = "ulimit -v 1000000;";  // 1 GB of address space: the 4 GB of tokens cannot fit
  const RunResult r = run_dion_data({"inspect", big.string()}, limited);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  expect_contains(r.err, {big.string(), "2147483647 tokens", "do not fit in this process's memory", "--shard-size"});
  EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
}

TEST(PrepareSafety, TemporariesOfAnOlderInterruptedRunAreRemoved) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  write_file(in / "a.txt", corpus(10, 1));
  // What an interrupted run of an older version left beside the shards.
  write_file(out / "fineweb_train_000001.bin.tmp.AbC123", "half a shard");
  write_file(out / "fineweb_val_000000.bin.tmp.xYz789", "half a shard");
  write_file(out / "other.bin.tmp.keep", "not ours");
  const RunResult r = run_dion_data(prepare_args(in / "a.txt", out.path(), {"--prefix", "fineweb"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.err, {"removed 2 temporary files of an interrupted earlier run"});
  auto want = expected_set(corpus(10, 1));
  want["other.bin.tmp.keep"] = "not ours";
  EXPECT_EQ(snapshot(out.path()), want);
}

TEST(PrepareSafety, SecondRunOnTheSameFolderIsRefusedNamingTheFirst) {
  DION_REQUIRE_GPT2();
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  write_file(in / "a.txt", corpus(20, 1));
  write_file(in / "b.txt", corpus(20, 2));
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 50;
  RunResult second;
  o.on_progress = [&](const data::PrepareProgress& p) {
    if (!p.final && second.exit_code < 0) {
      second = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}));
    }
  };
  auto source = data::document_source_open({(in / "a.txt").string()}, "@@");
  const auto r = data::prepare_shards(tok, *source, o);
  EXPECT_EQ(second.exit_code, 1);
  expect_contains(second.err, {"being written by another dion-data prepare", "pid " + std::to_string(::getpid())});
  // Only the first run's shards, and the lock is gone.
  EXPECT_EQ(snapshot(out.path()), expected_set(corpus(20, 1)));
  EXPECT_EQ(r.documents, 20u);
}

TEST(PrepareSafety, ShardsWrittenByAnotherProgramMeanwhileAreNotMixedIn) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  write_file(in / "a.txt", corpus(20, 1));
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 50;
  o.on_progress = [&](const data::PrepareProgress& p) {  // a writer that ignores the lock
    if (!p.final) write_file(out / "fineweb_train_000777.bin", shard_bytes({1, 2, 3}));
  };
  auto source = data::document_source_open({(in / "a.txt").string()}, "@@");
  try {
    data::prepare_shards(tok, *source, o);
    FAIL() << "no error";
  } catch (const DataError& e) {
    expect_contains(e.what(), {"changed while prepare ran", "would be mixed"});
  }
  EXPECT_EQ(list_dir(out.path()), std::vector<std::string>{"fineweb_train_000777.bin"});
}

// A folder already inconsistent before any run (shards of two corpora, a gap, a stray copy):
// the readers (the trainer's loader, through shard_folder_read) refuse it naming the files.
TEST(PrepareSafety, InconsistentShardFoldersAreRefusedNamingTheFiles) {
  const std::vector<uint16_t> full(50, 7), shorter(20, 7);
  auto expect_refused = [](const fs::path& dir, const std::vector<std::string>& parts) {
    try {
      data::shard_folder_read(dir, "fineweb");
      ADD_FAILURE() << "no error for " << dir;
    } catch (const DataError& e) {
      expect_contains(e.what(), parts);
      expect_contains(e.what(), {dir.string(), "numbered 0, 1, 2, ... without gaps"});
    }
  };
  {  // One set as prepare writes it: val 0, train 1.. full, the last train shard short.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000002.bin", shard_bytes(shorter));
    write_file(d / "other_train_000005.bin", shard_bytes(shorter));  // another prefix: ignored
    const data::ShardFolder f = data::shard_folder_read(d.path(), "fineweb");
    ASSERT_EQ(f.val.size(), 1u);
    ASSERT_EQ(f.train.size(), 2u);
    EXPECT_EQ(f.train[1].path.filename(), "fineweb_train_000002.bin");
    EXPECT_EQ(f.train[1].header.token_count, 20);
  }
  {  // Two corpora: one run's val_000001 (--val-fraction) beside the other's train_000001.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_val_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    expect_refused(d.path(), {"fineweb_train_000001.bin", "fineweb_val_000001.bin", "the same shard number 1",
                              "two sets are mixed"});
  }
  {  // The same number written with more digits.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_0000001.bin", shard_bytes(full));
    expect_refused(d.path(), {"fineweb_train_000001.bin", "fineweb_train_0000001.bin"});
  }
  {  // A gap in the numbering.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000003.bin", shard_bytes(full));
    expect_refused(d.path(), {"no shard number 2", "fineweb_*_000002.bin", "after fineweb_train_000001.bin",
                              "jumps to fineweb_train_000003.bin"});
  }
  {  // No shard 0.
    TempDir d;
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    expect_refused(d.path(), {"no shard number 0", "must start at 0"});
  }
  {  // A short shard before the last one: the end of a smaller run's set among a bigger one's.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000002.bin", shard_bytes(shorter));
    write_file(d / "fineweb_train_000003.bin", shard_bytes(full));
    expect_refused(d.path(),
                   {"fineweb_train_000001.bin holds 50 tokens", "fineweb_train_000002.bin holds 20", "from two sets"});
  }
  {  // The last shard longer than the others.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(shorter));
    write_file(d / "fineweb_train_000002.bin", shard_bytes(full));
    expect_refused(d.path(), {"fineweb_train_000001.bin holds 20 tokens", "fineweb_train_000002.bin holds 50"});
  }
  {  // A stray copy that the old glob fineweb_train_*.bin would have read as part of the set.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001.bin", shard_bytes(full));
    write_file(d / "fineweb_train_000001 (copy).bin", shard_bytes(full));
    expect_refused(d.path(), {"fineweb_train_000001 (copy).bin is not a shard name"});
  }
  {  // A bad header is named as shard_read_header names it.
    TempDir d;
    write_file(d / "fineweb_val_000000.bin", shard_bytes(full, 42));
    try {
      data::shard_folder_read(d.path(), "fineweb");
      ADD_FAILURE() << "no error for a bad magic";
    } catch (const DataError& e) {
      expect_contains(e.what(), {"fineweb_val_000000.bin", "bad magic 42"});
    }
  }
}

// prepare's output folder already holding a mixed set: refused without --overwrite; with it,
// replaced whole (every old shard goes, the strays of the other corpus too), leaving one set.
TEST(PrepareSafety, InconsistentOutputFolderIsRefusedOrReplacedWhole) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  write_file(in / "a.txt", corpus(20, 1));
  write_file(in / "b.txt", corpus(12, 2));
  ASSERT_EQ(run_dion_data(prepare_args(in / "a.txt", out.path())).exit_code, 0);
  // Shards of another corpus beside a's: a duplicate number and one far past a's last shard.
  write_file(out / "fineweb_val_000001.bin", shard_bytes({1, 2, 3}));
  write_file(out / "fineweb_train_000777.bin", shard_bytes({1, 2, 3}));
  const std::map<std::string, std::string> mixed = snapshot(out.path());
  EXPECT_THROW(data::shard_folder_read(out.path(), "fineweb"), DataError);

  const RunResult refused = run_dion_data(prepare_args(in / "b.txt", out.path()));
  EXPECT_EQ(refused.exit_code, 1) << refused.err;
  expect_contains(refused.err, {out.path().string(), "already has", "--overwrite"});
  EXPECT_EQ(snapshot(out.path()), mixed);

  const RunResult replaced = run_dion_data(prepare_args(in / "b.txt", out.path(), {"--overwrite"}));
  EXPECT_EQ(replaced.exit_code, 0) << replaced.err;
  EXPECT_EQ(snapshot(out.path()), expected_set(corpus(12, 2)));
  EXPECT_NO_THROW(data::shard_folder_read(out.path(), "fineweb"));
}

TEST(PrepareSafety, OwnShardsAmongTheInputsAreNotReadAsText) {
  DION_REQUIRE_GPT2();
  TempDir d;
  write_file(d / "a.txt", corpus(20, 1));
  const RunResult first = run_dion_data(prepare_args(d.path(), d.path()));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const auto first_set = snapshot(d.path());
  // prepare D -o D --overwrite: the same text, the same shards (not the shards as text).
  const RunResult again = run_dion_data({"prepare", d.path().string(), "-o", d.path().string(), "--tokenizer",
                                         gpt2_dir(), "--shard-size", "50", "--delimiter", "@@", "--overwrite"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  expect_contains(again.err, {"this run's own output shards", "not read"});
  EXPECT_EQ(snapshot(d.path()), first_set);
  // Named explicitly: refused.
  const RunResult named = run_dion_data(prepare_args(d / "fineweb_val_000000.bin", d.path(), {"--overwrite"}));
  EXPECT_EQ(named.exit_code, 1);
  expect_contains(named.err, {"fineweb_val_000000.bin", "its own output as text"});
}

// ---------------------------------------------------------------------------- hangs, crashes

TEST(PrepareSafety, FifoAsShardOrTokenizerFileFailsAtOnce) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "pipe.bin").c_str(), 0600), 0);
  const RunResult shard = run_dion_data({"inspect", (dir / "pipe.bin").string()});
  EXPECT_EQ(shard.exit_code, 1);  // 124 = hung until timeout
  expect_contains(shard.err, {"pipe.bin", "not a regular file", "FIFO"});

  fs::create_directories(dir / "gpt2");
  ASSERT_EQ(::mkfifo((dir / "gpt2/encoder.json").c_str(), 0600), 0);
  const RunResult tok = run_dion_data({"encode", "--tokenizer", (dir / "gpt2").string()}, "hello");
  EXPECT_EQ(tok.exit_code, 1);
  expect_contains(tok.err, {"encoder.json", "FIFO"});
}

TEST(PrepareSafety, ShardTruncatedAfterOpeningIsStillReadable) {
  TempDir dir;
  std::vector<uint16_t> tokens(100000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i % 50000);
  data::shard_write(dir / "s.bin", tokens);
  const auto shard = data::ShardFile::open(dir / "s.bin");
  // Truncating (or cp over) a mapped file made the next read die with SIGBUS.
  ASSERT_EQ(::truncate((dir / "s.bin").c_str(), 1024), 0);
  uint64_t sum = 0;
  for (uint16_t t : shard.tokens()) sum += t;
  uint64_t want = 0;
  for (uint16_t t : tokens) want += t;
  EXPECT_EQ(sum, want);
  const RunResult r = run_dion_data({"inspect", (dir / "s.bin").string()});
  EXPECT_EQ(r.exit_code, 1);
  expect_contains(r.err, {"s.bin", "truncated"});
}

TEST(PrepareSafety, FileSizeLimitIsAnErrorNotASignal) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  std::string text;
  for (int i = 0; i < 4000; ++i) text += "The file size limit is lower than this shard. ";
  write_file(in / "a.txt", text);
  RunOptions limited;
  limited.shell_prefix = "ulimit -f 40;";  // 20-40 kB, below the ~80 kB shard
  const RunResult r = run_dion_data(
      {"prepare", (in / "a.txt").string(), "-o", out.path().string(), "--tokenizer", gpt2_dir()}, limited);
  EXPECT_EQ(r.exit_code, 1) << r.err;  // 128 + SIGXFSZ (153) without the fix
  expect_contains(r.err, {"File too large", "ulimit -f"});
  EXPECT_TRUE(list_dir(out.path()).empty());  // no temporary, no staging, no lock
}

TEST(PrepareSafety, SigtermInsideALongDocumentStopsAndWritesNothing) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  {
    std::string doc;
    doc.reserve(48 << 20);
    for (int i = 0; doc.size() < (48u << 20); ++i) doc += "word" + std::to_string(i % 100003) + " and text, ";
    write_file(in / "big.txt", doc);  // one 48 MB document: seconds to tokenize
  }
  Background run(
      {"prepare", (in / "big.txt").string(), "-o", out.path().string(), "--tokenizer", gpt2_dir(), "--threads", "1"});
  // The lock file appears when prepare_shards starts, before the document is tokenized.
  const fs::path lock = out / ".fineweb.dion-prepare.lock";
  for (int i = 0; i < 6000 && !fs::exists(lock); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(fs::exists(lock));
  run.signal(SIGTERM);
  const RunResult r = run.wait();
  EXPECT_EQ(r.exit_code, 130) << r.err;
  expect_contains(r.err, {"interrupted", "no shards were written"});
  EXPECT_TRUE(list_dir(out.path()).empty());
}

// Documents from memory.
class VectorSource : public data::DocumentSource {
 public:
  explicit VectorSource(std::vector<std::string> docs) : docs_(std::move(docs)) {}
  bool next(std::string& doc) override {
    if (i_ == docs_.size()) return false;
    doc = docs_[i_++];
    return true;
  }
  uint64_t bytes_read() const override { return 0; }
  uint64_t bytes_total() const override { return 0; }

 private:
  std::vector<std::string> docs_;
  size_t i_ = 0;
};

TEST(PrepareSafety, StopIsSeenInsideADocumentAndAfterTheLastBatch) {
  DION_REQUIRE_TOKENIZER(tok);
  std::string big;
  for (int i = 0; big.size() < (6u << 20); ++i) big += "word" + std::to_string(i % 1000) + " ";
  // One batch (under 8 MB): the stop flag rises while the 6 MB document is tokenized.
  {
    TempDir out;
    VectorSource source({big, "a small second document"});
    data::PrepareOptions o;
    o.output_dir = out.path();
    int calls = 0;
    o.should_stop = [&] { return ++calls >= 3; };  // 1: before the batch; 2, 3: inside it
    try {
      data::prepare_shards(tok, source, o);
      FAIL() << "the stop was not seen: the shards were written";
    } catch (const DataError& e) {
      expect_contains(e.what(), {"interrupted"});
    }
    // Without the checks inside the document only 2 calls happen (before and after the one
    // batch): the stop would be missed and the shards written.
    EXPECT_EQ(calls, 4);  // 3rd inside the document (stops it), 4th after the batch
    EXPECT_TRUE(list_dir(out.path()).empty());
  }
  {  // Small documents: a stop during the last batch still prevents the swap.
    TempDir out;
    VectorSource source({"one", "two", "three"});
    data::PrepareOptions o;
    o.output_dir = out.path();
    int calls = 0;
    o.should_stop = [&] { return ++calls >= 2; };
    EXPECT_THROW(data::prepare_shards(tok, source, o), DataError);
    EXPECT_TRUE(list_dir(out.path()).empty());
  }
}

TEST(PrepareSafety, DevicesAndEndlessDocumentsAreRefused) {
  const RunResult zero = run_dion_data({"prepare", "/dev/zero", "-o", "/tmp/unused", "--tokenizer", gpt2_dir()});
  EXPECT_EQ(zero.exit_code, 1);
  expect_contains(zero.err, {"/dev/zero", "character device", "not text"});

  // /dev/zero on stdin is an endless document: the size cap names it (small cap here).
  TempDir in;
  write_file(in / "a.txt", std::string(5000, 'x'));
  data::DocumentSourceOptions o;
  o.max_document_bytes = 1000;
  auto source = data::document_source_open({(in / "a.txt").string()}, o);
  std::string doc;
  try {
    source->next(doc);
    FAIL() << "no error";
  } catch (const DataError& e) {
    expect_contains(e.what(), {"a.txt", "a document longer than 1000 bytes", "--delimiter"});
  }
}

TEST(PrepareSafety, NanValFractionIsRefused) {
  const RunResult cli = run_dion_data({"prepare", "-", "-o", "/tmp/unused", "--val-fraction", "nan"});
  EXPECT_EQ(cli.exit_code, 2);
  expect_contains(cli.err, {"--val-fraction", "[0, 1)"});
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  write_file(in / "a.txt", "text");
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.val_fraction = std::nan("");
  auto source = data::document_source_open({(in / "a.txt").string()}, "");
  EXPECT_THROW(data::prepare_shards(tok, *source, o), DataError);
}

TEST(PrepareSafety, BadFlagValuesExit2NamingTheFlag) {
  for (const auto& [args, flag] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"prepare", "-", "-o", "x", "--shard-size", "abc"}, "--shard-size"},
           {{"prepare", "-", "-o", "x", "--threads", "0"}, "--threads"},
           {{"inspect", "x.bin", "--head", "-3"}, "--head"},
           {{"download", "--attempts", "0"}, "--attempts"},
           {{"prepare", "-", "-o", "x", "--no-such-flag"}, "--no-such-flag"}}) {
    const RunResult r = run_dion_data(args);
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.err;
    expect_contains(r.err, {flag});
  }
}

TEST(PrepareSafety, InspectWithAWiderVocabularyPrintsWholeLines) {
  DION_REQUIRE_GPT2();
  TempDir dir;
  write_file(dir / "s.bin", shard_bytes({50256, 60000, 15496}));
  const RunResult r =
      run_dion_data({"inspect", (dir / "s.bin").string(), "--vocab-size", "65536", "--tokenizer", gpt2_dir()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.out, {"60000 (not a GPT-2 token)", "<60000: not a GPT-2 token>", "Hello"});
}

TEST(PrepareSafety, ProgressLineAgreesWithTheSummary) {
  DION_REQUIRE_GPT2();
  TempDir in, out;
  write_file(in / "a.txt", corpus(40, 3));
  const RunResult r = run_dion_data({"prepare", (in / "a.txt").string(), "-o", out.path().string(), "--tokenizer",
                                     gpt2_dir(), "--shard-size", "100"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const size_t shards = list_dir(out.path()).size();
  // stderr is a file: progress lines are plain; the last one is the final count.
  const std::string want = std::to_string(shards) + " shards |";
  const size_t last_progress = r.err.rfind(" shards |");
  ASSERT_NE(last_progress, std::string::npos) << r.err;
  EXPECT_EQ(r.err.rfind(want), last_progress - std::to_string(shards).size()) << r.err;
  expect_contains(r.err, {"prepare: " + std::to_string(shards) + " shards ("});
}

}  // namespace
}  // namespace dion::test
