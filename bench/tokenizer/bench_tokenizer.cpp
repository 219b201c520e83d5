// bench/tokenizer/bench_tokenizer.cpp — GPT-2 tokenizer throughput (Google Benchmark).
//
//   bench_tokenizer [--text FILE] [--tokenizer DIR] [benchmark flags]
// Defaults: the repository's data/tinyshakespeare/input.txt and data/gpt2. Reports bytes/s
// of the input text for: encode with a fresh tokenizer per run (empty word cache, what a
// one-shot `dion-data prepare` sees), encode with a warm cache, and decode. Single thread.
// bench/tokenizer/compare.py runs this next to tiktoken on the same text.
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "../bench_args.h"
#include "dion/data/tokenizer.h"

namespace {

std::string g_text;
const dion::data::Gpt2Tokenizer* g_tok = nullptr;

void BM_EncodeColdCache(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    dion::data::Gpt2Tokenizer tok(*g_tok);  // shares the vocabulary, empty cache
    state.ResumeTiming();
    benchmark::DoNotOptimize(tok.encode_ordinary(g_text));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_text.size()));
}

void BM_EncodeWarmCache(benchmark::State& state) {
  dion::data::Gpt2Tokenizer tok(*g_tok);
  (void)tok.encode_ordinary(g_text);
  for (auto _ : state) benchmark::DoNotOptimize(tok.encode_ordinary(g_text));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_text.size()));
}

void BM_Decode(benchmark::State& state) {
  dion::data::Gpt2Tokenizer tok(*g_tok);
  const auto ids = tok.encode_ordinary(g_text);
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * g_text.size()));
}

BENCHMARK(BM_EncodeColdCache)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_EncodeWarmCache)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_Decode)->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) {
  std::string text_path = DION_DATA_DIR "/tinyshakespeare/input.txt";
  std::string gpt2_dir = DION_DATA_DIR "/gpt2";
  CLI::App app{
      "GPT-2 tokenizer throughput, single thread: encode with a cold and a warm word\n"
      "cache, and decode, in bytes of input text per second.",
      "bench_tokenizer"};
  app.allow_extras();  // Google Benchmark's flags pass through to benchmark::Initialize
  app.footer(
      "Google Benchmark's own flags pass through, e.g. --benchmark_filter=REGEX,\n"
      "--benchmark_format=json. bench/tokenizer/compare.py runs this beside tiktoken.");
  app.add_option("--text", text_path, "Text file to tokenize")->check(CLI::ExistingFile)->capture_default_str();
  app.add_option("--tokenizer", gpt2_dir,
                 "Folder with the GPT-2 tokenizer files encoder.json and vocab.bpe (as dion-data)")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!init_benchmark(argv[0], app.remaining(), "bench_tokenizer")) return 2;
  std::ifstream in(text_path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "bench_tokenizer: cannot read %s (pass --text FILE)\n", text_path.c_str());
    return 1;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  g_text = ss.str();
  try {
    static const auto tok = dion::data::Gpt2Tokenizer::from_dir(gpt2_dir);
    g_tok = &tok;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tokenizer: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
