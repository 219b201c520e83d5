// dion/data/error.h — the one exception type of the data tools (tokenizer, shards, prepare,
// download).
//
// Every message names the file (or URL) involved, says what is wrong, and where it can, what to
// do next. The dion-data tool prints the message and exits non-zero. Nothing here knows about
// LibTorch or the optimizer library.
#pragma once

#include <stdexcept>
#include <string>

namespace dion::data {

class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace dion::data
