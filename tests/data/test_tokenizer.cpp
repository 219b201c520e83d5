// tests/data/test_tokenizer.cpp — the GPT-2 tokenizer against tiktoken's ids.
//
// Expected ids come from scripts/make_tokenizer_vectors.py (tiktoken's gpt2 encoding built from
// the same local files) and are committed under tests/vectors/tokenizer: ~420 hard strings
// (unicode, emoji, whitespace runs, contractions, digits, invalid UTF-8, fuzz) and Tiny
// Shakespeare (count, hash of all ids, first/last 1000). The tests read the repository's data/gpt2
// and data/tinyshakespeare; a missing file fails the test, naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "dion/data/error.h"
#include "dion/data/tokenizer.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::DataError;
using data::Gpt2Tokenizer;

nlohmann::json load_json(const fs::path& path) { return nlohmann::json::parse(read_file(path)); }

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  }
  return out;
}

// "ids differ at index 3: got 220, want 1849 (got 12 ids, want 11)" or "".
std::string first_difference(const std::vector<uint32_t>& got, const std::vector<uint32_t>& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  if (i == got.size() && i == want.size()) return "";
  std::string s = "ids differ at index " + std::to_string(i);
  if (i < got.size() && i < want.size()) {
    s += ": got " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  }
  return s + " (got " + std::to_string(got.size()) + " ids, want " + std::to_string(want.size()) + ")";
}

// ---------------------------------------------------------------------------- tiktoken vectors

TEST(Tokenizer, HardStringsMatchTiktoken) {
  DION_REQUIRE_TOKENIZER(tok);
  const auto vectors = load_json(source_dir() / "tests/vectors/tokenizer/hard_strings.json");
  ASSERT_GE(vectors["cases"].size(), 400u);
  int failures = 0;
  for (const auto& c : vectors["cases"]) {
    const std::string input = from_hex(c["input_hex"]);
    const auto want = c["ids"].get<std::vector<uint32_t>>();
    const auto got = c["special"].get<bool>() ? tok.encode(input) : tok.encode_ordinary(input);
    const std::string diff = first_difference(got, want);
    if (!diff.empty()) {
      ADD_FAILURE() << "case " << c["name"].get<std::string>() << ": " << diff;
      if (++failures > 20) break;
    }
  }
}

TEST(Tokenizer, TinyShakespeareMatchesTiktoken) {
  DION_REQUIRE_TOKENIZER(tok);
  const fs::path input = data_file("tinyshakespeare/input.txt");
  const auto want = load_json(source_dir() / "tests/vectors/tokenizer/tinyshakespeare.json");
  const std::string text = read_file(input);
  ASSERT_EQ(text.size(), want["input_bytes"].get<size_t>()) << input << " is not the file the vectors were made from";
  ASSERT_EQ(fmt_hex(fnv1a64(text)), want["input_fnv1a64"].get<std::string>())
      << input << " is not the file the vectors were made from";

  const std::vector<uint32_t> ids = tok.encode_ordinary(text);
  const auto head = want["head"].get<std::vector<uint32_t>>();
  const auto tail = want["tail"].get<std::vector<uint32_t>>();
  ASSERT_GE(ids.size(), head.size());
  EXPECT_EQ(first_difference(std::vector<uint32_t>(ids.begin(), ids.begin() + head.size()), head), "") << "first ids";
  EXPECT_EQ(first_difference(std::vector<uint32_t>(ids.end() - tail.size(), ids.end()), tail), "") << "last ids";
  EXPECT_EQ(ids.size(), want["tokens"].get<size_t>());
  EXPECT_EQ(fmt_hex(fnv1a64_ids(ids)), want["ids_fnv1a64"].get<std::string>())
      << "the ids differ from tiktoken's somewhere in the middle";
  // Decoding gives the text back.
  EXPECT_TRUE(tok.decode(ids) == text);
}

// ---------------------------------------------------------------------------- behaviour

TEST(Tokenizer, DecodeInvertsEncodeUpToInvalidUtf8) {
  DION_REQUIRE_TOKENIZER(tok);
  const auto vectors = load_json(source_dir() / "tests/vectors/tokenizer/hard_strings.json");
  for (const auto& c : vectors["cases"]) {
    if (c["special"].get<bool>()) continue;
    const std::string input = from_hex(c["input_hex"]);
    EXPECT_EQ(tok.decode(tok.encode_ordinary(input)), data::utf8_sanitize(input))
        << "case " << c["name"].get<std::string>();
  }
}

TEST(Tokenizer, EndOfTextIsSpecialOnlyInEncode) {
  DION_REQUIRE_TOKENIZER(tok);
  EXPECT_EQ(tok.encode("<|endoftext|>"), std::vector<uint32_t>{Gpt2Tokenizer::kEndOfText});
  const auto ordinary = tok.encode_ordinary("<|endoftext|>");
  EXPECT_GT(ordinary.size(), 1u);
  EXPECT_EQ(std::count(ordinary.begin(), ordinary.end(), Gpt2Tokenizer::kEndOfText), 0);
  EXPECT_EQ(tok.token_bytes(Gpt2Tokenizer::kEndOfText), "<|endoftext|>");
  EXPECT_EQ(tok.vocab_size(), 50257u);
  EXPECT_TRUE(tok.encode_ordinary("").empty());
}

TEST(Tokenizer, DecodeRejectsUnknownIds) {
  DION_REQUIRE_TOKENIZER(tok);
  const std::vector<uint32_t> ids{15496, 50257};
  try {
    (void)tok.decode(ids);
    FAIL() << "no error for id 50257";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("50257"), std::string::npos) << e.what();
  }
  const std::vector<uint16_t> small{15496, 995};
  EXPECT_EQ(tok.decode(small), "Hello world");
}

TEST(Tokenizer, LongPiecesAndCacheEvictionGiveStableIds) {
  DION_REQUIRE_TOKENIZER(tok);
  // More distinct words than the cache holds (65536), encoded twice by one tokenizer and once by
  // a fresh copy: eviction must not change a single id.
  std::string text;
  for (int i = 0; i < 70000; ++i) text += " w" + std::to_string(i * 7919 % 100003) + "q";
  const auto first = tok.encode_ordinary(text);
  const auto second = tok.encode_ordinary(text);
  Gpt2Tokenizer fresh(tok);
  EXPECT_EQ(first, second);
  EXPECT_EQ(first, fresh.encode_ordinary(text));
  // A 200k-space run is one piece; the heap-based merge keeps it fast and exact.
  const std::string spaces(200000, ' ');
  EXPECT_EQ(tok.decode(tok.encode_ordinary(spaces)), spaces);
}

TEST(Tokenizer, CopiesWorkInParallelThreads) {
  DION_REQUIRE_TOKENIZER(tok);
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "Line " + std::to_string(i) + ": naïve café 🙂 it's\n";
  const auto want = tok.encode_ordinary(text);
  std::vector<std::vector<uint32_t>> got(4);
  std::vector<std::thread> threads;
  for (auto& g : got) {
    threads.emplace_back([&tok, &text, &g] {
      Gpt2Tokenizer mine(tok);
      g = mine.encode_ordinary(text);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g, want);
}

// ---------------------------------------------------------------------------- UTF-8

TEST(Utf8, SanitizeMatchesPythonReplace) {
  const std::string fffd = "\xEF\xBF\xBD";
  // Expected values: Python's bytes.decode("utf-8", errors="replace").
  EXPECT_EQ(data::utf8_sanitize("abc"), "abc");
  EXPECT_EQ(data::utf8_sanitize("\xff"), fffd);
  EXPECT_EQ(data::utf8_sanitize("x\xe2\x82"), "x" + fffd);             // truncated: one
  EXPECT_EQ(data::utf8_sanitize("\xed\xa0\x80"), fffd + fffd + fffd);  // surrogate: three
  EXPECT_EQ(data::utf8_sanitize("\xc0\xaf"), fffd + fffd);             // overlong: two
  EXPECT_EQ(data::utf8_sanitize("\xf0\x9f\x98"), fffd);                // cut emoji: one
  EXPECT_EQ(data::utf8_sanitize("\xf4\x90\x80\x80"), fffd + fffd + fffd + fffd);
  EXPECT_EQ(data::utf8_sanitize("\xe2\x28\xa1"), fffd + "(" + fffd);
  EXPECT_TRUE(data::utf8_is_valid("h\xc3\xa9llo \xf0\x9f\x99\x82"));
  EXPECT_FALSE(data::utf8_is_valid("h\xe9llo"));
  EXPECT_TRUE(data::utf8_is_valid(std::string("a\0b", 3)));
}

// ---------------------------------------------------------------------------- loading errors

struct GptFiles {
  TempDir dir;
  std::string encoder, merges;
  GptFiles() {
    encoder = read_file(data_file("gpt2/encoder.json"));
    merges = read_file(data_file("gpt2/vocab.bpe"));
  }
  std::string load_error() {
    write_file(dir / "encoder.json", encoder);
    write_file(dir / "vocab.bpe", merges);
    try {
      (void)Gpt2Tokenizer::from_dir(dir.path());
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  }
};

TEST(TokenizerLoad, MissingFilesNameThePath) {
  TempDir dir;
  try {
    (void)Gpt2Tokenizer::from_dir(dir.path());
    FAIL() << "no error for an empty folder";
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find((dir / "encoder.json").string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  }
}

TEST(TokenizerLoad, MalformedOrMismatchedFilesAreRefused) {
  DION_REQUIRE_TOKENIZER(tok);
  {
    GptFiles f;
    f.encoder = "{\"a\": 1,";
    const std::string msg = f.load_error();
    EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  }
  {
    GptFiles f;
    f.encoder = "{\"a\": 0}";
    const std::string msg = f.load_error();
    EXPECT_NE(msg.find("expected an object of 50257 tokens"), std::string::npos) << msg;
  }
  {
    GptFiles f;  // swap merges 1 and 2: the merges no longer build encoder.json's tokens
    const size_t l1 = f.merges.find('\n') + 1, l2 = f.merges.find('\n', l1) + 1, l3 = f.merges.find('\n', l2) + 1;
    f.merges =
        f.merges.substr(0, l1) + f.merges.substr(l2, l3 - l2) + f.merges.substr(l1, l2 - l1) + f.merges.substr(l3);
    const std::string msg = f.load_error();
    EXPECT_NE(msg.find("vocab.bpe"), std::string::npos) << msg;
    EXPECT_NE(msg.find(":2:"), std::string::npos) << msg;
    EXPECT_NE(msg.find("do not belong together"), std::string::npos) << msg;
  }
  {
    GptFiles f;
    f.merges = f.merges.substr(0, f.merges.size() / 2);
    f.merges = f.merges.substr(0, f.merges.rfind('\n') + 1);
    const std::string msg = f.load_error();
    EXPECT_NE(msg.find("merges, expected 50000"), std::string::npos) << msg;
  }
  {
    GptFiles f;
    EXPECT_EQ(f.load_error(), "");  // the unmodified copies load
  }
}

}  // namespace
}  // namespace dion::test
