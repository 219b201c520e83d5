// Optimizer checkpoints that know their layout: Optimizer::save / load (see optimizer.h and
// docs/optimizers.md, "Checkpoints").
//
// save() writes, under the archive key "dion_checkpoint", every group's options and, per
// parameter, its global shape and dtype and each state tensor with its global shape and this
// rank's offsets in it (src/optim/state_layout.h). load() takes the archives of every rank that
// saved (one for a single process or a replicated layout) and cuts this rank's state out of the
// saved slices that overlap it, so a state saved at one layout (world size, FSDP / TP split)
// loads at another. A load is all or nothing: everything is read, checked and assembled first,
// and the optimizer changes only when all of it fits. Archives without "dion_checkpoint" (the
// earlier LibTorch-style format) still load, at the layout they were saved at.
// Not here: collectives (every rank reads the files it needs itself), model parameters.
#include <ATen/ATen.h>
#include <torch/optim/serialize.h>
#include <torch/serialize/archive.h>

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dion/optim/optimizer.h"
#include "state_layout.h"

namespace dion {

namespace {

constexpr int64_t kFormatVersion = 1;
const char* const kRoot = "dion_checkpoint";
// The layout of state tensor `key` of `p` in a group with options `o`: its algorithm's table.
std::optional<StateSpec> spec_of(const std::vector<StateSpec>& specs, const std::string& key) {
  for (const StateSpec& s : specs)
    if (s.key == key) return s;
  return std::nullopt;
}

std::string shape_str(c10::IntArrayRef v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string param_key(size_t g, size_t i) { return "param" + std::to_string(g) + "." + std::to_string(i); }

std::vector<int64_t> read_ints(torch::serialize::InputArchive& ar, const std::string& key) {
  c10::IValue v;
  ar.read(key, v);
  return v.toIntVector();
}

// Copy the part of `src` (at `src_offset` in the whole tensor) that overlaps `dst` (at
// `dst_offset`) into `dst`, and mark it in `covered`.
void copy_overlap(const at::Tensor& src, const std::vector<int64_t>& src_offset, at::Tensor& dst,
                  const std::vector<int64_t>& dst_offset, at::Tensor& covered) {
  at::Tensor s = src, d = dst, c = covered;
  for (size_t k = 0; k < dst_offset.size(); ++k) {
    const int64_t dim = static_cast<int64_t>(k);
    const int64_t lo = std::max(src_offset[k], dst_offset[k]);
    const int64_t hi = std::min(src_offset[k] + src.size(dim), dst_offset[k] + dst.size(dim));
    if (hi <= lo) return;
    s = s.narrow(dim, lo - src_offset[k], hi - lo);
    d = d.narrow(dim, lo - dst_offset[k], hi - lo);
    c = c.narrow(dim, lo - dst_offset[k], hi - lo);
  }
  d.copy_(s);
  c.fill_(true);
}

}  // namespace

// ---------------------------------------------------------------------------- save

void Optimizer::save(torch::serialize::OutputArchive& archive) const {
  const AxisPlace place = axis_place(dist_.get());
  torch::serialize::OutputArchive root(archive.compilation_unit());
  root.write("format_version", c10::IValue(kFormatVersion));
  root.write("groups", c10::IValue(static_cast<int64_t>(param_groups_.size())));
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::OutputArchive group(archive.compilation_unit());
    options(g).serialize(group);
    const auto& params = param_groups_[g].params();
    group.write("params", c10::IValue(static_cast<int64_t>(params.size())));
    root.write("group" + std::to_string(g), group);
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const Layout L = dist_ ? dist_->layout(p) : Layout{p.sizes().vec(), -1, false};
      torch::serialize::OutputArchive entry(archive.compilation_unit());
      entry.write("global_shape", c10::IValue(c10::List<int64_t>(L.global_shape)));
      entry.write("dtype", c10::IValue(static_cast<int64_t>(p.scalar_type())));
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it != state_.end()) {
        auto& s = static_cast<ParamState&>(*it->second);
        const std::vector<StateSpec> specs = state_specs(p, options(g));
        for (const auto& [key, t] : s.tensors()) {
          if (!t.defined()) continue;
          const std::optional<StateSpec> spec = spec_of(specs, key);
          const StateLayout kind = spec ? spec->layout : StateLayout::PARAM;
          const Box box = state_box(kind, L, place, kind == StateLayout::OUTER_ROWS ? t.size(1) : 0);
          entry.write(key, t, /*is_buffer=*/true);
          entry.write(key + ".global_shape", c10::IValue(c10::List<int64_t>(box.global)));
          entry.write(key + ".offset", c10::IValue(c10::List<int64_t>(box.offset)));
        }
      }
      root.write(param_key(g, i), entry);
    }
  }
  archive.write(kRoot, root);
}

// ---------------------------------------------------------------------------- load

void Optimizer::load(torch::serialize::InputArchive& archive) {
  torch::serialize::InputArchive root;
  if (!archive.try_read(kRoot, root)) {
    load_legacy(archive);
    return;
  }
  std::vector<torch::serialize::InputArchive> roots;
  roots.push_back(std::move(root));
  load_checked(roots);
}

void Optimizer::load(std::vector<torch::serialize::InputArchive>& archives) {
  if (archives.empty()) throw ValueError("loading optimizer state: no archives given");
  std::vector<torch::serialize::InputArchive> roots(archives.size());
  for (size_t a = 0; a < archives.size(); ++a)
    if (!archives[a].try_read(kRoot, roots[a]))
      throw ValueError("loading optimizer state: archive " + std::to_string(a) + " has no '" + kRoot +
                       "' entry (saved by an older version: load it alone, at its own layout)");
  load_checked(roots);
}

void Optimizer::load_checked(std::vector<torch::serialize::InputArchive>& roots) {
  auto fail = [](const std::string& what) { throw ValueError("loading optimizer state: " + what); };
  for (size_t a = 0; a < roots.size(); ++a) {
    c10::IValue v;
    roots[a].read("format_version", v);
    if (v.toInt() != kFormatVersion)
      fail("archive " + std::to_string(a) + " has format version " + std::to_string(v.toInt()) + ", this build reads " +
           std::to_string(kFormatVersion));
  }
  c10::IValue groups_v;
  roots[0].read("groups", groups_v);
  if (groups_v.toInt() != static_cast<int64_t>(param_groups_.size()))
    fail("the checkpoint has " + std::to_string(groups_v.toInt()) + " param groups, this optimizer has " +
         std::to_string(param_groups_.size()));

  const AxisPlace place = axis_place(dist_.get());
  std::vector<Options> new_options;
  std::map<void*, std::unique_ptr<ParamState>> new_state;
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    torch::serialize::InputArchive group;
    roots[0].read("group" + std::to_string(g), group);
    Options o = options(g);
    o.serialize(group);
    const std::string where = "param group " + std::to_string(g);
    if (o.algo() != options(g).algo())  // an unknown name is refused by validate() below
      fail(where + ": the checkpoint's algorithm is '" + o.algorithm() + "', this group's is '" +
           options(g).algorithm() + "'");
    const auto& params = param_groups_[g].params();
    c10::IValue count;
    group.read("params", count);
    if (count.toInt() != static_cast<int64_t>(params.size()))
      fail(where + ": the checkpoint has " + std::to_string(count.toInt()) + " parameters, this group has " +
           std::to_string(params.size()));
    o.validate(g);
    check_group(g, params, o);
    new_options.push_back(o);

    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor& p = params[i];
      const Layout L = dist_ ? dist_->layout(p) : Layout{p.sizes().vec(), -1, false};
      const std::string what =
          where + ", parameter " + std::to_string(i) + " (global shape " + shape_str(L.global_shape) + ")";
      std::vector<torch::serialize::InputArchive> entries(roots.size());
      for (size_t a = 0; a < roots.size(); ++a) {
        roots[a].read(param_key(g, i), entries[a]);
        const std::vector<int64_t> saved = read_ints(entries[a], "global_shape");
        if (saved != L.global_shape)
          fail(what + ": the checkpoint's parameter has global shape " + shape_str(saved) +
               " (a checkpoint of another model?)");
        c10::IValue dt;
        entries[a].read("dtype", dt);
        if (dt.toInt() != static_cast<int64_t>(p.scalar_type()))
          fail(what + ": the checkpoint's parameter is " +
               std::string(c10::toString(static_cast<at::ScalarType>(dt.toInt()))) + ", this one " +
               std::string(c10::toString(p.scalar_type())));
      }
      auto state = std::make_unique<ParamState>();
      bool any = false;
      for (const StateSpec& spec : state_specs(p, o)) {
        const std::string& key = spec.key;
        const StateLayout kind = spec.layout;
        // Every archive that holds this tensor contributes its slice.
        std::vector<std::pair<at::Tensor, std::vector<int64_t>>> slices;
        std::vector<int64_t> saved_global;
        for (size_t a = 0; a < roots.size(); ++a) {
          at::Tensor t;
          if (!entries[a].try_read(key, t, /*is_buffer=*/true)) continue;
          const std::vector<int64_t> global = read_ints(entries[a], key + ".global_shape");
          if (!saved_global.empty() && global != saved_global)
            fail(what + ": '" + key + "' has global shape " + shape_str(global) + " in archive " + std::to_string(a) +
                 " but " + shape_str(saved_global) + " in another");
          saved_global = global;
          slices.emplace_back(t, read_ints(entries[a], key + ".offset"));
        }
        if (slices.empty()) continue;
        const Box box = state_box(kind, L, place, kind == StateLayout::OUTER_ROWS ? saved_global.at(1) : 0);
        if (saved_global != box.global)
          fail(what + ": '" + key + "' has global shape " + shape_str(saved_global) + " in the checkpoint, expected " +
               shape_str(box.global) +
               (kind == StateLayout::OUTER_ROWS
                    ? " (a low-rank basis is of M or M^T depending on the layout; this layout's orientation "
                      "differs from the saved one)"
                    : ""));
        const at::ScalarType dtype = slices[0].first.scalar_type();
        at::Tensor target = at::empty(box.size, p.options().dtype(dtype));
        at::Tensor covered = at::zeros(box.size, at::kBool);
        for (auto& [t, offset] : slices) {
          if (t.scalar_type() != dtype)
            fail(what + ": '" + key + "' is " + std::string(c10::toString(t.scalar_type())) + " in one archive and " +
                 std::string(c10::toString(dtype)) + " in another");
          copy_overlap(t.to(p.device()), offset, target, box.offset, covered);
        }
        if (!covered.all().item<bool>())
          fail(what + ": the archives cover only part of this rank's slice of '" + key + "' (offset " +
               shape_str(box.offset) + ", size " + shape_str(box.size) + " of " + shape_str(box.global) +
               "); pass the archives of every rank that saved");
        state->set(key, target);
        any = true;
      }
      if (any) new_state[p.unsafeGetTensorImpl()] = std::move(state);
    }
  }
  // Everything fits: commit.
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    options(g) = new_options[g];
    for (const at::Tensor& p : param_groups_[g].params()) {
      auto it = new_state.find(p.unsafeGetTensorImpl());
      if (it == new_state.end())
        state_.erase(p.unsafeGetTensorImpl());
      else
        state_[p.unsafeGetTensorImpl()] = std::move(it->second);
    }
  }
}
// The earlier format (torch::optim::serialize, no layout): loads at the layout it was saved at.
void Optimizer::load_legacy(torch::serialize::InputArchive& archive) {
  // All or nothing: keep copies of the options and state, put them back when the archive does
  // not fit (different groups, or state tensors of the wrong shape).
  std::vector<Options> saved_options;
  for (size_t g = 0; g < param_groups_.size(); ++g) saved_options.push_back(options(g));
  decltype(state_) saved_state;
  for (auto& [key, value] : state_) saved_state[key] = value->clone();
  try {
    torch::optim::serialize<ParamState, Options>(archive, *this);
    check_loaded_state();
  } catch (...) {
    state_ = std::move(saved_state);
    for (size_t g = 0; g < param_groups_.size(); ++g) options(g) = saved_options[g];
    throw;
  }
}

void Optimizer::check_loaded_state() const {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      auto it = state_.find(params[i].unsafeGetTensorImpl());
      if (it == state_.end()) continue;
      const auto& s = static_cast<const ParamState&>(*it->second);
      const at::Tensor& p = params[i];
      auto bad = [&](const char* key, const at::Tensor& t, const std::string& want) {
        throw ValueError("loading optimizer state: param group " + std::to_string(g) + ", parameter " +
                         std::to_string(i) + " of shape " + shape_str(p.sizes()) + ": '" + key + "' has shape " +
                         shape_str(t.sizes()) + ", expected " + want + " (a checkpoint of another model?)");
      };
      const std::vector<StateSpec> specs = state_specs(p, options(g));
      for (const auto& [key, t] : s.tensors()) {
        if (!t.defined()) continue;
        const std::optional<StateSpec> spec = spec_of(specs, key);
        if (!spec)
          throw ValueError("loading optimizer state: param group " + std::to_string(g) + ", parameter " +
                           std::to_string(i) + ": state '" + key + "' is not kept by '" + options(g).algorithm() +
                           "' (a checkpoint of another algorithm?)");
        if (spec->layout == StateLayout::OUTER_ROWS) {  // its column count r is the checkpoint's
          if (t.dim() != 2 || t.size(0) != spec->shape[0])
            bad(key.c_str(), t, "[" + std::to_string(spec->shape[0]) + ", r]");
        } else if (t.sizes().vec() != spec->shape) {
          bad(key.c_str(), t, shape_str(spec->shape));
        }
      }
    }
  }
}

}  // namespace dion
