// tests/data/test_bytes.cpp — the byte tokenizer and the tokenizer slot of the shard
// header: byte shards of Tiny Shakespeare round-trip the text exactly, the header records the
// tokenizer (and an old all-zero slot reads as GPT-2), a set mixing tokenizers is refused,
// `inspect` decodes byte shards without the GPT-2 files and bounds their tokens by 257, and
// `prepare --tokenizer byte` writes them.
#include <gtest/gtest.h>

#include <cstring>

#include "dion/data/error.h"
#include "dion/data/prepare.h"
#include "dion/data/shard.h"
#include "dion/data/shard_folder.h"
#include "dion/data/tokenizer.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::ByteTokenizer;
using data::DataError;
using data::ShardTokenizer;

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "\"" << p << "\" not in:\n" << text;
}

// A hand-made shard (test_util's shard_bytes) with header slot [3] set to `slot3`.
std::string shard_with_slot3(const std::vector<uint16_t>& tokens, int32_t slot3) {
  std::string b = shard_bytes(tokens);
  std::memcpy(b.data() + 12, &slot3, 4);
  return b;
}

TEST(ByteTokenizer, EncodeDecodeIsTheIdentityOnBytes) {
  std::string all;
  for (int c = 0; c < 256; ++c) all.push_back(static_cast<char>(c));
  all += "naïve café 🙂 \xff\xfe (invalid UTF-8 stays as it is)";
  const std::vector<uint32_t> ids = ByteTokenizer::encode_ordinary(all);
  ASSERT_EQ(ids.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(all[i]));
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
  const std::vector<uint16_t> eot = {'a', 256, 'b'};
  EXPECT_EQ(ByteTokenizer::decode(eot), "a<|endoftext|>b");
  const std::vector<uint16_t> bad = {'a', 257};
  try {
    ByteTokenizer::decode(bad);
    FAIL() << "id 257 decoded";
  } catch (const DataError& e) {
    expect_contains(e.what(), {"257", "< 257"});
  }
}

TEST(ByteShards, TinyShakespeareRoundTripsExactly) {
  const fs::path input = data_file("tinyshakespeare/input.txt");
  const std::string text = read_file(input);
  ASSERT_GT(text.size(), 1000000u);
  TempDir out;
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 300000;  // several shards: the first val, then train
  auto source = data::document_source_open({input.string()}, "");
  const data::PrepareResult r = data::prepare_shards_bytes(*source, o);
  EXPECT_EQ(r.documents, 1u);
  EXPECT_EQ(r.tokens, text.size() + 1);  // end-of-text + one id per byte
  ASSERT_GE(r.shards.size(), 3u);
  std::vector<uint16_t> all;
  for (const auto& s : r.shards) {
    const auto f = data::ShardFile::open(s.path);
    EXPECT_EQ(f.header().tokenizer, ShardTokenizer::BYTES) << s.path;
    data::shard_check_tokens(f, ByteTokenizer::kVocabSize);  // every id < 257
    all.insert(all.end(), f.tokens().begin(), f.tokens().end());
  }
  // The header slot on disk: [3] = 1.
  const std::string head = read_file(r.shards[0].path).substr(0, 16);
  int32_t slot3 = 0;
  std::memcpy(&slot3, head.data() + 12, 4);
  EXPECT_EQ(slot3, 1);
  ASSERT_EQ(all.front(), ByteTokenizer::kEndOfText);
  EXPECT_EQ(ByteTokenizer::decode(std::span<const uint16_t>(all).subspan(1)), text);
  // The folder reads as one byte set.
  const data::ShardFolder folder = data::shard_folder_read(out.path(), "fineweb");
  EXPECT_EQ(folder.tokenizer, ShardTokenizer::BYTES);
  EXPECT_EQ(folder.val.size(), 1u);
  EXPECT_EQ(folder.train.size(), r.shards.size() - 1);
}

TEST(ByteShards, HeaderSlotOldShardsAreGpt2UnknownIsRefused) {
  TempDir d;
  // An old shard (slot [3] zero, as the reference and llm.c write it): GPT-2.
  write_file(d / "old.bin", shard_bytes({1, 2, 50256}));
  EXPECT_EQ(data::shard_read_header(d / "old.bin").tokenizer, ShardTokenizer::GPT2);
  // shard_write's default is GPT-2 too.
  data::shard_write(d / "new.bin", std::vector<uint16_t>{5, 6});
  EXPECT_EQ(data::shard_read_header(d / "new.bin").tokenizer, ShardTokenizer::GPT2);
  data::shard_write(d / "b.bin", std::vector<uint16_t>{5, 256}, ShardTokenizer::BYTES);
  EXPECT_EQ(data::shard_read_header(d / "b.bin").tokenizer, ShardTokenizer::BYTES);
  // An unknown tokenizer id is refused, naming the file and the known values.
  write_file(d / "future.bin", shard_with_slot3({1, 2}, 7));
  try {
    data::shard_read_header(d / "future.bin");
    FAIL() << "slot [3] = 7 accepted";
  } catch (const DataError& e) {
    expect_contains(e.what(), {"future.bin", "unknown tokenizer 7", "0 = gpt2", "1 = bytes"});
  }
  EXPECT_EQ(data::shard_tokenizer_vocab(ShardTokenizer::GPT2), 50257u);
  EXPECT_EQ(data::shard_tokenizer_vocab(ShardTokenizer::BYTES), 257u);
  EXPECT_EQ(data::shard_tokenizer_parse("byte", "--tokenizer"), ShardTokenizer::BYTES);
  try {
    data::shard_tokenizer_parse("cl100k", "--tokenizer");
    FAIL();
  } catch (const DataError& e) {
    expect_contains(e.what(), {"--tokenizer", "cl100k", "gpt2", "byte"});
  }
}

TEST(ByteShards, ASetMixingTokenizersIsRefused) {
  TempDir d;
  data::shard_write(d / data::shard_name("fineweb", "val", 0), std::vector<uint16_t>{256, 'a'}, ShardTokenizer::BYTES);
  data::shard_write(d / data::shard_name("fineweb", "train", 1), std::vector<uint16_t>{50256, 1});
  try {
    data::shard_folder_read(d.path(), "fineweb");
    FAIL() << "a byte val shard beside a GPT-2 train shard was read as one set";
  } catch (const DataError& e) {
    expect_contains(e.what(), {"fineweb_val_000000.bin", "bytes", "fineweb_train_000001.bin", "gpt2", "two sets"});
  }
}

TEST(ByteShards, PrepareCliAndInspect) {
  TempDir d;
  write_file(d / "in.txt", "First Citizen:\nBefore we proceed any further, hear me speak.\n");
  const RunResult p = run_dion_data({"prepare", (d / "in.txt").string(), "-o", (d / "out").string(), "--tokenizer",
                                     "byte", "--val-fraction", "0", "-q"},
                                    RunOptions{"", {"DION_GPT2_DIR="}, ""});
  ASSERT_EQ(p.exit_code, 0) << p.err;  // no GPT-2 files needed
  const fs::path shard = d / "out" / data::shard_name("fineweb", "train", 0);
  ASSERT_TRUE(fs::exists(shard)) << p.err;
  // inspect reads the tokenizer from the header: vocabulary 257, text decoded without GPT-2 files.
  const RunResult i =
      run_dion_data({"inspect", shard.string(), "--head", "15"}, RunOptions{"", {"DION_GPT2_DIR="}, ""});
  ASSERT_EQ(i.exit_code, 0) << i.err;
  expect_contains(i.out, {"tokenizer  bytes (vocabulary 257; tokens checked < 257)", "documents (<|endoftext|>) 1",
                          "decoded    \"<|endoftext|>First Citizen:\""});
  // A byte shard's id 300 is out of its vocabulary (a GPT-2 reader would take it).
  write_file(d / "bad.bin", shard_with_slot3({256, 'a', 300}, 1));
  const RunResult bad = run_dion_data({"inspect", (d / "bad.bin").string()});
  EXPECT_EQ(bad.exit_code, 1);
  expect_contains(bad.err, {"bad.bin", "token 300", "< 257"});
  // GPT-2 shards still inspect as before (vocabulary 50257).
  write_file(d / "g.bin", shard_bytes({50256, 15496}));
  const RunResult g = run_dion_data({"inspect", (d / "g.bin").string()});
  ASSERT_EQ(g.exit_code, 0) << g.err;
  expect_contains(g.out, {"tokenizer  gpt2 (vocabulary 50257"});
  // encode --tokenizer byte: one id per byte.
  const RunResult e = run_dion_data({"encode", "--tokenizer", "byte"}, "Hi\n");
  ASSERT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, "72 105 10\n");
}

}  // namespace
}  // namespace dion::test
