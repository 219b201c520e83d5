// src/train/loader.cpp — ShardLoader (the reference's DistributedDataLoader) and
// SyntheticLoader (debug mode). See loader.h.
#include "dion/train/loader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "dion/data/error.h"
#include "dion/data/shard_folder.h"
#include "dion/data/tokenizer.h"
#include "dion/train/config.h"

namespace dion::train {

namespace fs = std::filesystem;

// ---------------------------------------------------------------------------- shards

ShardLoader::ShardLoader(const fs::path& dir, const std::string& split, int64_t B, int64_t T, int64_t rank,
                         int64_t world, const std::string& prefix)
    : B_(B), T_(T), rank_(rank), world_(world) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataLoadError(
        fmt::format("data_dir '{}' is not a folder (does it exist?). Make shards with "
                    "`dion-data prepare TEXT -o {}` or fetch FineWeb with `dion-data download`",
                    dir.string(), dir.string()));
  const std::string head = prefix + "_" + split + "_";
  data::ShardFolder folder;
  try {
    folder = data::shard_folder_read(dir, prefix);  // one consistent set, or an error naming the files
  } catch (const data::DataError& e) {
    throw DataLoadError(e.what());
  }
  tokenizer_ = folder.tokenizer;
  const std::vector<data::ShardFolderEntry>& shards = split == "val" ? folder.val : folder.train;
  if (shards.empty())
    throw DataLoadError(fmt::format("data_dir '{}': no {}*.bin shards. Make them with `dion-data prepare TEXT -o {}`",
                                    dir.string(), head, dir.string()));
  const int64_t need = B * T * world + 1;
  for (const data::ShardFolderEntry& s : shards) {
    if (s.header.token_count < need)
      throw DataLoadError(
          fmt::format("shard '{}' holds {} tokens, fewer than one batch needs "
                      "(device_batch_size x sequence_length x ranks + 1 = {}); use a smaller "
                      "batch or bigger shards",
                      s.path.string(), s.header.token_count, need));
    files_.push_back(s.path);
    token_counts_.push_back(s.header.token_count);
  }
  checked_.assign(files_.size(), false);
  reset();
}

int64_t ShardLoader::tokens() const {
  int64_t total = 0;
  for (int64_t n : token_counts_) total += n;
  return total;
}

void ShardLoader::open_shard(int64_t index) {
  if (index == shard_ && current_) return;
  try {
    current_ = std::make_unique<data::ShardFile>(data::ShardFile::open(files_[index]));
    if (!checked_[index]) data::shard_check_tokens(*current_, data::shard_tokenizer_vocab(tokenizer_));
  } catch (const data::DataError& e) {
    throw DataLoadError(e.what());
  }
  checked_[index] = true;
  shard_ = index;
}

void ShardLoader::reset() {
  open_shard(0);
  offset_ = rank_ * B_ * T_;
}

Batch ShardLoader::next() {
  auto tokens = current_->tokens();
  const int64_t n = B_ * T_;
  // [B*T + 1] uint16 -> int64
  at::Tensor buf = at::empty({n + 1}, at::kLong);
  int64_t* out = buf.data_ptr<int64_t>();
  for (int64_t i = 0; i <= n; ++i) out[i] = tokens[offset_ + i];
  Batch b{buf.slice(0, 0, n).view({B_, T_}), buf.slice(0, 1, n + 1).view({B_, T_})};
  offset_ += n * world_;
  if (offset_ + (n * world_ + 1) > int64_t(tokens.size())) {
    open_shard((shard_ + 1) % int64_t(files_.size()));
    offset_ = rank_ * n;
  }
  return b;
}

LoaderPosition ShardLoader::position() const {
  return {shard_, offset_ - rank_ * B_ * T_, files_[shard_].filename().string()};  // rank 0's: global
}

void ShardLoader::restore(const LoaderPosition& pos) {
  if (pos.shard < 0 || pos.shard >= int64_t(files_.size()) || files_[pos.shard].filename() != pos.shard_name)
    throw DataLoadError(
        fmt::format("the checkpoint's loader position is shard #{} '{}', but the data folder's "
                    "shard #{} is '{}': the data changed since the checkpoint",
                    pos.shard, pos.shard_name, pos.shard,
                    pos.shard >= 0 && pos.shard < int64_t(files_.size()) ? files_[pos.shard].filename().string()
                                                                         : std::string("(none)")));
  const int64_t mine = pos.offset + rank_ * B_ * T_;
  if (pos.offset < 0 || mine + B_ * T_ + 1 > token_counts_[pos.shard])
    throw DataLoadError(
        fmt::format("the checkpoint's loader offset {} (this rank's: {}) does not fit shard '{}' "
                    "({} tokens)",
                    pos.offset, mine, pos.shard_name, token_counts_[pos.shard]));
  open_shard(pos.shard);
  offset_ = mine;
}

void ShardLoader::start_at_seed(uint64_t data_seed) {
  if (data_seed == 0) return;
  // splitmix64: one well-mixed draw from the seed (no generator state to save: the checkpoint
  // keeps the position itself).
  uint64_t z = data_seed + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  const int64_t last = token_counts_[0] - B_ * T_ * world_ - 1;  // the largest offset that fits
  restore({0, last > 0 ? int64_t(z % uint64_t(last + 1)) : 0, files_[0].filename().string()});
}

std::string ShardLoader::describe() const {
  int64_t total = 0;
  for (int64_t c : token_counts_) total += c;
  return fmt::format("{} shard(s), {} tokens, first {}", files_.size(), total, files_.front().string());
}

// ---------------------------------------------------------------------------- vocabulary

int64_t vocab_round_up(int64_t n) { return (n + 63) / 64 * 64; }

void loader_check_vocab(const Loader& loader, int64_t vocab_size, const std::string& data_dir) {
  if (vocab_size >= loader.vocab()) return;
  throw ConfigError(fmt::format(
      "key 'vocab_size': value {} is smaller than the vocabulary of the data: the shards in '{}' hold "
      "{} tokens (ids 0..{}); valid: vocab_size >= {}; use {} (the data's vocabulary rounded up to a multiple "
      "of 64{})",
      vocab_size, data_dir, loader.tokenizer(), loader.vocab() - 1, loader.vocab(), vocab_round_up(loader.vocab()),
      loader.tokenizer() == "gpt2" ? ", the reference's padded GPT-2 vocabulary" : ""));
}

// ---------------------------------------------------------------------------- synthetic

SyntheticLoader::SyntheticLoader(int64_t B, int64_t T, uint64_t seed, int64_t rank, int64_t world, int64_t vocab)
    : B_(B),
      T_(T),
      vocab_(std::min<int64_t>(vocab, data::Gpt2Tokenizer::kVocabSize)),
      seed_(seed),
      rank_(rank),
      world_(world),
      gen_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

Batch SyntheticLoader::next() {
  at::Tensor mine;
  for (int64_t r = 0; r < world_; ++r) {  // one batch per data-parallel rank; keep ours
    at::Tensor buf = at::randint(0, vocab_, {B_ * T_ + 1}, gen_, at::kLong);
    ++drawn_;
    if (r == rank_) mine = buf;
  }
  return {mine.slice(0, 0, B_ * T_).view({B_, T_}), mine.slice(0, 1).view({B_, T_})};
}

void SyntheticLoader::reset() {
  gen_.set_current_seed(seed_);
  drawn_ = 0;
}

LoaderPosition SyntheticLoader::position() const { return {0, drawn_, "synthetic"}; }

void SyntheticLoader::restore(const LoaderPosition& pos) {
  reset();
  for (int64_t i = 0; i < pos.offset; ++i) (void)at::randint(0, vocab_, {B_ * T_ + 1}, gen_, at::kLong);
  drawn_ = pos.offset;
}

std::string SyntheticLoader::describe() const {
  return fmt::format("synthetic uniform tokens (debug mode), seed {}", seed_);
}

}  // namespace dion::train
