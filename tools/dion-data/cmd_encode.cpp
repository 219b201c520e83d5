// tools/dion-data/cmd_encode.cpp — `dion-data encode`: print the GPT-2 ids of a text.
// For checking the tokenizer by hand or against tiktoken (scripts/make_tokenizer_vectors.py).
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "cli.h"
#include "dion/data/prepare.h"
#include "dion/data/tokenizer.h"

namespace dion::cli {

namespace {

struct EncodeArgs {
  std::string input = "-";
  std::string tokenizer;
  bool special = false;
  bool count_only = false;
};

// All of `input` ("-" = stdin), read the way prepare reads one document.
std::string read_input(const std::string& input) {
  auto source = data::document_source_open({input}, "");
  std::string text;
  source->next(text);  // false (text stays empty) for empty input
  return text;
}

void run_encode(const EncodeArgs& args) {
  const bool bytes = tokenizer_is_bytes(args.tokenizer);
  std::optional<data::Gpt2Tokenizer> tokenizer;
  if (!bytes) tokenizer = data::Gpt2Tokenizer::from_dir(tokenizer_dir(args.tokenizer, true));
  const std::string text = read_input(args.input);
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<uint32_t> ids = bytes ? data::ByteTokenizer::encode_ordinary(text)
                                          : (args.special ? tokenizer->encode(text) : tokenizer->encode_ordinary(text));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (args.count_only) {
    std::printf("%zu\n", ids.size());
  } else {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
      out += std::to_string(ids[i]);
      out += i + 1 == ids.size() ? '\n' : ' ';
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
  }
  std::fprintf(stderr, "dion-data encode: %zu bytes -> %zu tokens in %.3f s (%.2f MB/s)\n", text.size(), ids.size(),
               secs, secs > 0 ? static_cast<double>(text.size()) / secs / 1e6 : 0);
}

}  // namespace

void register_encode(CLI::App& app) {
  auto args = std::make_shared<EncodeArgs>();
  CLI::App* cmd = app.add_subcommand("encode",
                                     "Print the GPT-2 token ids of a text (space-separated, one line), as tiktoken's "
                                     "gpt2 encode_ordinary gives them. Invalid UTF-8 is encoded as after Python's "
                                     "errors=\"replace\".");
  cmd->add_option("input", args->input, "Text file, or - for stdin")->capture_default_str();
  add_tokenizer_flag(cmd, args->tokenizer);
  cmd->add_flag("--special", args->special,
                "Read the text <|endoftext|> as token 50256 (GPT-2 only; bytes stay bytes)");
  cmd->add_flag("--count", args->count_only, "Print only the number of tokens");
  cmd->callback([args] { run_encode(*args); });
}

}  // namespace dion::cli
