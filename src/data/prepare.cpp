// src/data/prepare.cpp — documents -> tokens -> staged shards -> renamed into place
// (see dion/data/prepare.h).
//
// Layout: the shard cutter, the driver; the documents come from document_source.cpp, the staged
// shard set from shard_set.cpp. The driver reads a batch of documents, tokenizes it on `threads`
// threads (each with its own tokenizer copy, documents split into contiguous ranges), then
// appends the tokens in document order, so the output does not depend on the thread count.
#include "dion/data/prepare.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <span>
#include <thread>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "shard_set.h"

namespace dion::data {

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------- shard cutter

// One token stream (val, train, or the reference's single stream) cut into shards.
struct Stream {
  const char* split;  // nullptr: "val" for shard number 0, "train" after (the reference)
  std::vector<uint16_t> buffer;
};

class ShardCutter {
 public:
  ShardCutter(detail::ShardSetWriter& staged, int64_t shard_size, ShardTokenizer tokenizer, PrepareResult& result)
      : staged_(staged), shard_size_(static_cast<size_t>(shard_size)), tokenizer_(tokenizer), result_(result) {}

  void append(Stream& s, std::span<const uint16_t> tokens) {
    while (!tokens.empty()) {
      if (s.buffer.capacity() == 0) s.buffer.reserve(std::min<size_t>(shard_size_, 1 << 24));
      const size_t take = std::min(tokens.size(), shard_size_ - s.buffer.size());
      s.buffer.insert(s.buffer.end(), tokens.begin(), tokens.begin() + take);
      tokens = tokens.subspan(take);
      if (s.buffer.size() == shard_size_) flush(s);
    }
  }

  void flush(Stream& s) {
    if (s.buffer.empty()) return;
    const std::string split = s.split != nullptr ? s.split : (next_index_ == 0 ? "val" : "train");
    const fs::path path = staged_.add(split, next_index_++, s.buffer, tokenizer_);
    result_.shards.push_back({path, split, static_cast<int64_t>(s.buffer.size())});
    (split == "val" ? result_.val_tokens : result_.train_tokens) += s.buffer.size();
    s.buffer.clear();
  }

 private:
  detail::ShardSetWriter& staged_;
  size_t shard_size_;
  ShardTokenizer tokenizer_;
  PrepareResult& result_;
  int64_t next_index_ = 0;
};

// Tokens of a contiguous range of documents, each prefixed by <|endoftext|> (GPT-2's 50256,
// or the byte tokenizer's 256).
struct BatchPart {
  std::vector<uint16_t> tokens;
  std::vector<size_t> doc_ends;  // end offset of each document in tokens
  std::exception_ptr error;
  bool stopped = false;  // should_stop said so inside a document
};

// `tok` null: the byte tokenizer.
void tokenize_range(Gpt2Tokenizer* tok, std::span<const std::string> docs, const std::function<bool()>& should_stop,
                    BatchPart& part) {
  try {
    std::vector<uint32_t> ids;
    part.tokens.clear();
    part.doc_ends.clear();
    for (const std::string& doc : docs) {
      ids.clear();
      if (tok == nullptr) {
        part.tokens.push_back(ByteTokenizer::kEndOfText);
        part.tokens.insert(part.tokens.end(), reinterpret_cast<const unsigned char*>(doc.data()),
                           reinterpret_cast<const unsigned char*>(doc.data()) + doc.size());
        part.doc_ends.push_back(part.tokens.size());
        if (should_stop && should_stop()) {
          part.stopped = true;
          return;
        }
        continue;
      }
      ids.push_back(Gpt2Tokenizer::kEndOfText);
      if (!tok->encode_ordinary(doc, ids, should_stop)) {
        part.stopped = true;
        return;
      }
      part.tokens.insert(part.tokens.end(), ids.begin(), ids.end());  // ids < 50257 fit uint16
      part.doc_ends.push_back(part.tokens.size());
    }
  } catch (...) {
    part.error = std::current_exception();
  }
}

}  // namespace

// ---------------------------------------------------------------------------- driver

namespace {
constexpr const char* kInterrupted =
    "interrupted: no shards were written and the output folder is as it was (staged shards "
    "removed)";
}  // namespace

namespace {

// `tokenizer` null: bytes.
PrepareResult prepare_impl(const Gpt2Tokenizer* tokenizer, DocumentSource& source, const PrepareOptions& options) {
  if (options.shard_size < 1 || options.shard_size > kShardMaxTokens) {
    throw DataError(
        fmt::format("shard size {} is out of range: use 1 .. {} tokens", options.shard_size, kShardMaxTokens));
  }
  if (std::isnan(options.val_fraction) || options.val_fraction >= 1.0) {
    throw DataError(fmt::format("val fraction {} is out of range: use a value in [0, 1)", options.val_fraction));
  }
  if (options.threads < 1) throw DataError(fmt::format("threads {} must be >= 1", options.threads));
  if (options.prefix.empty() || options.prefix.find('/') != std::string::npos) {
    throw DataError(fmt::format("prefix \"{}\" must be a non-empty file name part without '/'", options.prefix));
  }
  std::error_code ec;
  fs::create_directories(options.output_dir, ec);
  if (ec || !fs::is_directory(options.output_dir)) {
    throw DataError(fmt::format("output folder {}: cannot create it: {}", options.output_dir,
                                ec ? ec.message() : "a file of that name exists"));
  }
  detail::ShardSetWriter staged(options.output_dir, options.prefix);
  if (!options.overwrite) {
    const auto old = staged.existing();
    if (!old.empty()) {
      throw DataError(
          fmt::format("output folder {} already has {} {}_{{val,train}}_*.bin shards "
                      "(e.g. {}): pass --overwrite to replace them, or choose another "
                      "folder or --prefix{}",
                      options.output_dir, old.size(), options.prefix, old.front().filename(),
                      staged.recovered().empty() ? "" : " (first, this run " + staged.recovered() + ")"));
    }
  }

  PrepareResult result;
  const ShardTokenizer kind = tokenizer != nullptr ? ShardTokenizer::GPT2 : ShardTokenizer::BYTES;
  ShardCutter cutter(staged, options.shard_size, kind, result);
  const bool by_fraction = options.val_fraction >= 0;
  Stream single{nullptr, {}}, val{"val", {}}, train{"train", {}};
  // One per thread (the byte tokenizer needs none: nulls).
  std::vector<std::optional<Gpt2Tokenizer>> tokenizers(static_cast<size_t>(options.threads));
  if (tokenizer != nullptr)
    for (auto& t : tokenizers) t.emplace(*tokenizer);
  auto tok_at = [&](size_t t) { return tokenizers[t] ? &*tokenizers[t] : nullptr; };
  std::vector<BatchPart> parts(tokenizers.size());
  std::vector<std::string> docs;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  constexpr size_t kBatchBytes = 8 << 20;  // per thread
  uint64_t routed_to_val = 0;

  bool more = true;
  while (more) {
    if (options.should_stop && options.should_stop()) {
      throw DataError(kInterrupted);
    }
    // Read a batch of documents.
    size_t batch_bytes = 0, ndocs = 0;
    while (batch_bytes < kBatchBytes * tokenizers.size()) {
      if (ndocs == docs.size()) docs.emplace_back();
      if (!source.next(docs[ndocs])) {
        more = false;
        break;
      }
      batch_bytes += docs[ndocs].size();
      ++ndocs;
    }
    if (ndocs == 0) break;
    // Tokenize it: thread t takes a contiguous range of documents of about equal bytes.
    const std::span<const std::string> batch(docs.data(), ndocs);
    std::vector<std::thread> threads;
    size_t begin = 0, acc = 0;
    for (size_t t = 0; t < tokenizers.size(); ++t) {
      size_t end = begin;
      const size_t target = batch_bytes * (t + 1) / tokenizers.size();
      while (end < ndocs && (acc < target || t + 1 == tokenizers.size())) acc += batch[end++].size();
      const auto range = batch.subspan(begin, end - begin);
      if (t + 1 == tokenizers.size()) {
        tokenize_range(tok_at(t), range, options.should_stop, parts[t]);
      } else {
        threads.emplace_back(tokenize_range, tok_at(t), range, std::cref(options.should_stop), std::ref(parts[t]));
      }
      begin = end;
    }
    for (auto& th : threads) th.join();
    bool stop = options.should_stop && options.should_stop();  // also after the last batch
    for (BatchPart& part : parts) stop = std::exchange(part.stopped, false) || stop;
    if (stop) throw DataError(kInterrupted);
    // Append in document order.
    for (BatchPart& part : parts) {
      if (part.error) std::rethrow_exception(std::exchange(part.error, nullptr));
      size_t doc_begin = 0;
      for (size_t doc_end : part.doc_ends) {
        const std::span<const uint16_t> doc(part.tokens.data() + doc_begin, doc_end - doc_begin);
        doc_begin = doc_end;
        if (!by_fraction) {
          cutter.append(single, doc);
        } else {
          const double total = static_cast<double>(result.tokens + doc.size());
          const bool to_val = static_cast<double>(routed_to_val) < options.val_fraction * total;
          if (to_val) routed_to_val += doc.size();
          cutter.append(to_val ? val : train, doc);
        }
        result.tokens += doc.size();
        ++result.documents;
      }
      part.tokens.clear();
      part.doc_ends.clear();
    }
    if (options.on_progress) {
      options.on_progress({source.bytes_read(), source.bytes_total(), result.documents, result.tokens,
                           static_cast<int64_t>(result.shards.size()), elapsed()});
    }
  }
  if (result.documents == 0) {
    throw DataError("the input holds no documents (every input is empty): nothing was written");
  }
  cutter.flush(single);
  cutter.flush(val);
  cutter.flush(train);
  staged.commit(options.overwrite);
  result.bytes = source.bytes_read();
  result.seconds = elapsed();
  result.recovered = staged.recovered();
  if (options.on_progress) {
    options.on_progress({source.bytes_read(), source.bytes_total(), result.documents, result.tokens,
                         static_cast<int64_t>(result.shards.size()), result.seconds, true});
  }
  return result;
}

}  // namespace

PrepareResult prepare_shards(const Gpt2Tokenizer& tokenizer, DocumentSource& source, const PrepareOptions& options) {
  return prepare_impl(&tokenizer, source, options);
}

PrepareResult prepare_shards_bytes(DocumentSource& source, const PrepareOptions& options) {
  return prepare_impl(nullptr, source, options);
}

}  // namespace dion::data
