// python/convert.cpp — Python values to the library's and back (convert.h).
#include "convert.h"

#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>

#include <memory>
#include <string>

namespace dion_python {

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
  if (!py::isinstance<py::str>(v)) throw dion::TypeError(where(g, key) + " must be a string, got " + type_name(v));
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

}  // namespace dion_python
