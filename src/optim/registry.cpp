// The algorithm registry (dion/optim/algorithm.h): the builtin drivers' specs, registered in
// the order cmake/DionTorch.cmake lists their files, then those of tests and plugins.
#include "dion/optim/algorithm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "dion/errors.h"
#include "dion/optim/options.h"

namespace dion {

namespace detail {
void register_builtin_algorithms();  // src/optim/drivers/builtin.cpp: each builtin driver file's registration
}  // namespace detail

namespace {

struct Registry {
  std::vector<std::unique_ptr<AlgorithmSpec>> specs;  // stable addresses: handles point here
  std::vector<const AlgorithmSpec*> local;            // registered outside the builtins
  bool builtins_done = false;
  bool plugins_done = false;
};

std::recursive_mutex& registry_mutex() {
  static std::recursive_mutex m;
  return m;
}

Registry& raw_registry() {
  static Registry r;
  return r;
}

bool building_builtins = false;  // the builtin drivers' specs are being registered

void ensure_builtins(Registry& r) {
  if (r.builtins_done) return;
  r.builtins_done = true;
  building_builtins = true;
  try {
    detail::register_builtin_algorithms();
  } catch (...) {
    building_builtins = false;
    throw;
  }
  building_builtins = false;
}

Registry& registry() {
  std::lock_guard<std::recursive_mutex> lock(registry_mutex());
  Registry& r = raw_registry();
  ensure_builtins(r);
  return r;
}

void load_env_plugins() {
  Registry& r = registry();
  if (r.plugins_done) return;
  r.plugins_done = true;
  const char* env = std::getenv("DION_ALGORITHM_PLUGINS");
  if (!env || !*env) return;
  std::stringstream paths(env);
  for (std::string path; std::getline(paths, path, ':');)
    if (!path.empty()) load_algorithm_plugin(path);
}

}  // namespace

const AlgorithmSpec& Algorithm::spec() const {
  if (!spec_) throw std::logic_error("dion::Algorithm: no algorithm (an empty handle)");
  return *spec_;
}
const std::string& Algorithm::name() const { return spec().name; }
bool Algorithm::matrix() const { return spec_ && spec_->matrix; }

Algorithm register_algorithm(AlgorithmSpec spec) {
  std::lock_guard<std::recursive_mutex> lock(registry_mutex());
  Registry& r = raw_registry();
  if (!building_builtins) ensure_builtins(r);  // a test's or plugin's spec: the builtins first
  const std::string what = "register_algorithm('" + spec.name + "')";
  if (spec.name.empty()) throw std::invalid_argument("register_algorithm: the spec has no name");
  if (!spec.state || !spec.update) throw std::invalid_argument(what + ": the spec needs `state` and `update`");
  std::vector<std::string> names = spec.aliases;
  names.push_back(spec.name);
  for (const auto& existing : r.specs)
    for (const std::string& n : names) {
      bool taken = existing->name == n;
      for (const std::string& a : existing->aliases) taken = taken || a == n;
      if (taken) throw std::invalid_argument(what + ": the name '" + n + "' is taken by '" + existing->name + "'");
    }
  r.specs.push_back(std::make_unique<AlgorithmSpec>(std::move(spec)));
  if (!building_builtins) r.local.push_back(r.specs.back().get());
  return Algorithm(r.specs.back().get());
}

namespace detail {
Registrar::Registrar(AlgorithmSpec (*make)()) { register_algorithm(make()); }

std::vector<const AlgorithmSpec*>& local_specs() {
  std::lock_guard<std::recursive_mutex> lock(registry_mutex());
  return raw_registry().local;
}
}  // namespace detail

std::vector<Algorithm> algorithms() {
  std::lock_guard<std::recursive_mutex> lock(registry_mutex());
  load_env_plugins();
  std::vector<Algorithm> out;
  for (const auto& s : registry().specs) out.emplace_back(s.get());
  return out;
}

Algorithm find_algorithm(const std::string& name, bool aliases) {
  for (Algorithm a : algorithms()) {
    if (a.spec().name == name) return a;
    if (aliases)
      for (const std::string& alias : a.spec().aliases)
        if (alias == name) return a;
  }
  return {};
}

std::string algorithm_names(bool matrix_only) {
  std::string out;
  for (Algorithm a : algorithms())
    if (!matrix_only || a.matrix()) out += (out.empty() ? "" : ", ") + a.name();
  return out;
}

std::vector<Algorithm> load_algorithm_plugin(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(registry_mutex());
  registry();
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded: its code runs in steps
  if (!handle) {
    const char* e = dlerror();
    throw ValueError("algorithm plugin '" + path + "': cannot be loaded (" + (e ? e : "unknown error") +
                     "); give the path of a shared library built with DION_ALGORITHM_PLUGIN()");
  }
  using Entry = const std::vector<const AlgorithmSpec*>* (*)();
  auto entry = reinterpret_cast<Entry>(dlsym(handle, "dion_algorithm_plugin"));
  if (!entry)
    throw ValueError("algorithm plugin '" + path +
                     "': exports no dion_algorithm_plugin (add DION_ALGORITHM_PLUGIN() to one of its files)");
  std::vector<Algorithm> added;
  for (const AlgorithmSpec* spec : *entry()) {
    if (find_algorithm(spec->name, true)) continue;  // loaded twice, or linked in already
    try {
      added.push_back(register_algorithm(*spec));
    } catch (const std::invalid_argument& e) {
      throw ValueError("algorithm plugin '" + path + "': " + e.what());
    }
  }
  return added;
}

}  // namespace dion
