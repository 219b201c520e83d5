// tests/fuzz/fuzz_shard_header.cpp — libFuzzer target: the shard header parser and reader.
//
// Any bytes, as a shard file's content: shard_parse_header must either accept them (and then
// the size must be exactly 1024 + 2*count) or throw DataError, never crash or read out of
// bounds; an accepted shard's tokens are then checked against the vocabulary the same way.
// Built by DION_FUZZ (clang); run by scripts/sanitize.sh for a bounded time.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "dion/data/error.h"
#include "dion/data/shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dion::data;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    const ShardHeader h = shard_parse_header(bytes, static_cast<int64_t>(size), "fuzz.bin");
    if (h.magic != kShardMagic || h.version != kShardVersion || h.token_count < 0 ||
        shard_file_bytes(h.token_count) != static_cast<int64_t>(size) ||
        (h.tokenizer != ShardTokenizer::GPT2 && h.tokenizer != ShardTokenizer::BYTES)) {
      std::abort();  // accepted something it must refuse
    }
    std::vector<uint16_t> tokens(static_cast<size_t>(h.token_count));
    if (!tokens.empty())  // memcpy to a null pointer is undefined even for 0 bytes
      std::memcpy(tokens.data(), data + kShardHeaderBytes, tokens.size() * sizeof(uint16_t));
    volatile size_t out_of_vocab = 0;
    for (uint16_t t : tokens) out_of_vocab += t >= shard_tokenizer_vocab(h.tokenizer);
  } catch (const DataError&) {
    // refused with a message: fine
  }
  // The same bytes with the size unknown (as the downloader parses a header in flight).
  try {
    if (size >= kShardHeaderBytes) (void)shard_parse_header(bytes.substr(0, kShardHeaderBytes), -1, "fuzz.bin");
  } catch (const DataError&) {
  }
  return 0;
}
