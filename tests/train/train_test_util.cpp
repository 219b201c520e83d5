// tests/train/train_test_util.cpp — helpers of the dion-train tests (train_test_util.h).
#include "train_test_util.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "dion/data/prepare.h"
#include "dion/data/tokenizer.h"
#include "dion/train/fs_util.h"

extern char** environ;

namespace dion::train::test {

namespace fs = std::filesystem;

fs::path source_dir() { return DION_SOURCE_DIR; }
fs::path gpt2_dir() { return source_dir() / "data" / "gpt2"; }

TempDir::TempDir(const std::string& tag) {
  std::string templ = (fs::temp_directory_path() / ("dion_train_" + tag + ".XXXXXX")).string();
  if (!::mkdtemp(templ.data())) throw std::runtime_error("mkdtemp failed");
  path_ = templ;
}

TempDir::~TempDir() {
  remove_tree(path_);
}

int spawn_train(const std::vector<std::string>& args, const fs::path& output) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<std::string> all = {DION_TRAIN_EXE};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, DION_TRAIN_EXE, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? int(pid) : -1;
}

ProcResult run_train(const std::vector<std::string>& args) {
  const fs::path out_file = fs::temp_directory_path() / ("dion_train_out." + std::to_string(::getpid()) + "." +
                                                          std::to_string(std::rand()));
  ProcResult r;
  const pid_t pid = spawn_train(args, out_file);
  if (pid < 0) {
    r.output = "posix_spawn failed";
    return r;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(out_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  fs::remove(out_file);
  return r;
}

fs::path shakespeare_shards(const fs::path& dir, int64_t shard_size) {
  if (fs::exists(dir / "fineweb_val_000000.bin")) return dir;
  data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::from_dir(gpt2_dir());
  auto source = data::document_source_open({(source_dir() / "data" / "tinyshakespeare" / "input.txt").string()}, "");
  data::PrepareOptions o;
  o.output_dir = dir;
  o.shard_size = shard_size;
  data::prepare_shards(tok, *source, o);
  return dir;
}

std::vector<Record> read_metrics(const fs::path& file) {
  std::vector<Record> out;
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    Record r;
    r.kind = j.at("kind");
    r.step = j.at("step");
    r.tokens = j.at("tokens");
    if (r.kind == "train") {
      r.loss = j.at("loss");
      r.lr = j.at("lr");
    } else {
      r.loss = j.at("val_loss");
    }
    out.push_back(r);
  }
  return out;
}

bool is_empty_or_missing(const fs::path& dir) {
  std::error_code ec;
  return !fs::exists(dir, ec) || fs::is_empty(dir, ec);
}

}  // namespace dion::train::test
