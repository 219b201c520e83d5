// src/train/config_io.cpp — reading dion-train's keys: a YAML file, then `--key value` flags
// (config_parse), one key from text (config_set); and writing them back (config.yaml of a run,
// the items the ranks compare). Which keys exist and their types: config_keys.cpp.
#include "config_keys.h"

#include <yaml-cpp/yaml.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <map>

namespace dion::train {

namespace {

using namespace config_detail;

// ---------------------------------------------------------------------------- setting a key

// Sets `key` from a YAML node. `where`: "FILE" or "the command line", for messages.
void set_from_node(Config& c, const std::string& key, const YAML::Node& node, const std::string& where) {
  const Key* k = find_key(key);
  if (!k)
    throw ConfigError(
        fmt::format("{}: unknown key '{}'{}. Valid keys: {} (dion-train --help lists them with "
                    "defaults)",
                    where, key, did_you_mean(key, all_key_names()), key_names()));
  if (!node.IsDefined() || node.IsNull()) return;  // null: not set, the default applies
  c.keys_set.push_back(key);
  const std::string text = node.IsScalar() ? node.Scalar() : std::string("<a YAML list or map>");
  auto bad = [&](const char* expected) {
    return ConfigError(fmt::format("{}: key '{}': value '{}' is not {}", where, key, text, expected));
  };
  if (!node.IsScalar()) throw bad("a single value");
  std::visit(
      [&](auto member) {
        auto& v = c.*member;
        using T = std::decay_t<decltype(v)>;
        try {
          if constexpr (std::is_same_v<T, bool>) {
            v = node.as<bool>();
          } else if constexpr (std::is_same_v<T, int64_t>) {
            v = node.as<int64_t>();
          } else if constexpr (std::is_same_v<T, double>) {
            const double d = node.as<double>();
            if (!std::isfinite(d)) throw bad("a finite number");
            v = d;
          } else {
            v = node.as<std::string>();
          }
        } catch (const YAML::BadConversion&) {
          if constexpr (std::is_same_v<T, bool>)
            throw bad("a boolean (true or false)");
          else if constexpr (std::is_same_v<T, int64_t>)
            throw bad("an integer");
          else if constexpr (std::is_same_v<T, double>)
            throw bad("a number");
          else
            throw bad("a string");
        }
      },
      k->field);
}

}  // namespace

// ---------------------------------------------------------------------------- YAML, command line

void config_set(Config& config, const std::string& key, const std::string& value) {
  const Key* k = find_key(key);
  if (k && std::holds_alternative<std::string Config::*>(k->field)) {  // text as given ("" included)
    config.*std::get<std::string Config::*>(k->field) = value;
    config.keys_set.push_back(key);
    return;
  }
  if (k && std::holds_alternative<bool Config::*>(k->field) && value.empty()) {  // a bare --flag
    config.*std::get<bool Config::*>(k->field) = true;
    config.keys_set.push_back(key);
    return;
  }
  YAML::Node node;
  try {
    node = YAML::Load(value);
  } catch (const YAML::Exception&) {
    node = YAML::Node(value);  // not YAML: a plain string
  }
  if (node.IsNull() && !value.empty() && value != "null" && value != "~") node = YAML::Node(value);
  set_from_node(config, key, node, "command line");
}

void config_load_yaml(Config& config, const std::filesystem::path& file) {
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec))  // (libstdc++ opens a folder, then fails to read it)
    throw ConfigError(
        fmt::format("config file '{}': is a folder; give a YAML file (e.g. "
                    "configs/shakespeare_dion2.yaml)",
                    file.string()));
  YAML::Node root;
  try {
    root = YAML::LoadFile(file.string());
  } catch (const YAML::BadFile&) {
    throw ConfigError(fmt::format("config file '{}': cannot be read (does it exist?)", file.string()));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("config file '{}': not valid YAML: {}", file.string(), e.what()));
  } catch (const std::exception& e) {  // a read error of the stream
    throw ConfigError(fmt::format("config file '{}': cannot be read: {}", file.string(), e.what()));
  }
  if (root.IsNull()) return;  // empty file
  if (!root.IsMap())
    throw ConfigError(fmt::format("config file '{}': expected a mapping of key: value lines", file.string()));
  std::map<std::string, int> seen;  // key -> its first line (yaml-cpp keeps both of a repeated key)
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar())  // `? [a]: 1`, `{a: 1}: 2` (found with tests/fuzz/fuzz_config.cpp)
      throw ConfigError(fmt::format("config file '{}': line {}: a key must be a plain name, not a YAML list or map",
                                    file.string(), line));
    const auto [first, fresh] = seen.emplace(kv.first.Scalar(), line);
    if (!fresh)
      throw ConfigError(
          fmt::format("config file '{}': line {}: key '{}' is given again (first on line {}); give "
                      "each key once",
                      file.string(), line, kv.first.Scalar(), first->second));
    set_from_node(config, kv.first.Scalar(), kv.second, file.string());
  }
}

namespace {

// The WORLD_SIZE the processes run with: `given` when > 0, else the WORLD_SIZE variable, 1 when it
// is unset or not a positive integer (the process group reports a bad value when it starts).
int64_t world_size_or_env(int64_t given) {
  if (given > 0) return given;
  const char* env = std::getenv("WORLD_SIZE");
  if (!env || !*env) return 1;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  return *end == '\0' && v > 0 ? int64_t(v) : 1;
}

// train.py's init_distributed: with none of dp_size, fs_size, tp_size set (YAML null counts as not
// set), DDP over every process; with any of them set the others are 1 (their defaults).
void default_mesh(Config& c, int64_t world_size) {
  for (const std::string& k : c.keys_set)
    if (k == "dp_size" || k == "fs_size" || k == "tp_size") return;
  c.dp_size = world_size;
  c.mesh_from_world = true;
}

}  // namespace

Config config_parse(int argc, const char* const* argv, int64_t world_size) {
  // Every key is a "--key" option with 0 or 1 values (0 only makes sense for booleans).
  CLI::App app{"dion-train", "dion-train"};
  app.set_help_flag();  // our own --help (config_help)
  app.allow_extras();
  std::string config_file;
  bool help = false;
  std::vector<std::string> config_files;
  app.add_option("--config", config_files)
      ->expected(1)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("-h,--help", help);
  std::map<std::string, std::vector<std::string>> given;
  for (const Key& k : keys()) {
    auto* opt = app.add_option(std::string("--") + k.name, given[k.name]);
    opt->expected(std::holds_alternative<bool Config::*>(k.field) ? 0 : 1, 1);
    // One value per key: `--lr 0.01 0.7` leaves 0.7 as a stray word (an error below) instead of
    // CLI11 collecting both into the vector; a key given twice is an error below too.
    opt->allow_extra_args(false);
    opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  }
  try {
    std::vector<std::string> args;
    for (int i = argc - 1; i >= 1; --i) args.emplace_back(argv[i]);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    throw ConfigError(fmt::format("command line: {}", e.what()));
  }
  if (help) throw HelpRequested(config_help());
  for (const std::string& extra : app.remaining()) {
    std::string key = extra;
    if (key.rfind("--", 0) == 0) {
      key = key.substr(2, key.find('=') == std::string::npos ? std::string::npos : key.find('=') - 2);
      throw ConfigError(
          fmt::format("command line: unknown key '{}'{}. Valid keys: {} (dion-train --help lists "
                      "them with defaults)",
                      key, did_you_mean(key, all_key_names()), key_names()));
    }
    throw ConfigError(fmt::format("command line: unexpected argument '{}' (keys are given as --key value)", extra));
  }

  if (config_files.size() > 1)
    throw ConfigError(
        fmt::format("command line: --config given more than once ('{}', '{}'); give one YAML file "
                    "(keys on the command line override it)",
                    config_files[0], config_files[1]));
  config_file = config_files.empty() ? std::string() : config_files[0];
  for (const Key& k : keys()) {
    const size_t times = app.count(std::string("--") + k.name);
    if (times > 1) {
      std::string values;
      for (const std::string& v : given[k.name]) values += (values.empty() ? "'" : ", '") + v + "'";
      throw ConfigError(
          fmt::format("command line: key '{}' given {} times{}; give it once (a value on the command "
                      "line overrides the --config file's)",
                      k.name, times, values.empty() ? "" : " (values " + values + ")"));
    }
  }

  Config c;
  c.config_file = config_file;
  if (!config_file.empty()) config_load_yaml(c, config_file);
  for (const Key& k : keys()) {
    const auto& values = given[k.name];
    if (app.count(std::string("--") + k.name) == 0) continue;
    config_set(c, k.name, values.empty() ? std::string() : values.back());
  }
  default_mesh(c, world_size_or_env(world_size));
  if (c.debug) {  // the reference's debug mode (train.py main())
    c.batch_size = 2 * c.dp_size * c.fs_size;
    c.device_batch_size = 1;
    c.num_iterations = 20;
  }
  config_validate(c);
  return c;
}

std::vector<std::pair<std::string, std::string>> config_items(const Config& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Key& k : keys()) out.emplace_back(k.name, value_text(c, k.field));
  return out;
}

std::string config_to_yaml(const Config& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  for (const Key& k : keys()) {
    out << YAML::Key << k.name << YAML::Value;
    std::visit(
        [&](auto member) {
          const auto& v = c.*member;
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, double>)
            out << format_double(v);  // exact, shortest
          else if constexpr (std::is_same_v<T, std::string>)
            out << YAML::DoubleQuoted << v;
          else
            out << v;
        },
        k.field);
  }
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace dion::train
