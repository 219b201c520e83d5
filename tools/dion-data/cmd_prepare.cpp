// tools/dion-data/cmd_prepare.cpp — `dion-data prepare`: text -> FineWeb token shards.
// Flags and printing only; the work is dion::data::prepare_shards (dion/data/prepare.h).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>
#include <fmt/std.h>

#include "cli.h"
#include "dion/data/prepare.h"
#include "progress.h"

namespace dion::cli {

namespace {

struct PrepareArgs {
  std::vector<std::string> inputs;
  std::string output_dir;
  std::string prefix = "fineweb";
  int64_t shard_size = 100'000'000;
  double val_fraction = -1;
  std::string delimiter;
  std::string tokenizer;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool overwrite = false;
  bool quiet = false;
};

void run_prepare(const PrepareArgs& args) {
  const bool bytes = tokenizer_is_bytes(args.tokenizer);
  std::optional<data::Gpt2Tokenizer> tokenizer;
  if (!bytes) tokenizer = data::Gpt2Tokenizer::from_dir(tokenizer_dir(args.tokenizer, true));
  data::DocumentSourceOptions source_options;
  source_options.delimiter = unescape(args.delimiter);
  source_options.output_dir = args.output_dir;
  source_options.prefix = args.prefix;
  auto source = data::document_source_open(args.inputs, source_options);
  if (source->files_skipped() > 0 && !args.quiet) {
    std::fprintf(stderr,
                 "dion-data prepare: note: %llu files in the inputs are this run's own output "
                 "shards (%s_{val,train}_*.bin in %s): not read\n",
                 static_cast<unsigned long long>(source->files_skipped()), args.prefix.c_str(),
                 args.output_dir.c_str());
  }

  ProgressLine progress(!args.quiet);
  data::PrepareOptions options;
  options.output_dir = args.output_dir;
  options.prefix = args.prefix;
  options.shard_size = args.shard_size;
  options.val_fraction = args.val_fraction;
  options.threads = args.threads;
  options.overwrite = args.overwrite;
  options.should_stop = stop_requested;
  options.on_progress = [&](const data::PrepareProgress& p) {
    const double mbps = p.seconds > 0 ? static_cast<double>(p.bytes_read) / p.seconds / 1e6 : 0;
    const double ktps = p.seconds > 0 ? static_cast<double>(p.tokens) / p.seconds / 1e3 : 0;
    std::string text = fmt::format(
        "{} read, {} docs, {} tokens, {} shards | {:.1f} MB/s, "
        "{:.0f}k tokens/s",
        human_bytes(static_cast<double>(p.bytes_read)), group_digits(p.documents), group_digits(p.tokens), p.shards,
        mbps, ktps);
    double fraction = -1;
    if (p.bytes_total > 0) {
      fraction = static_cast<double>(p.bytes_read) / static_cast<double>(p.bytes_total);
      if (mbps > 0 && p.bytes_read < p.bytes_total) {
        text += fmt::format(", ETA {:.0f} s", static_cast<double>(p.bytes_total - p.bytes_read) / 1e6 / mbps);
      }
    }
    progress.update(fraction, text, p.final);
  };
  const data::PrepareResult r =
      bytes ? data::prepare_shards_bytes(*source, options) : data::prepare_shards(*tokenizer, *source, options);
  progress.finish();
  if (!r.recovered.empty()) {
    std::fprintf(stderr, "dion-data prepare: note: %s\n", r.recovered.c_str());
  }

  if (!args.quiet) {
    for (const data::ShardInfo& s : r.shards) {
      std::fprintf(stderr, "  %-5s %12s tokens  %s\n", s.split.c_str(),
                   group_digits(static_cast<uint64_t>(s.tokens)).c_str(), s.path.c_str());
    }
  }
  const double secs = r.seconds > 0 ? r.seconds : 1e-9;
  std::fprintf(stderr,
               "dion-data prepare: %zu shards (%s val + %s train tokens) from %s documents, %s "
               "in %.2f s: %.2f MB/s, %s tokens/s\n",
               r.shards.size(), group_digits(r.val_tokens).c_str(), group_digits(r.train_tokens).c_str(),
               group_digits(r.documents).c_str(), human_bytes(static_cast<double>(r.bytes)).c_str(), r.seconds,
               static_cast<double>(r.bytes) / secs / 1e6,
               group_digits(static_cast<uint64_t>(static_cast<double>(r.tokens) / secs)).c_str());
  if (r.train_tokens == 0) {
    std::fprintf(stderr,
                 "dion-data prepare: warning: no train shards were written (all %s "
                 "tokens fit in the val shard): lower --shard-size or use "
                 "--val-fraction\n",
                 group_digits(r.tokens).c_str());
  }
  if (r.val_tokens == 0) {
    std::fprintf(stderr,
                 "dion-data prepare: warning: no val shard was written: raise "
                 "--val-fraction or split the input into more documents (--delimiter)\n");
  }
}

}  // namespace

void register_prepare(CLI::App& app) {
  auto args = std::make_shared<PrepareArgs>();
  CLI::App* cmd =
      app.add_subcommand("prepare",
                         "Tokenize text into FineWeb shards PREFIX_{val,train}_NNNNNN.bin. Each document (one input "
                         "file, all of stdin, or one --delimiter-separated piece) becomes <|endoftext|> + its GPT-2 "
                         "tokens (with --tokenizer byte: end-of-text 256 + one id per byte; the shard header "
                         "records which). By default the first shard is val and the rest train, as the reference's "
                         "data/fineweb.py does. Shards appear only when everything succeeded.");
  cmd->add_option("inputs", args->inputs, "Text files, folders (read recursively), or - for stdin")->required();
  cmd->add_option("-o,--output-dir", args->output_dir, "Folder for the shards (created if missing)")->required();
  cmd->add_option("--prefix", args->prefix, "Shard name prefix (the trainer reads fineweb_*)")->capture_default_str();
  cmd->add_option("--shard-size", args->shard_size, "Tokens per shard (the last holds the rest)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{2147483647}));
  cmd->add_option("--val-fraction", args->val_fraction,
                  "Instead of 'first shard is val': send whole documents to val until it holds "
                  "this fraction of the tokens, in [0, 1)")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            // CLI::Range lets NaN through (every comparison with it is false).
            const double f = std::strtod(v.c_str(), nullptr);
            return f >= 0.0 && f < 1.0 ? "" : "must be a number in [0, 1), got " + v;
          },
          "in [0, 1)"));
  cmd->add_option("--delimiter", args->delimiter,
                  "Split each input into documents on this string (\\n, \\t, \\r, \\\\ are "
                  "understood), e.g. '\\n\\n'");
  add_tokenizer_flag(cmd, args->tokenizer);
  cmd->add_option("--threads", args->threads, "Tokenizer threads")->capture_default_str()->check(CLI::Range(1, 1024));
  cmd->add_flag("--overwrite", args->overwrite,
                "Replace existing PREFIX_{val,train}_*.bin shards in the output folder");
  cmd->add_flag("-q,--quiet", args->quiet, "No progress line or shard list");
  cmd->callback([args] { run_prepare(*args); });
}

}  // namespace dion::cli
