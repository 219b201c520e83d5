// dion/data/prepare.h — text -> FineWeb token shards (what `dion-data prepare` runs).
//
// Each document becomes <|endoftext|> followed by its GPT-2 tokens (encode_ordinary, as the
// reference's data/fineweb.py does). Tokens are cut into shards of exactly `shard_size` tokens
// (the last one holds the rest), a document running across a shard boundary as in the
// reference. Splits:
//   - default (val_fraction < 0): the first shard is "val", every later one "train" — exactly
//     the reference's layout;
//   - val_fraction in [0, 1): whole documents go to val or train so that val holds about that
//     fraction of the tokens (a document goes to val while val is below the fraction of all
//     tokens so far); val and train are cut into shards separately.
// Shard numbers are one sequence in the order shards fill up (so the default gives val_000000,
// train_000001, ...).
//
// Nothing half-written looks complete: every shard is written under a temporary name
// ("....bin.tmp.XXXXXX") and the whole set is renamed into place only when all input has been
// read and tokenized; on any error or cancellation the temporaries are removed and the output
// folder is as it was. An output folder that already has PREFIX_{val,train}_*.bin shards is
// refused unless `overwrite` (then the old ones are removed when the new set is renamed in).
//
// What it does not do: fetch text (see download.h for pre-tokenized shards), deduplicate,
// filter, or shuffle.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dion/data/tokenizer.h"

namespace dion::data {

// A stream of documents (text, any bytes).
class DocumentSource {
 public:
  virtual ~DocumentSource() = default;
  // Sets `doc` to the next document and returns true, or returns false after the last one.
  virtual bool next(std::string& doc) = 0;
  virtual uint64_t bytes_read() const = 0;   // input bytes consumed so far
  virtual uint64_t bytes_total() const = 0;  // all input bytes, 0 if unknown (stdin, a pipe)
};

// Documents from `inputs`: file paths, directories (walked recursively in sorted order, hidden
// entries skipped) and "-" for stdin. A document is one file (or all of stdin); with a
// non-empty `delimiter`, each file and stdin is split on it (the delimiter is dropped). Empty
// documents are skipped. Every input is checked up front (exists, readable, a directory is not
// empty); a problem throws DataError naming the path.
std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const std::string& delimiter);

struct PrepareProgress {
  uint64_t bytes_read = 0;
  uint64_t bytes_total = 0;  // 0 if unknown
  uint64_t documents = 0;
  uint64_t tokens = 0;
  int64_t shards = 0;
  double seconds = 0;
};

struct PrepareOptions {
  std::filesystem::path output_dir;  // created if missing
  std::string prefix = "fineweb";
  int64_t shard_size = 100'000'000;  // tokens per shard, 1 .. 2^31-1
  double val_fraction = -1;          // < 0: first shard is val; else in [0, 1)
  int threads = 1;                   // tokenizer threads
  bool overwrite = false;            // replace existing PREFIX_{val,train}_*.bin
  std::function<void(const PrepareProgress&)> on_progress;  // after each batch of documents
  std::function<bool()> should_stop;  // polled between batches; true cancels (Ctrl-C)
};

struct ShardInfo {
  std::filesystem::path path;
  std::string split;  // "val" or "train"
  int64_t tokens = 0;
};

struct PrepareResult {
  uint64_t documents = 0;
  uint64_t bytes = 0;
  uint64_t tokens = 0;  // including one <|endoftext|> per document
  uint64_t val_tokens = 0;
  uint64_t train_tokens = 0;
  double seconds = 0;
  std::vector<ShardInfo> shards;
};

// Tokenizes every document of `source` and writes the shards (see the top of this file).
// `tokenizer` is copied per thread. Throws DataError on bad options, bad input, a failed write,
// no documents at all, or cancellation; the output folder is then left as it was.
PrepareResult prepare_shards(const Gpt2Tokenizer& tokenizer, DocumentSource& source,
                             const PrepareOptions& options);

}  // namespace dion::data
