// tests/train/train_test_util.cpp — helpers of the dion-train tests (train_test_util.h).
#include "train_test_util.h"
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "dion/data/prepare.h"
#include "dion/data/tokenizer.h"
#include "dion/train/fs_util.h"
#include "../support/free_port.h"

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

TempDir::~TempDir() { remove_tree(path_); }

std::vector<std::string> later_wins(const std::vector<std::string>& args) {
  // Entries: a "--key" (or "--key=value") with the value after it when that is not a key; any
  // other word stands alone (and stays, for dion-train to refuse).
  std::vector<std::vector<std::string>> entries;
  for (size_t i = 0; i < args.size(); ++i) {
    const bool key = args[i].rfind("--", 0) == 0;
    entries.push_back({args[i]});
    if (key && args[i].find('=') == std::string::npos && i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0)
      entries.back().push_back(args[++i]);
  }
  auto key_of = [](const std::vector<std::string>& e) {
    return e[0].rfind("--", 0) == 0 ? e[0].substr(0, e[0].find('=')) : std::string();
  };
  std::vector<std::string> out;
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::string key = key_of(entries[i]);
    bool overridden = false;
    for (size_t j = i + 1; j < entries.size() && !key.empty() && !overridden; ++j)
      overridden = key_of(entries[j]) == key;
    if (!overridden) out.insert(out.end(), entries[i].begin(), entries[i].end());
  }
  return out;
}

namespace {
// posix_spawn under a lowered soft RLIMIT_FSIZE: the child inherits the limit; the parent's is
// restored at once (the tests spawn from one thread).
pid_t spawn_limited(const char* exe, posix_spawn_file_actions_t* fa, char* const* argv, char* const* envp,
                    int64_t fsize_limit) {
  rlimit saved{};
  ::getrlimit(RLIMIT_FSIZE, &saved);
  if (fsize_limit > 0) {
    rlimit lower = saved;
    lower.rlim_cur = rlim_t(fsize_limit);
    if (::setrlimit(RLIMIT_FSIZE, &lower) != 0) return -1;
  }
  pid_t pid = -1;
  if (posix_spawn(&pid, exe, fa, nullptr, argv, envp) != 0) pid = -1;
  if (fsize_limit > 0) ::setrlimit(RLIMIT_FSIZE, &saved);
  return pid;
}
}  // namespace

int spawn_train(const std::vector<std::string>& given, const fs::path& output, int64_t fsize_limit) {
  const std::vector<std::string> args = later_wins(given);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<std::string> all = {DION_TRAIN_EXE};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = spawn_limited(DION_TRAIN_EXE, &fa, argv.data(), environ, fsize_limit);
  posix_spawn_file_actions_destroy(&fa);
  return int(pid);
}

ProcResult run_train(const std::vector<std::string>& args) { return run_train_limited(args, 0); }

ProcResult run_train_limited(const std::vector<std::string>& args, int64_t fsize_limit) {
  const fs::path out_file =
      fs::temp_directory_path() / ("dion_train_out." + std::to_string(::getpid()) + "." + std::to_string(std::rand()));
  ProcResult r;
  const pid_t pid = spawn_train(args, out_file, fsize_limit);
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

namespace {
using dion::testing::free_port;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

std::vector<ProcResult> run_train_ranks(int world, const std::vector<std::string>& args, const RankOptions& o) {
  const int deadline_s = o.deadline_s, kill_rank = o.kill_rank;
  const int port = free_port();
  const std::string tag = std::to_string(::getpid()) + "." + std::to_string(std::rand());
  std::vector<fs::path> outs;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    outs.push_back(fs::temp_directory_path() / ("dion_train_rank" + std::to_string(r) + "." + tag));
    std::vector<std::string> env_text = {"RANK=" + std::to_string(r),           "LOCAL_RANK=" + std::to_string(r),
                                         "WORLD_SIZE=" + std::to_string(world), "MASTER_ADDR=127.0.0.1",
                                         "MASTER_PORT=" + std::to_string(port), "OMP_NUM_THREADS=1"};
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key != "RANK" && key != "LOCAL_RANK" && key != "WORLD_SIZE" && key != "MASTER_ADDR" && key != "MASTER_PORT" &&
          key != "OMP_NUM_THREADS")
        env_text.push_back(kv);
    }
    std::vector<char*> envp;
    for (std::string& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, outs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    std::vector<std::string> mine = args;
    if (r == 0) mine.insert(mine.end(), o.rank0_extra.begin(), o.rank0_extra.end());
    std::vector<std::string> all = {DION_TRAIN_EXE};
    for (const std::string& a : later_wins(mine)) all.push_back(a);
    std::vector<char*> argv;
    for (std::string& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid =
        spawn_limited(DION_TRAIN_EXE, &fa, argv.data(), envp.data(), r == o.fsize_limit_rank ? o.fsize_limit : 0);
    posix_spawn_file_actions_destroy(&fa);
    pids.push_back(pid);
  }
  std::vector<ProcResult> res(world);
  std::vector<bool> done(world, false);
  for (int r = 0; r < world; ++r)
    if (pids[r] < 0) {
      done[r] = true;
      res[r].output = "posix_spawn failed";
    }
  bool killed = kill_rank < 0;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::count(done.begin(), done.end(), false) > 0) {
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (!done[r] && ::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        res[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        done[r] = true;
      }
    }
    if (!killed && !done[kill_rank] && o.kill_when(read_file(outs[0]))) {
      ::kill(pids[kill_rank], SIGKILL);
      killed = true;
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(deadline_s)) {
      for (int r = 0; r < world; ++r)
        if (!done[r]) {
          ::kill(pids[r], SIGKILL);
          ::waitpid(pids[r], nullptr, 0);
          res[r].exit_code = -1;
          done[r] = true;
        }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < world; ++r) {
    res[r].output = read_file(outs[r]);
    fs::remove(outs[r]);
  }
  return res;
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
    // null (what the JSON writer makes of NaN and inf) reads as NaN.
    auto number = [&](const char* key) {
      return j.contains(key) && j.at(key).is_number() ? j.at(key).get<double>() : std::nan("");
    };
    if (r.kind == "train") {
      r.loss = number("loss");
      r.lr = j.at("lr");
      r.grad_norm = number("grad_norm");
      r.skipped = j.value("skipped", false);
    } else {
      r.loss = number("val_loss");
    }
    out.push_back(r);
  }
  return out;
}

bool is_empty_or_missing(const fs::path& dir) {
  std::error_code ec;
  return !fs::exists(dir, ec) || fs::is_empty(dir, ec);
}

std::vector<std::string> tiny_parallel_run(const std::filesystem::path& data, const std::filesystem::path& run_dir,
                                           int steps) {
  // clang-format off
  return {"--data_dir", data.string(), "--run_dir", run_dir.string(), "--model_dim", "64", "--n_layer", "2",
          "--n_head", "2", "--sequence_length", "64", "--batch_size", "4", "--device_batch_size", "1",
          "--val_tokens", "256", "--val_loss_every", "0", "--num_iterations", std::to_string(steps),
          "--warmup_ratio", "0", "--dtype", "fp32", "--optimizer", "muon", "--scalar_opt", "adamw", "--lr", "0.02",
          "--log_every", "1", "--comm_timeout_s", "60"};
  // clang-format on
}

std::vector<std::string> layout_flags(int dp, int fs, int tp) {
  return {"--dp_size", std::to_string(dp), "--fs_size", std::to_string(fs), "--tp_size", std::to_string(tp)};
}

void expect_all_ok(const std::vector<ProcResult>& rs) {
  for (size_t r = 0; r < rs.size(); ++r) EXPECT_EQ(rs[r].exit_code, 0) << "rank " << r << ":\n" << rs[r].output;
}

void expect_close(const std::vector<Record>& ref, const std::vector<Record>& got, const std::string& what) {
  ASSERT_FALSE(got.empty()) << what;
  double worst = 0;
  for (const Record& g : got) {
    const Record* e = nullptr;
    for (const Record& r : ref)
      if (r.kind == g.kind && r.step == g.step) e = &r;
    ASSERT_NE(e, nullptr) << what << ": no reference " << g.kind << " record at step " << g.step;
    const double rel = std::abs(g.loss - e->loss) / std::abs(e->loss);
    const double tol = g.kind == "train" && g.step == 0   ? kStep0Tol
                       : g.kind == "train" && g.step == 1 ? kStep1Tol
                                                          : kTol;
    EXPECT_LE(rel, tol) << what << ": " << g.kind << " step " << g.step << " loss " << g.loss << " vs " << e->loss;
    worst = std::max(worst, rel);
  }
  std::printf("%-40s %zu records, max relative difference %.2g\n", what.c_str(), got.size(), worst);
}

}  // namespace dion::train::test
