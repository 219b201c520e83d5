// dion/optim/algorithm.h — the algorithm registry: what the optimizer knows about an algorithm.
//
// API summary
// -----------
//   dion::Algorithm a = dion::find_algorithm("muon");   // a handle; empty when unknown
//   a.name(); a.spec().matrix; a == dion::Algorithm{}    // compared by identity
//   for (dion::Algorithm a : dion::algorithms()) ...     // registration order
//   dion::algorithm_names()                              // "muon", "normuon", ... for messages
//   dion::load_algorithm_plugin("libmy_algo.so")         // algorithms from a shared library
//
// An algorithm is one AlgorithmSpec, defined next to its driver (src/optim/drivers/<family>.cpp)
// and registered there with DION_REGISTER_ALGORITHM. The spec is the optimizer's contract: its
// name and aliases, matrix or scalar (and so which parameters it takes), the state it keeps
// (keys, shapes, dtypes, how each starts), its own checks of hyperparameters, parameters and
// layouts, when its tasks run in step(), and the update itself. The optimizer and the
// checkpoints ask the registry; none names an algorithm. What a tool needs beyond the contract
// lives with the tool, keyed by the algorithm's name, with a default for an algorithm it has no
// entry for: dion-train's (how train.py constructs the class: dion/train/optimizer_entry.h), the
// Python module's (class names and signatures: python/dion_cpp/_class_table.py) and dion-bench's
// (tools/dion-bench/algorithms.h).
//
// Adding an algorithm: write its math (dion/math/<name>.h), a driver file with its update and
// its spec, and export its class (DION_OPTIMIZER_CLASS in dion/dion.h), then, where the defaults
// are not enough, an entry in each tool's table. tests/optim/sign_descent.cpp is a whole
// algorithm in one file: it runs through the C++ API, Python, dion-train and dion-bench with the
// tools' defaults.
//
// Plugins: a shared library whose static initializers register specs (DION_REGISTER_ALGORITHM)
// and which exports dion_algorithm_plugin (DION_ALGORITHM_PLUGIN()) adds its algorithms to a
// running program: load_algorithm_plugin(path), or the DION_ALGORITHM_PLUGINS environment
// variable (paths separated by ':'), read the first time the registry is asked. dion-train,
// dion-bench and the Python module (dion_cpp.load_algorithm_plugin) all go through here.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace dion {

class Options;
class Distribution;
class ParamState;
struct AlgorithmSpec;
struct Plan;  // a megabatch's layout (dion/optim/plan.h)
namespace driver {
struct Batch;
struct Env;
}  // namespace driver

// A registered algorithm: a handle to its spec, compared by identity. Default: none.
class Algorithm {
 public:
  constexpr Algorithm() = default;
  explicit Algorithm(const AlgorithmSpec* spec) : spec_(spec) {}
  const AlgorithmSpec& spec() const;  // throws std::logic_error when empty
  const std::string& name() const;
  bool matrix() const;  // false when empty
  explicit operator bool() const { return spec_ != nullptr; }
  friend bool operator==(Algorithm a, Algorithm b) { return a.spec_ == b.spec_; }
  friend bool operator!=(Algorithm a, Algorithm b) { return a.spec_ != b.spec_; }

 private:
  const AlgorithmSpec* spec_ = nullptr;
};

// Where a state tensor's part on this rank sits in the whole (src/optim/state_layout.h): what
// a checkpoint records and what a load at another layout cuts out.
enum class StateLayout {
  PARAM,       // shaped and sharded like the parameter
  NEURON,      // like the parameter, except its last dim: [.., m, 1], whole on every rank
  SCALAR,      // 0-d, the same on every rank
  OUTER_ROWS,  // [rows, r]: the whole matrix's low-rank basis; a sharded parameter keeps its outer chunk of rows
};

// One state tensor of a parameter: its key (the reference's name: momentum, variance, ...), this
// rank's shape, its dtype and its layout.
struct StateSpec {
  std::string key;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  StateLayout layout = StateLayout::PARAM;
  // A counter of steps: a checkpoint without it resumes it from the group's step.
  bool from_step = false;
};

// What a spec's state and check functions see of one parameter.
struct ParamView {
  const at::Tensor& param;                   // this rank's tensor (a shard, or the whole)
  const std::vector<int64_t>& global_shape;  // the whole parameter's shape
  const Distribution* dist;                  // null: one process
};

// A hyperparameter value this algorithm refuses: the option's name and the rule's text.
struct OptionError {
  std::string option;
  std::string valid;
};

struct AlgorithmSpec {
  using Update = void (*)(const driver::Batch& batch, const Options& options, const driver::Env& env);

  std::string name;                  // "muon": Options::algorithm(name), the checkpoints' name
  std::vector<std::string> aliases;  // other names it is found by ("dion3")
  // Matrix algorithms take parameters of ndim >= 2, batched into megabatches (same shape, dtype,
  // layout); scalar ones take any parameter, one task per group.
  bool matrix = true;
  int phase = 0;                      // order within step(): lower first (matrix groups 0, lion 1, adamw 2)
  bool serial = false;                // its tasks draw random numbers: they run one after another, in order
  bool supports_split_sizes = false;  // split_sizes (row blocks of a fused weight) allowed
  bool weight_decay_on_host = false;  // reads weight decay on the host even with device scalars

  // The state of one parameter, in creation order. Required.
  std::function<std::vector<StateSpec>(const ParamView& p, const Options& o)> state;
  // A state tensor's first value; null (or returning undefined): zeros like the parameter.
  std::function<at::Tensor(const ParamView& p, const StateSpec& s)> initial_state;
  // Its own rules for hyperparameter values, beyond the table's (nullopt: valid).
  std::function<std::optional<OptionError>(const Options& o)> check_options;
  // Its own checks of one parameter (throw dion::ValueError / NotImplementedError with `what`,
  // which names the group, the parameter and its shape).
  std::function<void(const ParamView& p, const Options& o, const std::string& what)> check_param;
  // Its own refusals of a sharded megabatch's layout (throw NotImplementedError with `where`).
  std::function<void(const Plan& plan, const Options& o, const std::string& where)> check_plan;
  Update update = nullptr;  // one task: a megabatch (matrix) or a group (scalar)
};

// The registry. Registration order is the listing order. register_algorithm throws
// std::invalid_argument for a duplicate name or alias, or a spec without state / update.
Algorithm register_algorithm(AlgorithmSpec spec);
std::vector<Algorithm> algorithms();  // every registered algorithm (loads the env plugins first)
Algorithm find_algorithm(const std::string& name, bool aliases = false);  // empty: unknown
std::string algorithm_names(bool matrix_only = false);                    // "muon, normuon, ..." for messages
// Load a plugin (see above); throws dion::ValueError naming the path and dlerror() when it
// cannot be loaded or exports no dion_algorithm_plugin. Returns the algorithms it added.
std::vector<Algorithm> load_algorithm_plugin(const std::string& path);

namespace detail {
struct Registrar {
  explicit Registrar(AlgorithmSpec (*make)());
};
// Algorithms registered in this shared object (a plugin's own copy of the registry).
std::vector<const AlgorithmSpec*>& local_specs();
}  // namespace detail

}  // namespace dion

// Registers the spec `make()` returns, when the program (or plugin) starts.
#define DION_REGISTER_ALGORITHM(make) \
  static const ::dion::detail::Registrar DION_CONCAT_(dion_registrar_, __LINE__)(make)
#define DION_CONCAT_(a, b) DION_CONCAT2_(a, b)
#define DION_CONCAT2_(a, b) a##b

// In a plugin's source: the entry point load_algorithm_plugin looks for.
#define DION_ALGORITHM_PLUGIN()                                                                      \
  extern "C" __attribute__((visibility("default"))) const std::vector<const ::dion::AlgorithmSpec*>* \
  dion_algorithm_plugin() {                                                                          \
    return &::dion::detail::local_specs();                                                           \
  }
