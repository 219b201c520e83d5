// tools/dion-bench/measure.h — clocks, interleaved repetitions, an allocation counter and the
// machine description that dion-bench records with every table.
//
// What it is not: no statistics beyond medians, no output formatting (main.cpp writes JSON).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dion::bench {

// Process CPU time in seconds (with one intra-op thread, the work's own time even when other
// processes share the cores), or monotonic wall time.
double cpu_seconds();
double wall_seconds();

// Runs every callable `reps` times, interleaved (round r runs 0, 1, ..., k-1 for even r and the
// reverse for odd r, so that a drift in machine load hits all alike); returns per callable the
// CPU seconds of each repetition. `warmup` untimed rounds first.
std::vector<std::vector<double>> interleave(const std::vector<std::function<void()>>& fns, int reps, int warmup);

double median(std::vector<double> v);

// Counts bytes and calls of the CPU allocator (c10::SetCPUAllocator over the default one)
// between begin() and end(). install() once, before the tensors to be measured are created.
struct AllocCounter {
  static void install();
  static void begin();
  static int64_t bytes();  // since begin()
  static int64_t calls();
};

// Thread CPU time spent inside each library phase (the RecordFunction user scopes "dion::*" that
// src/math opens: dion::muon_pre, dion::orthogonalize, dion::lion, ...) between begin() and
// end(), in seconds per scope name; nested scopes count in both. install() once.
struct PhaseTimer {
  static void install();
  static void begin();
  static std::vector<std::pair<std::string, double>> end();  // in order of first entry
};

// Peak resident set size of this process, bytes (getrusage).
int64_t peak_rss_bytes();

// Load average, threads, CPU model and flags, torch version: recorded with every table.
nlohmann::json machine_info();

}  // namespace dion::bench
