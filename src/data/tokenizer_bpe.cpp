// src/data/tokenizer_bpe.cpp — GPT-2 byte-level BPE encoding and decoding (dion/data/tokenizer.h)
// with the vocabulary tokenizer.cpp loads: the pattern splits the text into pieces, each piece
// is merged into tokens. The merge follows tiktoken's _byte_pair_merge (rank of the concatenated
// pair, lowest first, leftmost on ties) but keeps the candidate pairs in a min-heap, so a long
// piece (a run of 100k spaces) costs O(n log n) instead of O(n^2).
#include "dion/data/tokenizer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include <fmt/format.h>

#include "dion/data/error.h"
#include "tokenizer_detail.h"

namespace dion::data {

using detail::kEndOfTextText;
using detail::kNoRank;
using detail::pcre2_error_text;

// ---------------------------------------------------------------------------- BPE

void Gpt2Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) {
  const Vocab& v = *vocab_;
  Workspace& w = *work_;
  if (piece.size() == 1) {
    out.push_back(v.byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (auto it = v.ranks.find(piece); it != v.ranks.end()) {  // the whole piece is one token
    out.push_back(it->second);
    return;
  }
  if (auto it = w.cache.find(piece); it != w.cache.end()) {
    const auto [offset, count] = it->second;
    out.insert(out.end(), w.cache_ids.begin() + offset, w.cache_ids.begin() + offset + count);
    return;
  }

  // Parts are identified by their start offset; next[i] is the start of the part after i
  // (n at the end); rank[i] is the rank of part i joined with its successor (kNoRank if that
  // is not a token, or i is the last part or no longer a part).
  const auto n = static_cast<uint32_t>(piece.size());
  auto& next = w.next;
  auto& prev = w.prev;
  auto& rank = w.rank;
  auto& heap = w.heap;
  next.resize(n);
  prev.resize(n);
  rank.resize(n);
  heap.clear();
  auto pair_rank = [&](uint32_t i) -> uint32_t {
    uint32_t j = next[i];
    if (j >= n) return kNoRank;
    uint32_t end = next[j] - i;
    auto it = v.ranks.find(piece.substr(i, end));
    return it == v.ranks.end() ? kNoRank : it->second;
  };
  for (uint32_t i = 0; i < n; ++i) {
    next[i] = i + 1;
    prev[i] = i == 0 ? kNoRank : i - 1;
  }
  for (uint32_t i = 0; i < n; ++i) {
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) heap.emplace_back(rank[i], i);
  }
  const auto cmp = std::greater<std::pair<uint32_t, uint32_t>>();
  std::make_heap(heap.begin(), heap.end(), cmp);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    const auto [r, i] = heap.back();
    heap.pop_back();
    if (rank[i] != r) continue;  // stale: part i was merged away or its pair changed
    const uint32_t j = next[i];
    next[i] = next[j];
    if (next[i] < n) prev[next[i]] = i;
    rank[j] = kNoRank;
    rank[i] = pair_rank(i);
    if (rank[i] != kNoRank) {
      heap.emplace_back(rank[i], i);
      std::push_heap(heap.begin(), heap.end(), cmp);
    }
    if (prev[i] != kNoRank) {
      const uint32_t p = prev[i];
      rank[p] = pair_rank(p);
      if (rank[p] != kNoRank) {
        heap.emplace_back(rank[p], p);
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
  }

  // Every part is a single byte or the result of a merge, so it is always a token.
  if (n > Workspace::kCacheMaxPieceBytes) {  // rare (long runs): not worth caching
    for (uint32_t i = 0; i < n; i = next[i]) out.push_back(v.ranks.find(piece.substr(i, next[i] - i))->second);
    return;
  }
  if (w.cache.size() >= Workspace::kCacheMaxEntries) {
    w.cache.clear();
    w.cache_ids.clear();
  }
  const auto offset = static_cast<uint32_t>(w.cache_ids.size());
  for (uint32_t i = 0; i < n; i = next[i]) {
    w.cache_ids.push_back(v.ranks.find(piece.substr(i, next[i] - i))->second);
  }
  const auto count = static_cast<uint32_t>(w.cache_ids.size()) - offset;
  w.cache.emplace(std::string(piece), std::make_pair(offset, count));
  out.insert(out.end(), w.cache_ids.begin() + offset, w.cache_ids.end());
}

// ---------------------------------------------------------------------------- encode / decode

void Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) {
  encode_ordinary(text, out, nullptr);
}

bool Gpt2Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out,
                                    const std::function<bool()>& should_stop) {
  constexpr PCRE2_SIZE kStopCheckBytes = 1 << 20;
  const Vocab& v = *vocab_;
  Workspace& w = *work_;
  std::string_view s = text;
  if (!utf8_is_valid(text)) {
    w.sanitized = utf8_sanitize(text);
    s = w.sanitized;
  }
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  PCRE2_SIZE pos = 0, next_check = kStopCheckBytes;
  while (pos < s.size()) {
    if (should_stop && pos >= next_check) {
      if (should_stop()) return false;
      next_check = pos + kStopCheckBytes;
    }
    int rc = v.jit ? pcre2_jit_match(v.regex, subject, s.size(), pos, 0, w.match, nullptr)
                   : pcre2_match(v.regex, subject, s.size(), pos, PCRE2_NO_UTF_CHECK, w.match, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: every character matches
    if (rc < 0) {
      throw DataError(fmt::format("tokenizer: PCRE2 match failed at byte {}: {}", pos, pcre2_error_text(rc)));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(w.match);
    encode_piece(s.substr(ov[0], ov[1] - ov[0]), out);
    pos = ov[1];
  }
  return true;
}

std::vector<uint32_t> Gpt2Tokenizer::encode_ordinary(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  encode_ordinary(text, out);
  return out;
}

std::vector<uint32_t> Gpt2Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t pos = 0;
  while (true) {
    size_t hit = text.find(kEndOfTextText, pos);
    encode_ordinary(text.substr(pos, hit == std::string_view::npos ? hit : hit - pos), out);
    if (hit == std::string_view::npos) break;
    out.push_back(kEndOfText);
    pos = hit + kEndOfTextText.size();
  }
  return out;
}

std::string_view Gpt2Tokenizer::token_bytes(uint32_t id) const {
  if (id >= kVocabSize) {
    throw DataError(
        fmt::format("tokenizer: token id {} is not in the GPT-2 vocabulary (ids are "
                    "0..{})",
                    id, kVocabSize - 1));
  }
  return vocab_->id_to_bytes[id];
}

namespace {
template <typename Id>
std::string decode_ids(const Gpt2Tokenizer& tok, std::span<const Id> ids) {
  std::string out;
  for (Id id : ids) out += tok.token_bytes(id);
  return out;
}
}  // namespace

std::string Gpt2Tokenizer::decode(std::span<const uint32_t> ids) const { return decode_ids(*this, ids); }
std::string Gpt2Tokenizer::decode(std::span<const uint16_t> ids) const { return decode_ids(*this, ids); }

}  // namespace dion::data
