// src/train/trainer_report.cpp — what a run says (dion/train/trainer.h): the start-up lines and
// the MFU peak, a line per validation and per logged step (rank 0's stdout), the metrics.jsonl
// and TensorBoard records, and the closing memory and summary lines. Nothing here decides
// anything about training.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>

#include "dion/math/ortho.h"
#include "dion/optim/algorithm.h"
#include "dion/train/loader.h"
#include "dion/train/metrics.h"
#include "dion/train/mfu.h"
#include "dion/train/ddp.h"
#include "dion/train/parallel.h"
#include "dion/train/tensorboard.h"
#include "dion/train/trainer.h"

namespace dion::train {

namespace {

std::string format_duration(double s) {
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

double peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

void Trainer::say(const std::string& line) const {
  if (!main_rank_) return;
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void Trainer::report_start() {
  const Config& c = c_;
  const std::string device_note = device_why_.empty() ? "" : " (" + device_why_ + ")";
  say(fmt::format("dion-train: GPT {} layers x {} dim x {} heads, {} parameters{}; {} on {} ({}){}", c.n_layer,
                  c.model_dim, c.n_head, gpt_param_count(gcfg_),
                  c.n_experts == 0 ? std::string()
                                   : fmt::format(" ({} active: MoE {} experts, top_k {}, expert_dim {}, {} shared{})",
                                                 gpt_active_param_count(gcfg_), c.n_experts, c.top_k,
                                                 gcfg_.moe.expert_dim, c.n_shared_experts,
                                                 c.ep_size > 1 ? fmt::format(", ep {}{}", c.ep_size, par_->mesh().shape().efs() > 1
                                                                    ? fmt::format(" x efs {}", par_->mesh().shape().efs())
                                                                    : "")
                                              : ""),
                  c.optimizer, c.device, dtype_, device_note));
  say(
      fmt::format("  batch {} x {} tokens (device batch {}, {} accumulation steps), {} steps, lr {} "
                  "(warmup {}, warmdown {}), scalar_opt {}",
                  c.batch_size, c.sequence_length, c.device_batch_size, accum_, c.num_iterations, c.lr, c.warmup_ratio,
                  c.warmdown_ratio, !find_algorithm(c.optimizer, true).matrix() ? c.optimizer : c.scalar_opt));
  say(fmt::format("  train data: {}", train_loader_->describe()));
  say(fmt::format("  val data:   {}; {} batches per validation", val_loader_->describe(), c.val_steps()));
  say(fmt::format("  run dir: {}; checkpoints: {}", run_dir_.string(),
                  c.checkpoint_dir.empty() ? std::string("none")
                                           : fmt::format("{} every {} steps", c.checkpoint_dir, c.checkpoint_freq)));
  if (par_->mesh().world_size() > 1)
    say(fmt::format(
        "  layout: {} processes = dp {} x fs {} x tp {}{}; {} data-parallel ranks; DDP buckets: {}", par_->mesh().world_size(),
        c.dp_size, c.fs_size, c.tp_size,
        c.mesh_from_world ? " (DDP over every process: no dp_size, fs_size or tp_size given, as train.py)" : "",
        par_->mesh().data_size(),
        ddp_ ? fmt::format("{} of <= {} MB", ddp_->buckets(), c.ddp_bucket_mb)
             : std::string(c.replicate_mesh_grad_sync ? "none (the optimizer syncs)" : "none")));
  if (ckpt_)
    say(fmt::format("  resumed from {} (step {} done{})", ckpt_->string(), st_.step,
                    st_.step == c.num_iterations - 1 ? ": every training step is done" : ""));
  for (const std::string& line : resume_lines_) say(line);
  report_mfu_start();
}

// MFU (dion/train/mfu.h): the model's FLOPs per token against the peak_tflops key or a matmul
// in the compute dtype timed once here.
void Trainer::report_mfu_start() {
  const Config& c = c_;
  model_flops_ = flops_per_token(gcfg_);
  // bf16 autocast on a CPU whose bf16 GEMMs are not native runs ATen's scalar fallback: said
  // once here, and the peak is then fp32's (the fastest GEMM this CPU has; timing the slow
  // kernel would put MFU above 100% and take a minute).
  std::string bf16_why;
  const bool slow_bf16 = autocast_ && device_.is_cpu() && !math::cpu_has_native_gemm(at::kBFloat16, &bf16_why);
  if (slow_bf16)
    say(
        fmt::format("  note: dtype bf16 on this CPU is slow: {}, so ATen runs bf16 GEMMs on a scalar fallback "
                    "(measured 16x slower a step than fp32 on an AVX2-only AMD EPYC); --dtype fp32 (auto's "
                    "choice on a CPU) avoids it",
                    bf16_why));
  const at::ScalarType peak_dtype = autocast_ && !slow_bf16 ? at::kBFloat16 : at::kFloat;
  peak_flops_ = c.peak_tflops > 0 ? c.peak_tflops * 1e12 : measure_peak_flops(device_, peak_dtype, gcfg_.kernels);
  say(fmt::format("  MFU: {:.3g} GFLOP per token (6 N + 12 L T C) against {:.3g} TFLOP/s ({}); CUDA graphs: {}",
                  model_flops_ / 1e9, peak_flops_ / 1e12,
                  c.peak_tflops > 0
                      ? std::string("peak_tflops")
                      : fmt::format("measured: {} matmul on {}, {} kernels",
                                    peak_dtype == at::kBFloat16 ? "bf16" : "fp32", device_.str(), c.model_kernels),
                  c.cuda_graphs ? "on (forward + backward and the optimizer step replayed after step 1)" : "off"));
}

void Trainer::report_val(int64_t step, double val_loss) {
  if (metrics_) {
    metrics_->val(step, val_loss, st_.tokens, elapsed());
    tensorboard_->add_scalar("val/loss", val_loss, step);
    tensorboard_->flush();
  }
  say(fmt::format("step {}/{} | val_loss {:.4f} | best {:.4f} @ step {}", step, c_.num_iterations, val_loss,
                  st_.best_val_loss, st_.best_val_step));
}

void Trainer::report_step(int64_t step, const StepResult& r) {
  const Config& c = c_;
  const int64_t N = c.num_iterations;
  const int64_t tokens_per_step = c.batch_size * c.sequence_length;
  const double ms_avg = steps_timed_ ? steps_ms_total_ / double(steps_timed_) : r.seconds * 1000;
  const double lr = topt_.base_lrs[0] * r.factor;
  const double norm = r.grad_norm.norm;
  if (metrics_) {
    metrics_->train(step, r.loss, norm, lr, st_.tokens, double(tokens_per_step) / r.seconds, r.seconds * 1000,
                    elapsed(), r.fwd_bwd_seconds * 1000, r.skipped, r.moe_imbalance, r.route_seconds * 1000);
    for (size_t i = 0; i < r.moe_imbalance.size(); ++i)
      tensorboard_->add_scalar(fmt::format("moe/load_imbalance_{}", i), r.moe_imbalance[i], step);
    tensorboard_->add_scalar("train/loss", r.loss, step);
    tensorboard_->add_scalar("train/lr", lr, step);
    tensorboard_->add_scalar("train/grad_norm", norm, step);
    tensorboard_->add_scalar("train/tokens_per_s", double(tokens_per_step) / r.seconds, step);
  }
  // Numbered as train.py (its loop, its debug lines and its wandb "step"): from 0, so "step s" of a
  // train line is the update that the validation line "step s+1" comes after.
  if (!(step % c.log_every == 0 || step == N - 1)) return;
  const double tok_s = double(tokens_per_step) / r.seconds;
  const double step_mfu = mfu(model_flops_, tok_s / double(par_->mesh().world_size()), peak_flops_);
  if (step_mfu > 1.0 && !said_mfu_above_peak_) {
    said_mfu_above_peak_ = true;
    say(
        fmt::format("  note: this step ran at {:.3g} TFLOP/s a process, above the peak of {:.3g} TFLOP/s{}: "
                    "MFU is shown as 100%; {}",
                    step_mfu * peak_flops_ / 1e12, peak_flops_ / 1e12,
                    c.peak_tflops > 0 ? " (peak_tflops)" : " (measured at start-up)",
                    c.peak_tflops > 0 ? "set peak_tflops to the device's real peak"
                                      : "set peak_tflops to the device's peak for a true figure"));
  }
  std::string line = fmt::format(
      "step {}/{} | loss {:.4f} | grad_norm {:.4f} | lr {:.3e} | {:.0f} tok/s | MFU {:.1f}% | {:.0f} "
      "ms/step | ETA {}",
      step, N, r.loss, norm, lr, tok_s, 100.0 * std::min(1.0, step_mfu), r.seconds * 1000,
      format_duration(ms_avg / 1000 * double(N - step - 1)));
  if (!r.moe_imbalance.empty()) {
    double worst = 0;
    for (double v : r.moe_imbalance) worst = std::max(worst, v);
    line += fmt::format(" | experts max/mean {:.2f}", worst);
  }
  if (c.time_optimizer)
    line += fmt::format(" (fwd+bwd {:.0f} ms{}, optimizer {:.0f} ms)", r.fwd_bwd_seconds * 1000,
                        r.route_seconds >= 0 ? fmt::format(" of which MoE routing {:.0f} ms", r.route_seconds * 1000)
                                             : std::string(),
                        (r.seconds - r.fwd_bwd_seconds) * 1000);
  say(line);
}

void Trainer::report_end() {
  Parallel& par = *par_;
  {  // peak memory of every rank (one all_gather), printed by rank 0
    at::Tensor mine = at::tensor({peak_rss_mb()}, at::kDouble);
    at::Tensor all = par.mesh().world().all_gather(mine).reshape({-1});
    std::string per_rank;
    for (int r = 0; r < par.mesh().world_size(); ++r)
      per_rank += fmt::format("{}{:.0f}", r ? ", " : "", all[r].item<double>());
    const double steps = double(std::max<int64_t>(sum_.steps_done, 1));
    say(fmt::format("memory: peak RSS per rank (MB): {}; sent per step by rank 0: model {:.0f} KB, optimizer {:.0f} KB",
                    per_rank, double(model_bytes_) / steps / 1024, double(optimizer_bytes_) / steps / 1024));
  }
  if (ddp_)
    say(fmt::format("DDP: {} of {} gradient buckets launched during backward (the last step)",
                    ddp_->launched_during_backward(), ddp_->buckets()));
  if (par.mesh().shape().fs > 1)
    say(
        fmt::format("FSDP: {} of {} forward weight gathers prefetched, {} of {} backward re-gathers, {} gradient "
                    "reduce-scatters; reshard_after_forward {}, gradient sync {}, weights gathered in {}",
                    par.fsdp().prefetched(), par.fsdp().gathers(), par.fsdp().regathers_prefetched(), par.fsdp().regathers(), par.fsdp().reduce_scatters(),
                    par.fsdp().reshard_after_forward(), c_.fast_fsdp ? "once per step (fast_fsdp)" : "every micro-batch",
                    c_.fsdp_param_dtype));
  if (sum_.stopped_early) return;
  say(
      fmt::format("done: {} steps, best val_loss {:.4f} @ step {}, {} training tokens, {} total ({} this run); "
                  "metrics in {}{}",
                  c_.num_iterations, st_.best_val_loss, st_.best_val_step, st_.tokens, format_duration(elapsed()),
                  format_duration(seconds_since(t_start_)), (run_dir_ / "metrics.jsonl").string(),
                  sum_.steps_skipped ? fmt::format("; {} non-finite step(s) skipped in this run", sum_.steps_skipped)
                                     : std::string()));
}

}  // namespace dion::train
