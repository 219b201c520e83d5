// src/train/train.cpp — the training loop of dion-train (train.h): the reference train.py's
// main(), for one process or one rank of a (dp, fs, tp) mesh (dion/train/parallel.h).
#include "dion/train/train.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <fmt/format.h>

#include <sys/resource.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>

#include "dion/cuda/fused.h"
#include "dion/math/ortho.h"
#include "dion/train/autocast.h"
#include "dion/train/checkpoint.h"
#include "dion/train/gpt.h"
#include "dion/train/grad_norm.h"
#include "dion/train/graphed_step.h"
#include "dion/train/loader.h"
#include "dion/train/metrics.h"
#include "dion/train/mfu.h"
#include "dion/train/tensorboard.h"
#include "dion/train/optim_setup.h"
#include "dion/train/parallel.h"
#include "dion/train/replicas.h"
#include "dion/train/resume_policy.h"
#include "dion/train/schedule.h"

namespace dion::train {

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string format_duration(double s) {
  const int64_t t = int64_t(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, (t % 3600) / 60);
  if (t >= 60) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}s", t);
}

bool g_main_rank = true;  // only rank 0 prints

void say(const std::string& line) {
  if (!g_main_rank) return;
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

// Mean over the data-parallel ranks of a per-rank sum `local` of `count` values (collective).
double mean_over_data(Parallel& par, const at::Tensor& local, int64_t count) {
  at::Tensor t = local.detach().to(at::kCPU, at::kDouble).reshape({1}).contiguous();
  par.data_group()->all_reduce_(t);
  return t.item<double>() / double(count * par.data_size());
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

double peak_rss_mb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

std::string resolve_device(const Config& c) {
  if (c.device != "auto") return c.device;
  return at::globalContext().hasCUDA() ? "cuda" : "cpu";
}

std::string resolve_dtype(const Config& c) {
  if (c.dtype != "auto") return c.dtype;
  return resolve_device(c) == "cuda" ? cuda_auto_dtype(cuda::compute_capability_major()) : kCpuAutoDtype;
}

RunSummary train_run(const Config& config) {
  // ---------------------------------------------------------------- checks before any write
  Config c = config;  // device auto resolved (what config.yaml and the checkpoints record)
  c.device = resolve_device(config);
  const std::string device_why = config.device != "auto" ? ""
                                 : c.device == "cuda"
                                     ? "device auto: a CUDA device is present; --device cpu trains on the CPU"
                                     : "device auto: no CUDA device here";
  const std::string device_note = device_why.empty() ? "" : " (" + device_why + ")";
  if (c.cuda_graphs && c.device != "cuda")
    throw ConfigError(
        fmt::format("key 'cuda_graphs': true needs device cuda (device is '{}'{}); valid: false, or "
                    "device cuda",
                    c.device, device_why.empty() ? "" : "; " + device_why));
  if (c.device == "cuda" && !at::globalContext().hasCUDA())
    throw ConfigError("key 'device': value 'cuda' but this machine (or this LibTorch) has no CUDA device; valid: cpu");
  comm::GroupOptions gopt;
  gopt.timeout = std::chrono::milliseconds(int64_t(c.comm_timeout_s * 1000));
  gopt.rendezvous_timeout = std::chrono::milliseconds(int64_t(c.rendezvous_timeout_s * 1000));
  comm::Group world = comm::Group::init_from_env(gopt);
  g_main_rank = world.rank() == 0;
  // Before the mesh: ranks that differ on dp/fs/tp would otherwise wait in the mesh's
  // sub-group rendezvous until comm_timeout_s instead of naming the key.
  check_config_agrees(world, c);
  Parallel par(std::move(world), MeshShape{c.dp_size, c.fs_size, c.tp_size});
  const at::Device device =
      c.device == "cuda" ? at::Device(at::kCUDA, int8_t(par.world().local_rank())) : at::Device(at::kCPU);
  const std::string dtype = resolve_dtype(c);
  const bool autocast = dtype == "bf16";

  std::unique_ptr<Loader> train_loader, val_loader;
  const int64_t drank = par.data_rank(), dsize = par.data_size();
  if (c.debug) {
    train_loader = std::make_unique<SyntheticLoader>(c.device_batch_size, c.sequence_length, uint64_t(c.seed), drank,
                                                     dsize, c.vocab_size);
    val_loader = std::make_unique<SyntheticLoader>(c.device_batch_size, c.sequence_length, uint64_t(c.seed) + 1, drank,
                                                   dsize, c.vocab_size);
  } else {
    train_loader =
        std::make_unique<ShardLoader>(c.data_dir, "train", c.device_batch_size, c.sequence_length, drank, dsize);
    val_loader = std::make_unique<ShardLoader>(c.data_dir, "val", c.device_batch_size, c.sequence_length, drank, dsize);
  }
  loader_check_vocab(*train_loader, c.vocab_size, c.data_dir);  // key vocab_size vs the shards' tokenizer
  // Sizes against the data: a validation that reads more than the val split re-reads it, a step
  // larger than the train split reads it more than once (--val_tokens 1.28e12 ran for days).
  if (val_loader->tokens() >= 0 && c.val_tokens > val_loader->tokens())
    throw ConfigError(
        fmt::format("key 'val_tokens': value {} is more than the {} tokens of the val shards in '{}'; "
                    "valid: at most {} (a validation reads each val token once)",
                    c.val_tokens, val_loader->tokens(), c.data_dir, val_loader->tokens()));
  if (train_loader->tokens() >= 0 && c.batch_size * c.sequence_length > train_loader->tokens())
    throw ConfigError(fmt::format(
        "keys 'batch_size' {} x 'sequence_length' {} = {} tokens per step, more than the {} "
        "tokens of the train shards in '{}'; valid: a step of at most the whole train split",
        c.batch_size, c.sequence_length, c.batch_size * c.sequence_length, train_loader->tokens(), c.data_dir));
  // A write past `ulimit -f` must fail with EFBIG (a clear CheckpointError) instead of the
  // default SIGXFSZ killing the process.
  std::signal(SIGXFSZ, SIG_IGN);
  const std::string data_fp = data_fingerprint(c);
  // ---------------------------------------------------------------- the checkpoint to resume
  // Verified whole (checkpoint.h) and compared with this run's keys (resume_policy.h) before
  // anything is built or written.
  std::optional<fs::path> ckpt;
  std::optional<CheckpointMeta> meta;
  std::vector<std::string> resume_lines;
  if (!c.checkpoint_dir.empty()) checkpoint_dir_check_writable(c.checkpoint_dir);  // not at the first save
  if (!c.checkpoint_dir.empty() && c.resume) {
    // Every rank verifies the whole checkpoint (every rank's files); a rank that finds it bad
    // tells the others through the all_gather below instead of leaving them waiting in it.
    CheckpointChoice choice;
    std::optional<CheckpointError> bad;
    try {
      choice = checkpoint_choose(c.checkpoint_dir, c.resume_fallback);
    } catch (const CheckpointError& e) {
      if (par.world_size() == 1) throw;
      bad = e;
    }
    for (const auto& [folder, problem] : choice.skipped)
      resume_lines.push_back(fmt::format("  resume_fallback: skipped {}: {}", folder.string(), problem));
    if (!choice.skipped.empty() && !choice.chosen)
      resume_lines.push_back("  resume_fallback: no good checkpoint left: starting over at step 0");
    ckpt = choice.chosen;
    meta = choice.meta;
    if (par.world_size() > 1) {     // every rank must resume the same checkpoint (a shared file system)
      constexpr int64_t kBad = -2;  // this rank's verification failed
      at::Tensor all = par.world()
                           .all_gather(at::tensor({bad    ? kBad
                                                   : ckpt ? meta->state.step
                                                          : int64_t(-1)},
                                                  at::kLong))
                           .reshape({-1});
      if (bad) throw *bad;
      for (int r = 0; r < par.world_size(); ++r)
        if (all[r].item<int64_t>() == kBad)
          throw CheckpointError(
              fmt::format("rank {} found checkpoint_dir '{}' not resumable (its message is in that "
                          "rank's log); every rank stops",
                          r, c.checkpoint_dir));
      for (int r = 1; r < par.world_size(); ++r)
        if (all[r].item<int64_t>() != all[0].item<int64_t>())
          throw CheckpointError(
              fmt::format("rank 0 resumes checkpoint_dir '{}' at step {} but rank {} at step {}: the "
                          "ranks must see the same checkpoint_dir (a shared file system)",
                          c.checkpoint_dir, all[0].item<int64_t>(), r, all[r].item<int64_t>()));
    }
    if (ckpt) {
      if (meta->state.step >= c.num_iterations)
        throw CheckpointError(fmt::format(
            "checkpoint '{}' is at step {}, past num_iterations {} (steps 0..{}): nothing "
            "to do; raise --num_iterations above {} to continue training it",
            ckpt->string(), meta->state.step, c.num_iterations, c.num_iterations - 1, meta->state.step + 1));
      for (std::string& line : resume_check(c, *meta, *ckpt, data_fp)) resume_lines.push_back(std::move(line));
    }
  }

  // ---------------------------------------------------------------- model and optimizer
  GPTConfig gcfg{c.sequence_length, c.vocab_size, c.n_layer, c.n_head, c.model_dim};
  gcfg.kernels = c.model_kernels == "exact" ? Kernels::exact : Kernels::fast;
  gpt_check_fits_memory(gcfg, device, par.world_size());  // a clear error, not an allocator's
  GPTConfig placeholder = gcfg;
  placeholder.placeholder_weights = true;  // never the whole model: init_model draws one weight at a time
  GPT model(placeholder);
  at::manual_seed(uint64_t(c.seed));  // after construction, as the reference (built on meta) draws
  par.init_model(model);              // the weights of one process; each rank keeps its parts
  par.set_reshard_after_forward(c.reshard_after_forward && !c.fast_fsdp);
  par.set_gather_dtype(c.fsdp_param_dtype == "bf16" ? at::kBFloat16 : at::kFloat);  // FSDP gathers
  model->to(device);
  TrainOptimizer topt = build_optimizer(c, model);
  dion::Optimizer& opt = *topt.optimizer;
  if (auto dist = par.distribution(model, c.replicate_mesh_grad_sync)) opt.set_distribution(dist);
  opt.init_state();
  // DDP / HSDP: the trainer sums gradients over dp, unless legacy Dion syncs them itself.
  std::unique_ptr<GradSync> ddp;
  if (par.shape().dp > 1 && !c.replicate_mesh_grad_sync)
    ddp = std::make_unique<GradSync>(par.dp_group(), model->parameters(), int64_t(c.ddp_bucket_mb * 1024 * 1024));

  TrainState st;
  if (ckpt) {
    checkpoint_load_model(*ckpt, model, &par);  // any layout -> this rank's parts
    checkpoint_load_training(*ckpt, opt);
    st = meta->state;
    train_loader->restore(st.loader);
  }

  // ---------------------------------------------------------------- run folder
  const fs::path run_dir = c.resolved_run_dir();
  const std::string config_yaml = config_to_yaml(c);
  std::optional<MetricsWriter> metrics;
  std::optional<EventWriter> tensorboard;
  if (par.is_main()) {  // one writer of the run folder
    fs::create_directories(run_dir);
    std::ofstream f(run_dir / "config.yaml");
    f << config_yaml;
    metrics.emplace(run_dir / "metrics.jsonl", ckpt ? st.step : -1);
    tensorboard.emplace((run_dir / "tb").string());  // TensorBoard: `tensorboard --logdir RUN_DIR/tb`
  }

  const int64_t N = c.num_iterations;
  const int64_t accum = c.grad_accum_steps();
  const int64_t tokens_per_step = c.batch_size * c.sequence_length;
  say(fmt::format("dion-train: GPT {} layers x {} dim x {} heads, {} parameters; {} on {} ({}){}", c.n_layer,
                  c.model_dim, c.n_head, gpt_param_count(gcfg), c.optimizer, c.device, dtype, device_note));
  say(
      fmt::format("  batch {} x {} tokens (device batch {}, {} accumulation steps), {} steps, lr {} "
                  "(warmup {}, warmdown {}), scalar_opt {}",
                  c.batch_size, c.sequence_length, c.device_batch_size, accum, N, c.lr, c.warmup_ratio,
                  c.warmdown_ratio, !find_algorithm(c.optimizer, true).matrix() ? c.optimizer : c.scalar_opt));
  say(fmt::format("  train data: {}", train_loader->describe()));
  say(fmt::format("  val data:   {}; {} batches per validation", val_loader->describe(), c.val_steps()));
  say(fmt::format("  run dir: {}; checkpoints: {}", run_dir.string(),
                  c.checkpoint_dir.empty() ? std::string("none")
                                           : fmt::format("{} every {} steps", c.checkpoint_dir, c.checkpoint_freq)));
  if (par.world_size() > 1)
    say(fmt::format(
        "  layout: {} processes = dp {} x fs {} x tp {}{}; {} data-parallel ranks; DDP buckets: {}", par.world_size(),
        c.dp_size, c.fs_size, c.tp_size,
        c.mesh_from_world ? " (DDP over every process: no dp_size, fs_size or tp_size given, as train.py)" : "", dsize,
        ddp ? fmt::format("{} of <= {} MB", ddp->buckets(), c.ddp_bucket_mb)
            : std::string(c.replicate_mesh_grad_sync ? "none (the optimizer syncs)" : "none")));
  if (ckpt)
    say(fmt::format("  resumed from {} (step {} done{})", ckpt->string(), st.step,
                    st.step == N - 1 ? ": every training step is done" : ""));
  for (const std::string& line : resume_lines) say(line);
  // MFU (dion/train/mfu.h): the model's FLOPs per token against the peak_tflops key or a matmul
  // in the compute dtype timed once here.
  const double model_flops = flops_per_token(gcfg);
  // bf16 autocast on a CPU whose bf16 GEMMs are not native runs ATen's scalar fallback: said
  // once here, and the peak is then fp32's (the fastest GEMM this CPU has; timing the slow
  // kernel would put MFU above 100% and take a minute).
  std::string bf16_why;
  const bool slow_bf16 = autocast && device.is_cpu() && !math::cpu_has_native_gemm(at::kBFloat16, &bf16_why);
  if (slow_bf16)
    say(fmt::format("  note: dtype bf16 on this CPU is slow: {}, so ATen runs bf16 GEMMs on a scalar fallback "
                    "(measured 16x slower a step than fp32 on an AVX2-only AMD EPYC); --dtype fp32 (auto's "
                    "choice on a CPU) avoids it",
                    bf16_why));
  const at::ScalarType peak_dtype = autocast && !slow_bf16 ? at::kBFloat16 : at::kFloat;
  const double peak_flops =
      c.peak_tflops > 0 ? c.peak_tflops * 1e12 : measure_peak_flops(device, peak_dtype, gcfg.kernels);
  say(fmt::format("  MFU: {:.3g} GFLOP per token (6 N + 12 L T C) against {:.3g} TFLOP/s ({}); CUDA graphs: {}",
                  model_flops / 1e9, peak_flops / 1e12,
                  c.peak_tflops > 0 ? std::string("peak_tflops")
                                    : fmt::format("measured: {} matmul on {}, {} kernels",
                                                  peak_dtype == at::kBFloat16 ? "bf16" : "fp32", device.str(),
                                                  c.model_kernels),
                  c.cuda_graphs ? "on (forward + backward and the optimizer step replayed after step 1)" : "off"));
  MicroStep micro(model, opt, device, autocast, 1.0 / double(accum * dsize), c.cuda_graphs);
  const std::vector<at::Tensor> params = model->parameters();
  // Legacy Dion with replicate_mesh_grad_sync sums the dp replicas' gradients itself (never here).
  const bool grads_summed_over_dp = !(c.replicate_mesh_grad_sync && par.shape().dp > 1);
  int64_t nonfinite_in_a_row = 0;
  bool said_mfu_above_peak = false;

  // ---------------------------------------------------------------- loop
  RunSummary sum;
  const Clock::time_point t_start = Clock::now();
  const double elapsed0 = st.elapsed_s;
  auto elapsed = [&] { return elapsed0 + seconds_since(t_start); };
  double steps_ms_total = 0;
  int64_t model_bytes = 0, optimizer_bytes = 0;  // sent by this rank, all steps of this invocation
  int64_t steps_timed = 0;
  int64_t last_saved = ckpt ? st.step : -1;  // the resumed checkpoint is not written again
  auto save = [&](int64_t step) {
    st.elapsed_s = elapsed();
    st.loader = train_loader->position();
    opt.synchronize_for_checkpoint();  // legacy Dion's decoupled momenta (a no-op otherwise)
    if (c.replica_check_every > 0) replicas_check(model, par, step);  // a checkpoint keeps dp rank 0's copy
    const fs::path p = checkpoint_save(c.checkpoint_dir, model, opt, st, config_yaml, &par, data_fp);
    last_saved = step;
    say(fmt::format("checkpoint {} written", p.string()));
  };

  model->train();
  for (int64_t step = st.step + 1; step <= N; ++step) {
    const bool last = step == N;
    if (last || (c.val_loss_every > 0 && step % c.val_loss_every == 0)) {
      const double vl = validate(model, *val_loader, c.val_steps(), device, autocast, par);
      if (st.best_val_step < 0 || vl < st.best_val_loss) {
        st.best_val_loss = vl;
        st.best_val_step = step;
      }
      if (metrics) {
        metrics->val(step, vl, st.tokens, elapsed());
        tensorboard->add_scalar("val/loss", vl, step);
        tensorboard->flush();
      }
      say(fmt::format("step {}/{} | val_loss {:.4f} | best {:.4f} @ step {}", step, N, vl, st.best_val_loss,
                      st.best_val_step));
    }
    if (last) break;

    const Clock::time_point t0 = Clock::now();
    const int64_t bytes0 = par.bytes_sent();
    at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
    for (int64_t i = 0; i < accum; ++i) {
      // fast_fsdp: FSDP gathers the weights once per step and reduce-scatters their summed
      // gradients once, in the last micro-batch's backward (the reference's
      // set_requires_gradient_sync(i == grad_accum_steps)); otherwise every micro-batch syncs.
      par.set_requires_gradient_sync(!c.fast_fsdp || i == accum - 1);
      Batch b = train_loader->next();
      if (ddp && i == accum - 1) ddp->arm();  // the last micro-batch's gradients are summed over dp
      // The loss is scaled by 1 / the GLOBAL micro-batch count: every gradient reduction is then a plain sum.
      loss_sum += micro.forward_backward(b.x, b.y);
    }
    if (ddp) ddp->finish();
    const double t_fwd_bwd = seconds_since(t0);
    const int64_t bytes1 = par.bytes_sent();
    // Before the optimizer step (dion/train/grad_norm.h): the loss and the global gradient norm,
    // identical on every rank (collectives), decide together whether the step is taken.
    nonfinite_test_inject(params, par, step);
    const double train_loss = mean_over_data(par, loss_sum, accum);
    const GradNorm gnorm = grad_norm(params, par, grads_summed_over_dp);
    const bool skipped = !gnorm.finite || !std::isfinite(train_loss);
    const double factor = lr_factor(step, N, c.warmup_ratio, c.warmdown_ratio);
    if (!skipped) {
      nonfinite_in_a_row = 0;
      if (c.grad_clip > 0) clip_gradients(params, gnorm.norm, c.grad_clip);
      for (size_t g = 0; g < topt.base_lrs.size(); ++g) opt.options(g).lr(topt.base_lrs[g] * factor);
      micro.optimizer_step();  // and zero the gradients
    } else {
      // Nothing is written to the weights or the optimizer state (its step counters included);
      // the data position has moved on (the batches were read).
      micro.discard_gradients();
      ++nonfinite_in_a_row;
      ++sum.steps_skipped;
      say(
          fmt::format("step {}/{}: {} is not finite (loss {}, grad_norm {}): step skipped, the weights and the "
                      "optimizer state unchanged ({} in a row; max_nonfinite_steps {})",
                      step, N, std::isfinite(train_loss) ? "the gradient" : "the loss", train_loss, gnorm.norm,
                      nonfinite_in_a_row, c.max_nonfinite_steps));
      if (nonfinite_in_a_row > c.max_nonfinite_steps)
        throw NonFiniteError(fmt::format(
            "step {}/{}: {} non-finite step{} in a row (loss {}, grad_norm {}), more than max_nonfinite_steps {}: "
            "the run diverged; stopping. Resume from the last checkpoint with a lower lr, or set grad_clip "
            "(docs/train.md \"Gradient norm, clipping, non-finite steps\")",
            step, N, nonfinite_in_a_row, nonfinite_in_a_row == 1 ? "" : "s", train_loss, gnorm.norm,
            c.max_nonfinite_steps));
    }
    replicas_test_perturb(model, par, step);
    if (c.replica_check_every > 0 && (step + 1) % c.replica_check_every == 0) replicas_check(model, par, step);
    const int64_t bytes2 = par.bytes_sent();
    model_bytes += bytes1 - bytes0;
    optimizer_bytes += bytes2 - bytes1;
    const double step_s = seconds_since(t0);

    st.step = step;
    st.tokens += tokens_per_step;
    ++sum.steps_done;
    if (sum.steps_done > 1 || N - step <= 1) {  // the first step of an invocation warms up
      steps_ms_total += step_s * 1000;
      ++steps_timed;
    }
    const double ms_avg = steps_timed ? steps_ms_total / double(steps_timed) : step_s * 1000;
    const double lr = topt.base_lrs[0] * factor;
    if (metrics) {
      metrics->train(step, train_loss, gnorm.norm, lr, st.tokens, double(tokens_per_step) / step_s, step_s * 1000,
                     elapsed(), t_fwd_bwd * 1000, skipped);
      tensorboard->add_scalar("train/loss", train_loss, step);
      tensorboard->add_scalar("train/lr", lr, step);
      tensorboard->add_scalar("train/grad_norm", gnorm.norm, step);
      tensorboard->add_scalar("train/tokens_per_s", double(tokens_per_step) / step_s, step);
    }
    // Numbered as train.py (its loop, its debug lines and its wandb "step"): from 0, so "step s" of a
    // train line is the update that the validation line "step s+1" comes after.
    if (step % c.log_every == 0 || step == N - 1) {
      const double tok_s = double(tokens_per_step) / step_s;
      const double step_mfu = mfu(model_flops, tok_s / double(par.world_size()), peak_flops);
      if (step_mfu > 1.0 && !said_mfu_above_peak) {
        said_mfu_above_peak = true;
        say(fmt::format("  note: this step ran at {:.3g} TFLOP/s a process, above the peak of {:.3g} TFLOP/s{}: "
                        "MFU is shown as 100%; {}",
                        step_mfu * peak_flops / 1e12, peak_flops / 1e12,
                        c.peak_tflops > 0 ? " (peak_tflops)" : " (measured at start-up)",
                        c.peak_tflops > 0 ? "set peak_tflops to the device's real peak"
                                          : "set peak_tflops to the device's peak for a true figure"));
      }
      std::string line = fmt::format(
          "step {}/{} | loss {:.4f} | grad_norm {:.4f} | lr {:.3e} | {:.0f} tok/s | MFU {:.1f}% | {:.0f} "
          "ms/step | ETA {}",
          step, N, train_loss, gnorm.norm, lr, tok_s,
          100.0 * std::min(1.0, step_mfu), step_s * 1000,
          format_duration(ms_avg / 1000 * double(N - step - 1)));
      if (c.time_optimizer)
        line += fmt::format(" (fwd+bwd {:.0f} ms, optimizer {:.0f} ms)", t_fwd_bwd * 1000, (step_s - t_fwd_bwd) * 1000);
      say(line);
    }
    if (c.checkpoint_freq > 0 && step > 0 && step % c.checkpoint_freq == 0) save(step);
    if (c.stop_after > 0 && sum.steps_done >= c.stop_after && step < N - 1) {
      if (last_saved != step) save(step);
      sum.stopped_early = true;
      say(fmt::format("stopped after {} steps (stop_after); run the same command again to continue", sum.steps_done));
      break;
    }
  }
  if (!sum.stopped_early && !c.checkpoint_dir.empty() && last_saved != st.step && st.step >= 0) save(st.step);

  {  // peak memory of every rank (one all_gather), printed by rank 0
    at::Tensor mine = at::tensor({peak_rss_mb()}, at::kDouble);
    at::Tensor all = par.world().all_gather(mine).reshape({-1});
    std::string per_rank;
    for (int r = 0; r < par.world_size(); ++r)
      per_rank += fmt::format("{}{:.0f}", r ? ", " : "", all[r].item<double>());
    const double steps = double(std::max<int64_t>(sum.steps_done, 1));
    say(fmt::format("memory: peak RSS per rank (MB): {}; sent per step by rank 0: model {:.0f} KB, optimizer {:.0f} KB",
                    per_rank, double(model_bytes) / steps / 1024, double(optimizer_bytes) / steps / 1024));
    if (ddp)
      say(fmt::format("DDP: {} of {} gradient buckets launched during backward (the last step)",
                      ddp->launched_during_backward(), ddp->buckets()));
    if (par.shape().fs > 1)
      say(
          fmt::format("FSDP: {} of {} forward weight gathers prefetched, {} of {} backward re-gathers, {} gradient "
                      "reduce-scatters; reshard_after_forward {}, gradient sync {}, weights gathered in {}",
                      par.prefetched(), par.gathers(), par.regathers_prefetched(), par.regathers(),
                      par.reduce_scatters(), par.reshard_after_forward(),
                      c.fast_fsdp ? "once per step (fast_fsdp)" : "every micro-batch", c.fsdp_param_dtype));
  }
  sum.last_step = st.step;
  sum.best_val_loss = st.best_val_loss;
  sum.best_val_step = st.best_val_step;
  if (!sum.stopped_early)
    say(
        fmt::format("done: {} steps, best val_loss {:.4f} @ step {}, {} training tokens, {} total ({} this run); "
                    "metrics in {}{}",
                    N, st.best_val_loss, st.best_val_step, st.tokens, format_duration(elapsed()),
                    format_duration(seconds_since(t_start)), (run_dir / "metrics.jsonl").string(),
                    sum.steps_skipped ? fmt::format("; {} non-finite step(s) skipped in this run", sum.steps_skipped)
                                      : std::string()));
  return sum;
}

}  // namespace dion::train
