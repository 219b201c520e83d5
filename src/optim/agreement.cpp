// The check that every rank holds the same optimizer (see agreement.h): describe, compare over
// every axis, spread the first disagreement to every rank, raise.
#include "agreement.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <sstream>
#include <string>

#include "dion/errors.h"
#include "dion/optim/options.h"

namespace dion {

namespace {

// ---------------------------------------------------------------------------- descriptions

// One parameter's description: a fixed row of int64 fields (doubles stored as their bits): the
// layout part below, then every hyperparameter the table (dion/optim/hyperparameters.h) marks as
// changing communication (`comm` rules), in table order, one or more slots each.
enum class Kind { INT, REAL, ALGORITHM, DTYPE, CHOICE, BOOL, SHAPE, SPLITS };
struct Field {
  std::string name;
  Kind kind = Kind::INT;
  int start = 0;                         // the field's first column (multi-slot fields)
  const rule::Choice* choice = nullptr;  // CHOICE: the two names
};
constexpr int kMaxDims = 8;    // global shape dims described one by one (the rest folded into the last)
constexpr int kMaxSplits = 8;  // split_sizes entries described one by one (the rest summed into the last)
enum : int {
  F_ALGORITHM,
  F_DTYPE,
  F_NDIM,
  F_SHAPE,  // kMaxDims slots
  F_SHARD_DIM = F_SHAPE + kMaxDims,
  F_INNER_DIM,
  F_REPLICATED,
  F_OWN_GROUP,  // shard_over: its group's size (0: the outer axis)
  F_OPTIONS     // the table's communication options from here on
};
int64_t bits(double v) {
  int64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}
double real(int64_t b) {
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Encoders by the hyperparameter's type: write the value from column `col` (when `row` is not
// null), return the next column, and describe the columns in `fields` (when not null).
struct Columns {
  int64_t* row = nullptr;
  std::vector<Field>* fields = nullptr;
  void put(int col, const char* name, Kind kind, int start, int64_t v, const rule::Choice* choice = nullptr) {
    if (row) row[col] = v;
    if (fields) {
      if (static_cast<int>(fields->size()) <= col) fields->resize(static_cast<size_t>(col) + 1);
      (*fields)[static_cast<size_t>(col)] = Field{name, kind, start, choice};
    }
  }
};
template <typename Rule>
int encode(Columns& c, int col, const char* name, double v, const Rule&) {
  c.put(col, name, Kind::REAL, col, bits(v));
  return col + 1;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, bool v, const Rule&) {
  c.put(col, name, Kind::BOOL, col, v);
  return col + 1;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, int64_t v, const Rule&) {
  c.put(col, name, Kind::INT, col, v);
  return col + 1;
}
int encode(Columns& c, int col, const char* name, const std::string& v, const rule::Choice& choice) {
  c.put(col, name, Kind::CHOICE, col, v == choice.a ? 0 : v == choice.b ? 1 : -1, &choice);
  return col + 1;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, const OptionalDtype& v, const Rule&) {
  c.put(col, name, Kind::DTYPE, col, v ? static_cast<int64_t>(*v) : -1);
  return col + 1;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, const SplitSizes& v, const Rule&) {
  c.put(col, name, Kind::SPLITS, col, static_cast<int64_t>(v.size()));
  for (int s = 0; s < kMaxSplits; ++s) c.put(col + 1 + s, name, Kind::SPLITS, col, 0);
  for (size_t s = 0; s < v.size(); ++s)
    if (c.row) c.row[col + 1 + std::min<int>(static_cast<int>(s), kMaxSplits - 1)] += v[s];
  return col + 1 + kMaxSplits;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, const Betas& v, const Rule&) {
  c.put(col, name, Kind::REAL, col, bits(std::get<0>(v)));
  c.put(col + 1, name, Kind::REAL, col, bits(std::get<1>(v)));
  return col + 2;
}
template <typename Rule>
int encode(Columns& c, int col, const char* name, math::AdjustLR v, const Rule&) {
  c.put(col, name, Kind::INT, col, static_cast<int64_t>(v));
  return col + 1;
}

// The table's communication options of `o`, from column F_OPTIONS; returns the row's width.
int encode_options(Columns& c, const Options& o) {
  int col = F_OPTIONS;
#define DION_AGREEMENT_FIELD(T, name, default_value, rule_object, doc) \
  if ((rule_object).comm) col = encode(c, col, #name, o.name(), rule_object);
  DION_HYPERPARAMETERS(DION_AGREEMENT_FIELD)
#undef DION_AGREEMENT_FIELD
  return col;
}

// Every column's description (layout part and options), and the row width.
const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> t;
    Columns c{nullptr, &t};
    const int width = encode_options(c, Options());
    t.resize(static_cast<size_t>(width));
    t[F_ALGORITHM] = {"algorithm", Kind::ALGORITHM, F_ALGORITHM};
    t[F_DTYPE] = {"dtype", Kind::DTYPE, F_DTYPE};
    t[F_NDIM] = {"global shape", Kind::SHAPE, F_NDIM};
    for (int d = 0; d < kMaxDims; ++d) t[F_SHAPE + d] = {"global shape", Kind::SHAPE, F_NDIM};
    t[F_SHARD_DIM] = {"sharded dim (outer axis)", Kind::INT, F_SHARD_DIM};
    t[F_INNER_DIM] = {"sharded dim (inner axis)", Kind::INT, F_INNER_DIM};
    t[F_REPLICATED] = {"replicated", Kind::BOOL, F_REPLICATED};
    t[F_OWN_GROUP] = {"size of the shard_over (expert) group", Kind::INT, F_OWN_GROUP};
    return t;
  }();
  return table;
}
int row_width() { return static_cast<int>(fields().size()); }
const Field& field(int col) { return fields().at(static_cast<size_t>(col)); }

// `algorithm`: the group's algorithm as its position in the registry (the same on every rank).
std::vector<int64_t> describe(const at::Tensor& p, const Options& o, int64_t algorithm, const Layout& L) {
  std::vector<int64_t> row(static_cast<size_t>(row_width()), 0);
  row[F_ALGORITHM] = algorithm;
  row[F_DTYPE] = static_cast<int64_t>(p.scalar_type());
  const int64_t nd = static_cast<int64_t>(L.global_shape.size());
  row[F_NDIM] = nd;
  for (int64_t d = 0; d < nd; ++d) {
    const int64_t slot = std::min<int64_t>(d, kMaxDims - 1);
    row[F_SHAPE + slot] = d < kMaxDims ? L.global_shape[d] : row[F_SHAPE + slot] * L.global_shape[d];
  }
  row[F_SHARD_DIM] = L.shard_dim;
  row[F_INNER_DIM] = L.inner_dim;
  row[F_REPLICATED] = L.replicated;
  row[F_OWN_GROUP] = L.group ? L.group->size() : 0;
  Columns c{row.data(), nullptr};
  encode_options(c, o);
  return row;
}

// The header (one row: the group count and the axis sizes), the per-group parameter counts,
// and one row per parameter, in group order.
struct Description {
  std::vector<int64_t> header, counts, rows;     // rows: [P * row_width()]
  std::vector<std::pair<size_t, size_t>> where;  // row -> (group, position)
  std::vector<int64_t> flat() const {
    std::vector<int64_t> all = header;
    all.insert(all.end(), counts.begin(), counts.end());
    all.insert(all.end(), rows.begin(), rows.end());
    return all;
  }
};

constexpr std::array<Axis, 3> kAxes = {Axis::OUTER, Axis::INNER, Axis::REPLICA};
const char* axis_name(Axis a) { return a == Axis::OUTER ? "outer" : a == Axis::INNER ? "inner" : "replica"; }

Description describe_all(const Distribution& dist, const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  Description d;
  d.header = {static_cast<int64_t>(groups.size()), row_width()};
  for (Axis a : kAxes) d.header.push_back(dist.axis_size(a));
  const std::vector<Algorithm> algos = algorithms();
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& o = static_cast<const Options&>(groups[g].options());
    const int64_t algorithm = std::find(algos.begin(), algos.end(), o.algo()) - algos.begin();
    const auto& params = groups[g].params();
    d.counts.push_back(static_cast<int64_t>(params.size()));
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<int64_t> row = describe(params[i], o, algorithm, dist.layout(params[i]));
      d.rows.insert(d.rows.end(), row.begin(), row.end());
      d.where.emplace_back(g, i);
    }
  }
  return d;
}

// ---------------------------------------------------------------------------- comparison

// A disagreement, as a fixed-size int64 record so that it can travel:
//   [found, phase, row, column, axis, my coordinates (3), other's coordinates (3),
//    my row (width), other's row (width)]
// phase 0: header, 1: per-group counts, 2: parameters. Coordinates: rank along each axis.
enum : int {
  R_FOUND,
  R_PHASE,
  R_ROW,
  R_COL,
  R_AXIS,
  R_MINE_AT,
  R_THEIRS_AT = R_MINE_AT + 3,
  R_VALUES = R_THEIRS_AT + 3
};

struct Phase {
  int id;
  int64_t width;              // int64 values per row
  std::vector<int64_t> data;  // [n, width]
};

std::vector<int64_t> coordinates(const Distribution& dist) {
  return {dist.axis_rank(Axis::OUTER), dist.axis_rank(Axis::INNER), dist.axis_rank(Axis::REPLICA)};
}

// The agreement's int64 control tensors travel on each axis's control device (a NCCL-only torch
// group has no backend for CPU tensors: they go to the current CUDA device and back); every read
// is of the host copy. On a Gloo group both moves are no-ops.
at::Tensor all_gather_on_host(Distribution& dist, const at::Tensor& x, Axis a) {
  const c10::Device dev = dist.axis(a)->control_device();
  return dist.all_gather(x.to(dev), a).to(at::kCPU);  // a blocking copy after the collective
}

// This rank's view: the first row/column where another rank of some axis differs from mine.
at::Tensor compare_over_axes(Distribution& dist, const Phase& phase) {
  const int64_t n = static_cast<int64_t>(phase.data.size()) / phase.width;
  at::Tensor report = at::zeros({R_VALUES + 2 * phase.width}, at::kLong);
  at::Tensor mine = at::tensor(phase.data, at::kLong);
  for (size_t a = 0; a < kAxes.size(); ++a) {
    if (dist.axis_size(kAxes[a]) <= 1) continue;
    at::Tensor all = all_gather_on_host(dist, mine, kAxes[a]).view({-1, n * phase.width});  // [S, n * width]
    if (report[R_FOUND].item<int64_t>()) continue;  // gather anyway: every rank issues the same collectives
    at::Tensor differs = all.ne(mine.unsqueeze(0));
    if (!differs.any().item<bool>()) continue;
    const auto rows = differs.any(1).nonzero();  // first disagreeing rank along this axis
    const int64_t other = rows[0][0].item<int64_t>();
    const int64_t flat = differs[other].nonzero()[0][0].item<int64_t>();
    const int64_t row = flat / phase.width, col = flat % phase.width;
    auto acc = report.accessor<int64_t, 1>();
    acc[R_FOUND] = 1;
    acc[R_PHASE] = phase.id;
    acc[R_ROW] = row;
    acc[R_COL] = col;
    acc[R_AXIS] = static_cast<int64_t>(a);
    const std::vector<int64_t> at_mine = coordinates(dist);
    for (int k = 0; k < 3; ++k) acc[R_MINE_AT + k] = acc[R_THEIRS_AT + k] = at_mine[k];
    acc[R_THEIRS_AT + a] = other;
    for (int64_t k = 0; k < phase.width; ++k) {
      acc[R_VALUES + k] = phase.data[row * phase.width + k];
      acc[R_VALUES + phase.width + k] = all[other][row * phase.width + k].item<int64_t>();
    }
  }
  return report;
}

// Every rank ends with a report: its own, or the first found along each axis in turn (the axes
// span the whole mesh, so a disagreement seen anywhere reaches every rank).
at::Tensor spread(Distribution& dist, at::Tensor report) {
  for (Axis a : kAxes) {
    if (dist.axis_size(a) <= 1) continue;
    at::Tensor all = all_gather_on_host(dist, report, a);  // [S, R]
    if (report[R_FOUND].item<int64_t>()) continue;
    for (int64_t s = 0; s < all.size(0); ++s)
      if (all[s][R_FOUND].item<int64_t>()) {
        report = all[s].clone();
        break;
      }
  }
  return report;
}

std::string rank_str(const Distribution& dist, const int64_t* at) {
  std::ostringstream os;
  std::vector<std::string> parts;
  for (size_t a = 0; a < kAxes.size(); ++a)
    if (dist.axis_size(kAxes[a]) > 1) parts.push_back(std::string(axis_name(kAxes[a])) + " " + std::to_string(at[a]));
  if (parts.size() == 1) return "rank " + std::to_string(at[0] + at[1] + at[2]);  // one axis: its rank
  os << "rank (";
  for (size_t i = 0; i < parts.size(); ++i) os << (i ? ", " : "") << parts[i];
  os << ")";
  return os.str();
}

std::string value_str(const int64_t* row, int col) {
  std::ostringstream os;
  const Field& f = field(col);
  const int64_t v = row[col];
  switch (f.kind) {
    case Kind::INT:
      os << v;
      break;
    case Kind::REAL:
      os << real(v);
      break;
    case Kind::BOOL:
      os << (v ? "true" : "false");
      break;
    case Kind::CHOICE:
      os << "'" << (v == 0 ? f.choice->a : v == 1 ? f.choice->b : "?") << "'";
      break;
    case Kind::ALGORITHM: {
      const std::vector<Algorithm> algos = algorithms();
      os << "'" << (v >= 0 && v < static_cast<int64_t>(algos.size()) ? algos[static_cast<size_t>(v)].name() : "?")
         << "'";
      break;
    }
    case Kind::DTYPE:
      os << (v < 0 ? std::string("(parameter dtype)") : c10::toString(static_cast<at::ScalarType>(v)));
      break;
    case Kind::SHAPE: {
      os << "[";
      const int64_t nd = row[F_NDIM];
      for (int64_t d = 0; d < std::min<int64_t>(nd, kMaxDims); ++d) os << (d ? ", " : "") << row[F_SHAPE + d];
      if (nd > kMaxDims) os << " (dims " << kMaxDims - 1 << ".." << nd - 1 << " folded)";
      os << "]";
      break;
    }
    case Kind::SPLITS: {
      os << "[";
      const int64_t n = row[f.start];
      for (int64_t s = 0; s < std::min<int64_t>(n, kMaxSplits); ++s) os << (s ? ", " : "") << row[f.start + 1 + s];
      if (n > kMaxSplits) os << " (last " << n - kMaxSplits + 1 << " summed)";
      os << "]";
      break;
    }
  }
  return os.str();
}

[[noreturn]] void raise(const Distribution& dist, const at::Tensor& report, int64_t width,
                        const std::vector<std::pair<size_t, size_t>>& where) {
  auto r = report.contiguous();
  const int64_t* v = r.data_ptr<int64_t>();
  const int64_t* mine = v + R_VALUES;
  const int64_t* theirs = v + R_VALUES + width;
  const std::string a = rank_str(dist, v + R_MINE_AT), b = rank_str(dist, v + R_THEIRS_AT);
  std::ostringstream os;
  os << "ranks disagree on the optimizer: ";
  const int64_t row = v[R_ROW], col = v[R_COL];
  switch (v[R_PHASE]) {
    case 0: {
      static const char* names[] = {"the number of param groups", "the description format", "the outer axis size",
                                    "the inner axis size", "the replica axis size"};
      os << names[col] << " is " << mine[col] << " on " << a << " but " << theirs[col] << " on " << b;
      break;
    }
    case 1: {
      const int64_t lo = std::min(mine[col], theirs[col]), hi = std::max(mine[col], theirs[col]);
      os << "param group " << col << " has " << mine[col] << " parameters on " << a << " but " << theirs[col] << " on "
         << b << " (parameters " << lo << ".." << hi - 1 << " of group " << col << " exist on one rank only)";
      break;
    }
    default: {
      // The row index is this rank's: when the report came from another rank, both have the
      // same group counts (phase 1 passed), so the row maps to the same (group, position).
      const auto [g, i] = where.at(static_cast<size_t>(row));
      os << "param group " << g << ", parameter " << i << " (global shape " << value_str(mine, F_NDIM)
         << "): " << field(static_cast<int>(col)).name << " is " << value_str(mine, static_cast<int>(col)) << " on "
         << a << " but " << value_str(theirs, static_cast<int>(col)) << " on " << b;
    }
  }
  os << " (every rank must build the same param groups, parameters, layouts and communication options; "
        "checked at the first step and after add_param_group, option edits and loads)";
  throw ValueError(os.str());
}

}  // namespace

void check_ranks_agree(Distribution& dist, const std::vector<torch::optim::OptimizerParamGroup>& groups,
                       std::vector<int64_t>& agreed) {
  const Description d = describe_all(dist, groups);
  const std::vector<int64_t> flat = d.flat();
  // Did anything change on any rank since the last agreement? (One small sum per axis.)
  at::Tensor changed = at::full({1}, flat == agreed ? 0 : 1, at::kLong);
  for (Axis a : kAxes) {
    if (dist.axis_size(a) <= 1) continue;
    at::Tensor c = changed.to(dist.axis(a)->control_device());
    dist.all_reduce_(c, a);
    changed = c.to(at::kCPU);
  }
  if (changed.item<int64_t>() == 0) return;

  const std::vector<Phase> phases = {{0, static_cast<int64_t>(d.header.size()), d.header},
                                     {1, std::max<int64_t>(1, static_cast<int64_t>(d.counts.size())), d.counts},
                                     {2, row_width(), d.rows}};
  for (const Phase& phase : phases) {
    // Each phase runs only when the previous ones agreed everywhere, so its sizes match on every
    // rank. An empty phase (no groups, no parameters) has nothing to compare.
    if (phase.data.empty()) continue;
    at::Tensor report = spread(dist, compare_over_axes(dist, phase));
    if (report[R_FOUND].item<int64_t>()) raise(dist, report, phase.width, d.where);
  }
  agreed = flat;
}

}  // namespace dion
