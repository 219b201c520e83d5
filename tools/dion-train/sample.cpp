// tools/dion-train/sample.cpp — `dion-train sample --checkpoint DIR --prompt TEXT`: loads the
// model of a checkpoint (a step_* folder, or a checkpoint_dir: its newest), encodes the prompt
// with the GPT-2 tokenizer, and prints the prompt and the generated text.
#include "sample.h"

#include "cli.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "dion/data/tokenizer.h"
#include "dion/train/checkpoint.h"
#include "dion/train/config.h"
#include "dion/train/generate.h"

#ifndef DION_SOURCE_DIR
#define DION_SOURCE_DIR "."
#endif

namespace dion::train::tool {

namespace fs = std::filesystem;

int run_sample(int argc, char** argv) {
  CLI::App app{"dion-train sample: generate text from a checkpoint", "dion-train sample"};
  std::string checkpoint, prompt = "\n", tokenizer;
  GenerateOptions o;
  uint64_t seed = 1337;
  app.add_option("--checkpoint", checkpoint, "a checkpoint folder (step_*) or a checkpoint_dir (its newest)")->required();
  app.add_option("--prompt", prompt, "text to continue");
  app.add_option("--max_tokens", o.max_tokens, "tokens to generate")->capture_default_str()->check(CLI::Range(int64_t(1), int64_t(100000)));
  app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--top_k", o.top_k, "sample among the k most likely tokens (0: all; more than the vocabulary: all)")->capture_default_str()->check(CLI::Range(int64_t(0), int64_t(INT32_MAX)));
  app.add_option("--seed", seed, "sampling seed")->capture_default_str();
  app.add_option("--tokenizer", tokenizer, "folder with encoder.json and vocab.bpe (default: $DION_GPT2_DIR, else the "
                                           "project's data/gpt2)");
  if (const std::optional<int> code = parse_args(app, argc, argv)) return *code;

  const fs::path ckpt = checkpoint_resolve(checkpoint);
  if (tokenizer.empty()) {
    const char* env = std::getenv("DION_GPT2_DIR");
    tokenizer = env && *env ? env : (fs::path(DION_SOURCE_DIR) / "data" / "gpt2").string();
  }
  data::Gpt2Tokenizer tok = data::Gpt2Tokenizer::from_dir(tokenizer);

  const CheckpointMeta meta = checkpoint_read_meta(ckpt);
  GPT model(meta.model);
  checkpoint_load_model(ckpt, model);

  std::vector<int64_t> ids;
  for (uint32_t id : tok.encode(prompt)) ids.push_back(id);
  if (ids.empty()) ids.push_back(data::Gpt2Tokenizer::kEndOfText);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::fputs(prompt.c_str(), stdout);
  generate(model, ids, o, gen, [&](int64_t id) {
    if (id >= int64_t(tok.vocab_size())) return;  // padding ids of the 50304 vocabulary: nothing to print
    const uint32_t u = uint32_t(id);
    std::string text = tok.decode(std::span<const uint32_t>(&u, 1));
    std::fputs(text.c_str(), stdout);
    std::fflush(stdout);
  });
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr, "dion-train sample: %lld tokens from %s (step %lld)\n", (long long)o.max_tokens,
               ckpt.string().c_str(), (long long)meta.state.step);
  return 0;
}

}  // namespace dion::train::tool
