// tools/dion-data/cli.h — what the dion-data subcommands share: registration functions, the
// Ctrl-C flag, where the GPT-2 files are, and text formatting for the terminal.
//
// The work itself lives in the dion_data library; these files only parse flags, print, and
// turn a DataError into a message and an exit code (main.cpp).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace dion::cli {

void register_prepare(CLI::App& app);
void register_inspect(CLI::App& app);
void register_download(CLI::App& app);
void register_encode(CLI::App& app);
void register_finish_swap(CLI::App& app);

// True once SIGINT/SIGTERM arrived; long loops poll it and clean up.
bool stop_requested();

// The folder with encoder.json + vocab.bpe: `flag` if given, else $DION_GPT2_DIR. Empty if
// neither is set and !required; throws DataError with the fix if required.
std::filesystem::path tokenizer_dir(const std::string& flag, bool required);
// True for `--tokenizer byte` (or "bytes"): the byte tokenizer, which needs no files. Any other
// value is a GPT-2 folder (a folder named "byte" is ./byte).
bool tokenizer_is_bytes(const std::string& flag);
// Adds the shared --tokenizer flag to `cmd`.
void add_tokenizer_flag(CLI::App* cmd, std::string& value);

// "\n" -> "\\n", non-printable bytes -> "\\xNN"; for showing token text on one line.
std::string escape_bytes(std::string_view bytes);
// "\\n", "\\t", "\\r", "\\\\" -> the characters; for --delimiter.
std::string unescape(std::string_view text);
// 1234567 -> "1,234,567".
std::string group_digits(uint64_t n);
// 1.5e6 -> "1.5 MB" (decimal units).
std::string human_bytes(double bytes);

}  // namespace dion::cli
