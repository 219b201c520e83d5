// tools/dion-bench/args.cpp — the shared argument helpers and the JSON output (args.h).
#include "args.h"

#include <ATen/ATen.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "measure.h"

namespace dion::bench {

using nlohmann::json;

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

// The whole of `text` as an integer, else nullopt ("4x", "", "2.5" and out-of-range are not).
std::optional<int64_t> parse_int(const std::string& text) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != text.size()) return std::nullopt;
  return v;
}

// "AxBxC" -> {A, B, C}; throws naming the flag.
std::vector<int64_t> parse_dims(const std::string& flag, const std::string& text, size_t count) {
  std::vector<int64_t> dims;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, 'x')) {
    const std::optional<int64_t> v = parse_int(part);
    if (!v || *v <= 0) throw CLI::ValidationError(flag, "'" + text + "': expected positive integers joined by 'x'");
    dims.push_back(*v);
  }
  if (dims.size() != count)
    throw CLI::ValidationError(flag, "'" + text + "': expected " + std::to_string(count) + " numbers joined by 'x'");
  return dims;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp32") return at::kFloat;
  throw CLI::ValidationError("--dtypes", "'" + name + "': valid values are bf16, fp32");
}

void emit(const Common& common, json table) {
  table["machine"] = dion::bench::machine_info();
  if (!common.json_path.empty()) {
    std::ofstream out(common.json_path, std::ios::app);
    if (!out) throw std::runtime_error("--json: cannot open " + common.json_path + " for append");
    out << table.dump() << "\n";
  }
}

// Every list flag is checked before anything is measured: a bad value is a usage error naming
// the flag (exit 2), not an error after minutes of other tables.
void check_list(const std::string& flag, const std::string& text, const std::vector<std::string>& valid) {
  const std::vector<std::string> items = split(text);
  if (items.empty()) throw CLI::ValidationError(flag, "empty list");
  for (const std::string& item : items) {
    if (valid.empty()) continue;
    if (std::find(valid.begin(), valid.end(), item) == valid.end()) {
      std::string names;
      for (const std::string& v : valid) names += (names.empty() ? "" : ", ") + v;
      throw CLI::ValidationError(flag, "'" + item + "': valid values are " + names);
    }
  }
}

}  // namespace dion::bench
