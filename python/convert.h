// python/convert.h — Python values to the library's and back, for the bindings (bindings.cpp).
//
// Param-group dicts and constructor keywords -> dion::Options (options_from_dict: every key of
// the hyperparameter table, the reference's other spellings), Options -> dict, the
// orthogonalizer keywords -> OrthoConfig (a Python newton_schulz_func as an OrthoFn that takes
// the GIL), and the scalar conversions, each raising TypeError / ValueError naming the group and
// the key.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>

#include "dion/errors.h"
#include "dion/math/ortho.h"
#include "dion/optim/options.h"

namespace dion_python {

namespace py = pybind11;

std::string where(size_t group, const char* option);  // "param group g: option" for messages
std::string type_name(const py::handle& v);
// A torch.distributed ProcessGroup from Python, or TypeError naming what was given.
c10::intrusive_ptr<c10d::ProcessGroup> process_group_of(const py::object& process_group);
double as_double(const py::handle& v, size_t g, const char* key);
int64_t as_int(const py::handle& v, size_t g, const char* key);
bool as_bool(const py::handle& v, const std::string& what);
std::string as_string(const py::handle& v, size_t g, const char* key);
std::optional<at::ScalarType> as_dtype(const py::handle& v, size_t g, const char* key);

// Every key of `d` the Options know, applied onto `o` (group g, for messages).
dion::Options options_from_dict(dion::Options o, const py::dict& d, size_t g);
py::dict dict_of(const dion::Options& o);
dion::Override override_of(const dion::Options& o);

dion::math::OrthoFn python_ortho(py::object fn);
// The orthogonalizer keywords of a constructor; the path is the process-wide g_ortho_path.
dion::math::OrthoConfig ortho_from_kwargs(const py::dict& kw);
extern dion::math::OrthoPath g_ortho_path;

}  // namespace dion_python
