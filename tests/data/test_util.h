// tests/data/test_util.h — what the data tools' tests share: where the data is, a
// self-removing temporary folder, file helpers, hand-made shard bytes, and running dion-data.
//
// The tests never touch the network beyond 127.0.0.1 (see http_server.h) and never need
// tiktoken: expected ids are committed under tests/vectors/tokenizer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dion/data/tokenizer.h"

namespace dion::test {

// The repo root, and the repository's data/ ($DION_DATA_DIR overrides the configured path).
std::filesystem::path source_dir();
std::filesystem::path data_dir();
// data_dir() / relative; throws (the test fails, naming the file) when it is missing.
std::filesystem::path data_file(const std::string& relative);
// The GPT-2 files of data/gpt2, loaded once (throws naming the file when one is missing); copy
// it to get a private cache.
const data::Gpt2Tokenizer& gpt2_tokenizer();
#define DION_REQUIRE_TOKENIZER(tok) dion::data::Gpt2Tokenizer tok(dion::test::gpt2_tokenizer())

// A fresh folder under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);
// The names of the files in `dir` (not recursive), sorted.
std::vector<std::string> list_dir(const std::filesystem::path& dir);

// Shard bytes built by hand (not by the library under test): the header ints given, then the
// tokens. Defaults make a valid shard.
std::string shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic = 20240520, int32_t version = 1,
                        int64_t count = INT64_MIN);  // INT64_MIN: tokens.size()

// FNV-1a 64 of the ids as uint32 little-endian (the hash in tinyshakespeare.json).
uint64_t fnv1a64_ids(const std::vector<uint32_t>& ids);
uint64_t fnv1a64(const std::string& bytes);
// 16 lowercase hex digits.
std::string fmt_hex(uint64_t v);

// Runs the dion-data tool with `args` (stdin from `stdin_data`), waits, and returns the exit
// code (128 + N when killed by signal N; 124 when it ran past 120 s, i.e. hung) with stdout and
// stderr.
struct RunResult {
  int exit_code = -1;
  std::string out, err;
};
struct RunOptions {
  std::string stdin_data;
  std::vector<std::string> env;  // "NAME=value" for the tool's environment
  std::string shell_prefix;      // shell text run first, e.g. "ulimit -f 100;"
};
RunResult run_dion_data(const std::vector<std::string>& args, const std::string& stdin_data = "");
RunResult run_dion_data(const std::vector<std::string>& args, const RunOptions& options);

// dion-data started in the background (stdin /dev/null, output to files), for signals and
// concurrency. The destructor kills it (SIGKILL) if it is still running.
class Background {
 public:
  explicit Background(const std::vector<std::string>& args);
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  int pid() const { return pid_; }
  void signal(int sig);
  RunResult wait();  // exit code as run_dion_data's

 private:
  TempDir io_;
  int pid_ = -1;
};

}  // namespace dion::test
