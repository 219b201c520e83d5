// dion/data/prepare.h — text -> FineWeb token shards (what `dion-data prepare` runs).
//
// Each document becomes <|endoftext|> followed by its GPT-2 tokens (encode_ordinary, as the
// reference's data/fineweb.py does), or with prepare_shards_bytes end-of-text (256) followed by
// its bytes (ByteTokenizer); the shards' header records which (shard.h, slot [3]). Tokens are cut into shards of exactly `shard_size` tokens
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
// The output folder (see src/data/shard_set.h for the mechanics):
//   - one run at a time per folder and prefix: a second run refuses at once, naming the first
//     (pid, host, start time); the lock dies with its process;
//   - the new shards are written into a hidden staging folder beside the old set and swapped
//     in only when all input has been read and tokenized; on an error or cancellation the
//     staging folder is removed and the output folder is as it was;
//   - the swap is journalled: a crash (kill -9, power cut) before the journal leaves the old
//     set; after it, the complete new set is on disk and the next run on the folder finishes
//     the swap (and removes any staging or temporary files an interrupted run left);
//   - a folder that already has PREFIX_{val,train}_*.bin shards is refused unless `overwrite`;
//     a folder whose shard set changes while the run works (another program wrote there) is
//     refused at the swap, leaving the old set.
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
  // Files found in the input folders that were not read because they are the output's own
  // shards (see DocumentSourceOptions::output_dir).
  virtual uint64_t files_skipped() const { return 0; }
};

struct DocumentSourceOptions {
  std::string delimiter;  // "" = one document per file (or all of stdin)
  // prepare's output folder and prefix: its own shards (PREFIX_{val,train}_*.bin there) are
  // never read as text: skipped in a folder walk, refused when named.
  std::filesystem::path output_dir;
  std::string prefix = "fineweb";
  // A document (the text between delimiters) longer than this is an error naming the input:
  // e.g. /dev/zero on stdin, or a binary file without the delimiter. The tokenizer needs the
  // whole document in memory.
  uint64_t max_document_bytes = uint64_t{1} << 30;
};

// Documents from `inputs`: file paths, directories (walked recursively in sorted order, hidden
// entries skipped) and "-" for stdin. A document is one file (or all of stdin); with a
// non-empty `delimiter`, each file and stdin is split on it (the delimiter is dropped). Empty
// documents are skipped. Every input is checked up front without blocking (exists, readable, a
// regular file, FIFO or folder; not a device or socket; a folder is not empty); a problem throws
// DataError naming the path.
std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const DocumentSourceOptions& options);
std::unique_ptr<DocumentSource> document_source_open(const std::vector<std::string>& inputs,
                                                     const std::string& delimiter);

struct PrepareProgress {
  uint64_t bytes_read = 0;
  uint64_t bytes_total = 0;  // 0 if unknown
  uint64_t documents = 0;
  uint64_t tokens = 0;
  int64_t shards = 0;
  double seconds = 0;
  bool final = false;  // the last call: every shard is written, `shards` is the total
};

struct PrepareOptions {
  std::filesystem::path output_dir;  // created if missing
  std::string prefix = "fineweb";
  int64_t shard_size = 100'000'000;                         // tokens per shard, 1 .. 2^31-1
  double val_fraction = -1;                                 // < 0: first shard is val; else in [0, 1); NaN refused
  int threads = 1;                                          // tokenizer threads
  bool overwrite = false;                                   // replace existing PREFIX_{val,train}_*.bin
  std::function<void(const PrepareProgress&)> on_progress;  // after each batch, and at the end
  // Polled between batches and about every MiB of a document being tokenized, also from the
  // tokenizer threads (so it must be thread-safe); true cancels (Ctrl-C, SIGTERM).
  std::function<bool()> should_stop;
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
  std::string recovered;  // what was left by an interrupted earlier run and cleaned up, or ""
};

// Tokenizes every document of `source` and writes the shards (see the top of this file).
// `tokenizer` is copied per thread. Throws DataError on bad options, bad input, a failed write,
// no documents at all, or cancellation; the output folder is then left as it was.
PrepareResult prepare_shards(const Gpt2Tokenizer& tokenizer, DocumentSource& source, const PrepareOptions& options);
// The same with the byte tokenizer (ByteTokenizer: one id per byte, end-of-text 256); the
// shards' header says ShardTokenizer::BYTES.
PrepareResult prepare_shards_bytes(DocumentSource& source, const PrepareOptions& options);

}  // namespace dion::data
