// tools/dion-train/sample.cpp — `dion-train sample --checkpoint DIR --prompt TEXT`: loads the
// model of a checkpoint (a step_* folder, or a checkpoint_dir: its newest), encodes the prompt
// with the run's tokenizer, and prints the prompt and the generated text.
//
// Which tokenizer: `--tokenizer byte` or `--tokenizer DIR` (GPT-2) when given; else the one
// the run's data had (the data_dir of the checkpoint's config, when its shards are still
// there: their header says); else the model's vocabulary decides (vocab_size < 50257 cannot
// be GPT-2: bytes; otherwise GPT-2). The checkpoint itself does not record the tokenizer.
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
#include <optional>
#include <regex>

#include "dion/data/shard_folder.h"
#include "dion/data/tokenizer.h"
#include "dion/train/checkpoint.h"
#include "dion/train/config.h"
#include "dion/train/generate.h"

#ifndef DION_SOURCE_DIR
#define DION_SOURCE_DIR "."
#endif

namespace dion::train::tool {

namespace fs = std::filesystem;

namespace {

// The tokenizer of the shards in the data_dir of `config_yaml`, if that folder still holds a
// readable set; nullopt otherwise. `why` says where the answer came from.
std::optional<data::ShardTokenizer> run_data_tokenizer(const std::string& config_yaml, std::string& why) {
  std::smatch m;
  static const std::regex data_dir_line(R"re((^|\n)data_dir: "([^"\n]*)")re");
  if (!std::regex_search(config_yaml, m, data_dir_line)) return std::nullopt;
  const fs::path dir = m[2].str();
  try {
    const data::ShardFolder folder = data::shard_folder_read(dir, "fineweb");
    if (folder.val.empty() && folder.train.empty()) return std::nullopt;
    why = fmt::format("the shards of the run's data_dir '{}'", dir.string());
    return folder.tokenizer;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

int run_sample(int argc, char** argv) {
  CLI::App app{"dion-train sample: generate text from a checkpoint", "dion-train sample"};
  std::string checkpoint, prompt = "\n", tokenizer;
  GenerateOptions o;
  uint64_t seed = 1337;
  app.add_option("--checkpoint", checkpoint, "a checkpoint folder (step_*) or a checkpoint_dir (its newest)")
      ->required();
  app.add_option("--prompt", prompt, "text to continue");
  app.add_option("--max_tokens", o.max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), int64_t(100000)));
  app.add_option("--temperature", o.temperature, "softmax temperature (0: greedy)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--top_k", o.top_k, "sample among the k most likely tokens (0: all; more than the vocabulary: all)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(0), int64_t(INT32_MAX)));
  app.add_option("--seed", seed, "sampling seed")->capture_default_str();
  app.add_option("--tokenizer", tokenizer,
                 "'byte' (each byte one id), or a folder with encoder.json and vocab.bpe "
                 "(default: the run's data's tokenizer; for GPT-2 $DION_GPT2_DIR, else the "
                 "project's data/gpt2)");
  if (const std::optional<int> code = parse_args(app, argc, argv)) return *code;

  const fs::path ckpt = checkpoint_resolve(checkpoint);
  const CheckpointMeta meta = checkpoint_read_meta(ckpt);
  bool bytes = tokenizer == "byte" || tokenizer == "bytes";
  if (tokenizer.empty()) {
    std::string why;
    if (const auto t = run_data_tokenizer(meta.config_yaml, why)) {
      bytes = *t == data::ShardTokenizer::BYTES;
    } else {
      bytes = meta.model.vocab_size < int64_t(data::Gpt2Tokenizer::kVocabSize);
      why = fmt::format("the model's vocab_size {} ({} 50257)", meta.model.vocab_size, bytes ? "<" : ">=");
    }
    std::fprintf(stderr, "dion-train sample: tokenizer %s, from %s (--tokenizer chooses)\n", bytes ? "byte" : "gpt2",
                 why.c_str());
    if (!bytes) {
      const char* env = std::getenv("DION_GPT2_DIR");
      tokenizer = env && *env ? env : (fs::path(DION_SOURCE_DIR) / "data" / "gpt2").string();
    }
  }
  std::optional<data::Gpt2Tokenizer> tok;
  if (!bytes) tok = data::Gpt2Tokenizer::from_dir(tokenizer);
  const int64_t data_vocab =
      bytes ? int64_t(data::ByteTokenizer::kVocabSize) : int64_t(data::Gpt2Tokenizer::kVocabSize);

  GPT model(meta.model);
  checkpoint_load_model(ckpt, model);

  std::vector<int64_t> ids;
  for (uint32_t id : bytes ? data::ByteTokenizer::encode_ordinary(prompt) : tok->encode(prompt)) ids.push_back(id);
  if (ids.empty()) ids.push_back(bytes ? data::ByteTokenizer::kEndOfText : data::Gpt2Tokenizer::kEndOfText);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::fputs(prompt.c_str(), stdout);
  generate(model, ids, o, gen, [&](int64_t id) {
    if (id >= data_vocab) return;  // padding ids (e.g. 50257..50303 of the 50304 vocabulary): nothing to print
    const uint32_t u = uint32_t(id);
    std::string text = bytes ? data::ByteTokenizer::decode(std::span<const uint32_t>(&u, 1))
                             : tok->decode(std::span<const uint32_t>(&u, 1));
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
