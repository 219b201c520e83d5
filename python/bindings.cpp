// dion_cpp._C — the C++ optimizers (dion::Muon, NorMuon, Dion2, NorDion2 = Dion3, Dion) for
// the Python classes in python/dion_cpp/_optimizers.py.
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
// inner, ..., replicate, ...) does the same for legacy Dion's outer / inner shard meshes and
// replicate mesh (Distributed(outer, inner).replicate(...)); shard(local, global_shape, dim,
// inner_dim) registers a DTensor's local shard. Python (_optimizers.py) decides what is sharded.
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "dion/dion.h"
#include "dion/optim/distributed.h"

namespace py = pybind11;

namespace {

// ---------------------------------------------------------------------------- dict -> Options

std::string where(size_t group, const char* option) {
  return "param group " + std::to_string(group) + ": option '" + option + "'";
}

std::string type_name(const py::handle& v) { return py::str(py::type::of(v).attr("__name__")); }

// A torch.distributed ProcessGroup from Python, or TypeError naming what was given.
c10::intrusive_ptr<c10d::ProcessGroup> process_group_of(const py::object& process_group) {
  try {
    return process_group.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  } catch (const py::cast_error&) {
    throw dion::TypeError("expected a torch.distributed.ProcessGroup, got " + type_name(process_group));
  }
}

double as_double(const py::handle& v, size_t g, const char* key) {
  // float, int, 0-d tensor, numpy scalar: anything with __float__ (as the reference accepts).
  if (py::isinstance<py::str>(v) || v.is_none())
    throw dion::TypeError(where(g, key) + " must be a number, got " + type_name(v));
  PyObject* f = PyNumber_Float(v.ptr());
  if (!f) {
    PyErr_Clear();
    throw dion::TypeError(where(g, key) + " must be a number, got " + type_name(v));
  }
  const double out = PyFloat_AsDouble(f);
  Py_DECREF(f);
  return out;
}

int64_t as_int(const py::handle& v, size_t g, const char* key) {
  if (py::isinstance<py::bool_>(v) || !py::isinstance<py::int_>(v))
    throw dion::ValueError(where(g, key) + " must be an integer, got " + std::string(py::repr(v)));
  return v.cast<int64_t>();
}

// A switch: True / False, the integers 0 / 1 or a numpy bool (the reference tests truthiness;
// anything else, a string above all, is a mistake: nesterov='no' would be truthy). `what` names
// the option in the error ("param group 0: option 'nesterov'").
bool as_bool(const py::handle& v, const std::string& what) {
  if (PyBool_Check(v.ptr())) return v.ptr() == Py_True;
  if (py::isinstance<py::int_>(v)) {
    const py::int_ i = py::reinterpret_borrow<py::int_>(v);
    if (i.equal(py::int_(0)) || i.equal(py::int_(1))) return i.equal(py::int_(1));
  } else if (type_name(v) == "bool" || type_name(v) == "bool_") {  // numpy.bool_ (numpy 1 and 2)
    return PyObject_IsTrue(v.ptr()) == 1;
  }
  throw dion::TypeError(what + " must be a bool (True or False, or the integers 0 / 1), got " +
                        std::string(py::repr(v)) + " of type " + type_name(v));
}

std::string as_string(const py::handle& v, size_t g, const char* key) {
  if (!py::isinstance<py::str>(v))
    throw dion::TypeError(where(g, key) + " must be a string, got " + type_name(v));
  return v.cast<std::string>();
}

std::optional<at::ScalarType> as_dtype(const py::handle& v, size_t g, const char* key) {
  if (v.is_none()) return std::nullopt;
  if (!THPDtype_Check(v.ptr()))
    throw dion::TypeError(where(g, key) + " must be a torch.dtype or None, got " + type_name(v));
  return reinterpret_cast<THPDtype*>(v.ptr())->scalar_type;
}

// One hyperparameter's Python value, converted by the field's type (and rule): the reference's
// conventions (None for adjust_lr is "none", None for num_heads is off, None for split_sizes is
// none, a torch.dtype or None for the state dtypes).
template <typename Rule>
void from_py(double& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  out = as_double(v, g, key);
}
template <typename Rule>
void from_py(bool& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  out = as_bool(v, where(g, key));
}
template <typename Rule>
void from_py(int64_t& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  out = as_int(v, g, key);
}
void from_py(int64_t& out, const py::handle& v, size_t g, const char* key, const dion::rule::Heads&) {
  // The reference: None or 1 = off, any other value must be a positive integer.
  const int64_t heads = v.is_none() ? 0 : as_int(v, g, key);
  if (!v.is_none() && heads < 1)
    throw dion::ValueError(where(g, key) + " must be a positive integer if set, got " + std::to_string(heads));
  out = heads;
}
template <typename Rule>
void from_py(std::string& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  out = as_string(v, g, key);
}
template <typename Rule>
void from_py(dion::Betas& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  if (!py::isinstance<py::sequence>(v) || py::len(v) != 2)
    throw dion::ValueError(where(g, key) + ": invalid " + key + " " + std::string(py::repr(v)) +
                           " (need a pair (beta1, beta2))");
  py::sequence s = v.cast<py::sequence>();
  out = {as_double(s[0], g, key), as_double(s[1], g, key)};
}
template <typename Rule>
void from_py(dion::math::AdjustLR& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  // The reference's values: 'spectral_norm', 'rms_norm' or None. C++'s spellings of None ('none',
  // '') are refused, as the reference refuses them.
  const std::string name = v.is_none() ? "none" : as_string(v, g, key);
  if (!v.is_none() && name != "spectral_norm" && name != "rms_norm")
    throw dion::ValueError(where(g, key) + ": invalid value '" + name +
                           "' (must be 'spectral_norm', 'rms_norm' or None)");
  out = dion::math::adjust_lr_from_string(name);
}
template <typename Rule>
void from_py(dion::SplitSizes& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  std::vector<int64_t> sizes;
  if (!v.is_none()) {
    if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v))
      throw dion::ValueError(where(g, key) + " must be a list or tuple of integers, got " + std::string(py::repr(v)));
    for (const py::handle& s : v) sizes.push_back(as_int(s, g, key));
    if (sizes.empty()) throw dion::ValueError(where(g, key) + " needs at least 2 block sizes, got []");
  }
  out = std::move(sizes);
}
template <typename Rule>
void from_py(dion::OptionalDtype& out, const py::handle& v, size_t g, const char* key, const Rule&) {
  out = as_dtype(v, g, key);
}

// A hyperparameter's value as Python sees it (group_options).
py::object to_py(double v) { return py::float_(v); }
py::object to_py(bool v) { return py::bool_(v); }
py::object to_py(int64_t v) { return py::int_(v); }
py::object to_py(const std::string& v) { return py::str(v); }
py::object to_py(const dion::Betas& v) { return py::make_tuple(std::get<0>(v), std::get<1>(v)); }
py::object to_py(dion::math::AdjustLR v) {
  return v == dion::math::AdjustLR::NONE ? py::none() : py::object(py::str(dion::math::to_string(v)));
}
py::object to_py(const dion::SplitSizes& v) { return py::cast(v); }
py::object to_py(const dion::OptionalDtype& t) {
  if (!t) return py::none();
  return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(*t)));
}

// Every key of a Python param group (or constructor keyword) the C++ Options know, applied onto
// `o`: "algorithm", "step" and every hyperparameter of the table (dion/optim/hyperparameters.h)
// under its own name, plus the reference's other spellings (group keys "beta1" / "beta2",
// Dion's "rcqr_oversample"). Keys it does not know ("params", "initial_lr" from a scheduler,
// ...) are left alone.
dion::Options options_from_dict(dion::Options o, const py::dict& d, size_t g) {
  auto get = [&d](const char* key) -> py::object {
    return d.contains(key) ? py::reinterpret_borrow<py::object>(d[key]) : py::object();
  };
  py::object v;
  if ((v = get("algorithm"))) o.algorithm(as_string(v, g, "algorithm"));
#define DION_FROM_DICT(T, name, default_value, rule_object, doc) \
  if ((v = get(#name))) {                                        \
    T value = o.name();                                          \
    from_py(value, v, g, #name, rule_object);                    \
    o.name(std::move(value));                                    \
  }
  DION_HYPERPARAMETERS(DION_FROM_DICT)
#undef DION_FROM_DICT
  if ((v = get("beta1"))) o.betas({as_double(v, g, "beta1"), std::get<1>(o.betas())});
  if ((v = get("beta2"))) o.betas({std::get<0>(o.betas()), as_double(v, g, "beta2")});
  if ((v = get("rcqr_oversample"))) o.oversample(as_double(v, g, "rcqr_oversample"));
  if ((v = get("step"))) o.step(as_int(v, g, "step"));
  return o;
}

// Every hyperparameter of `o` (and its algorithm) as {name: value}.
py::dict dict_of(const dion::Options& o) {
  py::dict out;
  out["algorithm"] = o.algorithm();
#define DION_TO_DICT(T, name, default_value, rule, doc) out[#name] = to_py(o.name());
  DION_HYPERPARAMETERS(DION_TO_DICT)
#undef DION_TO_DICT
  return out;
}

// The fields of `o` a group may override (everything ParamGroup carries).
dion::Override override_of(const dion::Options& o) {
  dion::Override ov;
  ov.algorithm = o.algorithm();
#define DION_OVERRIDE_OF(T, name, default_value, rule, doc) ov.name = o.name();
  DION_HYPERPARAMETERS(DION_OVERRIDE_OF)
#undef DION_OVERRIDE_OF
  return ov;
}

// ---------------------------------------------------------------------------- orthogonalizer

// A Python callable f(X, epsilon=...) as an OrthoFn. step() runs without the GIL, so the call
// takes it, and the callable is held through a shared_ptr whose deleter takes it too (copies
// of the OrthoFn made inside step() then never touch Python reference counts).
dion::math::OrthoFn python_ortho(py::object fn) {
  std::shared_ptr<py::object> held(new py::object(std::move(fn)), [](py::object* p) {
    // Destroyed after the interpreter finished (a C++ static, a leaked optimizer): leak the
    // callable rather than take a GIL that no longer exists (a fatal error: SIGABRT at exit).
    if (!Py_IsInitialized()) return;
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [held](const at::Tensor& X, double epsilon) {
    py::gil_scoped_acquire gil;
    py::object out = (*held)(X, py::arg("epsilon") = epsilon);
    at::Tensor Y;
    try {
      Y = out.cast<at::Tensor>();
    } catch (const py::cast_error&) {
      throw dion::TypeError("newton_schulz_func must return a torch.Tensor, got " + type_name(out));
    }
    // A wrong shape would be broadcast silently into the update.
    if (Y.sizes() != X.sizes())
      throw dion::ValueError("newton_schulz_func returned a tensor of shape " + c10::str(Y.sizes()) +
                             " for an input of shape " + c10::str(X.sizes()) +
                             ": it must return the orthogonalized input, of the same shape");
    if (!Y.is_floating_point())
      throw dion::TypeError("newton_schulz_func returned a tensor of dtype " +
                            std::string(c10::toString(Y.scalar_type())) + ": it must be floating point");
    return Y;
  };
}

// Constructor keywords that choose the orthogonalizer: use_polar_express, newton_schulz_func,
// use_gram_newton_schulz (Gram Newton-Schulz in fp16 as the reference; in fp32 on a CPU without
// native fp16 GEMMs, dion/math/ortho.h), use_triton (ignored:
// the C++ kernels are used). The path (exact: the reference's bits; fast) is process-wide:
// dion_cpp._C.set_ortho_path("fast") (docs/benchmarks.md).
dion::math::OrthoPath g_ortho_path = dion::math::OrthoPath::EXACT;

dion::math::OrthoConfig ortho_from_kwargs(const py::dict& kw) {
  dion::math::OrthoConfig ortho;
  ortho.path = g_ortho_path;
  if (kw.contains("use_polar_express") && !as_bool(kw["use_polar_express"], "option 'use_polar_express'"))
    ortho.method = dion::math::OrthoMethod::NEWTON_SCHULZ;
  if (kw.contains("use_gram_newton_schulz") && as_bool(kw["use_gram_newton_schulz"], "option 'use_gram_newton_schulz'"))
    ortho.use_gram_newton_schulz = true;
  if (kw.contains("newton_schulz_func") && !kw["newton_schulz_func"].is_none()) {
    py::object fn = py::reinterpret_borrow<py::object>(kw["newton_schulz_func"]);
    if (!PyCallable_Check(fn.ptr()))
      throw dion::TypeError("newton_schulz_func must be a callable function, got " + type_name(fn));
    ortho.custom = python_ortho(fn);
  }
  return ortho;
}

// ---------------------------------------------------------------------------- the optimizer

class PyOptimizer {
 public:
  // kind: "muon" | "normuon" | "dion2" | "nordion2" | "dion" | "any" (dion::Optimizer);
  // kwargs: the Python constructor's keywords (hyperparameters and orthogonalizer choice).
  PyOptimizer(const std::string& kind, const py::dict& kwargs) : kind_(algorithm_of(kind)) {
    dion::Options base = kind_ ? defaults_of(*kind_) : dion::Options();
    if (kind_ == dion::Algorithm::Dion) {
      // Compared as the reference compares them (`power_iters != 1`: 1.0 is accepted too).
      if (kwargs.contains("power_iters") && !py::int_(1).equal(kwargs["power_iters"]))
        throw dion::ValueError("Dion supports power_iters=1 only, got " +
                               std::string(py::repr(kwargs["power_iters"])));
      if (kwargs.contains("qr_method") && as_string(kwargs["qr_method"], 0, "qr_method") != "rcqr")
        throw dion::ValueError("Dion supports qr_method='rcqr' only, got " +
                               std::string(py::repr(kwargs["qr_method"])));
    }
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
                : std::make_shared<dion::Distributed>(std::move(outer_group),
                                                      wrap(inner, std::move(inner_ranks)));
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
    py::gil_scoped_release no_gil;
    opt.reset();
    d.reset();
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
  // {key: (shape, dtype)} from the library's table (Optimizer::state_specs); what
  // load_state_dict checks a checkpoint's state against.
  py::dict state_specs(size_t g, const at::Tensor& param, const py::dict& group) const {
    check_index(g);
    const dion::Options o = options_from_dict(live()->options(g), group, g);
    py::dict out;
    for (const auto& spec : live()->state_specs(param, o))
      out[py::str(spec.key)] = py::make_tuple(
          py::tuple(py::cast(spec.shape)),
          py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(torch::getTHPDtype(spec.dtype))));
    return out;
  }

  // The state of `param` as {key: tensor} (the live tensors), or None before it exists.
  py::object state(const at::Tensor& param) {
    const dion::ParamState* s = live()->state_of(param);
    if (!s) return py::none();
    py::dict out;
    if (s->momentum().defined()) out["momentum"] = s->momentum();
    if (s->variance().defined()) out["variance"] = s->variance();
    if (s->variance_neuron().defined()) out["variance_neuron"] = s->variance_neuron();
    if (s->Q().defined()) out["Q"] = s->Q();
    if (s->step_dev().defined()) out["step_dev"] = s->step_dev();
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
    if (key == "momentum") s.momentum(value);
    else if (key == "variance") s.variance(value);
    else if (key == "variance_neuron") s.variance_neuron(value);
    else if (key == "Q") s.Q(value);
    else if (key == "step_dev") s.step_dev(value);
    else
      throw dion::ValueError("unknown optimizer state key '" + key +
                             "' (known: momentum, variance, variance_neuron, Q, step_dev)");
  }

 private:
  dion::Optimizer* live() const {
    if (!opt_)
      throw dion::ValueError("this dion_cpp optimizer was released at interpreter exit (atexit): it cannot be used any more");
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
    return std::make_shared<dion::comm::Group>(dion::comm::Group::from_process_group(pg, std::move(ranks), {}, options));
  }

  // The class's matrix algorithm: "muon" | "normuon" | "dion2" | "nordion2" | "dion", or
  // nullopt for "any" (dion::Optimizer).
  static std::optional<dion::Algorithm> algorithm_of(const std::string& kind) {
    if (kind == "any") return std::nullopt;
    const auto a = dion::parse_algorithm(kind);
    if (!a || !dion::is_matrix_algorithm(*a))
      throw dion::ValueError("unknown optimizer kind '" + kind + "' (valid: muon, normuon, dion2, nordion2, dion, any)");
    return a;
  }

  static dion::Options defaults_of(dion::Algorithm a) {
    switch (a) {
      case dion::Algorithm::Muon: return dion::Muon::defaults();
      case dion::Algorithm::NorMuon: return dion::NorMuon::defaults();
      case dion::Algorithm::Dion2: return dion::Dion2::defaults();
      case dion::Algorithm::NorDion2: return dion::NorDion2::defaults();
      default: return dion::Dion::defaults();
    }
  }

  static std::unique_ptr<dion::Optimizer> make(std::optional<dion::Algorithm> kind, const dion::Options& d,
                                               dion::math::OrthoConfig ortho) {
    const std::vector<dion::ParamGroup> none;
    if (!kind) return std::make_unique<dion::Optimizer>(none, d, ortho);
    switch (*kind) {
      case dion::Algorithm::Muon: return std::make_unique<dion::Muon>(none, d, ortho);
      case dion::Algorithm::NorMuon: return std::make_unique<dion::NorMuon>(none, d, ortho);
      case dion::Algorithm::Dion2: return std::make_unique<dion::Dion2>(none, d, ortho);
      case dion::Algorithm::NorDion2: return std::make_unique<dion::NorDion2>(none, d, ortho);
      default: return std::make_unique<dion::Dion>(none, d);
    }
  }

  std::optional<dion::Algorithm> kind_;
  dion::Options defaults_;
  std::unique_ptr<dion::Optimizer> opt_;
  std::shared_ptr<dion::Distributed> dist_;  // null: single process
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
      .def("set_sharded_distribution", &PyOptimizer::set_sharded_distribution, py::arg("outer"),
           py::arg("outer_ranks"), py::arg("inner"), py::arg("inner_ranks"), py::arg("replicate"),
           py::arg("replicate_ranks"), py::arg("sync_gradients"))
      .def("shard", &PyOptimizer::shard, py::arg("local"), py::arg("global_shape"), py::arg("dim"),
           py::arg("inner_dim") = -1)
      .def("synchronize_for_checkpoint", &PyOptimizer::synchronize_for_checkpoint)
      .def("release", &PyOptimizer::release)
      .def("state", &PyOptimizer::state, py::arg("param"))
      .def("state_specs", &PyOptimizer::state_specs, py::arg("index"), py::arg("param"), py::arg("group"))
      .def("set_state", &PyOptimizer::set_state, py::arg("param"), py::arg("key"), py::arg("value"));
}
