// tests/data/test_shard.cpp — the FineWeb shard format: the bytes we write are the
// reference's layout, what we read is checked, and every corruption gives an error that names
// the file and what is wrong.
#include <gtest/gtest.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::DataError;

// The DataError message of `fn`, or "" if it did not throw.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected an error";
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
}

TEST(Shard, WriteMatchesTheReferenceLayoutAndReadsBack) {
  TempDir dir;
  const std::vector<uint16_t> tokens{50256, 0, 1, 65535, 15496, 995};
  const fs::path path = dir / "fineweb_val_000000.bin";
  data::shard_write(path, tokens);
  EXPECT_EQ(read_file(path), shard_bytes(tokens));  // byte for byte what data/fineweb.py writes
  EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"fineweb_val_000000.bin"});

  const data::ShardFile shard = data::ShardFile::open(path);
  EXPECT_EQ(shard.header().magic, 20240520);
  EXPECT_EQ(shard.header().version, 1);
  EXPECT_EQ(shard.header().token_count, 6);
  EXPECT_EQ(shard.header().file_bytes, 1024 + 12);
  EXPECT_EQ(std::vector<uint16_t>(shard.tokens().begin(), shard.tokens().end()), tokens);
  EXPECT_EQ(data::shard_read_header(path).token_count, 6);

  data::ShardFile moved = data::ShardFile::open(path);
  moved = data::ShardFile::open(path);  // move-assign over a mapped file
  EXPECT_EQ(moved.tokens().size(), 6u);
}

TEST(Shard, EmptyShardIsValid) {
  TempDir dir;
  data::shard_write(dir / "e.bin", {});
  const data::ShardFile shard = data::ShardFile::open(dir / "e.bin");
  EXPECT_EQ(shard.header().token_count, 0);
  EXPECT_TRUE(shard.tokens().empty());
}

TEST(Shard, Names) {
  EXPECT_EQ(data::shard_name("fineweb", "val", 0), "fineweb_val_000000.bin");
  EXPECT_EQ(data::shard_name("finewebedu", "train", 103), "finewebedu_train_000103.bin");
}

TEST(Shard, CorruptFilesGiveClearErrors) {
  TempDir dir;
  const std::vector<uint16_t> tokens(100, 7);
  struct Case {
    std::string name, bytes;
    std::vector<std::string> expect;
  };
  const std::string good = shard_bytes(tokens);
  const std::vector<Case> cases = {
      {"bad_magic.bin", shard_bytes(tokens, 12345), {"bad magic 12345", "expected 20240520"}},
      {"version2.bin", shard_bytes(tokens, 20240520, 2), {"unsupported version 2", "version 1"}},
      {"tiny.bin", good.substr(0, 100), {"truncated", "100 bytes", "1024-byte header"}},
      {"empty.bin", "", {"truncated", "0 bytes"}},
      {"cut.bin",
       good.substr(0, good.size() - 1),
       {"1223 bytes", "100 tokens", "1224 bytes", "truncated", "re-download"}},
      {"long.bin", good + "xx", {"longer than its header says"}},
      {"negative.bin", shard_bytes(tokens, 20240520, 1, -5), {"negative token count -5"}},
  };
  for (const Case& c : cases) {
    const fs::path path = dir / c.name;
    write_file(path, c.bytes);
    SCOPED_TRACE(c.name);
    auto expect = c.expect;
    expect.push_back(path.string());
    expect_contains(error_of([&] { (void)data::ShardFile::open(path); }), expect);
    expect_contains(error_of([&] { (void)data::shard_read_header(path); }), expect);
  }
}

TEST(Shard, UnreadablePathsGiveClearErrors) {
  TempDir dir;
  expect_contains(error_of([&] { (void)data::ShardFile::open(dir / "missing.bin"); }),
                  {(dir / "missing.bin").string(), "cannot open", "No such file"});
  expect_contains(error_of([&] { (void)data::ShardFile::open(dir.path()); }),
                  {dir.path().string(), "not a regular file", "directory"});
}

TEST(Shard, TokensOutsideTheVocabularyAreFound) {
  TempDir dir;
  std::vector<uint16_t> tokens(10, 1);
  tokens[7] = 50300;
  data::shard_write(dir / "big.bin", tokens);
  const data::ShardFile shard = data::ShardFile::open(dir / "big.bin");
  expect_contains(error_of([&] { data::shard_check_tokens(shard, 50257); }),
                  {(dir / "big.bin").string(), "token 50300", "index 7", "< 50257"});
  EXPECT_EQ(error_of([&] { data::shard_check_tokens(shard, 50304); }), "");
}

TEST(Shard, FailedWritesLeaveNothing) {
  TempDir dir;
  const fs::path path = dir / "no/such/folder/x.bin";
  expect_contains(error_of([&] {
                    data::shard_write(path, std::vector<uint16_t>{1, 2});
                  }),
                  {path.string(), "temporary file"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

}  // namespace
}  // namespace dion::test
