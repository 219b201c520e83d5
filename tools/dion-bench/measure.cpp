// Clocks, interleaving, allocation counter, machine description (see measure.h).
#include "measure.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/CPUAllocator.h>
#include <sys/resource.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <ctime>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "dion/math/ortho.h"

namespace dion::bench {

namespace {

double clock_of(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

std::atomic<int64_t> g_bytes{0}, g_calls{0};

// Forwards to the allocator that was current at install(), counting what passes through.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) override {
    g_bytes += static_cast<int64_t>(n);
    g_calls += 1;
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

 private:
  c10::Allocator* inner_;
};

// PhaseTimer: per scope name, accumulated thread CPU seconds (only while g_phases_on).
std::atomic<bool> g_phases_on{false};
std::mutex g_phases_mutex;
std::vector<std::pair<std::string, double>> g_phases;

struct PhaseStart : at::ObserverContext {
  double t0 = 0;
};

std::unique_ptr<at::ObserverContext> phase_enter(const at::RecordFunction& fn) {
  if (!g_phases_on || std::strncmp(fn.name(), "dion::", 6) != 0) return nullptr;
  auto ctx = std::make_unique<PhaseStart>();
  ctx->t0 = clock_of(CLOCK_THREAD_CPUTIME_ID);
  return ctx;
}

void phase_exit(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!ctx) return;
  const double dt = clock_of(CLOCK_THREAD_CPUTIME_ID) - static_cast<PhaseStart*>(ctx)->t0;
  std::lock_guard<std::mutex> lock(g_phases_mutex);
  for (auto& [name, t] : g_phases)
    if (name == fn.name()) {
      t += dt;
      return;
    }
  g_phases.emplace_back(fn.name(), dt);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      return colon == std::string::npos ? "" : line.substr(colon + 2);
    }
  return "";
}

}  // namespace

double cpu_seconds() { return clock_of(CLOCK_PROCESS_CPUTIME_ID); }
double wall_seconds() { return clock_of(CLOCK_MONOTONIC); }

std::vector<std::vector<double>> interleave(const std::vector<std::function<void()>>& fns, int reps, int warmup) {
  std::vector<std::vector<double>> times(fns.size());
  const int n = static_cast<int>(fns.size());
  for (int round = 0; round < warmup + reps; ++round) {
    for (int j = 0; j < n; ++j) {
      const int k = round % 2 == 0 ? j : n - 1 - j;
      const double t0 = cpu_seconds();
      fns[static_cast<size_t>(k)]();
      const double t = cpu_seconds() - t0;
      if (round >= warmup) times[static_cast<size_t>(k)].push_back(t);
    }
  }
  return times;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : 0.5 * (v[h - 1] + v[h]);
}

void AllocCounter::install() {
  static CountingAllocator counter(c10::GetCPUAllocator());
  static bool done = false;
  if (!done) c10::SetCPUAllocator(&counter, /*priority=*/100);
  done = true;
}
void AllocCounter::begin() {
  g_bytes = 0;
  g_calls = 0;
}
int64_t AllocCounter::bytes() { return g_bytes.load(); }
int64_t AllocCounter::calls() { return g_calls.load(); }

void PhaseTimer::install() {
  at::addGlobalCallback(
      at::RecordFunctionCallback(phase_enter, phase_exit).scopes({at::RecordScope::USER_SCOPE}).needsInputs(false));
}

void PhaseTimer::begin() {
  std::lock_guard<std::mutex> lock(g_phases_mutex);
  g_phases.clear();
  g_phases_on = true;
}

std::vector<std::pair<std::string, double>> PhaseTimer::end() {
  g_phases_on = false;
  std::lock_guard<std::mutex> lock(g_phases_mutex);
  return g_phases;
}

int64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

nlohmann::json machine_info() {
  nlohmann::json j;
  j["loadavg"] = read_first_line("/proc/loadavg");
  j["torch_threads"] = at::get_num_threads();
  j["hardware_threads"] = std::thread::hardware_concurrency();
  j["cpu"] = cpuinfo_field("model name");
  std::istringstream flags(cpuinfo_field("flags"));
  std::vector<std::string> have, wanted = {"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16"};
  for (std::string f; flags >> f;)
    if (std::find(wanted.begin(), wanted.end(), f) != wanted.end()) have.push_back(f);
  j["cpu_flags"] = have;
  if (const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA")) j["onednn_max_cpu_isa"] = cap;
  // What the fast path (wanting bf16) and Gram NS (wanting fp16) compute in here, and why.
  for (const auto& [key, wanted] : {std::pair{"fast_bf16", at::kBFloat16}, std::pair{"gram", at::kHalf}}) {
    const dion::math::CpuComputeDtype c = dion::math::cpu_compute_dtype(wanted);
    j["cpu_compute_dtype"][key] = {{"dtype", dion::math::dtype_short_name(c.dtype)}, {"reason", c.reason}};
  }
  j["torch_version"] = TORCH_VERSION;
  j["time_utc"] = [] {
    std::time_t t = std::time(nullptr);
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
    return std::string(buf);
  }();
  return j;
}

}  // namespace dion::bench
