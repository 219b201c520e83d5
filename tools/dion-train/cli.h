// tools/dion-train/cli.h — what the dion-train subcommands share when parsing their flags.
#pragma once

#include <CLI/CLI.hpp>

#include <optional>

namespace dion::train::tool {

// Parses argv into `app`. Returns the exit code to stop with — 0 after --help (printed), 2 after
// a usage error (printed, naming the flag) — or nothing when the subcommand should run.
inline std::optional<int> parse_args(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  return std::nullopt;
}

}  // namespace dion::train::tool
