// src/data/prepare.cpp — documents -> tokens -> staged shards -> renamed into place
// (see dion/data/prepare.h).
//
// Layout: the document reader, the staged shard set, the shard cutter, the driver. The driver
// reads a batch of documents, tokenizes it on `threads` threads (each with its own tokenizer
// copy, documents split into contiguous ranges), then appends the tokens in document order, so
// the output does not depend on the thread count.
#include "dion/data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <exception>
#include <optional>
#include <fcntl.h>
#include <span>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "dion/data/shard.h"
#include "file_util.h"
#include "shard_set.h"

namespace dion::data {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------- document reader

namespace {

struct Input {
  fs::path path;  // empty for stdin
  bool is_stdin = false;
  std::string label() const { return is_stdin ? std::string("<stdin>") : path.string(); }
};

// Where prepare writes, so that its own shards are never read as text.
struct OutputShards {
  fs::path dir;  // weakly canonical; empty: no output folder given
  std::string prefix;
  bool contains(const fs::path& p) const {
    if (dir.empty()) return false;
    std::error_code ec;
    return detail::is_shard_name(p.filename().string(), prefix) &&
           fs::weakly_canonical(fs::absolute(p).parent_path(), ec) == dir;
  }
};

// Checks one named input and appends the files it stands for to `out`; returns the bytes of
// those files, or -1 if one of them has no known size (stdin, a pipe). Files of `own` found in
// a folder are skipped and counted in `skipped`.
int64_t collect_input(const std::string& arg, const OutputShards& own, std::vector<Input>& out,
                      bool& stdin_used, uint64_t& skipped) {
  if (arg == "-") {
    if (stdin_used) throw DataError("input \"-\" (stdin) is given twice");
    stdin_used = true;
    out.push_back({fs::path(), true});
    return -1;
  }
  const fs::path path(arg);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw DataError(fmt::format("input {}: {}", path, detail::errno_text(errno)));
  }
  auto check_readable = [](const fs::path& p) {
    // O_NONBLOCK: a FIFO with no writer yet must not block the check.
    int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
      throw DataError(fmt::format("input {}: cannot read: {}", p, detail::errno_text(errno)));
    ::close(fd);
  };
  if (!S_ISDIR(st.st_mode)) {
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
      throw DataError(fmt::format("input {}: {}, not text (give files, folders, FIFOs, or - for "
                                  "stdin)",
                                  path, detail::file_type_text(st.st_mode)));
    }
    if (own.contains(path)) {
      throw DataError(fmt::format("input {} is one of the shards of the output folder: prepare "
                                  "would read its own output as text; name the text files "
                                  "instead",
                                  path));
    }
    check_readable(path);
    out.push_back({path, false});
    return S_ISREG(st.st_mode) ? st.st_size : -1;
  }
  std::vector<fs::path> files;
  std::error_code ec;
  auto it = fs::recursive_directory_iterator(path, ec);
  if (ec) throw DataError(fmt::format("input {}: cannot list the folder: {}", path, ec.message()));
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec)
      throw DataError(fmt::format("input {}: cannot list the folder: {}", path, ec.message()));
    const fs::path& p = it->path();
    if (p.filename().string().starts_with(".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink() && !fs::exists(p)) {
      throw DataError(
          fmt::format("input {}: broken symbolic link (remove it or fix its target)", p));
    }
    if (!it->is_regular_file()) continue;
    if (own.contains(p)) {
      ++skipped;
      continue;
    }
    files.push_back(p);
  }
  if (files.empty()) {
    throw DataError(fmt::format("input {}: the folder has no files to read{}", path,
                                skipped > 0 ? " (only the output's own shards)" : ""));
  }
  std::sort(files.begin(), files.end());
  int64_t bytes = 0;
  for (const fs::path& p : files) {
    check_readable(p);
    out.push_back({p, false});
    bytes += static_cast<int64_t>(fs::file_size(p));
  }
  return bytes;
}

// Reads the inputs one after another in 1 MiB blocks, cutting documents at the delimiter (or at
// the end of each input when there is none).
class InputDocuments : public DocumentSource {
 public:
  InputDocuments(std::vector<Input> inputs, std::string delimiter, uint64_t total,
                 uint64_t max_document_bytes, uint64_t skipped)
      : inputs_(std::move(inputs)),
        delimiter_(std::move(delimiter)),
        total_(total),
        max_document_bytes_(max_document_bytes),
        skipped_(skipped) {}
  ~InputDocuments() override { close_current(); }

  bool next(std::string& doc) override {
    while (true) {
      if (fd_ < 0 && !open_next()) return false;
      if (!delimiter_.empty()) {
        size_t hit = buffer_.find(delimiter_, search_from_);
        if (hit != std::string::npos) {
          doc.assign(buffer_, doc_start_, hit - doc_start_);
          doc_start_ = search_from_ = hit + delimiter_.size();
          if (doc.empty()) continue;
          return true;
        }
        // The delimiter may straddle the next read: search again from its possible start.
        search_from_ =
            std::max(doc_start_, buffer_.size() - std::min(buffer_.size(), delimiter_.size() - 1));
      }
      if (buffer_.size() - doc_start_ > max_document_bytes_) {
        throw DataError(fmt::format(
            "input {}: a document longer than {} bytes ({}); the tokenizer needs a whole "
            "document in memory: split the input with --delimiter, or check that it is text",
            inputs_[next_input_ - 1].label(), max_document_bytes_,
            delimiter_.empty() ? "one file is one document without --delimiter"
                               : "no delimiter found in that span"));
      }
      if (read_block()) continue;
      doc.assign(buffer_, doc_start_, std::string::npos);  // end of this input
      close_current();
      if (!doc.empty()) return true;
    }
  }
  uint64_t bytes_read() const override { return bytes_read_; }
  uint64_t bytes_total() const override { return total_; }
  uint64_t files_skipped() const override { return skipped_; }

 private:
  bool open_next() {
    if (next_input_ >= inputs_.size()) return false;
    const Input& in = inputs_[next_input_++];
    fd_ = in.is_stdin ? ::dup(STDIN_FILENO) : ::open(in.path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      throw DataError(
          fmt::format("input {}: cannot open: {}", in.label(), detail::errno_text(errno)));
    }
    buffer_.clear();
    doc_start_ = search_from_ = 0;
    return true;
  }
  // Appends up to 1 MiB to the buffer; false at end of input.
  bool read_block() {
    constexpr size_t kBlock = 1 << 20;
    if (doc_start_ > 0 && doc_start_ >= buffer_.size() / 2) {  // drop consumed text
      buffer_.erase(0, doc_start_);
      search_from_ -= doc_start_;
      doc_start_ = 0;
    }
    const size_t old = buffer_.size();
    buffer_.resize(old + kBlock);
    ssize_t n;
    do {
      n = ::read(fd_, buffer_.data() + old, kBlock);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      int err = errno;
      buffer_.resize(old);
      throw DataError(fmt::format("input {}: read failed: {}", inputs_[next_input_ - 1].label(),
                                  detail::errno_text(err)));
    }
    buffer_.resize(old + static_cast<size_t>(n));
    bytes_read_ += static_cast<uint64_t>(n);
    return n > 0;
  }
  void close_current() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  std::vector<Input> inputs_;
  std::string delimiter_;
  uint64_t total_ = 0;
  uint64_t max_document_bytes_ = 0;
  uint64_t skipped_ = 0;
  size_t next_input_ = 0;
  int fd_ = -1;
  std::string buffer_;
  size_t doc_start_ = 0;    // start of the current document in buffer_
  size_t search_from_ = 0;  // where to look for the delimiter next
  uint64_t bytes_read_ = 0;
};

}  // namespace

std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const DocumentSourceOptions& options) {
  if (inputs.empty()) throw DataError("no input given (name files, folders, or - for stdin)");
  OutputShards own;
  if (!options.output_dir.empty()) {
    std::error_code ec;
    own.dir = fs::weakly_canonical(fs::absolute(options.output_dir), ec);
    own.prefix = options.prefix;
  }
  std::vector<Input> files;
  bool stdin_used = false, size_known = true;
  uint64_t total = 0, skipped = 0;
  for (const std::string& arg : inputs) {
    int64_t bytes = collect_input(arg, own, files, stdin_used, skipped);
    if (bytes < 0)
      size_known = false;
    else
      total += static_cast<uint64_t>(bytes);
  }
  return std::make_unique<InputDocuments>(std::move(files), options.delimiter,
                                          size_known ? total : 0, options.max_document_bytes,
                                          skipped);
}

std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const std::string& delimiter) {
  DocumentSourceOptions options;
  options.delimiter = delimiter;
  return document_source_open(inputs, options);
}

namespace {

// ---------------------------------------------------------------------------- shard cutter

// One token stream (val, train, or the reference's single stream) cut into shards.
struct Stream {
  const char* split;  // nullptr: "val" for shard number 0, "train" after (the reference)
  std::vector<uint16_t> buffer;
};

class ShardCutter {
 public:
  ShardCutter(detail::ShardSetWriter& staged, int64_t shard_size, ShardTokenizer tokenizer,
              PrepareResult& result)
      : staged_(staged),
        shard_size_(static_cast<size_t>(shard_size)),
        tokenizer_(tokenizer),
        result_(result) {}

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
void tokenize_range(Gpt2Tokenizer* tok, std::span<const std::string> docs,
                    const std::function<bool()>& should_stop, BatchPart& part) {
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
PrepareResult prepare_impl(const Gpt2Tokenizer* tokenizer, DocumentSource& source,
                           const PrepareOptions& options) {
  if (options.shard_size < 1 || options.shard_size > kShardMaxTokens) {
    throw DataError(fmt::format("shard size {} is out of range: use 1 .. {} tokens",
                                options.shard_size, kShardMaxTokens));
  }
  if (std::isnan(options.val_fraction) || options.val_fraction >= 1.0) {
    throw DataError(fmt::format("val fraction {} is out of range: use a value in [0, 1)",
                                options.val_fraction));
  }
  if (options.threads < 1) throw DataError(fmt::format("threads {} must be >= 1", options.threads));
  if (options.prefix.empty() || options.prefix.find('/') != std::string::npos) {
    throw DataError(fmt::format("prefix \"{}\" must be a non-empty file name part without '/'",
                                options.prefix));
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
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
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
      while (end < ndocs && (acc < target || t + 1 == tokenizers.size()))
        acc += batch[end++].size();
      const auto range = batch.subspan(begin, end - begin);
      if (t + 1 == tokenizers.size()) {
        tokenize_range(tok_at(t), range, options.should_stop, parts[t]);
      } else {
        threads.emplace_back(tokenize_range, tok_at(t), range,
                             std::cref(options.should_stop), std::ref(parts[t]));
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
      options.on_progress({source.bytes_read(), source.bytes_total(), result.documents,
                           result.tokens, static_cast<int64_t>(result.shards.size()), elapsed()});
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
    options.on_progress({source.bytes_read(), source.bytes_total(), result.documents,
                         result.tokens, static_cast<int64_t>(result.shards.size()), result.seconds,
                         true});
  }
  return result;
}

}  // namespace

PrepareResult prepare_shards(const Gpt2Tokenizer& tokenizer, DocumentSource& source,
                             const PrepareOptions& options) {
  return prepare_impl(&tokenizer, source, options);
}

PrepareResult prepare_shards_bytes(DocumentSource& source, const PrepareOptions& options) {
  return prepare_impl(nullptr, source, options);
}

}  // namespace dion::data
