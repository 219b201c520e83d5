// src/train/config_help.cpp — dion-train --help: the usage lines and every key of the table
// (config_keys.cpp) with its type, default, help line and choices.
#include "config_keys.h"

#include <fmt/format.h>
#include <sstream>

namespace dion::train {

using namespace config_detail;

std::string config_help() {
  const Config defaults;
  std::ostringstream os;
  os << "dion-train: train the reference's GPT with a dion optimizer (docs/train.md)\n\n"
        "usage:\n"
        "  dion-train [--config FILE.yaml] [--key value ...]   train (command-line values override the file)\n"
        "  dion-train --nproc N [--config FILE.yaml] [...]     train in N local processes (as torchrun\n"
        "                                                      --nproc_per_node N; docs/train.md \"Launching\")\n"
        "  dion-train plot RUN_DIR... -o curves.png             loss curves of runs in one PNG\n"
        "  dion-train sample --checkpoint DIR --prompt TEXT     generate text from a checkpoint\n\n"
        "keys (YAML file or --key value; booleans also as a bare --key):\n";
  for (const Key& k : keys()) {
    std::string line = fmt::format("  --{:<26} {:<6} default {}", k.name, type_name(k.field),
                                   value_text(defaults, k.field).empty() ? "\"\"" : value_text(defaults, k.field));
    os << line << "\n      " << k.help;
    if (k.check == Check::CHOICE) os << " {" << join_choices(choices_of(k)) << "}";
    if (!k.hyperparameters.empty())  // its rules are the optimizer library's (hyperparameters.h)
      os << " [optimizer hyperparameter " << join_choices(k.hyperparameters)
         << (k.scalar ? ", scalar_opt's groups" : "") << "]";
    os << "\n";
  }
  return os.str();
}

}  // namespace dion::train
