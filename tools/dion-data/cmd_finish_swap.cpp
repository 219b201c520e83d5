// tools/dion-data/cmd_finish_swap.cpp — `dion-data finish-swap DIR [--prefix P]`: finish the swap
// of a `dion-data prepare` that was killed while swapping its new shards into DIR (readers refuse
// the folder until then), without preparing anything. Takes prepare's lock, so it refuses while a
// prepare runs on the folder.
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "dion/data/shard_folder.h"

namespace dion::cli {

namespace {

struct FinishSwapArgs {
  std::string dir;
  std::string prefix = "fineweb";
};

void run_finish_swap(const FinishSwapArgs& args) {
  const std::string done = data::shard_folder_finish_swap(args.dir, args.prefix);
  if (done.empty())
    std::printf("dion-data finish-swap: %s has no unfinished swap for prefix %s: nothing to do\n", args.dir.c_str(),
                args.prefix.c_str());
  else
    std::printf("dion-data finish-swap: %s: %s\n", args.dir.c_str(), done.c_str());
}

}  // namespace

void register_finish_swap(CLI::App& app) {
  auto args = std::make_shared<FinishSwapArgs>();
  CLI::App* cmd = app.add_subcommand("finish-swap",
                                     "Finish the swap of a dion-data prepare that was killed while swapping its new "
                                     "shards into DIR (the folder holds old and new shards mixed until then, and "
                                     "every reader refuses it). Refuses while a prepare runs on DIR.");
  cmd->add_option("dir", args->dir, "The output folder of the interrupted prepare")->required();
  cmd->add_option("--prefix", args->prefix, "Shard name prefix")->capture_default_str();
  cmd->callback([args] { run_finish_swap(*args); });
}

}  // namespace dion::cli
