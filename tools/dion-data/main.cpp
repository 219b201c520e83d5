// tools/dion-data/main.cpp — `dion-data`: the data tools' command line.
//
//   dion-data prepare   text files / folders / stdin -> FineWeb token shards
//   dion-data inspect   check shards and summarize them (header, histogram, first tokens)
//   dion-data download  fetch the reference's pre-tokenized FineWeb shards (resumable)
//   dion-data encode    print the GPT-2 token ids of a text (debugging, tiktoken checks)
//   dion-data finish-swap  finish the swap of a prepare that was killed while swapping
//
// Each subcommand lives in cmd_<name>.cpp; this file wires them up, installs the Ctrl-C
// handler, and turns errors into "dion-data: error: ..." and a non-zero exit code
// (1 = bad input or a failure, 2 = a bad command line, 130 = interrupted).
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include "cli.h"
#include "dion/errors.h"
#include "dion/data/error.h"

namespace dion::cli {

namespace {
std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }
}  // namespace

bool stop_requested() { return g_stop.load(); }

}  // namespace dion::cli

int main(int argc, char** argv) {
  CLI::App app{"dion-data: GPT-2 tokenizer and FineWeb token shards for dion-cpp (docs/data.md)", "dion-data"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "dion-data 0.1.0");
  dion::cli::register_prepare(app);
  dion::cli::register_inspect(app);
  dion::cli::register_download(app);
  dion::cli::register_encode(app);
  dion::cli::register_finish_swap(app);

  struct sigaction sa {};
  sa.sa_handler = dion::cli::on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // Past `ulimit -f`, write() then fails with EFBIG and the error names the file and the
  // limit, and the temporaries are removed; by default SIGXFSZ would kill us silently.
  std::signal(SIGXFSZ, SIG_IGN);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help / --version exit 0; every bad flag or value is a usage error, exit 2.
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const dion::data::DataError& e) {
    std::fprintf(stderr, "dion-data: error: %s\n", e.what());
    return dion::cli::stop_requested() ? 130 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dion-data: error: %s\n", dion::message_of(e).c_str());
    return 1;
  }
  return dion::cli::stop_requested() ? 130 : 0;
}
