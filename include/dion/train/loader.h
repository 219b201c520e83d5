// dion/train/loader.h — batches of tokens for the trainer: FineWeb shards in a folder, or
// debug mode's synthetic tokens.
//
// ShardLoader is the reference's DistributedDataLoader (models/gpt_utils.py) for one data-parallel
// rank of `world`: shards matching PREFIX_{train,val}_*.bin in sorted order; a batch is the
// B*T+1 tokens at `position` (x = first B*T, y = the next B*T, shifted by one); then
// position += B*T*world, and when fewer than B*T*world+1 tokens would remain, the next shard
// (cycling) starting at rank*B*T. Every shard's header and size are checked when the loader is
// built (so a bad shard fails before anything is written), and each shard's tokens are checked
// against the vocabulary when it is first mapped.
//
// Position: (shard index, offset) of the NEXT batch; it goes into the checkpoint. (The
// reference prefetches the next batch before saving its position, so its resume skips one
// batch; ours resumes at exactly the batch the uninterrupted run would read.)
//
// The vocabulary: a shard set records its tokenizer (GPT-2: 50257 ids, bytes: 257; dion/data/
// shard.h); vocab() says it, tokenizer() names it, and each shard's tokens are checked against
// it. loader_check_vocab refuses a model vocabulary (key vocab_size) smaller than the data's.
//
// SyntheticLoader: uniform random tokens in [0, min(50257, vocab)) from its own generator seeded with
// `seed`; data-parallel rank r of `world` takes batches r, r + world, ... of that one stream (so
// the global batch is the same at every world size); its position is the number of batches
// drawn from the stream, all ranks together (re-seeded and advanced on restore).
//
// Positions are GLOBAL (data-parallel rank 0's): ShardLoader's offset is rank 0's, and each
// rank adds rank * B * T itself, so that a position saved at one world size restores at
// another (at a shard boundary the rank-count-dependent wrap rule can differ: see docs/train.md).
//
// Data order (key data_seed): start_at_seed(s) moves the first batch to a global offset drawn
// from s in [0, tokens of shard 0 - B*T*world - 1]: another cut of the stream into windows and
// another order of them; at the end of the shard the next one starts at its first token as
// always. s = 0 keeps the reference's order.
//
// What it does not do: shuffle, or decide rank / world (the caller passes them).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dion/data/shard.h"

namespace dion::train {

// A data problem (missing folder, no shards, a bad shard). Exit code 1.
class DataLoadError : public std::runtime_error {
 public:
  explicit DataLoadError(const std::string& message) : std::runtime_error(message) {}
};

struct LoaderPosition {
  int64_t shard = 0;       // index into the sorted shard list
  int64_t offset = 0;      // token offset of the next batch in that shard
  std::string shard_name;  // the file's name, for the checkpoint (checked on restore)
};

struct Batch {
  at::Tensor x, y;  // [B, T] int64 (inputs, targets = inputs shifted by one)
};

class Loader {
 public:
  virtual ~Loader() = default;
  virtual Batch next() = 0;
  virtual void reset() = 0;  // back to the first batch (validation)
  virtual LoaderPosition position() const = 0;
  virtual void restore(const LoaderPosition& pos) = 0;
  virtual std::string describe() const = 0;      // one line for the log
  virtual int64_t tokens() const { return -1; }  // tokens in the split (-1: endless)
  virtual int64_t vocab() const = 0;             // token ids are < this
  virtual std::string tokenizer() const = 0;     // "gpt2", "bytes" or "synthetic"
};

// Throws ConfigError naming key 'vocab_size', its value, the data's tokenizer and vocabulary
// (`data_dir` for the message) and the value to use when vocab_size < loader.vocab().
void loader_check_vocab(const Loader& loader, int64_t vocab_size, const std::string& data_dir);
// The smallest multiple of 64 >= n (GPT-2's 50257 -> 50304, bytes' 257 -> 320): the reference
// pads its vocabulary so the embedding and lm_head matrices have friendly shapes.
int64_t vocab_round_up(int64_t n);

class ShardLoader : public Loader {
 public:
  // `split`: "train" or "val". Throws DataLoadError naming the folder / file.
  ShardLoader(const std::filesystem::path& dir, const std::string& split, int64_t B, int64_t T, int64_t rank = 0,
              int64_t world = 1, const std::string& prefix = "fineweb");
  Batch next() override;
  void reset() override;
  LoaderPosition position() const override;
  void restore(const LoaderPosition& pos) override;
  void start_at_seed(uint64_t data_seed);  // see above; 0: no change
  std::string describe() const override;
  int64_t tokens() const override;
  int64_t vocab() const override { return data::shard_tokenizer_vocab(tokenizer_); }
  std::string tokenizer() const override { return data::shard_tokenizer_name(tokenizer_); }
  const std::vector<std::filesystem::path>& files() const { return files_; }

 private:
  void open_shard(int64_t index);

  std::vector<std::filesystem::path> files_;
  std::vector<int64_t> token_counts_;
  int64_t B_, T_, rank_, world_;
  int64_t shard_ = -1, offset_ = 0;
  std::unique_ptr<data::ShardFile> current_;
  std::vector<bool> checked_;
  data::ShardTokenizer tokenizer_ = data::ShardTokenizer::GPT2;
};

class SyntheticLoader : public Loader {
 public:
  // `vocab`: tokens are drawn in [0, min(50257, vocab)) (the default keeps GPT-2's stream).
  SyntheticLoader(int64_t B, int64_t T, uint64_t seed, int64_t rank = 0, int64_t world = 1, int64_t vocab = 50257);
  Batch next() override;
  void reset() override;
  LoaderPosition position() const override;
  void restore(const LoaderPosition& pos) override;
  std::string describe() const override;
  int64_t vocab() const override { return vocab_; }
  std::string tokenizer() const override { return "synthetic"; }

 private:
  int64_t B_, T_;
  int64_t vocab_ = 50257;
  uint64_t seed_;
  int64_t rank_ = 0, world_ = 1;
  int64_t drawn_ = 0;
  at::Generator gen_;
};

}  // namespace dion::train
