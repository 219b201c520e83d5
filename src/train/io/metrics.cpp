// src/train/io/metrics.cpp — metrics.jsonl writer (metrics.h).
#include "dion/train/metrics.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace dion::train {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

MetricsWriter::MetricsWriter(const fs::path& file, int64_t keep_through_step) {
  std::vector<std::string> kept;
  if (keep_through_step >= 0) {
    std::ifstream in(file);
    std::string line;
    while (std::getline(in, line)) {
      try {
        const json j = json::parse(line);
        if (j.at("step").get<int64_t>() <= keep_through_step) kept.push_back(line);
      } catch (const json::exception&) {
        break;  // a line cut by a kill: everything after it is newer than the checkpoint
      }
    }
  }
  const fs::path tmp = fs::path(file.string() + ".tmp");
  {
    std::ofstream o(tmp, std::ios::trunc);
    for (const std::string& l : kept) o << l << "\n";
    if (!o) throw std::runtime_error(fmt::format("cannot write '{}'", tmp.string()));
  }
  fs::rename(tmp, file);
  out_.open(file, std::ios::app);
  if (!out_) throw std::runtime_error(fmt::format("cannot open '{}' for writing", file.string()));
}

void MetricsWriter::train(int64_t step, double loss, double grad_norm, double lr, int64_t tokens, double tokens_per_s,
                          double ms_per_step, double time_s, double fwd_bwd_ms, bool skipped,
                          const std::vector<double>& moe_imbalance, double moe_route_ms) {
  json j = {{"kind", "train"},
            {"step", step},
            {"loss", loss},
            {"grad_norm", grad_norm},
            {"lr", lr},
            {"tokens", tokens},
            {"tokens_per_s", tokens_per_s},
            {"ms_per_step", ms_per_step},
            {"time_s", time_s},
            {"fwd_bwd_ms", fwd_bwd_ms}};
  if (skipped) j["skipped"] = true;
  if (!moe_imbalance.empty()) j["moe_load_imbalance"] = moe_imbalance;
  if (moe_route_ms >= 0) j["moe_route_ms"] = moe_route_ms;
  out_ << j.dump() << std::endl;
}

void MetricsWriter::val(int64_t step, double val_loss, int64_t tokens, double time_s) {
  json j = {{"kind", "val"}, {"step", step}, {"val_loss", val_loss}, {"tokens", tokens}, {"time_s", time_s}};
  out_ << j.dump() << std::endl;
}

}  // namespace dion::train
