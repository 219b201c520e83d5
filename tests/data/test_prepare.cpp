// tests/data/test_prepare.cpp — text -> shards: the token stream is EOT + tokens per
// document, shards are cut and named as the reference does, the val fraction routes whole
// documents, the thread count does not change the output, and a failure leaves the output folder
// as it was (no shard, no temporary).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>

#include "dion/data/error.h"
#include "dion/data/prepare.h"
#include "dion/data/shard.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::DataError;
using data::Gpt2Tokenizer;

// All tokens of the shards in `result`, in shard order, and per split.
std::vector<uint16_t> read_tokens(const std::vector<data::ShardInfo>& shards, const std::string& split = "") {
  std::vector<uint16_t> all;
  for (const auto& s : shards) {
    if (!split.empty() && s.split != split) continue;
    const auto f = data::ShardFile::open(s.path);
    all.insert(all.end(), f.tokens().begin(), f.tokens().end());
  }
  return all;
}

// EOT + ids for each document.
std::vector<uint16_t> expected_stream(Gpt2Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<uint16_t> out;
  for (const auto& d : docs) {
    out.push_back(Gpt2Tokenizer::kEndOfText);
    for (uint32_t id : tok.encode_ordinary(d)) out.push_back(static_cast<uint16_t>(id));
  }
  return out;
}

std::vector<std::string> documents_text(int n) {
  std::vector<std::string> docs;
  for (int i = 0; i < n; ++i) {
    std::string d = "Document " + std::to_string(i) + ":";
    for (int j = 0; j <= i % 7; ++j) d += " naïve café 🙂 it's line " + std::to_string(j) + "\n";
    docs.push_back(d);
  }
  return docs;
}

data::PrepareResult prepare(const Gpt2Tokenizer& tok, const std::vector<std::string>& inputs,
                            data::PrepareOptions options, const std::string& delimiter = "") {
  auto source = data::document_source_open(inputs, delimiter);
  return data::prepare_shards(tok, *source, options);
}

TEST(Prepare, ReferenceLayoutFirstShardIsVal) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  const auto docs = documents_text(1);
  write_file(in / "a.txt", docs[0]);
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 10;
  const auto r = prepare(tok, {(in / "a.txt").string()}, o);
  const auto want = expected_stream(tok, docs);
  ASSERT_EQ(read_tokens(r.shards), want);
  ASSERT_EQ(r.shards.size(), (want.size() + 9) / 10);
  for (size_t i = 0; i < r.shards.size(); ++i) {
    EXPECT_EQ(r.shards[i].path.filename(),
              data::shard_name("fineweb", i == 0 ? "val" : "train", static_cast<int64_t>(i)));
    EXPECT_EQ(r.shards[i].tokens, i + 1 < r.shards.size() ? 10 : static_cast<int64_t>(want.size() - 10 * i));
  }
  EXPECT_EQ(r.documents, 1u);
  EXPECT_EQ(r.tokens, want.size());
  EXPECT_EQ(r.val_tokens, 10u);
  EXPECT_EQ(list_dir(out.path()).size(), r.shards.size());  // no temporaries left
}

TEST(Prepare, FilesAndFoldersInSortedOrderHiddenSkipped) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  fs::create_directories(in / "dir/sub");
  fs::create_directories(in / "dir/.hidden");
  write_file(in / "first.txt", "first file");
  write_file(in / "dir/b.txt", "bee");
  write_file(in / "dir/a.txt", "ay");
  write_file(in / "dir/sub/c.txt", "sea");
  write_file(in / "dir/.secret", "hidden");
  write_file(in / "dir/.hidden/x.txt", "hidden");
  write_file(in / "dir/empty.txt", "");  // an empty document is skipped
  data::PrepareOptions o;
  o.output_dir = out.path();
  const auto r = prepare(tok, {(in / "first.txt").string(), (in / "dir").string()}, o);
  EXPECT_EQ(read_tokens(r.shards), expected_stream(tok, {"first file", "ay", "bee", "sea"}));
  EXPECT_EQ(r.documents, 4u);
  ASSERT_EQ(r.shards.size(), 1u);
  EXPECT_EQ(r.shards[0].split, "val");
}

TEST(Prepare, DelimiterSplitsAcrossReadBlocks) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  // > 2 MiB of documents so that delimiters straddle the reader's 1 MiB blocks.
  std::vector<std::string> docs;
  std::string text;
  const std::string delim = "\n\n<DOC>\n\n";
  for (int i = 0; text.size() < (5u << 19); ++i) {
    std::string d = "doc " + std::to_string(i) + " " + std::string(static_cast<size_t>(i * 37 % 3001), 'x');
    docs.push_back(d);
    text += d + delim;
    if (i % 50 == 0) text += delim;  // an empty document: skipped
  }
  write_file(in / "all.txt", text);
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 100000;
  const auto r = prepare(tok, {(in / "all.txt").string()}, o, delim);
  EXPECT_EQ(r.documents, docs.size());
  EXPECT_EQ(read_tokens(r.shards), expected_stream(tok, docs));
}

TEST(Prepare, ThreadCountDoesNotChangeTheOutput) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out1, out3;
  const auto docs = documents_text(300);
  std::string text;
  for (const auto& d : docs) text += d + "@@";
  write_file(in / "docs.txt", text);
  data::PrepareOptions o;
  o.shard_size = 777;
  o.output_dir = out1.path();
  o.threads = 1;
  const auto r1 = prepare(tok, {(in / "docs.txt").string()}, o, "@@");
  o.output_dir = out3.path();
  o.threads = 3;
  const auto r3 = prepare(tok, {(in / "docs.txt").string()}, o, "@@");
  EXPECT_EQ(read_tokens(r1.shards), expected_stream(tok, docs));
  EXPECT_EQ(read_tokens(r3.shards), read_tokens(r1.shards));
  EXPECT_EQ(list_dir(out1.path()), list_dir(out3.path()));
}

TEST(Prepare, ValFractionRoutesWholeDocuments) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  const auto docs = documents_text(400);
  std::string text;
  for (const auto& d : docs) text += d + "@@";
  write_file(in / "docs.txt", text);
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 5000;
  o.val_fraction = 0.1;
  const auto r = prepare(tok, {(in / "docs.txt").string()}, o, "@@");
  const auto val = read_tokens(r.shards, "val"), train = read_tokens(r.shards, "train");
  EXPECT_EQ(val.size() + train.size(), r.tokens);
  EXPECT_EQ(val.size(), r.val_tokens);
  const double frac = static_cast<double>(val.size()) / static_cast<double>(r.tokens);
  EXPECT_NEAR(frac, 0.1, 0.02);
  // Every stream starts at a document boundary, and the documents partition the input.
  ASSERT_FALSE(val.empty());
  EXPECT_EQ(val.front(), Gpt2Tokenizer::kEndOfText);
  EXPECT_EQ(train.front(), Gpt2Tokenizer::kEndOfText);
  EXPECT_EQ(std::count(val.begin(), val.end(), Gpt2Tokenizer::kEndOfText) +
                std::count(train.begin(), train.end(), Gpt2Tokenizer::kEndOfText),
            400);
  // Names: one sequence in the order shards filled up; the numbers are unique.
  std::set<std::string> numbers;
  for (const auto& s : r.shards) {
    const std::string name = s.path.filename().string();
    EXPECT_TRUE(name.starts_with("fineweb_" + s.split + "_")) << name;
    numbers.insert(name.substr(name.size() - 10, 6));
  }
  EXPECT_EQ(numbers.size(), r.shards.size());
}

TEST(Prepare, ExistingShardsNeedOverwrite) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  write_file(in / "a.txt", "hello there, general kenobi");
  write_file(out / "fineweb_train_000009.bin", shard_bytes({1, 2, 3}));
  write_file(out / "notes.txt", "keep me");
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 4;
  try {
    prepare(tok, {(in / "a.txt").string()}, o);
    FAIL() << "no error for existing shards";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("already has 1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--overwrite"), std::string::npos) << msg;
  }
  EXPECT_EQ(list_dir(out.path()), (std::vector<std::string>{"fineweb_train_000009.bin", "notes.txt"}));
  o.overwrite = true;
  const auto r = prepare(tok, {(in / "a.txt").string()}, o);
  auto names = list_dir(out.path());
  EXPECT_EQ(std::count(names.begin(), names.end(), "fineweb_train_000009.bin"), 0);  // old removed
  EXPECT_EQ(std::count(names.begin(), names.end(), "notes.txt"), 1);
  EXPECT_EQ(names.size(), r.shards.size() + 1);
}

// A source that fails after a few documents, as a disk error or a bad file would.
class FailingSource : public data::DocumentSource {
 public:
  bool next(std::string& doc) override {
    if (n_ == 5) throw DataError("input fake.txt: read failed: Input/output error");
    doc = "document number " + std::to_string(n_++) + " with some words in it";
    return true;
  }
  uint64_t bytes_read() const override { return 0; }
  uint64_t bytes_total() const override { return 0; }

 private:
  int n_ = 0;
};

TEST(Prepare, FailureOrCancelLeavesTheFolderAsItWas) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir out;
  write_file(out / "notes.txt", "keep me");
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 3;  // several shards would be complete before the failure
  FailingSource failing;
  EXPECT_THROW(data::prepare_shards(tok, failing, o), DataError);
  EXPECT_EQ(list_dir(out.path()), std::vector<std::string>{"notes.txt"});

  TempDir in;
  write_file(in / "a.txt", "some text");
  o.should_stop = [] { return true; };
  try {
    prepare(tok, {(in / "a.txt").string()}, o);
    FAIL() << "no error when cancelled";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("interrupted"), std::string::npos) << e.what();
  }
  EXPECT_EQ(list_dir(out.path()), std::vector<std::string>{"notes.txt"});
}

TEST(Prepare, BadInputsAndOptionsAreRefusedUpFront) {
  DION_REQUIRE_TOKENIZER(tok);
  TempDir in, out;
  fs::create_directories(in / "emptydir");
  write_file(in / "empty.txt", "");
  write_file(in / "ok.txt", "fine");
  fs::create_symlink(in / "nowhere", in / "dangling");
  auto open_error = [&](const std::vector<std::string>& inputs) -> std::string {
    try {
      (void)data::document_source_open(inputs, "");
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(open_error({(in / "missing.txt").string()}).find("missing.txt"), std::string::npos);
  EXPECT_NE(open_error({(in / "emptydir").string()}).find("no files"), std::string::npos);
  EXPECT_NE(open_error({in.path().string()}).find("broken symbolic link"), std::string::npos);
  EXPECT_NE(open_error({}).find("no input"), std::string::npos);
  EXPECT_NE(open_error({"-", "-"}).find("twice"), std::string::npos);

  auto prepare_error = [&](const data::PrepareOptions& o, const std::string& input) -> std::string {
    try {
      prepare(tok, {input}, o);
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  };
  data::PrepareOptions o;
  o.output_dir = out.path();
  EXPECT_NE(prepare_error(o, (in / "empty.txt").string()).find("no documents"), std::string::npos);
  o.shard_size = 0;
  EXPECT_NE(prepare_error(o, (in / "ok.txt").string()).find("shard size 0"), std::string::npos);
  o.shard_size = 10;
  o.val_fraction = 1.0;
  EXPECT_NE(prepare_error(o, (in / "ok.txt").string()).find("val fraction 1"), std::string::npos);
  o.val_fraction = -1;
  o.output_dir = in / "ok.txt" / "sub";
  EXPECT_NE(prepare_error(o, (in / "ok.txt").string()).find("cannot create"), std::string::npos);
  EXPECT_TRUE(list_dir(out.path()).empty());
}

TEST(Prepare, TinyShakespeareShardsHoldTiktokensIds) {
  DION_REQUIRE_TOKENIZER(tok);
  const fs::path input = data_file("tinyshakespeare/input.txt");
  const auto want = nlohmann::json::parse(read_file(source_dir() / "tests/vectors/tokenizer/tinyshakespeare.json"));
  TempDir out;
  data::PrepareOptions o;
  o.output_dir = out.path();
  o.shard_size = 100000;
  o.threads = 2;
  const auto r = prepare(tok, {input.string()}, o);
  const auto tokens = read_tokens(r.shards);
  ASSERT_EQ(tokens.size(), want["tokens"].get<size_t>() + 1);
  EXPECT_EQ(tokens[0], Gpt2Tokenizer::kEndOfText);
  const std::vector<uint32_t> ids(tokens.begin() + 1, tokens.end());
  EXPECT_EQ(fmt_hex(fnv1a64_ids(ids)), want["ids_fnv1a64"].get<std::string>());
  EXPECT_EQ(r.shards.size(), 4u);
}

}  // namespace
}  // namespace dion::test
