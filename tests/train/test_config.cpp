// tests/train/test_config.cpp — dion-train's configuration, parameter groups and lr schedule,
// in process.
//
// - The reference's four configs (configs/*_160m.yaml, copied unchanged) parse, validate, and
//   build their model; the 160M model's parameter count equals the reference's
//   (162,201,600: models/gpt_model.py GPT(GPTConfig(n_embd=768, n_layer=12, n_head=6,
//   vocab_size=50304)) instantiated on the meta device, sum of numel; see test_gpt.cpp's
//   script for how the number was produced).
// - The command line overrides the file; null means "default"; the YAML dump reads back to the
//   same configuration; --help names every key.
// - Param groups per optimizer: what train.py's init_optimizer builds.
// - lr_factor = train.py get_lr, including Python's round-half-to-even.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "dion/cuda/fused.h"
#include "dion/train/config.h"
#include "dion/train/gpt.h"
#include "dion/optim/algorithm.h"
#include "dion/train/optim_setup.h"
#include "dion/train/optimizer_entry.h"
#include "dion/train/schedule.h"
#include "dion/train/train.h"
#include "train_test_util.h"

namespace dion::train {
namespace {

namespace fs = std::filesystem;
using test::source_dir;

Config parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dion-train");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return config_parse(int(argv.size()), argv.data());
}

// The ConfigError's message of parsing `args`, or "(no error)".
std::string error_of(std::vector<std::string> args) {
  try {
    parse(std::move(args));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

// The reference's number: sum(p.numel() for p in GPT(GPTConfig(sequence_len=1024,
// vocab_size=50304, n_layer=12, n_head=6, n_embd=768)).parameters()) on the meta device.
constexpr int64_t kReference160MParams = 162201600;

TEST(TrainConfig, ReferenceConfigsParseAndBuildTheirModel) {
  for (const char* name : {"dion2_160m", "dion_160m", "muon_160m", "normuon_160m"}) {
    SCOPED_TRACE(name);
    const Config c = parse({"--config", (source_dir() / "configs" / (std::string(name) + ".yaml")).string()});
    EXPECT_EQ(c.model_dim, 768);
    EXPECT_EQ(c.n_layer, 12);
    EXPECT_EQ(c.n_head, 6);
    EXPECT_EQ(c.batch_size, 1024);
    EXPECT_EQ(c.device_batch_size, 32);
    EXPECT_EQ(c.num_iterations, 3000);
    EXPECT_EQ(c.dp_size, 1);  // null -> default
    EXPECT_EQ(c.resolved_run_dir(), fs::path("runs") / name);
    const GPTConfig g{c.sequence_length, kVocabSize, c.n_layer, c.n_head, c.model_dim};
    EXPECT_EQ(gpt_param_count(g), kReference160MParams);
  }
  const Config dion = parse({"--config", (source_dir() / "configs/dion_160m.yaml").string()});
  EXPECT_EQ(dion.optimizer, "dion");
  EXPECT_TRUE(dion.mixed_precision);
  EXPECT_TRUE(dion.replicate_mesh_grad_sync);
  EXPECT_DOUBLE_EQ(dion.ortho_fraction, 0.5);
}

TEST(TrainConfig, The160MModelHasTheReferencesParameterCount) {
  // Built for real once (650 MB of fp32): the module's parameters, not the formula.
  const Config c = parse({"--config", (source_dir() / "configs/dion2_160m.yaml").string()});
  GPT model(GPTConfig{c.sequence_length, kVocabSize, c.n_layer, c.n_head, c.model_dim});
  int64_t n = 0;
  for (const at::Tensor& p : model->parameters()) n += p.numel();
  EXPECT_EQ(n, kReference160MParams);
  EXPECT_EQ(model->named_parameters().size(), 2u + 12u * 6u);
  EXPECT_TRUE(model->named_parameters().contains("transformer.h.11.mlp.c_proj.weight"));
  EXPECT_TRUE(model->named_parameters().contains("transformer.wte.weight"));
  EXPECT_TRUE(model->named_parameters().contains("lm_head.weight"));
}

TEST(TrainConfig, CommandLineOverridesTheFile) {
  const fs::path cfg = source_dir() / "configs/dion2_160m.yaml";
  const Config c = parse({"--config", cfg.string(), "--lr", "1e-3", "--n_layer=2", "--debug", "--optimizer", "muon",
                          "--run_dir", "runs/x"});
  EXPECT_DOUBLE_EQ(c.lr, 1e-3);
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_TRUE(c.debug);
  EXPECT_EQ(c.optimizer, "muon");
  // debug mode: the reference's overrides
  EXPECT_EQ(c.batch_size, 2);
  EXPECT_EQ(c.device_batch_size, 1);
  EXPECT_EQ(c.num_iterations, 20);
  EXPECT_EQ(c.val_steps(), 2);
  EXPECT_EQ(c.resolved_run_dir(), fs::path("runs/x"));
  const Config d = parse({"--debug", "false", "--resume", "false"});
  EXPECT_FALSE(d.debug);
  EXPECT_FALSE(d.resume);
  EXPECT_EQ(d.resolved_run_dir(), fs::path("runs/default"));
}

// Every optimizer runs under tensor parallelism. NorMuon and NorDion2 (dion3) were refused with
// tp_size > 1 until their per-neuron sums crossed the ranks of column-sharded weights (the
// column-parallel c_q, c_k, c_v, c_fc have TP on dim 0 and the FSDP dim on 1).
TEST(TrainConfig, TpSizeWorksWithEveryOptimizer) {
  for (const char* opt : {"adamw", "lion", "muon", "normuon", "dion2", "nordion2", "dion3", "dion"})
    EXPECT_EQ(error_of({"--tp_size", "2", "--fs_size", "2", "--optimizer", opt}), "(no error)") << opt;
}

// One value per key: a second value, a stray word, or a key given twice is an error naming it
// (they were taken as "the last value wins" or written into a folder named after the stray word).
TEST(TrainConfig, OneValuePerKey) {
  EXPECT_NE(error_of({"--lr", "0.01", "0.7"}).find("unexpected argument '0.7'"), std::string::npos)
      << error_of({"--lr", "0.01", "0.7"});
  EXPECT_NE(error_of({"--run_dir", "runs/x", "stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(error_of({"--debug", "true", "stray"}).find("unexpected argument 'stray'"), std::string::npos);
  const std::string twice = error_of({"--lr", "0.01", "--lr", "0.7"});
  EXPECT_NE(twice.find("key 'lr' given 2 times (values '0.01', '0.7'); give it once"), std::string::npos) << twice;
  EXPECT_NE(error_of({"--lr=0.01", "--debug", "--lr", "0.7"}).find("key 'lr' given 2 times"), std::string::npos);
  EXPECT_NE(error_of({"--debug", "--debug"}).find("key 'debug' given 2 times"), std::string::npos);
  EXPECT_NE(error_of({"--config", "a.yaml", "--config", "b.yaml"}).find("--config given more than once"),
            std::string::npos);
  EXPECT_EQ(parse({"--lr", "0.02", "--debug"}).lr, 0.02);
}

// An unknown key or value suggests the nearest valid one; the reference's values that are not
// implemented here say so and name the nearest choice (they were just "invalid").
TEST(TrainConfig, NearMissesSuggestAndReferenceOnlyValuesSaySo) {
  EXPECT_NE(error_of({"--modle_dim", "64"}).find("unknown key 'modle_dim' (did you mean 'model_dim'?)"),
            std::string::npos)
      << error_of({"--modle_dim", "64"});
  EXPECT_NE(error_of({"--num_iteration", "5"}).find("(did you mean 'num_iterations'?)"), std::string::npos);
  EXPECT_EQ(error_of({"--zzzzzz", "5"}).find("did you mean"), std::string::npos);
  EXPECT_NE(error_of({"--optimizer", "dion22"}).find("(did you mean 'dion2'?)"), std::string::npos);
  // Every value train.py accepts that dion-train does not (its optimizer if-chain, its qr_method
  // choices): "not implemented in dion-train", never "invalid", and the nearest supported choice.
  for (const auto& [key, value, nearest] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"optimizer", "dion_simple", "dion"},
                                                                      {"optimizer", "dion_reference", "dion"},
                                                                      {"optimizer", "muon_reference", "muon"},
                                                                      {"qr_method", "qr", "rcqr"},
                                                                      {"qr_method", "cqr", "rcqr"}}) {
    const std::string e = error_of({"--" + key, value});
    EXPECT_NE(e.find(fmt::format("key '{}': value '{}' is not implemented in dion-train (the reference train.py "
                                 "accepts it); the nearest supported choice is '{}'",
                                 key, value, nearest)),
              std::string::npos)
        << e;
    EXPECT_EQ(e.find("invalid"), std::string::npos) << e;
  }
  // The same from a YAML file, keys and values (the file's name in the message).
  test::TempDir tmp("config_near");
  {
    std::ofstream f(tmp / "typo.yaml");
    f << "n_layers: 2\n";
    std::ofstream g(tmp / "ref.yaml");
    g << "optimizer: dion_simple\n";
  }
  const std::string typo = error_of({"--config", (tmp / "typo.yaml").string()});
  EXPECT_NE(typo.find("typo.yaml: unknown key 'n_layers' (did you mean 'n_layer'?)"), std::string::npos) << typo;
  const std::string ref = error_of({"--config", (tmp / "ref.yaml").string()});
  EXPECT_NE(ref.find("value 'dion_simple' is not implemented in dion-train"), std::string::npos) << ref;
}

// The test helpers' override rule (train_test_util.h): the last of each key, where it stands.
TEST(TrainConfig, TestHelpersKeepTheLastOfEachKey) {
  using V = std::vector<std::string>;
  EXPECT_EQ(test::later_wins({"--lr", "1", "--debug", "--lr=2", "--n_layer", "3"}),
            (V{"--debug", "--lr=2", "--n_layer", "3"}));
  EXPECT_EQ(test::later_wins({"--lr", "1", "stray", "--lr", "2"}), (V{"stray", "--lr", "2"}));
  EXPECT_EQ(test::later_wins({"--debug", "--debug", "false"}), (V{"--debug", "false"}));
}

// A key given twice in a YAML file (yaml-cpp keeps both; the last used to win silently).
TEST(TrainConfig, YamlKeyGivenTwiceIsAnError) {
  test::TempDir tmp("config_twice");
  {
    std::ofstream f(tmp / "twice.yaml");
    f << "lr: 0.01\nn_layer: 2\nlr: 0.7\n";
  }
  const std::string e = error_of({"--config", (tmp / "twice.yaml").string()});
  EXPECT_NE(e.find("line 3: key 'lr' is given again (first on line 1)"), std::string::npos) << e;
}

// The warmup and the warmdown must not overlap (0.7 + 0.7 ran, with a schedule train.py never makes).
TEST(TrainConfig, WarmupAndWarmdownMayNotOverlap) {
  const std::string e = error_of({"--warmup_ratio", "0.7", "--warmdown_ratio", "0.7"});
  EXPECT_NE(e.find("'warmup_ratio' 0.7 + 'warmdown_ratio' 0.7 = 1.4 > 1"), std::string::npos) << e;
  EXPECT_EQ(parse({"--warmup_ratio", "0.5", "--warmdown_ratio", "0.5"}).warmup_ratio, 0.5);
}

TEST(TrainConfig, BadValuesNameTheKeyTheValueAndWhatIsValid) {
  EXPECT_NE(error_of({"--lr", "fast"}).find("key 'lr': value 'fast' is not a number"), std::string::npos);
  EXPECT_NE(error_of({"--n_layer", "2.5"}).find("key 'n_layer': value '2.5' is not an integer"), std::string::npos);
  EXPECT_NE(error_of({"--debug", "maybe"}).find("key 'debug': value 'maybe' is not a boolean"), std::string::npos);
  EXPECT_NE(error_of({"--optimizer", "sgd"}).find("one of: muon, normuon, dion2, nordion2, dion3, dion, adamw, lion"),
            std::string::npos);
  EXPECT_NE(error_of({"--learning_rate", "0.1"}).find("unknown key 'learning_rate'"), std::string::npos);
  EXPECT_NE(error_of({"--batch_size", "100", "--device_batch_size", "64"}).find("key 'batch_size': value 100"),
            std::string::npos);
  EXPECT_NE(error_of({"--model_dim", "100", "--n_head", "6"}).find("not divisible by n_head 6"), std::string::npos);
  EXPECT_NE(error_of({"--tp_size", "4", "--n_head", "6"}).find("key 'tp_size': value 4 does not divide n_head 6"),
            std::string::npos);
  EXPECT_NE(error_of({"--fs_size", "2", "--batch_size", "6", "--device_batch_size", "2"})
                .find("not divisible by device_batch_size 2 x data-parallel ranks 2"),
            std::string::npos);
  EXPECT_NE(error_of({"--warmup_ratio", "1.5"}).find("valid: a value in [0, 1]"), std::string::npos);
  EXPECT_NE(error_of({"--qk_clip_tau", "50"})
                .find("key 'qk_clip_tau': value 50.0 needs qk_norm false: with q and k RMS-normed the logits are at "
                      "most sqrt(head size) = 11.3 and"),
            std::string::npos)
      << error_of({"--qk_clip_tau", "50"});
  EXPECT_EQ(error_of({"--qk_clip_tau", "50", "--qk_norm", "false"}), "(no error)");
  EXPECT_NE(error_of({"--qk_clip_tau", "-1"}).find("key 'qk_clip_tau'"), std::string::npos);
  EXPECT_NE(error_of({"--checkpoint_freq", "10"}).find("needs checkpoint_dir"), std::string::npos);
  EXPECT_NE(error_of({"--val_tokens", "1000"}).find("key 'val_tokens'"), std::string::npos);
  EXPECT_NE(error_of({"--config", "/nonexistent.yaml"}).find("cannot be read"), std::string::npos);
  // numerics keys
  EXPECT_NE(error_of({"--grad_clip", "-1"}).find("key 'grad_clip': value '-1.0' is invalid; valid: a value >= 0"),
            std::string::npos);
  EXPECT_NE(error_of({"--max_nonfinite_steps", "-1"}).find("key 'max_nonfinite_steps'"), std::string::npos);
  EXPECT_NE(
      error_of({"--scalar_beta1", "1.5"}).find("key 'scalar_beta1': value '1.5' is invalid; valid: a value in [0, 1]"),
      std::string::npos);
  // the keys that set an optimizer hyperparameter follow the optimizer library's rules: its table's
  // (dion/optim/hyperparameters.h), whatever the algorithm, then the chosen algorithm's own
  EXPECT_NE(error_of({"--scalar_opt", "adamw", "--scalar_beta2", "1"})
                .find("key 'scalar_beta1' / 'scalar_beta2': value 0.9, 1.0 is invalid for scalar_opt 'adamw' (its "
                      "hyperparameter betas); valid: each must be finite and >= 0; for adamw beta1 != 1 and beta2 < 1"),
            std::string::npos)
      << error_of({"--scalar_opt", "adamw", "--scalar_beta2", "1"});
  EXPECT_NE(error_of({"--optimizer", "dion", "--replicate_mesh_grad_sync", "--dp_size", "2", "--batch_size", "128",
                      "--grad_clip", "1"})
                .find("key 'grad_clip': value 1.0 needs the gradient summed over the dp replicas"),
            std::string::npos);
}

// The keys that become optimizer hyperparameters (lr, mu, weight_decay, ortho_fraction,
// rcqr_oversample, scalar_beta1/2) have no rule of their own: the optimizer library's table gives
// each one, the chosen algorithm adds its own, and what the library accepts the trainer accepts.
TEST(TrainConfig, OptimizerKeysFollowTheOptimizersRules) {
  EXPECT_NE(error_of({"--mu", "-1"})
                .find("key 'mu': value '-1.0' is invalid; valid: must be finite and >= 0 (the "
                      "optimizer's rule for mu)"),
            std::string::npos)
      << error_of({"--mu", "-1"});
  // (NaN and infinity do not get that far: the parser refuses a number that is not finite)
  EXPECT_NE(error_of({"--lr", ".inf"}).find("key 'lr': value '.inf' is not a finite number"), std::string::npos);
  // ortho_fraction feeds fraction or rank_fraction: refused by their rule with any optimizer
  for (const char* optimizer : {"dion", "dion2", "muon"})
    EXPECT_NE(error_of({"--optimizer", optimizer, "--ortho_fraction", "2"})
                  .find("key 'ortho_fraction': value '2.0' is invalid; valid: must be in (0, 1] (the optimizer's "
                        "rule for fraction)"),
              std::string::npos)
        << optimizer;
  EXPECT_NE(error_of({"--rcqr_oversample", "0"})
                .find("key 'rcqr_oversample': value '0.0' is invalid; valid: must be "
                      "finite and > 0 (the optimizer's rule for oversample)"),
            std::string::npos)
      << error_of({"--rcqr_oversample", "0"});
  // weight_decay: the table says finite; legacy Dion's spec adds >= 0 (as its reference class)
  EXPECT_NE(error_of({"--optimizer", "dion", "--weight_decay", "-0.1"})
                .find("key 'weight_decay': value -0.1 is invalid for optimizer 'dion' (its hyperparameter "
                      "weight_decay); valid: must be finite, and >= 0 for dion"),
            std::string::npos)
      << error_of({"--optimizer", "dion", "--weight_decay", "-0.1"});
  EXPECT_EQ(parse({"--optimizer", "muon", "--weight_decay", "-0.1", "--debug"}).weight_decay, -0.1);
  // mu = 1 is accepted by the library (the reference checks mu >= 0 only), and so here
  EXPECT_EQ(parse({"--mu", "1", "--debug"}).mu, 1.0);
  // the help line says where the rule comes from
  const std::string help = config_help();
  EXPECT_NE(help.find("[optimizer hyperparameter fraction, rank_fraction]"), std::string::npos);
  EXPECT_NE(help.find("[optimizer hyperparameter betas, scalar_opt's groups]"), std::string::npos);
}

// Three inputs tests/fuzz/fuzz_config.cpp found: a YAML key that is a list or map (was: yaml-cpp's
// "bad conversion" escaping as a non-ConfigError, exit 1), a folder as --config (was: libstdc++'s
// "basic_filebuf::underflow", exit 1), and sizes whose product overflows int64 in the checks
// (was: undefined behaviour, then a nonsense message or none).
TEST(TrainConfig, FuzzFindingsAreConfigErrors) {
  test::TempDir tmp("config_fuzz");
  for (const char* text : {"? [a]\n: 1\n", "{a: 1}: 2\n"}) {
    {
      std::ofstream f(tmp / "key.yaml");
      f << text;
    }
    EXPECT_NE(error_of({"--config", (tmp / "key.yaml").string()}).find("line 1: a key must be a plain name"),
              std::string::npos)
        << text;
  }
  EXPECT_NE(error_of({"--config", tmp.path().string()}).find("is a folder; give a YAML file"), std::string::npos);
  EXPECT_NE(
      error_of({"--sequence_length", "4611686018427387904", "--device_batch_size", "4"}).find("is larger than 2^63"),
      std::string::npos);
}

TEST(TrainConfig, YamlDumpReadsBackToTheSameConfig) {
  const Config a = parse({"--config", (source_dir() / "configs/shakespeare_dion2.yaml").string(), "--lr", "0.1",
                          "--wandb_job_name", "a: b"});
  test::TempDir tmp("config");
  {
    std::ofstream f(tmp / "dump.yaml");
    f << config_to_yaml(a);
  }
  Config b;
  config_load_yaml(b, tmp / "dump.yaml");
  b.config_file = a.config_file;
  EXPECT_EQ(config_to_yaml(a), config_to_yaml(b));
  EXPECT_EQ(b.wandb_job_name, "a: b");
  EXPECT_DOUBLE_EQ(b.lr, 0.1);
}

TEST(TrainConfig, HelpListsEveryKeyWithItsDefault) {
  std::string help;
  try {
    parse({"--help"});
  } catch (const HelpRequested& h) {
    help = h.what();
  }
  for (const char* key : {"model_dim", "n_layer", "batch_size", "optimizer", "scalar_opt", "ortho_fraction", "dp_size",
                          "replicate_mesh_grad_sync", "use_polar_express", "ortho_path", "run_dir", "dtype", "seed"})
    EXPECT_NE(help.find(std::string("--") + key), std::string::npos) << key;
  EXPECT_NE(help.find("default 0.02"), std::string::npos);  // lr
}

// train.py's init_distributed: no mesh size given -> DDP over every process; any one given -> the
// others 1. YAML null is "not given" (the reference's configs say `dp_size: null`).
TEST(TrainConfig, NoMeshSizeMeansDdpOverTheWorldAsTrainPy) {
  auto parse_at = [](std::vector<std::string> args, int64_t world) {
    args.insert(args.begin(), "dion-train");
    std::vector<const char*> argv;
    for (const std::string& a : args) argv.push_back(a.c_str());
    return config_parse(int(argv.size()), argv.data(), world);
  };
  const std::vector<std::string> small = {"--batch_size", "8",    "--device_batch_size", "1",
                                          "--val_tokens", "8192", "--sequence_length",   "1024"};
  Config c = parse_at(small, 4);
  EXPECT_EQ(c.dp_size, 4);
  EXPECT_EQ(c.fs_size, 1);
  EXPECT_EQ(c.tp_size, 1);
  EXPECT_TRUE(c.mesh_from_world);
  c = parse_at(small + std::vector<std::string>{"--fs_size", "2"}, 4);
  EXPECT_EQ(c.dp_size, 1);
  EXPECT_EQ(c.fs_size, 2);
  EXPECT_FALSE(c.mesh_from_world);
  c = parse_at(small + std::vector<std::string>{"--dp_size", "1"}, 4);  // given, even as the default
  EXPECT_EQ(c.dp_size, 1);
  EXPECT_FALSE(c.mesh_from_world);
  c = parse_at(small, 1);
  EXPECT_EQ(c.dp_size, 1);
  // The reference's configs: dp_size / fs_size / tp_size null.
  const Config ref = parse_at({"--config", (source_dir() / "configs" / "dion2_160m.yaml").string()}, 8);
  EXPECT_EQ(ref.dp_size, 8);
  EXPECT_TRUE(ref.mesh_from_world);
  // The batch is checked against the chosen layout: 8 sequences do not split over 3 x device batch 4.
  EXPECT_NE(error_of({"--batch_size", "8", "--device_batch_size", "4"}).find("(no error)"), std::string::npos);
  EXPECT_THROW(parse_at({"--batch_size", "8", "--device_batch_size", "4"}, 3), ConfigError);
}

// dtype auto on CUDA: bf16 autocast only on GPUs with bf16 hardware (compute capability 8 and
// up); a T4 (7.5) or V100 (7.0) would emulate bf16 GEMMs, so fp32 there.
TEST(TrainConfig, CudaAutoDtypeIsBf16OnlyWithBf16Hardware) {
  EXPECT_EQ(cuda_auto_dtype(7), "fp32");
  EXPECT_EQ(cuda_auto_dtype(6), "fp32");
  EXPECT_EQ(cuda_auto_dtype(8), "bf16");
  EXPECT_EQ(cuda_auto_dtype(9), "bf16");
  EXPECT_EQ(cuda_auto_dtype(-1), "bf16");  // unknown: as before
}

// device auto: cuda where a CUDA device is present, else cpu.
TEST(TrainConfig, DeviceAutoIsCudaWhenPresentElseCpu) {
  Config c;
  EXPECT_EQ(c.device, "auto");
  EXPECT_EQ(resolve_device(c), at::globalContext().hasCUDA() ? "cuda" : "cpu");
  EXPECT_EQ(resolve_dtype(c),
            at::globalContext().hasCUDA() ? cuda_auto_dtype(dion::cuda::compute_capability_major()) : kCpuAutoDtype);
  c.device = "cpu";
  EXPECT_EQ(resolve_device(c), "cpu");
  EXPECT_NE(error_of({"--device", "gpu"}).find("one of: auto, cpu, cuda"), std::string::npos);
}

// ---------------------------------------------------------------------------- param groups

TEST(TrainOptimizer, GroupsAsTheReferenceBuildsThem) {
  const GPTConfig g{32, kVocabSize, 2, 2, 32};
  for (const char* name : {"adamw", "lion", "muon", "normuon", "dion2", "nordion2", "dion3", "dion"}) {
    for (const char* scalar : {"adamw", "lion"}) {
      SCOPED_TRACE(std::string(name) + " + " + scalar);
      Config c;
      c.optimizer = name;
      c.scalar_opt = scalar;
      c.model_dim = 32;
      c.lr = 0.02;
      GPT model(g);
      TrainOptimizer t = build_optimizer(c, model);
      ASSERT_EQ(t.optimizer->param_groups().size(), 3u);
      EXPECT_EQ(t.optimizer->param_groups()[0].params().size(), 12u);  // 2 blocks x 6 matrices
      EXPECT_TRUE(t.optimizer->param_groups()[1].params()[0].is_same(model->embedding_weight()));
      EXPECT_TRUE(t.optimizer->param_groups()[2].params()[0].is_same(model->lm_head_weight()));
      const std::string algo0 = t.optimizer->options(0).algorithm();
      const bool all_scalar = std::string(name) == "adamw" || std::string(name) == "lion";
      const std::string expect0 = std::string(name) == "dion3" ? "nordion2" : name;
      EXPECT_EQ(algo0, expect0);
      EXPECT_EQ(t.optimizer->options(1).algorithm(), all_scalar ? name : scalar);
      EXPECT_EQ(t.optimizer->options(2).algorithm(), all_scalar ? name : scalar);
      EXPECT_EQ(t.optimizer->options(0).weight_decay(), 0.01);
      EXPECT_EQ(t.optimizer->options(1).weight_decay(), 0.0);
      EXPECT_EQ(t.optimizer->options(2).weight_decay(), 0.0);
      const double lm = all_scalar || std::string(scalar) == "adamw" ? 0.02 : 0.02 / std::sqrt(32.0);
      EXPECT_DOUBLE_EQ(t.optimizer->options(2).lr(), lm);
      EXPECT_DOUBLE_EQ(t.base_lrs[2], lm);
      if (!all_scalar) {  // scalar_beta1 / scalar_beta2: train.py's effective (0.9, 0.95) by default
        for (size_t g = 1; g <= 2; ++g) {
          EXPECT_EQ(std::get<0>(t.optimizer->options(g).betas()), 0.9);
          EXPECT_EQ(std::get<1>(t.optimizer->options(g).betas()), 0.95);
        }
        Config written = c;
        written.scalar_beta1 = 0.95;
        written.scalar_beta2 = 0.98;
        GPT m2(g);
        TrainOptimizer t2 = build_optimizer(written, m2);
        for (size_t g2 = 1; g2 <= 2; ++g2) {
          EXPECT_EQ(std::get<0>(t2.optimizer->options(g2).betas()), 0.95);
          EXPECT_EQ(std::get<1>(t2.optimizer->options(g2).betas()), 0.98);
        }
      }
      if (std::string(name) == "dion2") {
        EXPECT_DOUBLE_EQ(t.optimizer->options(0).fraction(), 0.25);
      }
      if (std::string(name) == "muon") {
        EXPECT_TRUE(t.optimizer->options(0).nesterov());
      }
      // One step runs.
      at::Tensor idx = at::randint(0, 50257, {2, 8}, at::kLong);
      model->loss(idx, idx).backward();
      t.optimizer->step();
    }
  }
}

// embed_lr and lm_head_lr set their group's rate apart from lr (matrix and scalar optimizers
// alike); 0, the default, keeps the reference's rule (checked above), and a negative rate is refused.
TEST(TrainOptimizer, EmbedAndLmHeadLearningRatesSetTheirGroupsApart) {
  GPTConfig g{16, 50257, 1, 2, 32};
  for (const char* name : {"dion2", "muon", "adamw"}) {
    SCOPED_TRACE(name);
    Config c = parse({"--optimizer", name, "--lr", "0.02", "--embed_lr", "0.003", "--lm_head_lr", "0.001"});
    c.model_dim = 32;
    GPT model(g);
    TrainOptimizer t = build_optimizer(c, model);
    EXPECT_DOUBLE_EQ(t.optimizer->options(0).lr(), 0.02);
    EXPECT_DOUBLE_EQ(t.optimizer->options(1).lr(), 0.003);
    EXPECT_DOUBLE_EQ(t.optimizer->options(2).lr(), 0.001);
    EXPECT_EQ(t.base_lrs, (std::vector<double>{0.02, 0.003, 0.001}));
  }
  Config only_head = parse({"--optimizer", "dion2", "--scalar_opt", "lion", "--lr", "0.02", "--lm_head_lr", "0.005"});
  only_head.model_dim = 32;
  GPT model(g);
  TrainOptimizer t = build_optimizer(only_head, model);
  EXPECT_DOUBLE_EQ(t.optimizer->options(1).lr(), 0.02);   // embedding: the rule
  EXPECT_DOUBLE_EQ(t.optimizer->options(2).lr(), 0.005);  // lm_head: the key, not 0.02 / sqrt(32)
  for (const std::string key : {"embed_lr", "lm_head_lr"})
    EXPECT_NE(error_of({"--" + key, "-0.1"}).find("key '" + key + "'"), std::string::npos)
        << error_of({"--" + key, "-0.1"});
}

// The losses of `steps` optimizer steps on the batch (idx, idx).
std::vector<double> train_steps(GPT& model, dion::Optimizer& opt, const at::Tensor& idx, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    at::Tensor loss = model->loss(idx, idx);
    losses.push_back(loss.item<double>());
    loss.backward();
    opt.step();
    opt.zero_grad();
  }
  return losses;
}

// (final matrix weights, losses of 4 steps) of a run of `name` on a 1-layer, 32-wide GPT at lr
// 0.02 from seed 0, after `tweak` sets the key under test.
std::pair<std::vector<at::Tensor>, std::vector<double>> tiny_run(const std::string& name, const at::Tensor& idx,
                                                                 const std::function<void(Config&)>& tweak) {
  const GPTConfig g{16, kVocabSize, 1, 2, 32};
  Config c;
  c.optimizer = name;
  c.scalar_opt = "adamw";
  c.model_dim = 32;
  c.lr = 0.02;
  tweak(c);
  at::manual_seed(0);
  GPT model(g);
  TrainOptimizer t = build_optimizer(c, model);
  const std::vector<double> losses = train_steps(model, *t.optimizer, idx, 4);
  std::vector<at::Tensor> w;
  for (const at::Tensor& p : model->block_params()) w.push_back(p.detach().clone());
  return {w, losses};
}

// use_gram_newton_schulz reaches the optimizers train.py passes it to (Muon, Dion2, NorDion2 /
// Dion3: the run trains and its weights differ from Newton-Schulz's, through the non-square MLP
// matrices) and no other (NorMuon, Dion: bit for bit the run without it). It used to be refused.
TEST(TrainOptimizer, GramNewtonSchulzWhereTrainPyPassesIt) {
  EXPECT_NO_THROW(parse({"--use_gram_newton_schulz", "--optimizer", "dion2"}));
  at::manual_seed(7);
  const at::Tensor idx = at::randint(0, 50257, {2, 16}, at::kLong);
  auto run = [&](const std::string& name, bool gram) {
    return tiny_run(name, idx, [&](Config& c) { c.use_gram_newton_schulz = gram; });
  };
  for (const std::string name : {"muon", "dion2", "nordion2", "dion3", "normuon", "dion"}) {
    SCOPED_TRACE(name);
    const auto [w_gram, loss_gram] = run(name, true);
    const auto [w_ns, loss_ns] = run(name, false);
    const bool passed = name != "normuon" && name != "dion";
    bool same = true;
    for (size_t i = 0; i < w_gram.size(); ++i) same = same && at::equal(w_gram[i], w_ns[i]);
    EXPECT_EQ(same, !passed);
    EXPECT_TRUE(std::isfinite(loss_gram.back()));
    EXPECT_LT(loss_gram.back(), loss_gram.front());  // it trains
  }
}

// dion-train's table (dion/train/optimizer_entry.h): every built-in algorithm has its entry; one
// without (a plugin's) gets lr, mu and weight_decay; a registered entry is what build_optimizer uses.
TEST(TrainOptimizer, EntriesLiveWithTheTrainerAndDefaultForOthers) {
  for (const dion::Algorithm a : dion::algorithms()) EXPECT_NE(find_train_entry(a.name()), nullptr) << a.name();
  EXPECT_EQ(train_entry("muon").reference_variants, std::vector<std::string>{"muon_reference"});
  EXPECT_EQ(find_train_entry("no_such_algorithm"), nullptr);
  dion::Options d = dion::Options().algorithm("muon").mu(0.5).nesterov(false);
  Config keys;
  keys.mu = 0.8;
  keys.ortho_fraction = 0.5;
  train_entry("no_such_algorithm").options(d, keys);
  EXPECT_EQ(d.mu(), 0.8);
  EXPECT_FALSE(d.nesterov());  // the default entry sets mu only (lr and weight decay: build_optimizer)
  // A registered entry replaces the built-in one: here Muon without Nesterov, at a fixed mu.
  const TrainEntry muon = train_entry("muon");
  register_train_entry("muon", {.options = [](dion::Options& o, const Config&) { o.mu(0.25).nesterov(false); }});
  const TrainGroupOptions g = train_group_options(parse({"--optimizer", "muon"}), dion::find_algorithm("muon").spec());
  register_train_entry("muon", muon);
  EXPECT_EQ(g.matrix.mu(), 0.25);
  EXPECT_FALSE(g.matrix.nesterov());
  EXPECT_TRUE(
      train_group_options(parse({"--optimizer", "muon"}), dion::find_algorithm("muon").spec()).matrix.nesterov());
}

// The lm_head's lr scale is dion-train's (the entry's lm_head_lr_scaled; it was the library's
// dion::lm_head_lr_scale, tests/optim/test_optimizer.cpp).
TEST(TrainOptimizer, LmHeadLrScale) {
  EXPECT_DOUBLE_EQ(lm_head_lr_scale("lion", 768), 1.0 / std::sqrt(768.0));
  EXPECT_DOUBLE_EQ(lm_head_lr_scale("lion", 1024), 1.0 / 32.0);
  EXPECT_DOUBLE_EQ(lm_head_lr_scale("adamw", 768), 1.0);
}

// cuda_kernels (the project's own CUDA kernels, dion/math/own_kernels.h): off by default, reaches
// the optimizer's OrthoConfig when set, and is refused with device cpu (the kernels run on CUDA
// tensors only).
TEST(TrainOptimizer, CudaKernelsKeyIsOptInAndReachesTheOptimizer) {
  EXPECT_FALSE(Config{}.cuda_kernels);
  EXPECT_FALSE(parse({}).cuda_kernels);
  EXPECT_TRUE(parse({"--cuda_kernels", "true", "--device", "cuda"}).cuda_kernels);
  EXPECT_NE(error_of({"--cuda_kernels", "true", "--device", "cpu"})
                .find("key 'cuda_kernels': true needs device cuda (the kernels run on CUDA tensors; device is 'cpu')"),
            std::string::npos);
  const GPTConfig g{32, kVocabSize, 1, 2, 32};
  for (bool on : {false, true}) {
    Config c;
    c.optimizer = "muon";
    c.model_dim = 32;
    c.cuda_kernels = on;
    GPT model(g);
    TrainOptimizer t = build_optimizer(c, model);
    EXPECT_EQ(t.optimizer->ortho().cuda_kernels, on);
  }
}

// ortho_path reaches every matrix optimizer that orthogonalizes through OrthoConfig (Muon,
// NorMuon, Dion2, NorDion2 / Dion3): fast is the default bit for bit; it is not bit-identical to
// exact after a few steps (bf16 rounding of other products) but stays close (weights within 2e-2
// of the weights' scale, the last loss within 1%). Legacy Dion has its own QR path and ignores it.
TEST(TrainOptimizer, OrthoPathReachesTheMatrixOptimizers) {
  EXPECT_EQ(Config{}.ortho_path, "fast");
  EXPECT_EQ(parse({"--ortho_path", "fast"}).ortho_path, "fast");
  EXPECT_NE(error_of({"--ortho_path", "fastest"})
                .find("key 'ortho_path': value 'fastest' is invalid; valid: one of: "
                      "exact, fast"),
            std::string::npos);
  at::manual_seed(7);
  const at::Tensor idx = at::randint(0, 50257, {2, 16}, at::kLong);
  auto run = [&](const std::string& name, const std::string& path) {
    return tiny_run(name, idx, [&](Config& c) {
      if (!path.empty()) c.ortho_path = path;
    });
  };
  for (const std::string name : {"muon", "normuon", "dion2", "dion3", "dion"}) {
    SCOPED_TRACE(name);
    const auto [w_default, loss_default] = run(name, "");
    const auto [w_exact, loss_exact] = run(name, "exact");
    const auto [w_fast, loss_fast] = run(name, "fast");
    bool default_is_fast = true, fast_same = true;
    double max_rel = 0;
    for (size_t i = 0; i < w_exact.size(); ++i) {
      default_is_fast = default_is_fast && at::equal(w_fast[i], w_default[i]);
      fast_same = fast_same && at::equal(w_exact[i], w_fast[i]);
      const double scale = w_exact[i].abs().max().item<double>();
      max_rel = std::max(max_rel, (w_fast[i] - w_exact[i]).abs().max().item<double>() / scale);
    }
    EXPECT_TRUE(default_is_fast);
    EXPECT_EQ(fast_same, name == "dion");  // legacy Dion does not use the orthogonalizer's path
    EXPECT_LT(max_rel, 2e-2);
    EXPECT_NEAR(loss_fast.back(), loss_exact.back(), 0.01 * loss_exact.back());
    EXPECT_LT(loss_fast.back(), loss_fast.front());  // it trains
  }
}

// mixed_precision (Dion): train.py's DionMixedPrecisionConfig sets momentum, variance and Q to
// bf16; here the matrices' momentum and Q and the AdamW groups' variance are bf16 (the scalar
// groups' momentum stays float32, docs/train.md). Without it every state is float32. The run
// trains, and its first steps stay near the float32-state run (bf16 states: the loss within 1%).
TEST(TrainOptimizer, MixedPrecisionStateDtypesAsTrainPy) {
  const GPTConfig g{16, kVocabSize, 1, 2, 32};
  at::manual_seed(7);
  const at::Tensor idx = at::randint(0, 50257, {2, 16}, at::kLong);
  std::map<bool, double> last_loss;
  for (const bool mp : {false, true}) {
    SCOPED_TRACE(mp ? "mixed_precision" : "float32 states");
    Config c;
    c.optimizer = "dion";
    c.scalar_opt = "adamw";
    c.model_dim = 32;
    c.mixed_precision = mp;
    at::manual_seed(0);
    GPT model(g);
    TrainOptimizer t = build_optimizer(c, model);
    const std::vector<double> losses = train_steps(model, *t.optimizer, idx, 4);
    const at::ScalarType low = mp ? at::kBFloat16 : at::kFloat;
    const ParamState* matrix = t.optimizer->state_of(model->block_params()[0]);
    const ParamState* emb = t.optimizer->state_of(model->embedding_weight());
    const ParamState* head = t.optimizer->state_of(model->lm_head_weight());
    ASSERT_TRUE(matrix && emb && head);
    EXPECT_EQ(matrix->momentum().scalar_type(), low);
    EXPECT_EQ(matrix->Q().scalar_type(), low);
    EXPECT_EQ(emb->variance().scalar_type(), low);
    EXPECT_EQ(head->variance().scalar_type(), low);
    EXPECT_EQ(emb->momentum().scalar_type(), at::kFloat);
    EXPECT_LT(losses.back(), losses.front());  // it trains
    last_loss[mp] = losses.back();
  }
  EXPECT_NEAR(last_loss[true], last_loss[false], 0.01 * last_loss[false]);
}

// ---------------------------------------------------------------------------- schedule

TEST(TrainSchedule, IsTheReferencesGetLr) {
  // N = 10, warmup 0.25 -> round(2.5) = 2 (ties to even), warmdown 0.5 -> 5.
  const double expect[11] = {0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 0.8, 0.6, 0.4, 0.2, 0.0};
  for (int s = 0; s <= 10; ++s) EXPECT_DOUBLE_EQ(lr_factor(s, 10, 0.25, 0.5), expect[s]) << s;
  EXPECT_EQ(python_round(3.5), 4);
  EXPECT_EQ(python_round(0.5), 0);
  // The 160M configs: no warmup, warmdown over the last 600 of 3000 steps.
  EXPECT_DOUBLE_EQ(lr_factor(0, 3000, 0.0, 0.2), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(2400, 3000, 0.0, 0.2), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(2401, 3000, 0.0, 0.2), 599.0 / 600.0);
}

}  // namespace
}  // namespace dion::train
