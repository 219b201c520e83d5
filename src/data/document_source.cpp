// src/data/document_source.cpp — the documents prepare reads (document_source_open in
// dion/data/prepare.h): the inputs checked up front (files, folders walked in sorted order,
// FIFOs, stdin; the output's own shards never read as text), then read one after another in
// 1 MiB blocks and cut into documents at the delimiter.
#include "dion/data/prepare.h"

#include <algorithm>
#include <cerrno>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/std.h>

#include "dion/data/error.h"
#include "file_util.h"
#include "shard_set.h"

namespace dion::data {

namespace fs = std::filesystem;

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
int64_t collect_input(const std::string& arg, const OutputShards& own, std::vector<Input>& out, bool& stdin_used,
                      uint64_t& skipped) {
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
    if (fd < 0) throw DataError(fmt::format("input {}: cannot read: {}", p, detail::errno_text(errno)));
    ::close(fd);
  };
  if (!S_ISDIR(st.st_mode)) {
    if (!S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode)) {
      throw DataError(
          fmt::format("input {}: {}, not text (give files, folders, FIFOs, or - for "
                      "stdin)",
                      path, detail::file_type_text(st.st_mode)));
    }
    if (own.contains(path)) {
      throw DataError(
          fmt::format("input {} is one of the shards of the output folder: prepare "
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
    if (ec) throw DataError(fmt::format("input {}: cannot list the folder: {}", path, ec.message()));
    const fs::path& p = it->path();
    if (p.filename().string().starts_with(".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink() && !fs::exists(p)) {
      throw DataError(fmt::format("input {}: broken symbolic link (remove it or fix its target)", p));
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
  InputDocuments(std::vector<Input> inputs, std::string delimiter, uint64_t total, uint64_t max_document_bytes,
                 uint64_t skipped)
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
        search_from_ = std::max(doc_start_, buffer_.size() - std::min(buffer_.size(), delimiter_.size() - 1));
      }
      if (buffer_.size() - doc_start_ > max_document_bytes_) {
        throw DataError(fmt::format(
            "input {}: a document longer than {} bytes ({}); the tokenizer needs a whole "
            "document in memory: split the input with --delimiter, or check that it is text",
            inputs_[next_input_ - 1].label(), max_document_bytes_,
            delimiter_.empty() ? "one file is one document without --delimiter" : "no delimiter found in that span"));
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
      throw DataError(fmt::format("input {}: cannot open: {}", in.label(), detail::errno_text(errno)));
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
      throw DataError(
          fmt::format("input {}: read failed: {}", inputs_[next_input_ - 1].label(), detail::errno_text(err)));
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
  return std::make_unique<InputDocuments>(std::move(files), options.delimiter, size_known ? total : 0,
                                          options.max_document_bytes, skipped);
}

std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const std::string& delimiter) {
  DocumentSourceOptions options;
  options.delimiter = delimiter;
  return document_source_open(inputs, options);
}

}  // namespace dion::data
