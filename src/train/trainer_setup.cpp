// src/train/trainer_setup.cpp — Trainer::setup() (dion/train/trainer.h): everything a run
// checks and builds before its first step, in order: the device, the rendezvous and the mesh,
// the data, the checkpoint to resume, the model and optimizer, the run folder. Every check that
// can refuse the run comes before anything is written.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <csignal>

#include <fstream>
#include <functional>

#include "dion/train/loader.h"
#include "dion/train/metrics.h"
#include "dion/train/ddp.h"
#include "dion/train/parallel.h"
#include "dion/train/resume_policy.h"
#include "dion/train/tensorboard.h"
#include "dion/train/trainer.h"
#include "qk_clip.h"

namespace dion::train {

namespace fs = std::filesystem;

namespace {

// Every rank must run the same configuration: one all_gather of a hash per key; a difference
// names the first differing key and the ranks (ConfigError on every rank).
void check_config_agrees(comm::Group& world, const Config& c) {
  if (world.size() == 1) return;
  const auto items = config_items(c);
  at::Tensor h = at::empty({int64_t(items.size())}, at::kLong);
  for (size_t i = 0; i < items.size(); ++i) h[int64_t(i)] = int64_t(std::hash<std::string>{}(items[i].second) >> 1);
  at::Tensor all = world.all_gather(h);  // [world, keys]
  for (int r = 1; r < world.size(); ++r)
    for (size_t i = 0; i < items.size(); ++i)
      if (!at::equal(all[r][int64_t(i)], all[0][int64_t(i)]))
        throw ConfigError(
            fmt::format("key '{}' differs between rank 0 and rank {} (this rank {} has '{}'): every rank "
                        "must run the same configuration",
                        items[i].first, r, world.rank(), items[i].second));
}

}  // namespace

void Trainer::setup() {
  check_device();
  connect();
  open_data();
  // The checkpoint to resume: verified whole (checkpoint.h) and compared with this run's keys
  // (resume_policy.h) before anything is built or written.
  choose_checkpoint();
  build_model();
  open_run_dir();
}

// Checks before any write.
void Trainer::check_device() {
  const std::string asked = c_.device;
  c_.device = resolve_device(c_);
  device_why_ = asked != "auto"       ? ""
                : c_.device == "cuda" ? "device auto: a CUDA device is present; --device cpu trains on the CPU"
                                      : "device auto: no CUDA device here";
  if (c_.cuda_graphs && c_.device != "cuda")
    throw ConfigError(
        fmt::format("key 'cuda_graphs': true needs device cuda (device is '{}'{}); valid: false, or "
                    "device cuda",
                    c_.device, device_why_.empty() ? "" : "; " + device_why_));
  if (c_.device == "cuda" && !at::globalContext().hasCUDA())
    throw ConfigError("key 'device': value 'cuda' but this machine (or this LibTorch) has no CUDA device; valid: cpu");
}

void Trainer::connect() {
  comm::GroupOptions gopt;
  gopt.timeout = std::chrono::milliseconds(int64_t(c_.comm_timeout_s * 1000));
  gopt.rendezvous_timeout = std::chrono::milliseconds(int64_t(c_.rendezvous_timeout_s * 1000));
  comm::Group world = comm::Group::init_from_env(gopt);
  main_rank_ = world.rank() == 0;
  // Before the mesh: ranks that differ on dp/fs/tp would otherwise wait in the mesh's
  // sub-group rendezvous until comm_timeout_s instead of naming the key.
  check_config_agrees(world, c_);
  par_ = std::make_unique<Parallel>(std::move(world), MeshShape{c_.dp_size, c_.fs_size, c_.tp_size, c_.ep_size});
  device_ = c_.device == "cuda" ? at::Device(at::kCUDA, int8_t(par_->mesh().world().local_rank())) : at::Device(at::kCPU);
  dtype_ = resolve_dtype(c_);
  autocast_ = dtype_ == "bf16";
}

void Trainer::open_data() {
  const Config& c = c_;
  const int64_t drank = par_->mesh().coord().data, dsize = par_->mesh().data_size();
  if (c.debug) {
    train_loader_ = std::make_unique<SyntheticLoader>(c.device_batch_size, c.sequence_length, uint64_t(c.seed), drank,
                                                      dsize, c.vocab_size);
    val_loader_ = std::make_unique<SyntheticLoader>(c.device_batch_size, c.sequence_length, uint64_t(c.seed) + 1, drank,
                                                    dsize, c.vocab_size);
  } else {
    auto train = std::make_unique<ShardLoader>(c.data_dir, "train", c.device_batch_size, c.sequence_length, drank, dsize);
    train->start_at_seed(uint64_t(c.data_seed));  // key data_seed (a resumed run restores its position later)
    train_loader_ = std::move(train);
    val_loader_ =
        std::make_unique<ShardLoader>(c.data_dir, "val", c.device_batch_size, c.sequence_length, drank, dsize);
  }
  loader_check_vocab(*train_loader_, c.vocab_size, c.data_dir);  // key vocab_size vs the shards' tokenizer
  // Sizes against the data: a validation that reads more than the val split re-reads it, a step
  // larger than the train split reads it more than once (--val_tokens 1.28e12 ran for days).
  if (val_loader_->tokens() >= 0 && c.val_tokens > val_loader_->tokens())
    throw ConfigError(
        fmt::format("key 'val_tokens': value {} is more than the {} tokens of the val shards in '{}'; "
                    "valid: at most {} (a validation reads each val token once)",
                    c.val_tokens, val_loader_->tokens(), c.data_dir, val_loader_->tokens()));
  if (train_loader_->tokens() >= 0 && c.batch_size * c.sequence_length > train_loader_->tokens())
    throw ConfigError(fmt::format(
        "keys 'batch_size' {} x 'sequence_length' {} = {} tokens per step, more than the {} "
        "tokens of the train shards in '{}'; valid: a step of at most the whole train split",
        c.batch_size, c.sequence_length, c.batch_size * c.sequence_length, train_loader_->tokens(), c.data_dir));
  // A write past `ulimit -f` must fail with EFBIG (a clear CheckpointError) instead of the
  // default SIGXFSZ killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  data_fp_ = data_fingerprint(c);
}

void Trainer::choose_checkpoint() {
  const Config& c = c_;
  if (!c.checkpoint_dir.empty()) checkpoint_dir_check_writable(c.checkpoint_dir);  // not at the first save
  if (c.checkpoint_dir.empty() || !c.resume) return;
  // Every rank verifies the whole checkpoint (every rank's files); a rank that finds it bad
  // tells the others through agree_on_checkpoint instead of leaving them waiting in it.
  CheckpointChoice choice;
  std::optional<CheckpointError> bad;
  try {
    choice = checkpoint_choose(c.checkpoint_dir, c.resume_fallback);
  } catch (const CheckpointError& e) {
    if (par_->mesh().world_size() == 1) throw;
    bad = e;
  }
  for (const auto& [folder, problem] : choice.skipped)
    resume_lines_.push_back(fmt::format("  resume_fallback: skipped {}: {}", folder.string(), problem));
  if (!choice.skipped.empty() && !choice.chosen)
    resume_lines_.push_back("  resume_fallback: no good checkpoint left: starting over at step 0");
  ckpt_ = choice.chosen;
  meta_ = choice.meta;
  if (par_->mesh().world_size() > 1) agree_on_checkpoint(bad);
  if (!ckpt_) return;
  if (meta_->state.step >= c.num_iterations)
    throw CheckpointError(
        fmt::format("checkpoint '{}' is at step {}, past num_iterations {} (steps 0..{}): nothing "
                    "to do; raise --num_iterations above {} to continue training it",
                    ckpt_->string(), meta_->state.step, c.num_iterations, c.num_iterations - 1, meta_->state.step + 1));
  for (std::string& line : resume_check(c, *meta_, *ckpt_, data_fp_)) resume_lines_.push_back(std::move(line));
}

// Every rank must resume the same checkpoint (a shared file system): one all_gather of each
// rank's step (or its failure); a rank whose verification failed throws its own error, the
// others name it.
void Trainer::agree_on_checkpoint(const std::optional<CheckpointError>& bad) {
  constexpr int64_t kBad = -2;  // this rank's verification failed
  at::Tensor all = par_->mesh().world()
                       .all_gather(at::tensor({bad     ? kBad
                                               : ckpt_ ? meta_->state.step
                                                       : int64_t(-1)},
                                              at::kLong))
                       .reshape({-1});
  if (bad) throw *bad;
  for (int r = 0; r < par_->mesh().world_size(); ++r)
    if (all[r].item<int64_t>() == kBad)
      throw CheckpointError(
          fmt::format("rank {} found checkpoint_dir '{}' not resumable (its message is in that "
                      "rank's log); every rank stops",
                      r, c_.checkpoint_dir));
  for (int r = 1; r < par_->mesh().world_size(); ++r)
    if (all[r].item<int64_t>() != all[0].item<int64_t>())
      throw CheckpointError(
          fmt::format("rank 0 resumes checkpoint_dir '{}' at step {} but rank {} at step {}: the "
                      "ranks must see the same checkpoint_dir (a shared file system)",
                      c_.checkpoint_dir, all[0].item<int64_t>(), r, all[r].item<int64_t>()));
}

void Trainer::build_model() {
  const Config& c = c_;
  Parallel& par = *par_;
  gcfg_ = GPTConfig{c.sequence_length, c.vocab_size, c.n_layer, c.n_head, c.model_dim};
  gcfg_.kernels = c.model_kernels == "exact" ? Kernels::exact : Kernels::fast;
  gcfg_.qk_norm = c.qk_norm;
  gcfg_.track_max_logits = c.qk_clip_tau > 0;
  gcfg_.moe = MoEConfig{c.n_experts,  c.top_k, c.resolved_expert_dim(), c.n_shared_experts, c.moe_every,
                        c.router_score == "sigmoid", c.moe_aux_loss_coef};
  gpt_check_fits_memory(gcfg_, device_, par.mesh().world_size());  // a clear error, not an allocator's
  GPTConfig placeholder = gcfg_;
  placeholder.placeholder_weights = true;  // never the whole model: init_model draws one weight at a time
  model_ = GPT(placeholder);
  at::manual_seed(uint64_t(c.seed));  // after construction, as the reference (built on meta) draws
  par.init_model(model_);             // the weights of one process; each rank keeps its parts
  par.fsdp().set_reshard_after_forward(c.reshard_after_forward && !c.fast_fsdp);
  par.fsdp().set_gather_dtype(c.fsdp_param_dtype == "bf16" ? at::kBFloat16 : at::kFloat);  // FSDP gathers
  model_->to(device_);
  topt_ = build_optimizer(c, model_);
  dion::Optimizer& opt = *topt_.optimizer;
  if (auto dist = par.distribution(model_, c.replicate_mesh_grad_sync)) opt.set_distribution(dist);
  opt.init_state();
  // DDP / HSDP: the trainer sums gradients over dp, unless legacy Dion syncs them itself.
  // MoE under ep: the expert stacks are not replicated over dp but over edp (parallel.h).
  const int64_t bucket = int64_t(c.ddp_bucket_mb * 1024 * 1024);
  if (par.mesh().shape().dp > 1 && !c.replicate_mesh_grad_sync)
    ddp_ = std::make_unique<GradSync>(par.mesh().replicas(ReplicaAxis::dp), par.replicated_over(model_, ReplicaAxis::dp),
                                      bucket);
  if (const auto& edp = par.mesh().replicas(ReplicaAxis::edp); edp && edp->size() > 1)
    expert_sync_ = std::make_unique<GradSync>(edp, par.replicated_over(model_, ReplicaAxis::edp), bucket);
  if (ckpt_) {
    checkpoint_load_model(*ckpt_, model_, &par);  // any layout -> this rank's parts
    // The state from the checkpoint (the groups' step counters too), the hyperparameters from this
    // run's config: a key the resume policy lets change (mu, weight_decay, selection_scope, ...)
    // takes effect, as its line says. lr stays the checkpoint's until the schedule sets it.
    std::vector<dion::Options> configured;
    for (size_t g = 0; g < opt.param_groups().size(); ++g) configured.push_back(opt.options(g));
    checkpoint_load_training(*ckpt_, opt);
    for (size_t g = 0; g < configured.size(); ++g) {
      dion::Options o = configured[g];
      o.step(opt.options(g).step()).lr(opt.options(g).lr());
      opt.set_options(g, o);
    }
    st_ = meta_->state;
    train_loader_->restore(st_.loader);
  }
  if (c.qk_clip_tau > 0) qk_clip_ = std::make_unique<TrainQkClip>(c.qk_clip_tau, model_, par);
}

void Trainer::open_run_dir() {
  run_dir_ = c_.resolved_run_dir();
  config_yaml_ = config_to_yaml(c_);
  if (!par_->mesh().is_main()) return;  // one writer of the run folder
  fs::create_directories(run_dir_);
  std::ofstream f(run_dir_ / "config.yaml");
  f << config_yaml_;
  metrics_ = std::make_unique<MetricsWriter>(run_dir_ / "metrics.jsonl", ckpt_ ? st_.step : -1);
  tensorboard_ = std::make_unique<EventWriter>((run_dir_ / "tb").string());  // `tensorboard --logdir RUN_DIR/tb`
}

}  // namespace dion::train
