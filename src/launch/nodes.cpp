// src/launch/nodes.cpp — multi-node flags and the restart loop (dion/launch/nodes.h).
#include "dion/launch/nodes.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <stdexcept>

namespace dion::launch {

namespace {

int parse_flag_int(const std::string& flag, const std::string& text, int lo, int hi, const std::string& what) {
  const bool digits = !text.empty() && text.size() <= 9 && text.find_first_not_of("0123456789") == std::string::npos;
  const int v = digits ? std::stoi(text) : -1;
  if (!digits || v < lo || v > hi)
    throw std::invalid_argument(flag + ": '" + text + "' is not " + what + "; valid: an integer in [" +
                                std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

// Removes `--name V` / `--name=V` from argv; the last one wins. Nothing when absent.
std::optional<std::string> take(std::vector<std::string>& argv, const std::string& name) {
  std::optional<std::string> value;
  const std::string flag = "--" + name;
  for (size_t i = 1; i < argv.size();) {
    size_t erase = 0;
    if (argv[i] == flag) {
      if (i + 1 >= argv.size()) throw std::invalid_argument(flag + ": needs a value");
      value = argv[i + 1];
      erase = 2;
    } else if (argv[i].rfind(flag + "=", 0) == 0) {
      value = argv[i].substr(flag.size() + 1);
      erase = 1;
    } else {
      ++i;
      continue;
    }
    argv.erase(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.begin() + static_cast<std::ptrdiff_t>(i + erase));
  }
  return value;
}

void say(const LaunchOptions& o, const std::string& text) {
  const std::string line = o.name + " node " + std::to_string(o.node_rank) + ": " + text + "\n";
  [[maybe_unused]] const ssize_t n = ::write(o.err_fd, line.data(), line.size());
}

}  // namespace

const std::vector<LauncherFlag>& launcher_flags() {
  static const std::vector<LauncherFlag> flags = {
      {"--nproc", "N", "start N local processes (ranks) of this command line, as torchrun does"},
      {"--nproc_per_node", "N", "the same as --nproc (torchrun's name)"},
      {"--nnodes", "M", "the job runs on M nodes (each node runs its own dion-train --nproc N)"},
      {"--node_rank", "K", "this node's index in [0, M); its ranks are K*N .. K*N + N - 1"},
      {"--master_addr", "HOST", "node 0's host name or address (where rank 0's TCPStore listens)"},
      {"--master_port", "P", "rank 0's TCPStore port (attempt A of a restarted job uses P + A)"},
      {"--max_restarts", "R", "restart every local rank up to R times after a failed attempt"},
      {"--standalone", "", "one node on a free local port (torchrun's --standalone)"},
      {"--cpu_bind", "cores|none", "cores: pin each local rank to its own physical cores (default none)"},
  };
  return flags;
}

std::string launcher_help() {
  std::string out = "\nLauncher flags (taken before the keys above; docs/train.md, \"Launching\" and \"Multi-node\"):\n";
  for (const LauncherFlag& f : launcher_flags()) {
    std::string head = "  " + f.name + (f.value.empty() ? "" : " " + f.value);
    head.resize(std::max<size_t>(head.size() + 2, 26), ' ');
    out += head + f.help + "\n";
  }
  return out;
}

NodeFlags take_node_flags(std::vector<std::string>& argv) {
  NodeFlags f;
  for (size_t i = 1; i < argv.size();) {
    if (argv[i] == "--standalone") {
      f.standalone = true;
      argv.erase(argv.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (auto v = take(argv, "nnodes")) f.nnodes = parse_flag_int("--nnodes", *v, 1, 1024, "a number of nodes");
  if (auto v = take(argv, "node_rank")) f.node_rank = parse_flag_int("--node_rank", *v, 0, 1023, "a node rank");
  if (auto v = take(argv, "master_port")) f.master_port = parse_flag_int("--master_port", *v, 1, 65535, "a TCP port");
  if (auto v = take(argv, "max_restarts"))
    f.max_restarts = parse_flag_int("--max_restarts", *v, 0, 1000, "a number of restarts");
  if (auto v = take(argv, "master_addr")) {
    if (v->empty()) throw std::invalid_argument("--master_addr: needs a host name or address (node 0's)");
    f.master_addr = *v;
  }
  if (auto v = take(argv, "cpu_bind")) {
    if (*v != "cores" && *v != "none")
      throw std::invalid_argument("--cpu_bind: '" + *v + "' is not a binding; valid: cores, none");
    f.cpu_bind = *v;
  }
  return f;
}

void apply_node_flags(const NodeFlags& f, LaunchOptions& o) {
  o.nnodes = f.nnodes.value_or(1);
  o.node_rank = f.node_rank.value_or(0);
  if (o.node_rank >= o.nnodes)
    throw std::invalid_argument("--node_rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                                std::to_string(o.nnodes) + "; valid: 0 to " + std::to_string(o.nnodes - 1));
  if (f.standalone && (o.nnodes > 1 || f.master_addr || f.master_port))
    throw std::invalid_argument(
        "--standalone is one node on a free local port: not with --nnodes > 1, "
        "--master_addr or --master_port");
  const char* env_addr = std::getenv("MASTER_ADDR");
  if (o.nnodes > 1 && !f.master_addr && !(env_addr && *env_addr))
    throw std::invalid_argument("--nnodes " + std::to_string(o.nnodes) +
                                " needs --master_addr HOST (node 0's address, the same on every node)");
  if (f.master_addr) o.master_addr = *f.master_addr;
  o.max_restarts = f.max_restarts.value_or(0);
  o.bind_cores = f.cpu_bind == "cores";
  if (f.master_port) {
    o.master_port = *f.master_port;
  } else if (const char* p = std::getenv("MASTER_PORT"); p && *p) {
    o.master_port = parse_flag_int("MASTER_PORT (environment)", p, 1, 65535, "a TCP port");
  } else if (o.nnodes > 1) {
    o.master_port = 29500;  // torchrun's default: every node must agree, a free local port would not
  }
  if (o.master_port > 0 && o.master_port + o.max_restarts > 65535)
    throw std::invalid_argument("--master_port " + std::to_string(o.master_port) + " + --max_restarts " +
                                std::to_string(o.max_restarts) + " is past 65535 (attempt A uses port P + A)");
}

int run_attempts(LaunchOptions o) {
  const int base_port = o.master_port;  // 0: one node, a free port each attempt
  for (int attempt = 0;; ++attempt) {
    o.restart_count = attempt;
    if (base_port > 0) o.master_port = base_port + attempt;
    const auto t0 = std::chrono::steady_clock::now();
    const LaunchResult r = launch(o);
    if (r.exit_code == 0 || r.signal != 0 || o.max_restarts == 0) return r.exit_code;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string failed =
        "attempt " + std::to_string(attempt) + " failed after " + std::to_string(static_cast<int>(secs)) + " s (rank " +
        std::to_string(o.node_rank * o.nproc + r.first_failed_rank) + " exit code " + std::to_string(r.exit_code) + ")";
    if (r.exit_code == 2) {
      say(o, failed + ": a configuration error, not restarted");
      return r.exit_code;
    }
    if (attempt >= o.max_restarts) {
      say(o, failed + "; no restarts left (--max_restarts " + std::to_string(o.max_restarts) + ")");
      return r.exit_code;
    }
    say(o, failed + "; every local rank stopped; restart " + std::to_string(attempt + 1) + " of " +
               std::to_string(o.max_restarts) +
               (base_port > 0 ? " at MASTER_PORT " + std::to_string(base_port + attempt + 1) : std::string()) +
               ", resuming from the last complete checkpoint");
  }
}

}  // namespace dion::launch
