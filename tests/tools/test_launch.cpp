// tests/tools/test_launch.cpp — the local launcher of `dion-train --nproc N`
// (src/launch/launch.cpp), with tests/tools/launch_child.cpp as the ranks: no training.
//
// Checks: the environment each rank sees (torchrun's variables, one MASTER_PORT for all), the
// "[rank R] " prefix on every forwarded line of stdout and stderr (a last line without a newline
// included), the first failure's exit code, SIGTERM to the siblings and SIGKILL after the grace
// period for one that ignores SIGTERM, SIGINT / SIGTERM / SIGHUP to the launcher forwarded, and no
// process left behind: every recorded pid is gone (kill(pid, 0) fails with ESRCH) once launch()
// returns, and kill -9 of the launcher takes its children along (PR_SET_PDEATHSIG); --cpu_bind
// cores: disjoint CPU sets covering the test's own, OMP_NUM_THREADS = the rank's cores, and more
// ranks than cores refused before any child starts. No timing assertions: how each rank ended
// (exit code or signal) shows what the launcher did.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dion/launch/launch.h"
#include "dion/launch/nodes.h"

namespace dion::launch {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "dion_launch_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Output files for the launcher's two streams.
struct Outputs {
  explicit Outputs(const TempDir& dir)
      : out_path(dir.path() / "out.txt"),
        err_path(dir.path() / "err.txt"),
        out(::open(out_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644)),
        err(::open(err_path.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644)) {}
  ~Outputs() {
    ::close(out);
    ::close(err);
  }
  fs::path out_path, err_path;
  int out, err;
};

LaunchOptions options(int nproc, std::vector<std::string> args, const Outputs& o) {
  LaunchOptions opt;
  opt.nproc = nproc;
  opt.exe = LAUNCH_CHILD_EXE;
  opt.argv = {"launch_child"};
  opt.argv.insert(opt.argv.end(), args.begin(), args.end());
  opt.out_fd = o.out;
  opt.err_fd = o.err;
  opt.grace = 300ms;
  return opt;
}

void expect_all_gone(const std::vector<pid_t>& pids) {
  for (pid_t pid : pids) {
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << "pid " << pid << " still exists";
    EXPECT_EQ(errno, ESRCH) << "pid " << pid;
  }
}

// Waits (bounded: the test fails rather than hangs) for DIR/ready.0 .. ready.(n-1); their pids.
std::vector<pid_t> wait_ready(const fs::path& dir, int n) {
  std::vector<pid_t> pids;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (int r = 0; r < n; ++r) {
    const fs::path f = dir / ("ready." + std::to_string(r));
    while (!fs::exists(f) && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_TRUE(fs::exists(f)) << "rank " << r << " never became ready";
    pids.push_back(static_cast<pid_t>(std::atoi(read_file(f).c_str())));
  }
  return pids;
}

// launch()'s refusal message, or "(it ran)".
std::string launch_error(const LaunchOptions& opt) {
  try {
    launch(opt);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(it ran)";
}

// Runs launch() in a child process of the test (so that signals to it do not hit the test).
pid_t launch_in_child(const LaunchOptions& opt) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 1;
    try {
      code = launch(opt).exit_code;
    } catch (...) {
    }
    ::_exit(code);
  }
  return pid;
}

TEST(Launch, EveryRankGetsTorchrunsEnvironmentAndPrefixedOutput) {
  TempDir dir;
  Outputs o(dir);
  ::unsetenv("MASTER_PORT");
  ::unsetenv("MASTER_ADDR");
  const LaunchResult res = launch(options(3, {"env"}, o));
  EXPECT_EQ(res.exit_code, 0);
  EXPECT_EQ(res.first_failed_rank, -1);
  ASSERT_EQ(res.pids.size(), 3u);
  EXPECT_EQ(res.rank_codes, std::vector<int>({0, 0, 0}));
  const std::string out = read_file(o.out_path), err = read_file(o.err_path);
  std::set<std::string> ports;
  for (int r = 0; r < 3; ++r) {
    const std::string p = "[rank " + std::to_string(r) + "] ";
    for (const std::string& line :
         {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), std::string("WORLD_SIZE=3"),
          std::string("LOCAL_WORLD_SIZE=3"), std::string("GROUP_RANK=0"), std::string("GROUP_WORLD_SIZE=1"),
          std::string("MASTER_ADDR=127.0.0.1"), std::string("no newline")})
      EXPECT_NE(out.find(p + line + "\n"), std::string::npos) << p + line << " missing in:\n" << out;
    EXPECT_NE(err.find(p + "to stderr\n"), std::string::npos) << err;
    const size_t at = out.find(p + "MASTER_PORT=");
    ASSERT_NE(at, std::string::npos);
    const std::string port = out.substr(at + p.size() + 12, out.find('\n', at) - at - p.size() - 12);
    EXPECT_GE(std::atoi(port.c_str()), 1);
    EXPECT_LE(std::atoi(port.c_str()), 65535);
    ports.insert(port);
  }
  EXPECT_EQ(ports.size(), 1u) << "every rank must see the same MASTER_PORT";
  if (!std::getenv("OMP_NUM_THREADS")) {  // the cores shared out: at least 1 each
    EXPECT_EQ(out.find("OMP_NUM_THREADS=0\n"), std::string::npos) << out;
    EXPECT_NE(out.find("[rank 2] OMP_NUM_THREADS="), std::string::npos) << out;
  }
  EXPECT_EQ(out.find("to stderr"), std::string::npos) << "stderr went to stdout";
  std::istringstream lines(out + err);
  for (std::string line; std::getline(lines, line);)
    EXPECT_EQ(line.rfind("[rank ", 0), 0u) << "an unprefixed line: " << line;
  expect_all_gone(res.pids);
}

TEST(Launch, UserMasterPortIsKeptAndABadOneRefused) {
  TempDir dir;
  Outputs o(dir);
  ::setenv("MASTER_PORT", "29123", 1);
  const LaunchResult res = launch(options(2, {"env"}, o));
  EXPECT_EQ(res.exit_code, 0);
  EXPECT_NE(read_file(o.out_path).find("[rank 1] MASTER_PORT=29123\n"), std::string::npos);
  ::setenv("MASTER_PORT", "70000", 1);
  EXPECT_NE(launch_error(options(2, {"env"}, o)).find("MASTER_PORT='70000' is invalid"), std::string::npos);
  ::unsetenv("MASTER_PORT");
}

TEST(Launch, RefusesToRunUnderAnotherLauncher) {
  TempDir dir;
  Outputs o(dir);
  ::setenv("RANK", "0", 1);
  EXPECT_NE(launch_error(options(2, {"env"}, o)).find("RANK=0 is set"), std::string::npos);
  ::unsetenv("RANK");
  EXPECT_EQ(read_file(o.out_path), "") << "a child started";
}

TEST(Launch, FirstFailureStopsTheOthersAndIsTheExitCode) {
  TempDir dir;
  Outputs o(dir);
  const LaunchResult res = launch(options(3, {"fail", "1", "7", dir.path().string()}, o));
  EXPECT_EQ(res.exit_code, 7);
  EXPECT_EQ(res.first_failed_rank, 1);
  EXPECT_EQ(res.rank_codes, std::vector<int>({128 + SIGTERM, 7, 128 + SIGTERM}));  // siblings: SIGTERM
  const std::string err = read_file(o.err_path);
  EXPECT_NE(err.find("[rank 1] rank 1 fails with 7\n"), std::string::npos) << err;
  EXPECT_NE(err.find("dion-train --nproc: rank 1 exited with code 7; stopping the other ranks"), std::string::npos)
      << err;
  EXPECT_EQ(err.find("SIGKILL)\n"), std::string::npos) << "nobody needed SIGKILL:\n" << err;
  expect_all_gone(res.pids);
}

TEST(Launch, SiblingIgnoringSigtermIsKilledAfterTheGracePeriod) {
  TempDir dir;
  Outputs o(dir);
  const LaunchResult res = launch(options(2, {"stubborn0", "1", "3", dir.path().string()}, o));
  EXPECT_EQ(res.exit_code, 3);
  EXPECT_EQ(res.rank_codes, std::vector<int>({128 + SIGKILL, 3}));
  EXPECT_NE(read_file(o.err_path).find("rank 0 did not stop within 300 ms: killed (SIGKILL)"), std::string::npos)
      << read_file(o.err_path);
  expect_all_gone(res.pids);
}

class LaunchSignal : public ::testing::TestWithParam<int> {};

TEST_P(LaunchSignal, IsForwardedToEveryRankAndIsTheExitCode) {
  const int signo = GetParam();
  TempDir dir;
  Outputs o(dir);
  const pid_t launcher = launch_in_child(options(2, {"hang", dir.path().string()}, o));
  const std::vector<pid_t> pids = wait_ready(dir.path(), 2);
  ::kill(launcher, signo);
  int status = 0;
  ASSERT_EQ(::waitpid(launcher, &status, 0), launcher);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 128 + signo);
  EXPECT_NE(read_file(o.err_path).find("received signal " + std::to_string(signo)), std::string::npos)
      << read_file(o.err_path);
  expect_all_gone(pids);  // the launcher reaped them before it exited
}

INSTANTIATE_TEST_SUITE_P(Signals, LaunchSignal, ::testing::Values(SIGINT, SIGTERM, SIGHUP), [](const auto& info) {
  return std::string(info.param == SIGINT ? "SIGINT" : info.param == SIGTERM ? "SIGTERM" : "SIGHUP");
});

TEST(Launch, KillNineOfTheLauncherTakesItsChildrenAlong) {
  // Orphans are re-parented to this process (not init), so that they can be waited for here.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  TempDir dir;
  Outputs o(dir);
  const pid_t launcher = launch_in_child(options(2, {"stubborn", dir.path().string()}, o));
  const std::vector<pid_t> pids = wait_ready(dir.path(), 2);
  ::kill(launcher, SIGKILL);
  ASSERT_EQ(::waitpid(launcher, nullptr, 0), launcher);
  for (pid_t pid : pids) {  // stubborn: only the parent-death SIGKILL ends them
    int status = 0;
    pid_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while ((got = ::waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    ASSERT_EQ(got, pid) << "rank pid " << pid << " outlived its launcher";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  }
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  expect_all_gone(pids);
}

TEST(Launch, NprocFlagIsTakenOutOfTheCommandLine) {
  std::vector<std::string> a = {"dion-train", "--config", "x.yaml", "--nproc", "4", "--lr", "0.1"};
  EXPECT_EQ(take_nproc_flag(a), 4);
  EXPECT_EQ(a, std::vector<std::string>({"dion-train", "--config", "x.yaml", "--lr", "0.1"}));
  std::vector<std::string> b = {"dion-train", "--nproc=2"};
  EXPECT_EQ(take_nproc_flag(b), 2);
  EXPECT_EQ(b, std::vector<std::string>({"dion-train"}));
  std::vector<std::string> c = {"dion-train", "--lr", "0.1"};
  EXPECT_EQ(take_nproc_flag(c), std::nullopt);
  for (const char* bad : {"0", "-1", "abc", "1.5", "1025", ""}) {
    std::vector<std::string> d = {"dion-train", "--nproc", bad};
    try {
      take_nproc_flag(d);
      ADD_FAILURE() << "--nproc " << bad << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--nproc"), std::string::npos) << e.what();
    }
  }
  std::vector<std::string> e = {"dion-train", "--nproc"};
  EXPECT_THROW(take_nproc_flag(e), std::invalid_argument);
}

// Node 1 of 2 with 2 processes each (nodes.h): ranks 2 and 3 of 4, prefixed with their global rank.
TEST(Launch, NodeKOfMGetsGlobalRanksAndTheNodesEnvironment) {
  TempDir dir;
  Outputs o(dir);
  LaunchOptions opt = options(2, {"env"}, o);
  opt.nnodes = 2;
  opt.node_rank = 1;
  opt.master_addr = "10.1.2.3";
  opt.master_port = 29777;
  opt.restart_count = 1;
  opt.max_restarts = 3;
  const LaunchResult res = launch(opt);
  EXPECT_EQ(res.exit_code, 0);
  const std::string out = read_file(o.out_path);
  for (int local = 0; local < 2; ++local) {
    const std::string p = "[rank " + std::to_string(2 + local) + "] ";
    for (const std::string& line :
         {"RANK=" + std::to_string(2 + local), "LOCAL_RANK=" + std::to_string(local), std::string("WORLD_SIZE=4"),
          std::string("LOCAL_WORLD_SIZE=2"), std::string("GROUP_RANK=1"), std::string("GROUP_WORLD_SIZE=2"),
          std::string("MASTER_ADDR=10.1.2.3"), std::string("MASTER_PORT=29777")})
      EXPECT_NE(out.find(p + line + "\n"), std::string::npos) << p + line << " missing in:\n" << out;
  }
  EXPECT_EQ(out.find("[rank 0] "), std::string::npos) << out;
  opt.node_rank = 2;
  EXPECT_NE(launch_error(opt).find("node_rank 2 is not in [0, nnodes = 2)"), std::string::npos);
}

TEST(Launch, NodeFlagsAreTakenOutAndBadCombinationsRefused) {
  std::vector<std::string> a = {
      "dion-train",     "--nnodes", "2",    "--node_rank=1", "--master_addr",    "h0", "--master_port", "29600",
      "--max_restarts", "2",        "--lr", "0.1",           "--nproc_per_node", "4"};
  EXPECT_EQ(take_nproc_flag(a), 4);
  const NodeFlags f = take_node_flags(a);
  EXPECT_EQ(a, std::vector<std::string>({"dion-train", "--lr", "0.1"}));
  LaunchOptions o;
  apply_node_flags(f, o);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "h0");
  EXPECT_EQ(o.master_port, 29600);
  EXPECT_EQ(o.max_restarts, 2);
  ::unsetenv("MASTER_ADDR");
  ::unsetenv("MASTER_PORT");
  auto refused = [](std::vector<std::string> args, const std::string& want) {
    try {
      LaunchOptions x;
      apply_node_flags(take_node_flags(args), x);
      ADD_FAILURE() << want << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused({"t", "--nnodes", "2", "--node_rank", "2", "--master_addr", "h"}, "--node_rank 2 is not below --nnodes 2");
  refused({"t", "--nnodes", "2"}, "needs --master_addr");
  refused({"t", "--nnodes", "0"}, "--nnodes: '0'");
  refused({"t", "--master_port", "65535", "--max_restarts", "1"}, "past 65535");
  refused({"t", "--standalone", "--nnodes", "2", "--master_addr", "h"}, "--standalone is one node");
  LaunchOptions two;  // two nodes without a port: torchrun's 29500, the same on every node
  std::vector<std::string> t = {"t", "--nnodes", "2", "--master_addr", "h"};
  apply_node_flags(take_node_flags(t), two);
  EXPECT_EQ(two.master_port, 29500);
}

// The table `dion-train --help` prints is the parser's: each flag in it is taken out of a
// command line (with a valid value), and no other word is.
TEST(Launch, EveryLauncherFlagIsParsedAndInTheHelp) {
  const std::string help = launcher_help();
  ASSERT_GE(launcher_flags().size(), 9u);
  for (const LauncherFlag& f : launcher_flags()) {
    SCOPED_TRACE(f.name);
    EXPECT_NE(help.find(f.name + (f.value.empty() ? "" : " " + f.value)), std::string::npos) << help;
    const std::string value = f.name == "--master_addr" ? "h0"
                              : f.name == "--node_rank" ? "0"
                              : f.name == "--cpu_bind"  ? "cores"
                                                        : "2";
    std::vector<std::string> a = {"dion-train", "--lr", "0.1", f.name};
    if (!f.value.empty()) a.push_back(value);
    (void)take_nproc_flag(a);
    (void)take_node_flags(a);
    EXPECT_EQ(a, std::vector<std::string>({"dion-train", "--lr", "0.1"}));
  }
  std::vector<std::string> other = {"dion-train", "--nnodez", "2", "--nproc_per", "1"};
  const std::vector<std::string> before = other;
  (void)take_nproc_flag(other);
  (void)take_node_flags(other);
  EXPECT_EQ(other, before);
}

// The CPUs this process may run on.
std::set<int> own_cpus() {
  const int n = 1 << 14;
  cpu_set_t* set = CPU_ALLOC(n);
  std::set<int> cpus;
  if (set && ::sched_getaffinity(0, CPU_ALLOC_SIZE(n), set) == 0)
    for (int c = 0; c < n; ++c)
      if (CPU_ISSET_S(c, CPU_ALLOC_SIZE(n), set)) cpus.insert(c);
  CPU_FREE(set);
  return cpus;
}

// The physical cores among `cpus` (sysfs's package and core id; a CPU without them is one core).
size_t count_cores(const std::set<int>& cpus) {
  std::set<std::string> cores;
  for (int c : cpus) {
    const fs::path t = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology";
    std::ifstream package(t / "physical_package_id"), core(t / "core_id");
    long p = 0, k = 0;
    cores.insert(package >> p && core >> k ? std::to_string(p) + "/" + std::to_string(k) : "cpu" + std::to_string(c));
  }
  return cores.size();
}

// The value of "[rank R] KEY=" in the launcher's stdout ("" when absent).
std::string rank_value(const std::string& out, int rank, const std::string& key) {
  const std::string head = "[rank " + std::to_string(rank) + "] " + key + "=";
  const size_t at = out.find(head);
  if (at == std::string::npos) return "";
  return out.substr(at + head.size(), out.find('\n', at) - at - head.size());
}

TEST(Launch, CpuRangesFormatsASortedListAsRanges) {
  EXPECT_EQ(cpu_ranges({0, 1, 2, 3, 8, 9, 10, 11}), "0-3,8-11");
  EXPECT_EQ(cpu_ranges({0}), "0");
  EXPECT_EQ(cpu_ranges({0, 2, 3, 5}), "0,2-3,5");
  EXPECT_EQ(cpu_ranges({}), "");
}

// Two ranks bound to cores: each sees its own non-empty CPUs (together the test's), OMP_NUM_THREADS
// its core count, and the launcher says where each runs.
TEST(Launch, CpuBindCoresGivesEachRankItsOwnCores) {
  TempDir dir;
  Outputs o(dir);
  const std::optional<std::string> omp =
      std::getenv("OMP_NUM_THREADS") ? std::optional<std::string>(std::getenv("OMP_NUM_THREADS")) : std::nullopt;
  ::unsetenv("OMP_NUM_THREADS");
  ::unsetenv("MASTER_PORT");
  LaunchOptions opt = options(2, {"cpus"}, o);
  opt.bind_cores = true;
  std::optional<LaunchResult> res;
  std::string refused;
  try {
    res = launch(opt);
  } catch (const std::runtime_error& e) {
    refused = e.what();
  }
  if (omp) ::setenv("OMP_NUM_THREADS", omp->c_str(), 1);
  if (refused.find("may run on 1 core ") != std::string::npos) GTEST_SKIP() << refused;
  ASSERT_TRUE(res) << refused;
  EXPECT_EQ(res->exit_code, 0);
  const std::string out = read_file(o.out_path), err = read_file(o.err_path);
  const std::set<int> own = own_cpus();
  std::set<int> all;
  std::string line = "dion-train --nproc: --cpu_bind cores: ";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    std::set<int> cpus;
    std::istringstream list(rank_value(out, r, "CPUS"));
    for (std::string c; std::getline(list, c, ',');) cpus.insert(std::atoi(c.c_str()));
    EXPECT_FALSE(cpus.empty()) << out;
    for (int c : cpus) {
      EXPECT_TRUE(own.count(c)) << "CPU " << c << " is not the test's";
      EXPECT_TRUE(all.insert(c).second) << "CPU " << c << " given to two ranks";
    }
    EXPECT_EQ(rank_value(out, r, "OMP_NUM_THREADS"), std::to_string(count_cores(cpus))) << out;
    line += (r ? ", rank " : "rank ") + std::to_string(r) + " on CPUs " +
            cpu_ranges(std::vector<int>(cpus.begin(), cpus.end()));
  }
  EXPECT_EQ(all, own) << "every core is shared out";
  EXPECT_NE(err.find(line + "\n"), std::string::npos) << line << " missing in:\n" << err;
  expect_all_gone(res->pids);

  opt.nnodes = 2;  // node 1 of 2 binds its own ranks, 2 and 3
  opt.node_rank = 1;
  opt.master_addr = "10.1.2.3";
  opt.master_port = 29777;
  opt.argv = {"launch_child", "env"};
  EXPECT_EQ(launch(opt).exit_code, 0);
  EXPECT_NE(read_file(o.err_path).find("dion-train node 1: --cpu_bind cores: rank 2 on CPUs "), std::string::npos)
      << read_file(o.err_path);
}

TEST(Launch, CpuBindCoresRefusesMoreRanksThanCoresBeforeAnyChildStarts) {
  TempDir dir;
  Outputs o(dir);
  LaunchOptions opt = options(static_cast<int>(own_cpus().size()) + 1, {"env"}, o);
  opt.bind_cores = true;
  const std::string error = launch_error(opt);
  EXPECT_NE(error.find("dion-train --nproc: --cpu_bind cores: "), std::string::npos) << error;
  EXPECT_NE(error.find("or --cpu_bind none"), std::string::npos) << error;
  EXPECT_EQ(read_file(o.out_path), "") << "a child started";
  EXPECT_EQ(read_file(o.err_path), "") << "a child started";
}

TEST(Launch, CpuBindFlagIsTakenOutAndABadValueRefused) {
  std::vector<std::string> a = {"dion-train", "--cpu_bind", "cores", "--lr", "0.1"};
  NodeFlags f = take_node_flags(a);
  EXPECT_EQ(a, std::vector<std::string>({"dion-train", "--lr", "0.1"}));
  EXPECT_EQ(f.cpu_bind, "cores");
  EXPECT_TRUE(f.any()) << "a launcher flag: needs --nproc";
  LaunchOptions o;
  apply_node_flags(f, o);
  EXPECT_TRUE(o.bind_cores);
  std::vector<std::string> b = {"dion-train", "--cpu_bind=none"};
  f = take_node_flags(b);
  EXPECT_EQ(b, std::vector<std::string>({"dion-train"}));
  EXPECT_EQ(f.cpu_bind, "none");
  apply_node_flags(f, o);
  EXPECT_FALSE(o.bind_cores);
  std::vector<std::string> c = {"dion-train", "--lr", "0.1"};
  EXPECT_EQ(take_node_flags(c).cpu_bind, std::nullopt);
  for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
           {"t", "--cpu_bind", "sockets"}, {"t", "--cpu_bind=Cores"}, {"t", "--cpu_bind="}, {"t", "--cpu_bind"}}) {
    std::vector<std::string> args = bad;
    try {
      take_node_flags(args);
      ADD_FAILURE() << bad.back() << ": accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("--cpu_bind"), std::string::npos) << e.what();
    }
  }
  std::vector<std::string> d = {"t", "--cpu_bind", "sockets"};
  try {
    take_node_flags(d);
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()), "--cpu_bind: 'sockets' is not a binding; valid: cores, none");
  }
}

}  // namespace
}  // namespace dion::launch
