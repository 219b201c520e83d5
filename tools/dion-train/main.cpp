// tools/dion-train/main.cpp — `dion-train`: train the reference's GPT with a dion optimizer,
// plot runs, sample text from a checkpoint (docs/train.md).
//
//   dion-train [--config FILE.yaml] [--key value ...]        train (src/train/trainer.cpp)
//   dion-train --nproc N [--config FILE.yaml] [...]          N local processes (src/launch)
//   dion-train --nnodes M --node_rank K --nproc N --master_addr HOST0 [--master_port P]
//              [--max_restarts R] [...]                     node K of a multi-node job (nodes.cpp)
//   dion-train plot RUN_DIR... -o curves.png                  python3 tools/dion-train/plot.py
//   dion-train sample --checkpoint DIR --prompt TEXT [...]    generate text (sample.cpp)
//   dion-train export --checkpoint DIR [-o FILE]              weights as safetensors (export.cpp)
//
// Exit codes: 0 done, 1 bad data / checkpoint / failure, 2 bad configuration or flags.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dion/errors.h"
#include "dion/launch/launch.h"
#include "dion/launch/nodes.h"
#include "dion/train/checkpoint.h"
#include "dion/train/config.h"
#include "dion/train/loader.h"
#include "dion/train/trainer.h"
#include "export.h"
#include "sample.h"
#include "test_hooks.h"

#ifndef DION_TRAIN_PLOT_SCRIPT
#define DION_TRAIN_PLOT_SCRIPT ""
#endif

namespace {

int fail(int code, const std::string& message) {
  std::fprintf(stderr, "dion-train: error: %s\n", message.c_str());
  return code;
}

// `dion-train plot ARGS...` -> `python3 plot.py ARGS...` (the script draws; this only finds it).
int run_plot(int argc, char** argv) {
  const char* env = std::getenv("DION_TRAIN_PLOT_SCRIPT");
  const std::string script = env && *env ? env : DION_TRAIN_PLOT_SCRIPT;
  std::error_code ec;
  if (script.empty() || !std::filesystem::is_regular_file(script, ec))
    return fail(1, "plot: the plotting script '" + script +
                       "' is missing (it is tools/dion-train/plot.py in the source tree; set DION_TRAIN_PLOT_SCRIPT "
                       "to its path)");
  std::vector<char*> args = {const_cast<char*>("python3"), const_cast<char*>(script.c_str())};
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execvp("python3", args.data());
  return fail(1, std::string("plot: cannot run python3: ") + std::strerror(errno));
}

// `dion-train --nproc N ARGS...`: N copies of `dion-train ARGS...` (dion/launch/launch.h). The configuration
// is parsed here first, so that a bad one is reported once, not by every rank.
int run_launcher(int nproc, const dion::launch::NodeFlags& nodes, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  // Parsed at the world size the children will see (WORLD_SIZE is not set here yet).
  (void)dion::train::config_parse(static_cast<int>(argv.size()), argv.data(),
                                  int64_t(nproc) * nodes.nnodes.value_or(1));  // throws
  dion::launch::LaunchOptions options;
  options.nproc = nproc;
  options.argv = args;
  try {
    dion::launch::apply_node_flags(nodes, options);
  } catch (const std::invalid_argument& e) {
    return fail(2, e.what());
  }
  return dion::launch::run_attempts(options);
}

// LibTorch's CPU tensors come from malloc, and glibc serves each large one (over 32 MB at most)
// with a fresh mmap: every step's logits, gradients and gathers page-fault their memory in anew
// (measured: zero-filling a fresh 206 MB tensor 180 ms, a reused one 10 ms; docs/benchmarks.md).
// A trainer allocates the same sizes every step, so freed memory stays in the process heap for
// the next step (peak RSS is unchanged: the high-water mark is kept, not exceeded). And no
// fastbins: with them every free of a large block (a step frees hundreds) first merges all the
// small freed blocks (malloc_consolidate): 4.7% of a bf16 2 x 128 step's perf samples on the
// Xeon, and without them the fast kind's forward + backward ran 3-10% faster in interleaved runs
// (2026-12-07: bf16 2 x 128, 4 x 256, fp32 2 x 128). DION_MALLOC=system keeps glibc's defaults.
void keep_freed_memory() {
  const char* choice = std::getenv("DION_MALLOC");
  if (choice && std::strcmp(choice, "system") == 0) return;
  mallopt(M_MMAP_MAX, 0);                 // large blocks from the heap, reusable once freed
  mallopt(M_TRIM_THRESHOLD, 0x7fffffff);  // and never handed back between steps
  mallopt(M_MXFAST, 0);                   // small frees go to the tcache and bins: nothing to consolidate
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  if (argc >= 2 && std::strcmp(argv[1], "plot") == 0) return run_plot(argc, argv);
  try {
    if (argc >= 2 && std::strcmp(argv[1], "sample") == 0) return dion::train::tool::run_sample(argc - 1, argv + 1);
    if (argc >= 2 && std::strcmp(argv[1], "export") == 0) return dion::train::tool::run_export(argc - 1, argv + 1);
    std::vector<std::string> args(argv, argv + argc);
    std::optional<int> nproc;
    dion::launch::NodeFlags nodes;
    try {
      nproc = dion::launch::take_nproc_flag(args);
      nodes = dion::launch::take_node_flags(args);
    } catch (const std::invalid_argument& e) {
      return fail(2, e.what());
    }
    if (nodes.any() && !nproc)
      return fail(2,
                  "--nnodes, --node_rank, --master_addr, --master_port, --max_restarts and --cpu_bind are the launcher's: "
                  "they need --nproc N (the processes on this node)");
    if (nproc) return run_launcher(*nproc, nodes, args);
    const dion::train::Config config = dion::train::config_parse(argc, argv);
    // train_run(config), with the tests' fault injection when they ask for it (test_hooks.h).
    dion::train::Trainer(config, dion::train::tool::test_hooks_from_env()).run();
    return 0;
  } catch (const dion::train::HelpRequested& h) {
    std::fputs(h.what(), stdout);
    std::fputs(dion::launch::launcher_help().c_str(), stdout);
    return 0;
  } catch (const dion::train::ConfigError& e) {
    return fail(2, dion::message_of(e));
  } catch (const std::exception& e) {  // (a library's message without its C++ backtrace)
    return fail(1, dion::message_of(e));
  }
}
