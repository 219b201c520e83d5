// src/train/trainer.cpp — Trainer::run() and its loop (dion/train/trainer.h): validation, one
// training step (micro-batches, gradient sync, norm, clipping, the non-finite guard, the
// optimizer step at the scheduled lr), checkpoints. Setup: trainer_setup.cpp; console lines,
// metrics.jsonl and TensorBoard: trainer_report.cpp.
#include "dion/train/trainer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>

#include "dion/train/autocast.h"
#include "dion/train/graphed_step.h"
#include "dion/train/loader.h"
#include "dion/train/metrics.h"
#include "dion/train/ddp.h"
#include "dion/train/parallel.h"
#include "dion/train/replicas.h"
#include "dion/train/schedule.h"
#include "dion/train/tensorboard.h"
#include "qk_clip.h"

namespace dion::train {

namespace {

// Mean over the data-parallel ranks of a per-rank sum `local` of `count` values (collective).
double mean_over_data(Parallel& par, const at::Tensor& local, int64_t count) {
  at::Tensor t = local.detach().to(at::kCPU, at::kDouble).reshape({1}).contiguous();
  par.mesh().group(Axis::data)->all_reduce_(t);
  return t.item<double>() / double(count * par.mesh().data_size());
}

// Mean loss over the validation batches (the reference: val_steps batches from the start, each
// data-parallel rank its own slice).
double validate(GPT& model, Loader& val, int64_t steps, const at::Device& device, bool autocast, Parallel& par) {
  model->eval();
  at::NoGradGuard no_grad;
  val.reset();
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (int64_t i = 0; i < steps; ++i) {
    Batch b = val.next();
    AutocastScope ac(device.type(), autocast);
    sum += model->loss(b.x.to(device), b.y.to(device));
  }
  model->train();
  return mean_over_data(par, sum, steps);
}

}  // namespace

Trainer::Trainer(const Config& config, TrainHooks hooks) : c_(config), hooks_(std::move(hooks)) {}

Trainer::~Trainer() = default;

double Trainer::seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double Trainer::elapsed() const { return elapsed0_ + seconds_since(t_start_); }

RunSummary Trainer::run() {
  setup();
  accum_ = c_.grad_accum_steps();
  report_start();
  micro_ = std::make_unique<MicroStep>(model_, *topt_.optimizer, device_, autocast_,
                                       1.0 / double(accum_ * par_->mesh().data_size()), c_.cuda_graphs);
  params_ = model_->parameters();
  // Legacy Dion with replicate_mesh_grad_sync sums the dp replicas' gradients itself (never here).
  grads_summed_over_dp_ = !(c_.replicate_mesh_grad_sync && par_->mesh().shape().dp > 1);
  t_start_ = Clock::now();
  elapsed0_ = st_.elapsed_s;
  last_saved_ = ckpt_ ? st_.step : -1;  // the resumed checkpoint is not written again
  model_->train();
  const int64_t N = c_.num_iterations;
  for (int64_t s = st_.step + 1; s <= N; ++s) {
    if (s == N || (c_.val_loss_every > 0 && s % c_.val_loss_every == 0)) evaluate(s);
    if (s == N) break;
    report_step(s, step(s));
    if (save_or_stop(s)) break;
  }
  if (!sum_.stopped_early && !c_.checkpoint_dir.empty() && last_saved_ != st_.step && st_.step >= 0) save(st_.step);
  if (qk_clip_) say(qk_clip_->summary());
  report_end();
  sum_.last_step = st_.step;
  sum_.best_val_loss = st_.best_val_loss;
  sum_.best_val_step = st_.best_val_step;
  return sum_;
}

void Trainer::evaluate(int64_t step) {
  const double vl = validate(model_, *val_loader_, c_.val_steps(), device_, autocast_, *par_);
  if (st_.best_val_step < 0 || vl < st_.best_val_loss) {
    st_.best_val_loss = vl;
    st_.best_val_step = step;
  }
  report_val(step, vl);
}

Trainer::StepResult Trainer::step(int64_t step) {
  StepResult r;
  const Clock::time_point t0 = Clock::now();
  const int64_t bytes0 = par_->mesh().bytes_sent();
  if (c_.n_experts > 0) model_->take_route_seconds();  // drops the validation forwards' routing
  const at::Tensor loss_sum = forward_backward();
  r.fwd_bwd_seconds = seconds_since(t0);
  if (c_.n_experts > 0) r.route_seconds = model_->take_route_seconds();
  const int64_t bytes1 = par_->mesh().bytes_sent();
  // Before the optimizer step (dion/train/grad_norm.h): the loss and the global gradient norm,
  // identical on every rank (collectives), decide together whether the step is taken.
  if (hooks_.after_backward) hooks_.after_backward(par_->mesh().rank(), step, params_);
  r.loss = mean_over_data(*par_, loss_sum, accum_);
  r.grad_norm = grad_norm(params_, *par_, grads_summed_over_dp_);
  r.skipped = !r.grad_norm.finite || !std::isfinite(r.loss);
  r.factor = lr_factor(step, c_.num_iterations, c_.warmup_ratio, c_.warmdown_ratio);
  update_or_skip(step, r);
  balance_experts(r);
  if (hooks_.after_update) hooks_.after_update(par_->mesh().rank(), step, params_);
  if (c_.replica_check_every > 0 && (step + 1) % c_.replica_check_every == 0) replicas_check(model_, *par_, step);
  const int64_t bytes2 = par_->mesh().bytes_sent();
  model_bytes_ += bytes1 - bytes0;
  optimizer_bytes_ += bytes2 - bytes1;
  r.seconds = seconds_since(t0);

  st_.step = step;
  st_.tokens += c_.batch_size * c_.sequence_length;
  ++sum_.steps_done;
  if (sum_.steps_done > 1 || c_.num_iterations - step <= 1) {  // the first step of an invocation warms up
    steps_ms_total_ += r.seconds * 1000;
    ++steps_timed_;
  }
  return r;
}

at::Tensor Trainer::forward_backward() {
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  for (int64_t i = 0; i < accum_; ++i) {
    // fast_fsdp: FSDP gathers the weights once per step and reduce-scatters their summed
    // gradients once, in the last micro-batch's backward (the reference's
    // set_requires_gradient_sync(i == grad_accum_steps)); otherwise every micro-batch syncs.
    par_->fsdp().set_requires_gradient_sync(!c_.fast_fsdp || i == accum_ - 1);
    Batch b = train_loader_->next();
    if (ddp_ && i == accum_ - 1) ddp_->arm();  // the last micro-batch's gradients are summed over dp
    if (expert_sync_ && i == accum_ - 1) expert_sync_->arm();
    // The loss is scaled by 1 / the GLOBAL micro-batch count: every gradient reduction is then a plain sum.
    loss_sum += micro_->forward_backward(b.x, b.y);
  }
  if (ddp_) ddp_->finish();
  if (expert_sync_) expert_sync_->finish();
  return loss_sum;
}

// The optimizer step at the scheduled lr (after clipping); or, when not finite, the step skipped
// on every rank, and more than max_nonfinite_steps in a row stop the run.
void Trainer::update_or_skip(int64_t step, const StepResult& r) {
  if (!r.skipped) {
    nonfinite_in_a_row_ = 0;
    if (c_.grad_clip > 0) clip_gradients(params_, r.grad_norm.norm, c_.grad_clip);
    for (size_t g = 0; g < topt_.base_lrs.size(); ++g) topt_.optimizer->options(g).lr(topt_.base_lrs[g] * r.factor);
    micro_->optimizer_step();  // and zero the gradients
    if (qk_clip_) qk_clip_->apply(step);
    return;
  }
  // Nothing is written to the weights or the optimizer state (its step counters included);
  // the data position has moved on (the batches were read).
  const int64_t N = c_.num_iterations;
  micro_->discard_gradients();
  if (qk_clip_) qk_clip_->discard();
  ++nonfinite_in_a_row_;
  ++sum_.steps_skipped;
  say(
      fmt::format("step {}/{}: {} is not finite (loss {}, grad_norm {}): step skipped, the weights and the "
                  "optimizer state unchanged ({} in a row; max_nonfinite_steps {})",
                  step, N, std::isfinite(r.loss) ? "the gradient" : "the loss", r.loss, r.grad_norm.norm,
                  nonfinite_in_a_row_, c_.max_nonfinite_steps));
  if (nonfinite_in_a_row_ > c_.max_nonfinite_steps)
    throw NonFiniteError(fmt::format(
        "step {}/{}: {} non-finite step{} in a row (loss {}, grad_norm {}), more than max_nonfinite_steps {}: "
        "the run diverged; stopping. Resume from the last checkpoint with a lower lr, or set grad_clip "
        "(docs/train.md \"Gradient norm, clipping, non-finite steps\")",
        step, N, nonfinite_in_a_row_, nonfinite_in_a_row_ == 1 ? "" : "s", r.loss, r.grad_norm.norm,
        c_.max_nonfinite_steps));
}

void Trainer::balance_experts(StepResult& r) {
  if (c_.n_experts == 0) return;
  at::Tensor load = model_->take_expert_load().to(at::kLong).contiguous();  // [MoE layers, E], this rank's tokens
  if (par_->mesh().world_size() > 1) par_->mesh().group(Axis::data)->all_reduce_(load);
  const at::Tensor l = load.to(at::kDouble);
  const at::Tensor imbalance = l.amax(1) / l.mean(1).clamp_min(1e-12);
  r.moe_imbalance.assign(imbalance.data_ptr<double>(), imbalance.data_ptr<double>() + imbalance.numel());
  if (!r.skipped && c_.moe_bias_rate > 0) model_->update_expert_bias(load, c_.moe_bias_rate);
}

// A checkpoint every checkpoint_freq steps; stop_after: saved (once) and stopped.
bool Trainer::save_or_stop(int64_t step) {
  if (c_.checkpoint_freq > 0 && step > 0 && step % c_.checkpoint_freq == 0) save(step);
  if (!(c_.stop_after > 0 && sum_.steps_done >= c_.stop_after && step < c_.num_iterations - 1)) return false;
  if (last_saved_ != step) save(step);
  sum_.stopped_early = true;
  say(fmt::format("stopped after {} steps (stop_after); run the same command again to continue", sum_.steps_done));
  return true;
}

void Trainer::save(int64_t step) {
  st_.elapsed_s = elapsed();
  st_.loader = train_loader_->position();
  topt_.optimizer->synchronize_for_checkpoint();  // legacy Dion's decoupled momenta (a no-op otherwise)
  if (c_.replica_check_every > 0) replicas_check(model_, *par_, step);  // a checkpoint keeps dp rank 0's copy
  const std::filesystem::path p =
      checkpoint_save(c_.checkpoint_dir, model_, *topt_.optimizer, st_, config_yaml_, par_.get(), data_fp_);
  last_saved_ = step;
  say(fmt::format("checkpoint {} written", p.string()));
}

}  // namespace dion::train
