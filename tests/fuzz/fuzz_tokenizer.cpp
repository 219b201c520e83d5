// tests/fuzz/fuzz_tokenizer.cpp — libFuzzer target: the GPT-2 tokenizer's round trip.
//
// Any bytes: decode(encode_ordinary(x)) must equal utf8_sanitize(x) (what tiktoken sees after
// errors="replace"), every id must be < 50257, and encode() (special tokens on) must round
// trip too. Needs the GPT-2 files: $DION_GPT2_DIR, else the configured shared data folder.
// Built by DION_FUZZ (clang); run by scripts/sanitize.sh for a bounded time.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "dion/data/tokenizer.h"

namespace {
std::unique_ptr<dion::data::Gpt2Tokenizer> g_tok;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_tokenizer: %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("DION_GPT2_DIR");
  const std::filesystem::path dir =
      env != nullptr && *env != '\0' ? std::filesystem::path(env) : std::filesystem::path(DION_DATA_DIR) / "gpt2";
  g_tok = std::make_unique<dion::data::Gpt2Tokenizer>(dion::data::Gpt2Tokenizer::from_dir(dir));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dion::data::Gpt2Tokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string want = dion::data::utf8_sanitize(text);
  check(dion::data::utf8_is_valid(want), "utf8_sanitize gave invalid UTF-8");
  const auto ids = g_tok->encode_ordinary(text);
  for (uint32_t id : ids) check(id < Gpt2Tokenizer::kEndOfText, "encode_ordinary gave a special or out-of-range id");
  check(g_tok->decode(ids) == want, "decode(encode_ordinary(x)) != utf8_sanitize(x)");
  const auto special = g_tok->encode(text);
  check(g_tok->decode(special) == want, "decode(encode(x)) != utf8_sanitize(x)");
  return 0;
}
