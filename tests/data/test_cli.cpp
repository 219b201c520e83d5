// tests/data/test_cli.cpp — the dion-data program end to end: --help everywhere,
// prepare + inspect on real text, a download from the local server, and the exit code and
// message of each kind of bad input (the message names the file and what is wrong).
#include <gtest/gtest.h>

#include "http_server.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;

std::string gpt2_dir() { return data_file("gpt2").string(); }

void expect_contains(const std::string& text, const std::vector<std::string>& parts) {
  for (const auto& p : parts) EXPECT_NE(text.find(p), std::string::npos) << "\"" << p << "\" not in:\n" << text;
}

TEST(Cli, HelpForEverySubcommand) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cmds = {
      {"prepare", {"--output-dir", "--shard-size", "--val-fraction", "--delimiter", "--tokenizer"}},
      {"inspect", {"--head", "--top", "--vocab-size"}},
      {"download", {"--dataset", "--chunks", "--base-url", "--attempts", "fineweb100B"}},
      {"encode", {"--special", "--count"}},
  };
  for (const auto& [cmd, flags] : cmds) {
    const RunResult r = run_dion_data({cmd, "--help"});
    EXPECT_EQ(r.exit_code, 0) << cmd;
    expect_contains(r.out, flags);
  }
  const RunResult top = run_dion_data({"--help"});
  EXPECT_EQ(top.exit_code, 0);
  expect_contains(top.out, {"prepare", "inspect", "download", "encode"});
  EXPECT_NE(run_dion_data({}).exit_code, 0);  // a subcommand is required
  EXPECT_NE(run_dion_data({"prepare", "--no-such-flag"}).exit_code, 0);
}

TEST(Cli, PrepareThenInspect) {
  (void)gpt2_tokenizer();  // data/gpt2 must be there: a missing file fails, naming it
  TempDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "Paragraph " + std::to_string(i) + ": the quick brown fox.\n\n";
  write_file(dir / "in.txt", text);
  const RunResult p = run_dion_data({"prepare", (dir / "in.txt").string(), "-o", (dir / "out").string(), "--tokenizer",
                                     gpt2_dir(), "--shard-size", "200", "--delimiter", "\\n\\n", "--threads", "2"});
  ASSERT_EQ(p.exit_code, 0) << p.err;
  expect_contains(p.err, {"from 50 documents", "MB/s", "tokens/s", "fineweb_val_000000.bin"});
  const auto names = list_dir(dir / "out");
  ASSERT_GE(names.size(), 2u);
  EXPECT_EQ(names[0], "fineweb_train_000001.bin");
  EXPECT_EQ(names.back(), "fineweb_val_000000.bin");

  const RunResult i = run_dion_data(
      {"inspect", (dir / "out/fineweb_val_000000.bin").string(), "--tokenizer", gpt2_dir(), "--head", "6"});
  ASSERT_EQ(i.exit_code, 0) << i.err;
  expect_contains(i.out, {"magic 20240520, version 1, 200 tokens", "= 1024 + 2 x count: ok", "unique",
                          "documents (<|endoftext|>)", "top", "first 6", "\"<|endoftext|>Paragraph 0: the\""});

  // Preparing into the same folder again is refused; --overwrite replaces.
  const RunResult again =
      run_dion_data({"prepare", (dir / "in.txt").string(), "-o", (dir / "out").string(), "--tokenizer", gpt2_dir()});
  EXPECT_EQ(again.exit_code, 1);
  expect_contains(again.err, {"already has", "--overwrite"});
  const RunResult over = run_dion_data({"prepare", (dir / "in.txt").string(), "-o", (dir / "out").string(),
                                        "--tokenizer", gpt2_dir(), "--overwrite", "-q"});
  EXPECT_EQ(over.exit_code, 0) << over.err;
  expect_contains(over.err, {"no train shards"});  // one 50-document file in one val shard
  EXPECT_EQ(list_dir(dir / "out"), std::vector<std::string>{"fineweb_val_000000.bin"});
}

TEST(Cli, PrepareFromStdinAndEncode) {
  (void)gpt2_tokenizer();  // data/gpt2 must be there: a missing file fails, naming it
  TempDir dir;
  const RunResult p = run_dion_data({"prepare", "-", "-o", dir.path().string(), "--tokenizer", gpt2_dir(), "--prefix",
                                     "tiny", "--val-fraction", "0.5", "--delimiter", "|"},
                                    "one|two|three|four");
  ASSERT_EQ(p.exit_code, 0) << p.err;
  const auto names = list_dir(dir.path());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_TRUE(names[0].starts_with("tiny_train_")) << names[0];
  EXPECT_TRUE(names[1].starts_with("tiny_val_")) << names[1];

  const RunResult e = run_dion_data({"encode", "--tokenizer", gpt2_dir()}, "Hello world");
  EXPECT_EQ(e.exit_code, 0) << e.err;
  EXPECT_EQ(e.out, "15496 995\n");
  const RunResult s = run_dion_data({"encode", "--special", "--tokenizer", gpt2_dir()}, "<|endoftext|>");
  EXPECT_EQ(s.out, "50256\n");
}

TEST(Cli, InspectReportsEachKindOfCorruption) {
  TempDir dir;
  const std::vector<uint16_t> tokens{50256, 15496, 995};
  const std::string good = shard_bytes(tokens);
  write_file(dir / "good.bin", good);
  write_file(dir / "magic.bin", shard_bytes(tokens, 42));
  write_file(dir / "version.bin", shard_bytes(tokens, 20240520, 3));
  write_file(dir / "truncated.bin", good.substr(0, good.size() - 2));
  write_file(dir / "vocab.bin", shard_bytes({1, 2, 60000}));
  fs::create_directories(dir / "folder.bin");
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"magic.bin", {"bad magic 42", "expected 20240520"}}, {"version.bin", {"unsupported version 3"}},
      {"truncated.bin", {"truncated", "3 tokens"}},         {"vocab.bin", {"token 60000 at index 2", "< 50257"}},
      {"missing.bin", {"cannot open", "No such file"}},     {"folder.bin", {"not a regular file"}},
  };
  for (const auto& [name, expect] : cases) {
    const RunResult r = run_dion_data({"inspect", (dir / name).string()});
    EXPECT_EQ(r.exit_code, 1) << name;
    expect_contains(r.err, expect);
    expect_contains(r.err, {(dir / name).string(), "dion-data: error:"});
  }
  // A good file among bad ones is still inspected; the exit code reports the bad one.
  const RunResult mixed = run_dion_data({"inspect", (dir / "good.bin").string(), (dir / "magic.bin").string()});
  EXPECT_EQ(mixed.exit_code, 1);
  expect_contains(mixed.out, {"good.bin", "3 tokens"});
  expect_contains(mixed.err, {"1 of 2 files failed"});
  const RunResult wide = run_dion_data({"inspect", (dir / "vocab.bin").string(), "--vocab-size", "65536"});
  EXPECT_EQ(wide.exit_code, 0) << wide.err;
}

TEST(Cli, PrepareErrorsLeaveNoShards) {
  TempDir dir;
  const RunResult no_tok = run_dion_data({"prepare", "-", "-o", (dir / "out").string()}, "text");
  EXPECT_EQ(no_tok.exit_code, 1);
  expect_contains(no_tok.err, {"--tokenizer", "DION_GPT2_DIR", "encoder.json"});
  const RunResult bad_tok =
      run_dion_data({"prepare", "-", "-o", (dir / "out").string(), "--tokenizer", (dir / "nope").string()}, "text");
  EXPECT_EQ(bad_tok.exit_code, 1);
  expect_contains(bad_tok.err, {(dir / "nope/encoder.json").string(), "cannot open"});
  {
    const RunResult missing = run_dion_data(
        {"prepare", (dir / "missing.txt").string(), "-o", (dir / "out").string(), "--tokenizer", gpt2_dir()});
    EXPECT_EQ(missing.exit_code, 1);
    expect_contains(missing.err, {"input", (dir / "missing.txt").string(), "No such file"});
  }
  EXPECT_FALSE(fs::exists(dir / "out") && !list_dir(dir / "out").empty());
  const RunResult range = run_dion_data({"prepare", "-", "-o", (dir / "out").string(), "--shard-size", "0"});
  EXPECT_NE(range.exit_code, 0);
  expect_contains(range.err, {"--shard-size"});
}

TEST(Cli, DownloadFromLocalServer) {
  TestHttpServer server;
  TempDir dir;
  const std::string val = shard_bytes({50256, 1, 2}), t1 = shard_bytes({50256, 3}), t2 = shard_bytes({50256, 4, 5, 6});
  server.add_file("/repo/fineweb_val_000000.bin", val);
  server.add_file("/repo/fineweb_train_000001.bin", t1, {.cut_after = 1000, .cut_times = 1});
  server.add_file("/repo/fineweb_train_000002.bin", t2);
  const std::vector<std::string> args = {
      "download",  "--chunks", "2", "-o", dir.path().string(), "--base-url", server.base_url() + "/repo",
      "--backoff", "0.01"};
  const RunResult r = run_dion_data(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_contains(r.err, {"3 downloaded, 0 already present"});
  EXPECT_EQ(read_file(dir / "fineweb_train_000001.bin"), t1);
  EXPECT_EQ(list_dir(dir.path()).size(), 3u);
  const RunResult again = run_dion_data(args);
  EXPECT_EQ(again.exit_code, 0) << again.err;
  expect_contains(again.err, {"0 downloaded, 3 already present"});

  const RunResult missing = run_dion_data({"download", "--chunks", "3", "-o", dir.path().string(), "--base-url",
                                           server.base_url() + "/repo", "--backoff", "0.01"});
  EXPECT_EQ(missing.exit_code, 1);
  expect_contains(missing.err, {"fineweb_train_000003.bin", "HTTP 404"});
  const RunResult unknown = run_dion_data({"download", "--dataset", "nope"});
  EXPECT_EQ(unknown.exit_code, 2);  // a bad command line (docs/data.md), before any transfer
  expect_contains(unknown.err, {"unknown dataset \"nope\"", "fineweb10B"});
}

// Every --flag docs/data.md's `dion-data ...` sections name is a flag dion-data has (the README
// once said --gpt2-dir, which dion-data rejects; its data section has since moved there).
TEST(Cli, DocsNameOnlyRealFlags) {
  std::string help;
  for (const char* cmd : {"prepare", "inspect", "download", "encode", "finish-swap"}) help += run_dion_data({cmd, "--help"}).out;
  auto section = [](const std::string& text, const std::string& start, const std::string& end) {
    std::string out;
    for (size_t pos = text.find(start); pos != std::string::npos; pos = text.find(start, pos + 1)) {
      const size_t stop = text.find(end, pos + start.size());
      out += text.substr(pos, stop == std::string::npos ? std::string::npos : stop - pos);
    }
    return out;
  };
  const std::string docs = section(read_file(source_dir() / "docs/data.md"), "\n## `dion-data", "\n## ");
  ASSERT_NE(docs.find("dion-data prepare"), std::string::npos);
  size_t checked = 0;
  for (size_t pos = docs.find("--"); pos != std::string::npos; pos = docs.find("--", pos + 2)) {
    size_t end = pos + 2;
    while (end < docs.size() && (std::isalnum(static_cast<unsigned char>(docs[end])) || docs[end] == '-')) ++end;
    const std::string flag = docs.substr(pos, end - pos);
    if (flag.size() < 4 || !std::isalpha(static_cast<unsigned char>(flag[2]))) continue;
    EXPECT_NE(help.find(flag), std::string::npos) << flag << " is in the docs but not a dion-data flag";
    ++checked;
  }
  EXPECT_GT(checked, 20u);
}

// The tokenizer folder is `--tokenizer DIR` everywhere, as in dion-data: the scripts and
// benchmarks that once took `--gpt2-dir` (scripts/make_tokenizer_vectors.py,
// bench/tokenizer/compare.py, bench_tokenizer) and the docs naming them do not any more.
// (docs/errors.md keeps the old name in its history row; this file names it here.)
TEST(Cli, NoProgramOrDocTakesGpt2Dir) {
  const std::filesystem::path root = source_dir();
  std::vector<std::filesystem::path> files = {root / "README.md"};
  for (const char* dir : {"bench", "scripts", "docs", "tools", "examples"})
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / dir))
      if (entry.is_regular_file() && entry.path().filename() != "errors.md") files.push_back(entry.path());
  ASSERT_GT(files.size(), 10u);
  const std::string old_flag = std::string("--") + "gpt2-dir";
  for (const auto& file : files)
    EXPECT_EQ(read_file(file).find(old_flag), std::string::npos)
        << file << " still names " << old_flag << ": the flag is --tokenizer (as dion-data)";
}

}  // namespace
}  // namespace dion::test
