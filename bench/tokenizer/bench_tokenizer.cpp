// bench/tokenizer/bench_tokenizer.cpp — GPT-2 tokenizer throughput (Google Benchmark).
//
//   bench_tokenizer [--text FILE] [--gpt2-dir DIR] [benchmark flags]
// Defaults: ../shared/data/tinyshakespeare/input.txt and ../shared/data/gpt2. Reports bytes/s
// of the input text for: encode with a fresh tokenizer per run (empty word cache, what a
// one-shot `dion-data prepare` sees), encode with a warm cache, and decode. Single thread.
// bench/tokenizer/compare.py runs this next to tiktoken on the same text.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

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
  benchmark::Initialize(&argc, argv);
  std::string text_path = DION_SHARED_DATA_DIR "/tinyshakespeare/input.txt";
  std::string gpt2_dir = DION_SHARED_DATA_DIR "/gpt2";
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--text") == 0 && i + 1 < argc) {
      text_path = argv[++i];
    } else if (std::strcmp(argv[i], "--gpt2-dir") == 0 && i + 1 < argc) {
      gpt2_dir = argv[++i];
    } else {
      std::fprintf(stderr, "bench_tokenizer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
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
