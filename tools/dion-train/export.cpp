// tools/dion-train/export.cpp — `dion-train export --checkpoint DIR [-o FILE]`: writes the model
// weights of a checkpoint (a step_* folder, or a checkpoint_dir: its newest) as one safetensors
// file that Python reads with `safetensors.torch.load_file` (names = the GPT's parameter names,
// e.g. `blocks.0.attn.c_q.weight`; whole tensors, global shapes; metadata: the model's
// dimensions and the checkpoint's step). Written atomically (dion/train/safetensors.h).
//
// What it is not: a converter to the reference's state_dict names, or an optimizer-state export.
#include "export.h"

#include "cli.h"

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "dion/train/checkpoint.h"
#include "dion/train/gpt.h"
#include "dion/train/safetensors.h"

namespace dion::train::tool {

namespace fs = std::filesystem;

int run_export(int argc, char** argv) {
  CLI::App app{"dion-train export: a checkpoint's model weights as a safetensors file", "dion-train export"};
  std::string checkpoint, output;
  app.add_option("--checkpoint", checkpoint, "a checkpoint folder (step_*) or a checkpoint_dir (its newest)")
      ->required();
  app.add_option("-o,--output", output, "the .safetensors file to write (default: CHECKPOINT/model.safetensors)");
  if (const std::optional<int> code = parse_args(app, argc, argv)) return *code;

  const fs::path ckpt = checkpoint_resolve(checkpoint);
  const CheckpointMeta meta = checkpoint_read_meta(ckpt);
  GPT model(meta.model);
  checkpoint_load_model(ckpt, model);

  NamedTensors tensors;
  for (const auto& item : model->named_parameters())
    tensors.emplace_back(item.key(), item.value().detach().to(at::kCPU).contiguous());
  const GPTConfig& m = meta.model;
  const std::map<std::string, std::string> metadata = {
      {"format", "dion-train"},
      {"step", std::to_string(meta.state.step)},
      {"vocab_size", std::to_string(m.vocab_size)},
      {"n_layer", std::to_string(m.n_layer)},
      {"n_head", std::to_string(m.n_head)},
      {"n_embd", std::to_string(m.n_embd)},
      {"sequence_len", std::to_string(m.sequence_len)},
  };
  const fs::path out = output.empty() ? ckpt / "model.safetensors" : fs::path(output);
  save_safetensors(out.string(), tensors, metadata);
  std::printf("dion-train export: %zu tensors of %s -> %s\n", tensors.size(), ckpt.string().c_str(),
              out.string().c_str());
  return 0;
}

}  // namespace dion::train::tool
