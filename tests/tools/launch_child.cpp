// tests/tools/launch_child.cpp — the child program of test_launch.cpp: what one rank does under
// the launcher of `dion-train --nproc N`, chosen by argv, so that the launcher is tested without
// training.
//
//   launch_child env                       print the launcher's variables (stdout), one line to
//                                          stderr, then a last line without a newline; exit 0
//   launch_child fail R CODE DIR           rank R waits for DIR/ready.<other ranks> files, then
//                                          exits CODE; the others run `hang DIR`
//   launch_child hang DIR                  write DIR/ready.<rank> (holding the pid), then wait
//                                          forever (default SIGTERM: dies of it)
//   launch_child stubborn DIR              as hang, but ignoring SIGTERM (only SIGKILL ends it)
//   launch_child stubborn0 R CODE DIR      rank 0 stubborn, rank R fails as `fail`, others hang
//   launch_child cpus                      print CPUS=<the CPUs it may run on, "0,1,...">
//                                          (sched_getaffinity) and OMP_NUM_THREADS; exit 0
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

int rank() { return std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "-1"); }
int world() { return std::atoi(std::getenv("WORLD_SIZE") ? std::getenv("WORLD_SIZE") : "0"); }

[[noreturn]] void hang(const std::string& dir, bool ignore_term) {
  ::alarm(60);  // a launcher that fails to stop this rank fails its test instead of hanging it
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  {
    const std::string tmp = dir + "/.ready." + std::to_string(rank());
    std::ofstream(tmp) << ::getpid() << "\n";
    std::filesystem::rename(tmp, dir + "/ready." + std::to_string(rank()));  // whole or absent
  }
  std::printf("rank %d ready\n", rank());
  std::fflush(stdout);
  for (;;) ::pause();
}

int fail_after_others(int code, const std::string& dir) {
  for (int r = 0; r < world(); ++r)  // the test's deadline bounds this wait
    while (r != rank() && !std::filesystem::exists(dir + "/ready." + std::to_string(r)))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::fprintf(stderr, "rank %d fails with %d\n", rank(), code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "env") {
    for (const char* v : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                          "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"})
      std::printf("%s=%s\n", v, std::getenv(v) ? std::getenv(v) : "(unset)");
    std::fflush(stdout);
    std::fprintf(stderr, "to stderr\n");
    std::printf("no newline");
    return 0;
  }
  if (mode == "cpus") {
    const int n = 1 << 14;
    cpu_set_t* set = CPU_ALLOC(n);
    if (!set || ::sched_getaffinity(0, CPU_ALLOC_SIZE(n), set) != 0) return 98;
    std::string cpus;
    for (int c = 0; c < n; ++c)
      if (CPU_ISSET_S(c, CPU_ALLOC_SIZE(n), set)) cpus += (cpus.empty() ? "" : ",") + std::to_string(c);
    CPU_FREE(set);
    std::printf("CPUS=%s\nOMP_NUM_THREADS=%s\n", cpus.c_str(),
                std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "(unset)");
    return 0;
  }
  if (mode == "hang" && argc == 3) hang(argv[2], false);
  if (mode == "stubborn" && argc == 3) hang(argv[2], true);
  if ((mode == "fail" || mode == "stubborn0") && argc == 5) {
    if (rank() == std::atoi(argv[2])) return fail_after_others(std::atoi(argv[3]), argv[4]);
    hang(argv[4], mode == "stubborn0" && rank() == 0);
  }
  std::fprintf(stderr, "launch_child: bad arguments (see tests/tools/launch_child.cpp)\n");
  return 99;
}
