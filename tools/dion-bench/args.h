// tools/dion-bench/args.h — what dion-bench's tables share: the common flags, the parsing of
// list flags (a bad value is a usage error naming the flag) and the JSON output.
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dion::bench {

struct Common {
  int threads = 1;
  std::string json_path;
};

std::vector<std::string> split(const std::string& list);  // "a,b" -> {a, b}
std::optional<int64_t> parse_int(const std::string& text);
// "AxBxC" with `count` positive numbers; CLI::ValidationError naming `flag` otherwise.
std::vector<int64_t> parse_dims(const std::string& flag, const std::string& text, size_t count);
at::ScalarType parse_dtype(const std::string& name);  // bf16 | fp32
// One table as a JSON line appended to --json (with the machine's description).
void emit(const Common& common, nlohmann::json table);
// Every item of the list flag `flag` is one of `valid` (empty: any), else CLI::ValidationError.
void check_list(const std::string& flag, const std::string& text, const std::vector<std::string>& valid);

}  // namespace dion::bench
