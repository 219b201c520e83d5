// dion_cpp._C — the C++ optimizers for the Python classes in python/dion_cpp/_optimizers.py,
// and the algorithm registry they are generated from (algorithms(), load_algorithm_plugin).
//
// What it is: one class, `Optimizer`, that owns a dion::Optimizer of the requested kind over
// the caller's parameter tensors (at::Tensor shares the TensorImpl of the torch.Tensor, so
// updates are visible in Python and gradients set in Python are seen here). Python param-group
// dicts (the reference's keys: lr, mu, beta1, beta2, weight_decay, adjust_lr, num_heads, ...)
// are turned into dion::Options here, in one function (options_from_dict), and validated by the
// library (Options::validate, the optimizer's group checks). Library exceptions become Python
// exceptions of the same name: dion::ValueError -> ValueError, dion::TypeError -> TypeError,
// dion::NotImplementedError -> NotImplementedError, c10::Error -> RuntimeError.
//
// What it is not: no math and no bookkeeping of its own. Hyperparameters live in the Python
// param_groups and are pushed here before every step (set_group); state tensors live here and
// are handed to Python as the same tensor objects (state / set_state).
//
// Distribution: set_distribution(process_group, ranks, sync_gradients) wraps a
// torch.distributed ProcessGroup (Gloo for CPU tensors, NCCL for CUDA tensors) as a
// dion::comm::Group (Group::from_process_group) and gives the optimizer a dion::Distributed
// over it: the optimizer issues its collectives on torch's own backends, from the thread that
// calls step(), 3 megabatch tasks in flight (dion/comm/tasks.h). Every method that may issue a
// collective (step, init_state, synchronize_for_checkpoint) releases the GIL first, as torch's
// own c10d bindings do: a Gloo worker thread that retires a finished collective drops its
// tensors while holding the backend's queue lock, and dropping a Python-owned tensor takes the
// GIL; a caller that enqueues a collective while holding the GIL then deadlocks with it (the
// intermittent hang of earlier versions, docs/distributed.md); set_sharded_distribution(outer, ...,
// inner, ..., replicate, ...) does the same for the outer / inner shard meshes and
// replicate mesh of a class with the "meshes" behaviour (Distributed(outer, inner).replicate(...));
// shard(local, global_shape, dim, inner_dim) registers a DTensor's local shard, shard_over(group, ...)
// a stack split over its own group (an EP group; or a matrix dim split over two mesh dims, with the
// members in chunk order: OrderedAxis). Python (_optimizers.py, _layouts.py) decides what is sharded.
//
// QkClip: dion::QkClip (dion/optim/qk_clip.h) over a ProcessGroup, for dion_cpp.QKClip (_qk_clip.py).
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dion/dion.h"
#include "convert.h"
#include "dion/optim/distributed.h"

namespace py = pybind11;

namespace {

using namespace dion_python;  // convert.h

// ---------------------------------------------------------------------------- a group in another order

// An AxisGroup whose member order is not its ProcessGroup's: logical rank l is the ProcessGroup's
// member perm[l]. A ProcessGroup orders its members by global rank; a dim split over two mesh
// dims by FSDP2 over TP (torchtitan's (_StridedShard(0, sf=tp), Shard(0)) on ("fsdp", "tp")) puts
// chunk t * F + f on the rank at (f, t): the assembly concatenates chunks in group-rank order, so
// it needs the group in chunk order. all_reduce is order-free; all_gather and all_to_all
// reorder their dim-0 chunks.
class OrderedAxis : public dion::AxisGroup {
 public:
  OrderedAxis(std::shared_ptr<dion::AxisGroup> base, std::vector<int64_t> perm)
      : base_(std::move(base)), perm_(std::move(perm)), inverse_(perm_.size()) {
    for (size_t l = 0; l < perm_.size(); ++l) inverse_[static_cast<size_t>(perm_[l])] = static_cast<int64_t>(l);
  }
  int size() const override { return base_->size(); }
  int rank() const override { return static_cast<int>(inverse_[static_cast<size_t>(base_->rank())]); }
  std::string name() const override { return base_->name() + " (in chunk order)"; }
  c10::Device control_device() const override { return base_->control_device(); }
  void all_reduce_(at::Tensor& x) override { base_->all_reduce_(x); }
  at::Tensor all_gather(const at::Tensor& x) override {
    at::Tensor physical = base_->all_gather(x);  // [W, ...], the ProcessGroup's order
    return physical.index_select(0, index(perm_, physical.device()));
  }
  at::Tensor all_to_all(const at::Tensor& x) override {
    const int64_t W = size();
    // Physical member p gets logical chunk inverse[p]; logical chunk l comes from member perm[l].
    at::Tensor send = x.unflatten(0, {W, x.size(0) / W}).index_select(0, index(inverse_, x.device())).flatten(0, 1);
    at::Tensor recv = base_->all_to_all(send.contiguous());
    return recv.unflatten(0, {W, recv.size(0) / W}).index_select(0, index(perm_, recv.device())).flatten(0, 1);
  }

 private:
  static at::Tensor index(const std::vector<int64_t>& order, c10::Device device) {
    return at::tensor(order, at::kLong).to(device);
  }
  std::shared_ptr<dion::AxisGroup> base_;
  std::vector<int64_t> perm_, inverse_;
};

// ---------------------------------------------------------------------------- the optimizer

class PyQkClip;

class PyOptimizer {
  friend class PyQkClip;  // wrap()

 public:
  // kind: a registered matrix algorithm's name (its class), or "any" (dion::Optimizer);
  // kwargs: the Python constructor's keywords (hyperparameters and orthogonalizer choice).
  PyOptimizer(const std::string& kind, const py::dict& kwargs) : kind_(algorithm_of(kind)) {
    dion::Options base = kind_ ? dion::NamedOptimizer::defaults_of(kind_->name()) : dion::Options();
    if (kwargs.contains("mixed_precision_config") && !kwargs["mixed_precision_config"].is_none()) {
      py::handle mp = kwargs["mixed_precision_config"];
      py::dict dtypes;
      for (const char* name : {"momentum_dtype", "Q_dtype", "variance_dtype"})
        if (py::hasattr(mp, name)) dtypes[name] = mp.attr(name);
      base = options_from_dict(base, dtypes, 0);
    }
    defaults_ = options_from_dict(base, kwargs, 0);
    opt_ = make(kind_, defaults_, ortho_from_kwargs(kwargs));
  }

  // Add a Python param group (a dict with every default filled in, as torch.optim makes it).
  void add_param_group(const std::vector<at::Tensor>& params, const py::dict& group) {
    const size_t g = live()->param_groups().size();
    dion::Options o = options_from_dict(defaults_, group, g);
    live()->add_param_group(dion::ParamGroup{params, override_of(o)});
    live()->options(g) = o;  // the step counter (ParamGroup carries every hyperparameter)
  }

  // Push a Python group's (possibly edited) hyperparameters into C++ group g, checked as
  // add_param_group checks a group (Optimizer::set_options); nothing changes when refused.
  // Returns whether the algorithm changed (the group's state was dropped).
  bool set_group(size_t g, const py::dict& group) {
    check_index(g);
    dion::Options o = options_from_dict(live()->options(g), group, g);
    const bool changed = o.algo() != live()->options(g).algo();
    live()->set_options(g, o);
    return changed;
  }

  // The checks of set_group without the change (load_state_dict's dry run).
  void check_group(size_t g, const py::dict& group) const {
    check_index(g);
    live()->check_options(g, options_from_dict(live()->options(g), group, g));
  }

  // Group g's algorithm and hyperparameters as C++ holds them (every field of the table).
  py::dict group_options(size_t g) const {
    check_index(g);
    return dict_of(live()->options(g));
  }

  std::string group_algorithm(size_t g) const {
    check_index(g);
    return live()->options(g).algorithm();
  }

  // The state dtypes group g configures ({momentum_dtype, Q_dtype, variance_dtype}: a
  // torch.dtype, or None for the parameter's).
  py::dict state_dtypes(size_t g) const {
    check_index(g);
    const dion::Options& o = live()->options(g);
    auto dtype = [](const std::optional<at::ScalarType>& t) -> py::object {
      if (!t) return py::none();
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*t)));
    };
    py::dict out;
    out["momentum_dtype"] = dtype(o.momentum_dtype());
    out["Q_dtype"] = dtype(o.Q_dtype());
    out["variance_dtype"] = dtype(o.variance_dtype());
    return out;
  }

  void step() {
    py::gil_scoped_release no_gil;
    live()->step();
  }

  // Megabatch tasks in flight (the reference's 3), on the calling thread.
  static constexpr int kTasksInFlight = 3;

  // DDP / FSDP over a torch.distributed ProcessGroup. `ranks`: the group's global ranks
  // (dist.get_process_group_ranks). Call before the first step.
  void set_distribution(const py::object& process_group, std::vector<int> ranks, bool sync_gradients) {
    dist_ = std::make_shared<dion::Distributed>(wrap(process_group, std::move(ranks)), sync_gradients);
    dist_->overlap(kTasksInFlight);
    live()->set_distribution(dist_);
  }

  // Legacy Dion's sharding meshes: Distributed(outer) or Distributed(outer, inner) (FSDP,
  // FSDP x TP), plus .replicate(replicate, sync_gradients) (HSDP) when `replicate` is not None.
  // Each group comes with its global ranks, as in set_distribution. Call before the first step.
  void set_sharded_distribution(const py::object& outer, std::vector<int> outer_ranks, const py::object& inner,
                                std::vector<int> inner_ranks, const py::object& replicate,
                                std::vector<int> replicate_ranks, bool sync_gradients) {
    auto outer_group = wrap(outer, std::move(outer_ranks));
    dist_ = inner.is_none()
                ? std::make_shared<dion::Distributed>(std::move(outer_group))
                : std::make_shared<dion::Distributed>(std::move(outer_group), wrap(inner, std::move(inner_ranks)));
    if (!replicate.is_none()) dist_->replicate(wrap(replicate, std::move(replicate_ranks)), sync_gradients);
    dist_->overlap(kTasksInFlight);
    live()->set_distribution(dist_);
  }

  // `local` is this rank's chunk along `dim` of a parameter of `global_shape` (FSDP2 chunking),
  // and along `inner_dim` over the inner group when it is >= 0 (FSDP x TP).
  void shard(const at::Tensor& local, std::vector<int64_t> global_shape, int64_t dim, int64_t inner_dim) {
    if (!dist_) throw dion::ValueError("shard: no distribution (call set_distribution first)");
    dist_->shard(local, std::move(global_shape), dim, inner_dim);
  }

  // Expert parallelism (torchtitan's EP mesh): `local` is this rank's chunk along `dim` of a
  // parameter of `global_shape` split over `process_group` (not the optimizer's distribution
  // group): Distribution::shard_over. Without a distribution yet (no distributed_mesh) the dense
  // parameters stay local: a one-process outer group. One AxisGroup per ProcessGroup, so every
  // stack on one EP group shares its one-time shard check.
  // `order`: the group's members (global ranks) in the order of the chunks they hold, when that
  // is not the ProcessGroup's (OrderedAxis); empty: the ProcessGroup's order.
  void shard_over(const py::object& process_group, std::vector<int> ranks, const at::Tensor& local,
                  std::vector<int64_t> global_shape, int64_t dim, const std::vector<int>& order) {
    if (!dist_) {
      dist_ = std::make_shared<dion::Distributed>(std::make_shared<dion::comm::Group>());
      dist_->overlap(kTasksInFlight);
      live()->set_distribution(dist_);
    }
    std::vector<int64_t> perm;
    if (!order.empty()) {
      std::vector<int> sorted_order = order, sorted_ranks = ranks;
      std::sort(sorted_order.begin(), sorted_order.end());
      std::sort(sorted_ranks.begin(), sorted_ranks.end());
      if (sorted_order != sorted_ranks)
        throw dion::ValueError("shard_over: `order` must list the group's ranks, each once");
      for (int g : order) perm.push_back(std::find(ranks.begin(), ranks.end(), g) - ranks.begin());
    }
    const auto key = std::make_pair(process_group_of(process_group).get(), perm);
    auto it = expert_groups_.find(key);
    if (it == expert_groups_.end()) {
      std::shared_ptr<dion::AxisGroup> axis = std::make_shared<dion::GroupAxis>(wrap(process_group, std::move(ranks)));
      if (!perm.empty()) axis = std::make_shared<OrderedAxis>(std::move(axis), perm);
      it = expert_groups_.emplace(key, std::move(axis)).first;
    }
    dist_->shard_over(it->second, local, std::move(global_shape), dim);
  }

  // Drop the C++ optimizer and its distribution now (the module's atexit handler, for every
  // distributed optimizer still alive at interpreter exit): the references to torch's
  // ProcessGroups (and through them Gloo's worker threads) go while the interpreter and c10d
  // are whole, instead of whenever the Python object dies in the interpreter's teardown, or
  // never (an object left in a reference cycle), with the threads running into exit()'s static
  // destructors. Without the GIL: a ProcessGroup's destructor joins Gloo's threads, which may
  // need the GIL to drop tensors. Every later call raises.
  void release() {
    std::unique_ptr<dion::Optimizer> opt = std::move(opt_);
    std::shared_ptr<dion::Distributed> d = std::move(dist_);
    auto experts = std::move(expert_groups_);
    expert_groups_.clear();
    py::gil_scoped_release no_gil;
    opt.reset();
    d.reset();
    experts.clear();
  }

  void synchronize_for_checkpoint() {
    py::gil_scoped_release no_gil;
    live()->synchronize_for_checkpoint();
  }

  int64_t group_step(size_t g) const { return live()->options(g).step(); }
  // Collective (the first call checks the shard specs across ranks): without the GIL, as step().
  void init_state() {
    py::gil_scoped_release no_gil;
    live()->init_state();
  }

  // The state `param` of group g has once `group`'s edits (a checkpoint's saved group) apply:
  // {key: (shape, dtype, from_step)} from the library's table (Optimizer::state_specs); what
  // load_state_dict checks a checkpoint's state against.
  py::dict state_specs(size_t g, const at::Tensor& param, const py::dict& group) const {
    check_index(g);
    const dion::Options o = options_from_dict(live()->options(g), group, g);
    py::dict out;
    for (const auto& spec : live()->state_specs(param, o))
      out[py::str(spec.key)] = py::make_tuple(
          py::tuple(py::cast(spec.shape)),
          py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(spec.dtype))),
          spec.from_step);
    return out;
  }

  // The state of `param` as {key: tensor} (the live tensors), or None before it exists.
  py::object state(const at::Tensor& param) {
    const dion::ParamState* s = live()->state_of(param);
    if (!s) return py::none();
    py::dict out;
    for (const auto& [key, t] : s->tensors())
      if (t.defined()) out[py::str(key)] = t;
    return out;
  }

  // Drop param's state (load_state_dict: the checkpoint's state replaces all state).
  void clear_state(const at::Tensor& param) {
    check_owned(param, "clear_state");
    live()->state().erase(param.unsafeGetTensorImpl());
  }

  // Make `value` param's state `key` (used by load_state_dict); creates the state if needed.
  void set_state(const at::Tensor& param, const std::string& key, const at::Tensor& value) {
    check_owned(param, "set_state");
    auto& slot = live()->state()[param.unsafeGetTensorImpl()];
    if (!slot) slot = std::make_unique<dion::ParamState>();
    auto& s = static_cast<dion::ParamState&>(*slot);
    // A key the parameter's algorithm keeps (its spec's state table).
    std::string known;
    for (size_t g = 0; g < live()->param_groups().size(); ++g)
      for (const at::Tensor& p : live()->param_groups()[g].params())
        if (p.is_same(param)) {
          for (const dion::StateSpec& spec : live()->state_specs(param, live()->options(g))) {
            if (spec.key == key) {
              s.set(key, value);
              return;
            }
            known += (known.empty() ? "" : ", ") + spec.key;
          }
          throw dion::ValueError("unknown optimizer state key '" + key + "' for '" + live()->options(g).algorithm() +
                                 "' (known: " + known + ")");
        }
  }

 private:
  dion::Optimizer* live() const {
    if (!opt_)
      throw dion::ValueError(
          "this dion_cpp optimizer was released at interpreter exit (atexit): it cannot be used any more");
    return opt_.get();
  }

  void check_index(size_t g) const {
    if (g >= live()->param_groups().size())
      throw dion::ValueError("no param group " + std::to_string(g) + " (the optimizer has " +
                             std::to_string(live()->param_groups().size()) + ")");
  }

  void check_owned(const at::Tensor& param, const char* what) const {
    for (const auto& group : live()->param_groups())
      for (const at::Tensor& p : group.params())
        if (p.is_same(param)) return;
    throw dion::ValueError(std::string(what) + ": the tensor is not a parameter of this optimizer");
  }

  // A torch ProcessGroup as a dion::comm::Group (Group::from_process_group): collectives go to
  // torch's own backends (no connections of our own), with the group's timeout where its backend
  // tells it.
  static std::shared_ptr<dion::comm::Group> wrap(const py::object& process_group, std::vector<int> ranks) {
    const c10::intrusive_ptr<c10d::ProcessGroup> pg = process_group_of(process_group);
    dion::comm::GroupOptions options;  // the torch group's timeout, where its backend tells it
    if (pg->getSize() > 1) {
      for (const c10::Device& d : pg->getDeviceTypes()) {
        try {
          options.timeout = pg->getBackend(d.type())->getBackendOptions()->timeout;
          break;
        } catch (const std::exception&) {
          // a backend without getBackendOptions: try the next, or keep the default
        }
      }
    }
    return std::make_shared<dion::comm::Group>(
        dion::comm::Group::from_process_group(pg, std::move(ranks), {}, options));
  }

  // The class's matrix algorithm (a registered one), or nullopt for "any" (dion::Optimizer).
  static std::optional<dion::Algorithm> algorithm_of(const std::string& kind) {
    if (kind == "any") return std::nullopt;
    const dion::Algorithm a = dion::find_algorithm(kind);
    if (!a.matrix())
      throw dion::ValueError("unknown optimizer kind '" + kind + "' (valid: " + dion::algorithm_names(true) + ", any)");
    return a;
  }

  static std::unique_ptr<dion::Optimizer> make(std::optional<dion::Algorithm> kind, const dion::Options& d,
                                               dion::math::OrthoConfig ortho) {
    const std::vector<dion::ParamGroup> none;
    if (!kind) return std::make_unique<dion::Optimizer>(none, d, ortho);
    return std::make_unique<dion::NamedOptimizer>(kind->name(), none, d, ortho, nullptr);
  }

  std::optional<dion::Algorithm> kind_;
  dion::Options defaults_;
  std::unique_ptr<dion::Optimizer> opt_;
  std::shared_ptr<dion::Distributed> dist_;  // null: single process
  // shard_over's groups, by the ProcessGroup they wrap (also held by dist_).
  std::map<std::pair<const c10d::ProcessGroup*, std::vector<int64_t>>, std::shared_ptr<dion::AxisGroup>> expert_groups_;
};

// ---------------------------------------------------------------------------- QK-clip

// dion::QkClip over a torch ProcessGroup (dion_cpp.QKClip, python/dion_cpp/_qk_clip.py builds the
// layers: each DTensor's local part and the global row of each local row). apply() releases the
// GIL as step() does; the maxima are copied into a tensor made here before the collective.
class PyQkClip {
 public:
  PyQkClip(double tau, const py::list& layers, const py::object& process_group, std::vector<int> ranks) {
    std::vector<dion::QkClipLayer> ls;
    for (const py::handle& h : layers) {
      const py::dict d = py::reinterpret_borrow<py::dict>(h);
      auto tensor = [&](const char* key) {
        return d.contains(key) && !d[key].is_none() ? d[key].cast<at::Tensor>() : at::Tensor();
      };
      ls.push_back({d["name"].cast<std::string>(), tensor("wq"), tensor("wk"), tensor("wq_rows"), tensor("wk_rows"),
                    d["n_heads"].cast<int64_t>(), d["n_kv_heads"].cast<int64_t>(), d["head_dim"].cast<int64_t>()});
    }
    std::shared_ptr<dion::AxisGroup> group;
    if (!process_group.is_none())
      group = std::make_shared<dion::GroupAxis>(PyOptimizer::wrap(process_group, std::move(ranks)));
    clip_ = std::make_unique<dion::QkClip>(tau, std::move(ls), std::move(group));
  }
  at::Tensor apply(const std::vector<at::Tensor>& max_logits) {
    if (!clip_) throw dion::ValueError("QKClip: released (the interpreter is exiting)");
    std::vector<at::Tensor> copies;
    for (const at::Tensor& t : max_logits) copies.push_back(t.defined() ? t.detach().to(at::kCPU, at::kFloat).clone() : t);
    py::gil_scoped_release no_gil;
    return clip_->apply(copies);
  }
  void release() {
    py::gil_scoped_release no_gil;
    clip_.reset();
  }

 private:
  std::unique_ptr<dion::QkClip> clip_;
};

}  // namespace

// ---------------------------------------------------------------------------- module

PYBIND11_MODULE(_C, m) {
  m.doc() = "dion-cpp optimizers (use the classes in dion_cpp, not this module)";
  m.attr("__version__") = DION_VERSION;  // the CMake project's version (cmake/DionPython.cmake)
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const dion::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const dion::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const dion::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  // The replica check's collective (_checks.ReplicaCheck): the elementwise MAX of `values` over
  // the ranks of `process_group`. The tensor is made and read here, never a Python object:
  // Gloo's worker thread drops its reference to a finished work a moment after wait() returns,
  // and were that the last reference to a Python tensor at interpreter exit, the thread would
  // need the GIL there and be ended inside C++ (std::terminate, SIGABRT).
  m.def(
      "all_reduce_max",
      [](const py::object& process_group, const std::vector<int64_t>& values, const std::string& device,
         double timeout_s) {
        const c10::intrusive_ptr<c10d::ProcessGroup> pg = process_group_of(process_group);
        std::vector<at::Tensor> t{at::tensor(values, at::kLong).to(at::Device(device))};
        {
          py::gil_scoped_release no_gil;
          c10d::AllreduceOptions opts;
          opts.reduceOp = c10d::ReduceOp(c10d::ReduceOp::MAX);
          auto work = pg->allreduce(t, opts);
          try {
            work->wait(std::chrono::milliseconds(int64_t(timeout_s * 1000)));
          } catch (const std::exception& e) {
            throw std::runtime_error(dion::message_of(e));
          }
        }
        at::Tensor out = t[0].cpu();
        return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + out.numel());
      },
      py::arg("process_group"), py::arg("values"), py::arg("device"), py::arg("timeout_s"),
      "elementwise MAX of `values` (int64) over the ranks of `process_group`, waiting at most timeout_s");

  // The algorithm registry (dion/optim/algorithm.h): one dict per algorithm, in order; the Python
  // classes are generated from it and python/dion_cpp/_class_table.py.
  m.def("algorithms", [] {
    py::list out;
    for (const dion::Algorithm a : dion::algorithms()) {
      const dion::AlgorithmSpec& s = a.spec();
      const dion::Options o = dion::Options().algorithm(a);
      py::dict defaults;
      defaults["lr"] = o.lr();
      defaults["mu"] = o.mu();
      defaults["weight_decay"] = o.weight_decay();
      py::dict d;
      d["name"] = s.name;
      d["aliases"] = s.aliases;
      d["matrix"] = s.matrix;
      d["defaults"] = defaults;  // a class with no entry in _class_table.py takes these
      out.append(d);
    }
    return out;
  });
  // Every state key a registered algorithm keeps (each spec's table, for a [2, 2] parameter).
  m.def("state_keys", [] {
    std::vector<std::string> keys;
    const at::Tensor p = at::zeros({2, 2});
    const std::vector<int64_t> shape = {2, 2};
    for (const dion::Algorithm a : dion::algorithms())
      for (const dion::StateSpec& s : a.spec().state(dion::ParamView{p, shape, nullptr}, dion::Options().algorithm(a)))
        if (std::find(keys.begin(), keys.end(), s.key) == keys.end()) keys.push_back(s.key);
    return keys;
  });
  m.def(
      "load_algorithm_plugin",
      [](const std::string& path) {
        std::vector<std::string> names;
        for (const dion::Algorithm a : dion::load_algorithm_plugin(path)) names.push_back(a.name());
        return names;
      },
      py::arg("path"), "load a shared library of algorithms (dion/optim/algorithm.h); returns the names it added");

  // The hyperparameter table (dion/optim/hyperparameters.h): [(name, doc)], in order.
  m.def("hyperparameters", [] {
    py::list out;
    for (const dion::HyperparameterInfo& h : dion::hyperparameters()) out.append(py::make_tuple(h.name, h.doc));
    return out;
  });

  m.def(
      "set_ortho_path",
      [](const std::string& path) {
        try {
          g_ortho_path = dion::math::ortho_path_from_string(path);
        } catch (const std::invalid_argument& e) {
          throw dion::ValueError(e.what());
        }
      },
      py::arg("path"), "'exact' (default: the reference's bits) or 'fast', for optimizers built later");
  m.def("get_ortho_path", [] { return dion::math::to_string(g_ortho_path); });
  m.def(
      "set_cuda_kernels", [](bool on) { dion::math::set_own_cuda_kernels(on); }, py::arg("on"),
      "True: the project's own CUDA kernels (fused element-wise steps, symmetric products by block rows + mirror) "
      "for CUDA tensors, process-wide; False (default): ATen's CUDA ops, until a GPU run has checked the kernels");
  m.def("get_cuda_kernels", [] { return dion::math::use_own_cuda_kernels(); });
  m.def(
      "cpu_compute_dtype",
      [](const std::string& wanted) {
        try {
          const dion::math::CpuComputeDtype c =
              dion::math::cpu_compute_dtype(dion::math::cpu_dtype_from_string(wanted));
          return py::make_tuple(dion::math::dtype_short_name(c.dtype), c.reason);
        } catch (const std::invalid_argument& e) {
          throw dion::ValueError(e.what());
        }
      },
      py::arg("wanted") = "fp16",
      "(dtype, reason): what the fast path (wanting 'bf16') and Gram Newton-Schulz (wanting 'fp16') compute in on "
      "this CPU, and why");

  py::class_<PyQkClip>(m, "QkClip")
      .def(py::init<double, const py::list&, const py::object&, std::vector<int>>(), py::arg("tau"), py::arg("layers"),
           py::arg("process_group"), py::arg("ranks"))
      .def("apply", &PyQkClip::apply, py::arg("max_logits"))
      .def("release", &PyQkClip::release);
  py::class_<PyOptimizer>(m, "Optimizer")
      .def(py::init<const std::string&, const py::dict&>(), py::arg("kind"), py::arg("kwargs"))
      .def("add_param_group", &PyOptimizer::add_param_group, py::arg("params"), py::arg("group"))
      .def("set_group", &PyOptimizer::set_group, py::arg("index"), py::arg("group"))
      .def("check_group", &PyOptimizer::check_group, py::arg("index"), py::arg("group"))
      .def("group_algorithm", &PyOptimizer::group_algorithm, py::arg("index"))
      .def("group_options", &PyOptimizer::group_options, py::arg("index"))
      .def("state_dtypes", &PyOptimizer::state_dtypes, py::arg("index"))
      .def("clear_state", &PyOptimizer::clear_state, py::arg("param"))
      .def("step", &PyOptimizer::step)
      .def("group_step", &PyOptimizer::group_step, py::arg("index"))
      .def("init_state", &PyOptimizer::init_state)
      .def("set_distribution", &PyOptimizer::set_distribution, py::arg("process_group"), py::arg("ranks"),
           py::arg("sync_gradients"))
      .def("set_sharded_distribution", &PyOptimizer::set_sharded_distribution, py::arg("outer"), py::arg("outer_ranks"),
           py::arg("inner"), py::arg("inner_ranks"), py::arg("replicate"), py::arg("replicate_ranks"),
           py::arg("sync_gradients"))
      .def("shard", &PyOptimizer::shard, py::arg("local"), py::arg("global_shape"), py::arg("dim"),
           py::arg("inner_dim") = -1)
      .def("shard_over", &PyOptimizer::shard_over, py::arg("process_group"), py::arg("ranks"), py::arg("local"),
           py::arg("global_shape"), py::arg("dim"), py::arg("order") = std::vector<int>{})
      .def("synchronize_for_checkpoint", &PyOptimizer::synchronize_for_checkpoint)
      .def("release", &PyOptimizer::release)
      .def("state", &PyOptimizer::state, py::arg("param"))
      .def("state_specs", &PyOptimizer::state_specs, py::arg("index"), py::arg("param"), py::arg("group"))
      .def("set_state", &PyOptimizer::set_state, py::arg("param"), py::arg("key"), py::arg("value"));
}
