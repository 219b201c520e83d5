// tools/dion-data/cmd_inspect.cpp — `dion-data inspect`: check shards and summarize them.
//
// For each file: the header and size check, every token < vocab size, a histogram summary
// (min, max, unique, documents = <|endoftext|> count, top tokens) and the first tokens decoded
// (GPT-2 shards when the GPT-2 files are available; byte shards always). The tokenizer and its
// vocabulary come from each shard's header (slot [3]); --vocab-size overrides the bound. A bad file prints its error and the others are still
// inspected; the exit code is 1 if any file was bad.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>

#include <fmt/format.h>
#include <fmt/std.h>

#include "cli.h"
#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "dion/data/shard_folder.h"
#include "dion/data/tokenizer.h"

namespace dion::cli {

namespace {

struct InspectArgs {
  std::vector<std::string> files;
  std::string tokenizer;
  size_t head = 32;
  size_t top = 10;
  uint32_t vocab_size = 0;  // 0: the vocabulary of the shard's tokenizer (its header)
};

// The bytes of `id`, or nullopt for an id outside the vocabulary (possible with --vocab-size
// above it) or a GPT-2 shard without the GPT-2 files.
std::optional<std::string> token_bytes(data::ShardTokenizer kind, const data::Gpt2Tokenizer* tok, uint32_t id) {
  if (kind == data::ShardTokenizer::BYTES) {
    if (id >= data::ByteTokenizer::kVocabSize) return std::nullopt;
    const uint32_t one[1] = {id};
    return data::ByteTokenizer::decode(std::span<const uint32_t>(one));
  }
  if (tok == nullptr || id >= tok->vocab_size()) return std::nullopt;
  return std::string(tok->token_bytes(id));
}

// "GPT-2" / "byte", for "(not a GPT-2 token)".
const char* kind_label(data::ShardTokenizer kind) { return kind == data::ShardTokenizer::BYTES ? "byte" : "GPT-2"; }

// The text of `id` in quotes, "(not a T token)" for an id outside the vocabulary, "" for a
// GPT-2 shard without the GPT-2 files.
std::string token_text(data::ShardTokenizer kind, const data::Gpt2Tokenizer* tok, uint32_t id) {
  if (kind == data::ShardTokenizer::GPT2 && tok == nullptr) return "";
  const auto b = token_bytes(kind, tok, id);
  if (!b) return fmt::format("(not a {} token)", kind_label(kind));
  return "\"" + escape_bytes(*b) + "\"";
}

// The report of one file, built whole before anything is printed: an error half-way leaves no
// half line on stdout.
std::string inspect_one(const std::string& file, const InspectArgs& args, const data::Gpt2Tokenizer* tok) {
  // A shard of a folder whose swap is unfinished may be the old set's or the new one's.
  const std::string prefix = data::shard_prefix_of(file);
  if (!prefix.empty()) data::shard_folder_check_swap(std::filesystem::absolute(file).parent_path(), prefix);
  const data::ShardFile shard = data::ShardFile::open(file);
  const data::ShardHeader& h = shard.header();
  const data::ShardTokenizer kind = h.tokenizer;
  const uint32_t vocab = args.vocab_size > 0 ? args.vocab_size : data::shard_tokenizer_vocab(kind);
  data::shard_check_tokens(shard, vocab);
  const auto tokens = shard.tokens();
  const uint32_t eot =
      kind == data::ShardTokenizer::BYTES ? data::ByteTokenizer::kEndOfText : data::Gpt2Tokenizer::kEndOfText;
  std::string out = file + "\n";
  out += fmt::format("  header     magic {}, version {}, {} tokens; {} bytes = 1024 + 2 x count: ok\n", h.magic,
                     h.version, group_digits(static_cast<uint64_t>(h.token_count)),
                     group_digits(static_cast<uint64_t>(h.file_bytes)));
  out += fmt::format("  tokenizer  {} (vocabulary {}; tokens checked < {})\n", data::shard_tokenizer_name(kind),
                     data::shard_tokenizer_vocab(kind), vocab);
  if (tokens.empty()) return out;

  std::vector<uint64_t> counts(65536, 0);
  for (uint16_t t : tokens) ++counts[t];
  uint32_t lo = 0, hi = 65535;
  while (counts[lo] == 0) ++lo;
  while (counts[hi] == 0) --hi;
  const auto unique =
      static_cast<uint64_t>(std::count_if(counts.begin(), counts.end(), [](uint64_t c) { return c > 0; }));
  out += fmt::format("  tokens     min {}, max {}, unique {}, documents (<|endoftext|>) {}\n", lo, hi,
                     group_digits(unique), group_digits(counts[eot]));

  std::vector<uint32_t> order(65536);
  std::iota(order.begin(), order.end(), 0u);
  const size_t k = std::min<size_t>(args.top, unique);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](uint32_t a, uint32_t b) { return counts[a] != counts[b] ? counts[a] > counts[b] : a < b; });
  out += fmt::format("  top {:<6}", k);
  for (size_t i = 0; i < k; ++i) {
    const uint32_t id = order[i];
    out += fmt::format("{}{} {} {:.2f}%", i == 0 ? " " : ", ", id, token_text(kind, tok, id),
                       100.0 * static_cast<double>(counts[id]) / static_cast<double>(tokens.size()));
  }
  out += "\n";

  const auto head = tokens.first(std::min(args.head, tokens.size()));
  out += fmt::format("  first {:<4}", head.size());
  for (uint16_t t : head) out += fmt::format(" {}", t);
  out += "\n";
  if (tok != nullptr || kind == data::ShardTokenizer::BYTES) {
    std::string text;
    for (uint16_t t : head) {
      const auto b = token_bytes(kind, tok, t);
      text += b ? escape_bytes(*b) : fmt::format("<{}: not a {} token>", t, kind_label(kind));
    }
    out += "  decoded    \"" + text + "\"\n";
  }
  return out;
}

void run_inspect(const InspectArgs& args) {
  std::optional<data::Gpt2Tokenizer> tok;
  const auto dir = tokenizer_is_bytes(args.tokenizer) ? std::filesystem::path() : tokenizer_dir(args.tokenizer, false);
  if (!dir.empty()) tok = data::Gpt2Tokenizer::from_dir(dir);
  int bad = 0;
  for (const std::string& file : args.files) {
    try {
      const std::string report = inspect_one(file, args, tok ? &*tok : nullptr);
      std::fwrite(report.data(), 1, report.size(), stdout);
    } catch (const data::DataError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "dion-data: error: %s\n", e.what());
      ++bad;
    }
  }
  std::fflush(stdout);
  if (bad > 0) {
    throw data::DataError(fmt::format("inspect: {} of {} files failed the checks", bad, args.files.size()));
  }
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect",
                                     "Check FineWeb shards (magic, version, size = 1024 + 2 x count, tokens < vocab "
                                     "size) and summarize them: token histogram (min/max/unique/top) and the first "
                                     "tokens decoded. Exits 1 if any file is bad.");
  cmd->add_option("files", args->files, "Shard files")->required();
  add_tokenizer_flag(cmd, args->tokenizer);
  cmd->add_option("--head", args->head, "How many leading tokens to show")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top", args->top, "How many most frequent tokens to show")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--vocab-size", args->vocab_size,
                  "Tokens must be below this (default: the vocabulary the shard's header names: "
                  "50257 for GPT-2, 257 for bytes)")
      ->check(CLI::Range(1u, 65536u));
  cmd->callback([args] { run_inspect(*args); });
}

}  // namespace dion::cli
