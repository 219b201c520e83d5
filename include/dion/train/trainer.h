// dion/train/trainer.h — one training run of dion-train as a class whose parts a reader finds by
// name: the reference train.py's main() for one process or one rank of a (dp, fs, tp) mesh
// (dion/train/parallel.h). train_run(config) (train.h) is Trainer(config).run().
//
//   Trainer trainer(config);           // stores the configuration; nothing is checked or built yet
//   RunSummary s = trainer.run();      // setup(), then the loop, then the summary (throws as train.h)
//
// run() calls, in order (src/train/trainer.cpp unless named):
//   setup()           trainer_setup.cpp: device and dtype checks, the rendezvous (every rank the same
//                     configuration), the mesh, the loaders and their sizes, the checkpoint to
//                     resume (verified and agreed by every rank), the GPT, the optimizer, DDP,
//                     the resumed state, RUN_DIR/config.yaml, metrics.jsonl and tb/ opened;
//   report_start()    trainer_report.cpp: the start-up lines, the peak FLOP/s for MFU measured;
//   then per step s = first..num_iterations:
//     evaluate(s)     validation every val_loss_every steps and at the end (best val_loss kept);
//     step(s)         one training step: grad_accum_steps x (forward + backward), the DDP / FSDP
//                     gradient sync, the global gradient norm, clipping, the optimizer step at
//                     the scheduled lr or, when the loss or the gradient is not finite, the step
//                     skipped (max_nonfinite_steps in a row: NonFiniteError), the replica check;
//     report_step(s)  trainer_report.cpp: metrics.jsonl and TensorBoard records, the console line;
//     save(s)         a checkpoint every checkpoint_freq steps (and at stop_after, and at the end);
//   report_end()      trainer_report.cpp: peak memory of every rank, bytes sent, the final line.
//
// TrainHooks: test seams, empty in a production run. after_backward(rank, step, params) runs
// once the step's gradients are summed, before the gradient norm (a test writes a NaN into a
// gradient); after_update(rank, step, params) after the optimizer step (or the skip), before
// the replica check (a test changes a bit of a weight). `rank` is the global rank, `params`
// this rank's parameters (model->parameters(), their .grad()). The library never installs any;
// dion-train installs the ones its tests ask for (tools/dion-train/test_hooks.h).
//
// Only rank 0 prints (stdout); every rank runs every collective in the same order.
// Not here: the configuration (config.h), the checkpoint format (checkpoint.h), what to refuse
// on resume (resume_policy.h), the layouts (parallel.h), the micro-step and its CUDA graphs
// (graphed_step.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dion/train/checkpoint.h"
#include "dion/train/config.h"
#include "dion/train/gpt.h"
#include "dion/train/grad_norm.h"
#include "dion/train/optim_setup.h"
#include "dion/train/train.h"

namespace dion::train {

class EventWriter;    // dion/train/tensorboard.h
class GradSync;       // dion/train/ddp.h
class Loader;         // dion/train/loader.h
class MetricsWriter;  // dion/train/metrics.h
class MicroStep;      // dion/train/graphed_step.h
class Parallel;       // dion/train/parallel.h
class TrainQkClip;    // src/train/qk_clip.h

struct TrainHooks {
  // rank: global rank; step: the training step (0-based); params: this rank's parameters.
  using ParamsHook = std::function<void(int rank, int64_t step, const std::vector<at::Tensor>& params)>;
  ParamsHook after_backward;  // gradients summed, before the gradient norm
  ParamsHook after_update;    // after the optimizer step (or the skip), before the replica check
};

class Trainer {
 public:
  explicit Trainer(const Config& config, TrainHooks hooks = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // The whole run (once). Throws ConfigError, DataLoadError, CheckpointError, NonFiniteError,
  // ReplicaDriftError (train.h, replicas.h).
  RunSummary run();

 private:
  using Clock = std::chrono::steady_clock;
  // What one training step measured, for report_step.
  struct StepResult {
    double loss = 0;  // mean over the data-parallel ranks and micro-batches
    GradNorm grad_norm;
    double factor = 1;     // the schedule's lr factor
    bool skipped = false;  // not finite: nothing written to the weights or the optimizer state
    double seconds = 0, fwd_bwd_seconds = 0;
    std::vector<double> moe_imbalance;  // MoE: max / mean of the step's global tokens per expert, per layer
    double route_seconds = -1;          // MoE: dispatch and combine (GPT::take_route_seconds), this rank
  };

  // ---- setup (trainer_setup.cpp), in the order run() calls them
  void setup();
  void check_device();       // device auto resolved; cuda_graphs / cuda refused without CUDA
  void connect();            // rendezvous, the configuration compared, the mesh, device, dtype
  void open_data();          // the loaders, the vocabulary and sizes against the data
  void choose_checkpoint();  // the checkpoint to resume, verified and compared with this run
  // Every rank resumes the same checkpoint (`bad`: this rank's verification failed).
  void agree_on_checkpoint(const std::optional<CheckpointError>& bad);
  void build_model();   // GPT, optimizer, DDP, the resumed state
  void open_run_dir();  // config.yaml, metrics.jsonl, tb/ (rank 0)
  // ---- the loop (trainer.cpp)
  void evaluate(int64_t step);
  StepResult step(int64_t step);
  at::Tensor forward_backward();  // the micro-batches; returns their loss sum (0-d fp32)
  void update_or_skip(int64_t step, const StepResult& r);
  // MoE: the step's tokens per expert summed over the data ranks -> r.moe_imbalance, and the
  // auxiliary-loss-free bias step (moe.h) unless the step is skipped.
  void balance_experts(StepResult& r);
  bool save_or_stop(int64_t step);  // the checkpoint_freq and stop_after saves; true: stop
  void save(int64_t step);
  // ---- report (trainer_report.cpp): console lines (rank 0), metrics.jsonl, TensorBoard
  void report_start();
  void report_mfu_start();
  void report_val(int64_t step, double val_loss);
  void report_step(int64_t step, const StepResult& r);
  void report_end();
  void say(const std::string& line) const;
  double elapsed() const;  // the run's wall time, all invocations
  static double seconds_since(Clock::time_point t0);

  // Members in the order they are built (and destroyed in reverse, as the function was).
  Config c_;  // device auto resolved (what config.yaml and the checkpoints record)
  TrainHooks hooks_;
  std::string device_why_;  // why device auto chose what it did ("" when not auto)
  bool main_rank_ = true;   // only rank 0 prints
  std::unique_ptr<Parallel> par_;
  at::Device device_{at::kCPU};
  std::string dtype_;
  bool autocast_ = false;
  std::unique_ptr<Loader> train_loader_, val_loader_;
  std::string data_fp_;
  std::optional<std::filesystem::path> ckpt_;
  std::optional<CheckpointMeta> meta_;
  std::vector<std::string> resume_lines_;
  GPTConfig gcfg_;
  GPT model_{nullptr};
  TrainOptimizer topt_;
  std::unique_ptr<GradSync> ddp_;
  std::unique_ptr<GradSync> expert_sync_;  // MoE under ep: the expert stacks' gradients summed over edp
  std::unique_ptr<TrainQkClip> qk_clip_;   // qk_clip_tau > 0 (src/train/qk_clip.h)
  TrainState st_;
  std::filesystem::path run_dir_;
  std::string config_yaml_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<EventWriter> tensorboard_;
  int64_t accum_ = 1;
  double model_flops_ = 0, peak_flops_ = 0;
  std::unique_ptr<MicroStep> micro_;
  std::vector<at::Tensor> params_;
  bool grads_summed_over_dp_ = true;  // false: legacy Dion's replicate_mesh_grad_sync sums them
  int64_t nonfinite_in_a_row_ = 0;
  bool said_mfu_above_peak_ = false;
  // The loop's accounting.
  RunSummary sum_;
  Clock::time_point t_start_;
  double elapsed0_ = 0;  // elapsed_s of the resumed checkpoint
  double steps_ms_total_ = 0;
  int64_t steps_timed_ = 0;
  int64_t model_bytes_ = 0, optimizer_bytes_ = 0;  // sent by this rank, all steps of this invocation
  int64_t last_saved_ = -1;                        // the resumed checkpoint is not written again
};

}  // namespace dion::train
