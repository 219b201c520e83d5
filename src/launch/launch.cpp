// src/launch/launch.cpp — the local launcher (dion/launch/launch.h).
//
// One thread: fork + execve each child (the environment and the --cpu_bind CPU sets are built
// before fork, so the child runs only async-signal-safe calls before exec), then a poll() loop
// over the children's stdout and stderr pipes and a self-pipe the signal handlers write to,
// reaping children with waitpid(WNOHANG) every round. Not here: parsing dion-train's own flags
// (main.cpp).
#include "dion/launch/launch.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>

extern char** environ;

namespace dion::launch {

namespace {

// ---------------------------------------------------------------------------- helpers

void write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the reader is gone: nothing sensible to do with the text
    done += static_cast<size_t>(n);
  }
}

// A free TCP port on the loopback interface (the kernel picks it; the first rank binds it again).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    throw std::runtime_error(std::string("cannot open a socket to find a free port: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw std::runtime_error(std::string("cannot find a free port for MASTER_PORT: ") + std::strerror(err));
  return ntohs(addr.sin_port);
}

int parse_int(const std::string& text, int lo, int hi) {  // -1 when not an integer in [lo, hi]
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int v = std::stoi(text);
  return v >= lo && v <= hi ? v : -1;
}

const char* env_or_null(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// The environment of rank `rank`: ours, then everything else of the launcher's but the keys we set.
// `cores`: the physical cores the rank is bound to (--cpu_bind cores), 0 when not bound.
std::vector<std::string> child_environment(int local, const LaunchOptions& o, const std::string& addr, int port,
                                           int cores) {
  const int nproc = o.nproc, rank = o.node_rank * o.nproc + local, world = o.nnodes * o.nproc;
  const std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(nproc)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"ROLE_NAME", "default"},
      {"MASTER_ADDR", addr},
      {"MASTER_PORT", std::to_string(port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(o.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)}};
  std::vector<std::string> env;
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  if (!env_or_null("OMP_NUM_THREADS")) {  // torchrun sets 1; we share the cores out instead
    const unsigned hw = std::thread::hardware_concurrency();
    const unsigned n = cores > 0 ? static_cast<unsigned>(cores) : hw / static_cast<unsigned>(nproc);
    env.push_back("OMP_NUM_THREADS=" + std::to_string(std::max(1u, n)));  // bound: one thread a core
  }
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& kv : ours) replaced = replaced || kv.first == key;
    if (!replaced) env.push_back(entry);
  }
  return env;
}

// ---------------------------------------------------------------------------- --cpu_bind cores

struct CpuSetFree {
  void operator()(cpu_set_t* set) const { CPU_FREE(set); }
};
using CpuSet = std::unique_ptr<cpu_set_t, CpuSetFree>;  // CPU_ALLOC'd: a machine may have over 1024 CPUs

// The CPUs this process may run on (sched_getaffinity, with a set as large as the kernel's).
std::vector<int> allowed_cpus(const std::string& me) {
  for (int n = CPU_SETSIZE;; n *= 2) {
    const CpuSet set(CPU_ALLOC(n));
    const size_t size = CPU_ALLOC_SIZE(n);
    if (set && ::sched_getaffinity(0, size, set.get()) == 0) {
      std::vector<int> cpus;
      for (int c = 0; c < static_cast<int>(size * 8); ++c)
        if (CPU_ISSET_S(c, size, set.get())) cpus.push_back(c);
      return cpus;
    }
    const int err = set ? errno : ENOMEM;
    if (err != EINVAL || n >= (1 << 22))  // EINVAL: the kernel's set is larger
      throw std::runtime_error(me +
                               "--cpu_bind cores: cannot read the CPUs this process may run on: " + std::strerror(err));
  }
}

// /sys/devices/system/cpu/cpuK/topology/<name>, or nothing when it is missing or unreadable.
std::optional<long> topology(int cpu, const char* name) {
  std::ifstream f("/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + name);
  long v = 0;
  if (f >> v) return v;
  return std::nullopt;
}

struct Binding {          // one local rank's share
  std::vector<int> cpus;  // sorted
  int cores = 0;
};

// The physical cores this process may run on, ordered by (package, core id), each with its allowed
// hardware threads (a CPU without a readable topology is a core of its own): local rank r gets
// cores [r*C/N, (r+1)*C/N). Throws when there are fewer cores than ranks.
std::vector<Binding> core_shares(int nproc, const std::string& me) {
  const std::vector<int> cpus = allowed_cpus(me);
  std::map<std::tuple<int, long, long>, std::vector<int>> cores;  // (0, package, core id) or (1, cpu, 0)
  for (int c : cpus) {
    const std::optional<long> package = topology(c, "physical_package_id"), core = topology(c, "core_id");
    cores[package && core ? std::make_tuple(0, *package, *core) : std::make_tuple(1, long{c}, 0L)].push_back(c);
  }
  const int64_t n = nproc, count = static_cast<int64_t>(cores.size());
  if (count < n)
    throw std::runtime_error(me + "--cpu_bind cores: " + std::to_string(n) + " ranks but this process may run on " +
                             std::to_string(count) + (count == 1 ? " core" : " cores") + " (CPUs " + cpu_ranges(cpus) +
                             "); use --nproc " + std::to_string(count) + " or fewer, or --cpu_bind none");
  std::vector<Binding> out(static_cast<size_t>(nproc));
  auto core = cores.begin();
  for (int64_t r = 0; r < n; ++r) {
    Binding& b = out[static_cast<size_t>(r)];
    for (int64_t k = r * count / n; k < (r + 1) * count / n; ++k, ++core, ++b.cores)
      b.cpus.insert(b.cpus.end(), core->second.begin(), core->second.end());
    std::sort(b.cpus.begin(), b.cpus.end());
  }
  return out;
}

// ---------------------------------------------------------------------------- signals

int g_signal_pipe_w = -1;  // the handlers' end of the self-pipe

void on_signal(int signo) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(signo);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe_w, &b, 1);
  errno = saved;
}

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP};

// Installs the forwarding handlers for its lifetime; restores the previous ones after.
class SignalForwarding {
 public:
  SignalForwarding() {
    if (::pipe2(fds_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw std::runtime_error(std::string("cannot create a pipe: ") + std::strerror(errno));
    g_signal_pipe_w = fds_[1];
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &sa, &old_[i]);
  }
  ~SignalForwarding() {
    for (size_t i = 0; i < std::size(kForwarded); ++i) ::sigaction(kForwarded[i], &old_[i], nullptr);
    g_signal_pipe_w = -1;
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  int read_fd() const { return fds_[0]; }

 private:
  int fds_[2] = {-1, -1};
  struct sigaction old_[std::size(kForwarded)]{};
};

// ---------------------------------------------------------------------------- one child

struct Stream {  // one child's stdout or stderr
  int fd = -1;   // read end; -1 once closed
  int dest = -1;
  std::string partial;  // text after the last newline
};

struct Child {
  pid_t pid = -1;
  bool running = false;
  Stream streams[2];
};

// Writes every complete line of `s.partial` with the prefix (all of it at EOF or when a line
// grows past 64 KiB without a newline).
void flush_lines(Stream& s, const std::string& prefix, bool all) {
  size_t start = 0;
  for (size_t nl; (nl = s.partial.find('\n', start)) != std::string::npos; start = nl + 1)
    write_all(s.dest, prefix + s.partial.substr(start, nl + 1 - start));
  s.partial.erase(0, start);
  if (!s.partial.empty() && (all || s.partial.size() > 65536)) {
    write_all(s.dest, prefix + s.partial + "\n");
    s.partial.clear();
  }
}

}  // namespace

// ---------------------------------------------------------------------------- public

std::string cpu_ranges(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0, j = 0; i < cpus.size(); i = ++j) {
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) + (j > i ? "-" + std::to_string(cpus[j]) : "");
  }
  return out;
}

std::optional<int> take_nproc_flag(std::vector<std::string>& argv) {
  std::optional<int> n;
  for (size_t i = 1; i < argv.size();) {
    std::string value;
    size_t erase = 0;
    if (argv[i] == "--nproc" || argv[i] == "--nproc_per_node") {  // torchrun's name, an alias
      if (i + 1 >= argv.size())
        throw std::invalid_argument("--nproc: needs a value (the number of processes, 1 to 1024)");
      value = argv[i + 1];
      erase = 2;
    } else if (argv[i].rfind("--nproc=", 0) == 0 || argv[i].rfind("--nproc_per_node=", 0) == 0) {
      value = argv[i].substr(argv[i].find('=') + 1);
      erase = 1;
    } else {
      ++i;
      continue;
    }
    const int v = parse_int(value, 1, 1024);
    if (v < 0)
      throw std::invalid_argument("--nproc: '" + value +
                                  "' is not a number of processes; valid: an integer in [1, 1024]");
    n = v;
    argv.erase(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.begin() + static_cast<std::ptrdiff_t>(i + erase));
  }
  return n;
}

LaunchResult launch(const LaunchOptions& o) {
  const std::string me = o.nnodes > 1 ? o.name + " node " + std::to_string(o.node_rank) + ": " : o.name + " --nproc: ";
  if (o.nproc < 1)
    throw std::runtime_error(me + "the number of processes must be at least 1, got " + std::to_string(o.nproc));
  if (o.argv.empty()) throw std::runtime_error(me + "no command line to run");
  for (const char* var : {"RANK", "WORLD_SIZE"})
    if (env_or_null(var))
      throw std::runtime_error(me + var + "=" + std::getenv(var) +
                               " is set: this process was started by a launcher already (torchrun?); use either "
                               "torchrun or --nproc, not both");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw std::runtime_error(me + "node_rank " + std::to_string(o.node_rank) +
                             " is not in [0, nnodes = " + std::to_string(o.nnodes) + ")");
  const std::vector<Binding> bindings = o.bind_cores ? core_shares(o.nproc, me) : std::vector<Binding>();
  int port = o.master_port;
  if (port > 0) {
  } else if (const char* p = env_or_null("MASTER_PORT")) {
    port = parse_int(p, 1, 65535);
    if (port < 0)
      throw std::runtime_error(me + "environment variable MASTER_PORT='" + p +
                               "' is invalid: it must be an integer in [1, 65535]");
  } else {
    port = free_port();
  }
  const std::string addr = !o.master_addr.empty()       ? o.master_addr
                           : env_or_null("MASTER_ADDR") ? std::getenv("MASTER_ADDR")
                                                        : "127.0.0.1";

  // Everything the children need, built before the first fork.
  std::vector<char*> argv;
  for (const std::string& a : o.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::vector<std::string>> envs;
  std::vector<std::vector<char*>> envps;
  for (int r = 0; r < o.nproc; ++r)
    envs.push_back(child_environment(r, o, addr, port, o.bind_cores ? bindings[static_cast<size_t>(r)].cores : 0));
  for (auto& env : envs) {
    envps.emplace_back();
    for (std::string& e : env) envps.back().push_back(e.data());
    envps.back().push_back(nullptr);
  }
  const size_t base = static_cast<size_t>(o.node_rank) * static_cast<size_t>(o.nproc);  // global rank of local 0
  std::vector<CpuSet> cpu_sets;  // --cpu_bind cores: rank r's, each of cpu_set_size bytes
  size_t cpu_set_size = 0;
  if (o.bind_cores) {
    int max_cpu = 0;
    for (const Binding& b : bindings) max_cpu = std::max(max_cpu, b.cpus.back());
    cpu_set_size = CPU_ALLOC_SIZE(max_cpu + 1);
    std::string line = me + "--cpu_bind cores: ";
    for (size_t r = 0; r < bindings.size(); ++r) {
      cpu_sets.emplace_back(CPU_ALLOC(max_cpu + 1));
      if (!cpu_sets.back()) throw std::runtime_error(me + "--cpu_bind cores: out of memory");
      CPU_ZERO_S(cpu_set_size, cpu_sets.back().get());
      for (int c : bindings[r].cpus) CPU_SET_S(c, cpu_set_size, cpu_sets.back().get());
      line += (r ? ", rank " : "rank ") + std::to_string(base + r) + " on CPUs " + cpu_ranges(bindings[r].cpus);
    }
    write_all(o.err_fd, line + "\n");
  }

  SignalForwarding signals;
  LaunchResult res;
  std::vector<Child> children(static_cast<size_t>(o.nproc));
  const pid_t launcher = ::getpid();
  auto kill_all = [&](int signo) {
    for (const Child& c : children)
      if (c.running) ::kill(c.pid, signo);
  };

  for (int r = 0; r < o.nproc; ++r) {
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
      const std::string why = std::strerror(errno);
      kill_all(SIGKILL);
      for (const Child& c : children)
        if (c.running) ::waitpid(c.pid, nullptr, 0);
      throw std::runtime_error(me + "cannot create pipes for rank " + std::to_string(r) + ": " + why);
    }
    const pid_t pid = ::fork();
    if (pid == 0) {  // the child: async-signal-safe calls only until execve
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) ::_exit(137);  // the launcher died before prctl
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      if (o.bind_cores && ::sched_setaffinity(0, cpu_set_size, cpu_sets[static_cast<size_t>(r)].get()) != 0) {
        const char msg[] = "dion-train: --cpu_bind cores: sched_setaffinity failed\n";
        [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof(msg) - 1);
        ::_exit(126);
      }
      ::execve(o.exe.c_str(), argv.data(), envps[static_cast<size_t>(r)].data());
      const char msg[] = "dion-train: execve of the child program failed\n";
      [[maybe_unused]] const ssize_t n = ::write(2, msg, sizeof(msg) - 1);
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    if (pid < 0) {
      const std::string why = std::strerror(errno);
      ::close(out[0]);
      ::close(err[0]);
      kill_all(SIGKILL);
      for (const Child& c : children)
        if (c.running) ::waitpid(c.pid, nullptr, 0);
      throw std::runtime_error(me + "cannot start rank " + std::to_string(r) + ": fork failed: " + why);
    }
    Child& c = children[static_cast<size_t>(r)];
    c.pid = pid;
    c.running = true;
    c.streams[0] = {out[0], o.out_fd, {}};
    c.streams[1] = {err[0], o.err_fd, {}};
    res.pids.push_back(pid);
  }
  res.rank_codes.assign(static_cast<size_t>(o.nproc), 0);

  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> kill_at;      // SIGKILL the rest then
  std::optional<Clock::time_point> drain_until;  // all exited: read what is left until then
  int running = o.nproc;
  auto stop_others = [&](int signo, const std::string& why) {
    if (kill_at) return;
    write_all(o.err_fd, me + why + "\n");
    kill_all(signo);
    kill_at = Clock::now() + o.grace;
  };

  for (;;) {
    std::vector<pollfd> fds = {{signals.read_fd(), POLLIN, 0}};
    std::vector<std::pair<size_t, int>> owners = {{0, 0}};  // (rank, 0 stdout / 1 stderr) of each fd
    for (size_t r = 0; r < children.size(); ++r)
      for (int k = 0; k < 2; ++k)
        if (children[r].streams[k].fd >= 0) {
          fds.push_back({children[r].streams[k].fd, POLLIN, 0});
          owners.emplace_back(r, k);
        }
    if (running == 0 && (fds.size() == 1 || (drain_until && Clock::now() >= *drain_until))) break;
    const int n = ::poll(fds.data(), fds.size(), 50);
    if (n < 0 && errno != EINTR) throw std::runtime_error(me + "poll failed: " + std::strerror(errno));

    if (n > 0 && (fds[0].revents & POLLIN)) {  // a signal to the launcher
      unsigned char b = 0;
      while (::read(fds[0].fd, &b, 1) == 1) {
        if (res.signal == 0) res.signal = b;
      }
      if (res.signal != 0 && !kill_at)
        stop_others(res.signal, "received signal " + std::to_string(res.signal) + " (" + strsignal(res.signal) +
                                    "): forwarded to every rank");
    }
    for (size_t i = 1; n > 0 && i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const auto [rank, k] = owners[i];
      Stream& s = children[rank].streams[k];
      char buf[65536];
      const ssize_t got = ::read(s.fd, buf, sizeof(buf));
      if (got < 0 && errno == EINTR) continue;
      const std::string prefix = "[rank " + std::to_string(base + rank) + "] ";
      if (got > 0) {
        s.partial.append(buf, static_cast<size_t>(got));
        flush_lines(s, prefix, false);
      } else {
        flush_lines(s, prefix, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }

    for (size_t r = 0; r < children.size(); ++r) {  // reap
      Child& c = children[r];
      int status = 0;
      if (!c.running || ::waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
      c.running = false;
      --running;
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      res.rank_codes[r] = code;
      if (code != 0 && res.first_failed_rank < 0 && res.signal == 0 && !kill_at) {
        res.first_failed_rank = static_cast<int>(r);
        const std::string how = WIFEXITED(status) ? "exited with code " + std::to_string(code)
                                                  : std::string("was killed by signal ") + strsignal(WTERMSIG(status));
        stop_others(SIGTERM, "rank " + std::to_string(base + r) + " " + how +
                                 "; stopping the other ranks (SIGTERM, then "
                                 "SIGKILL after " +
                                 std::to_string(o.grace.count()) + " ms)");
      }
    }
    if (running == 0 && !drain_until) drain_until = Clock::now() + std::chrono::milliseconds(500);
    if (kill_at && running > 0 && Clock::now() >= *kill_at) {
      for (size_t r = 0; r < children.size(); ++r)
        if (children[r].running)
          write_all(o.err_fd, me + "rank " + std::to_string(base + r) + " did not stop within " +
                                  std::to_string(o.grace.count()) + " ms: killed (SIGKILL)\n");
      kill_all(SIGKILL);
      kill_at = Clock::time_point::max();  // once
    }
  }
  // Pipes still open past the drain (a grandchild holds them): forward what is buffered, close.
  for (size_t r = 0; r < children.size(); ++r)
    for (Stream& s : children[r].streams) {
      flush_lines(s, "[rank " + std::to_string(base + r) + "] ", true);
      if (s.fd >= 0) ::close(s.fd);
    }

  if (res.signal != 0)
    res.exit_code = 128 + res.signal;
  else if (res.first_failed_rank >= 0)
    res.exit_code = res.rank_codes[static_cast<size_t>(res.first_failed_rank)];
  return res;
}

}  // namespace dion::launch
