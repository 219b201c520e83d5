// tools/dion-data/cli.cpp — helpers shared by the subcommands (see cli.h).
#include "cli.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "dion/data/error.h"

namespace dion::cli {

std::filesystem::path tokenizer_dir(const std::string& flag, bool required) {
  std::string dir = flag;
  if (dir.empty()) {
    if (const char* env = std::getenv("DION_GPT2_DIR"); env != nullptr) dir = env;
  }
  if (dir.empty() && required) {
    throw data::DataError(
        "no GPT-2 tokenizer files: pass --tokenizer DIR or set DION_GPT2_DIR to a folder with "
        "encoder.json and vocab.bpe (download them from "
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/; see docs/data.md)");
  }
  return dir;
}

bool tokenizer_is_bytes(const std::string& flag) { return flag == "byte" || flag == "bytes"; }

void add_tokenizer_flag(CLI::App* cmd, std::string& value) {
  cmd->add_option("--tokenizer", value,
                  "Folder with the GPT-2 files encoder.json and vocab.bpe "
                  "(default: $DION_GPT2_DIR), or 'byte': each byte one id, end-of-text 256 "
                  "(257 ids; no files needed)");
}

std::string escape_bytes(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) {
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      default:
        if (c < 0x20 || c == 0x7F) {
          out += fmt::format("\\x{:02x}", c);
        } else {
          out += static_cast<char>(c);  // UTF-8 passes through; a split character shows as is
        }
    }
  }
  return out;
}

std::string unescape(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 == text.size()) {
      out += text[i];
      continue;
    }
    switch (text[++i]) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      default:
        out += '\\', out += text[i];
    }
  }
  return out;
}

std::string group_digits(uint64_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace dion::cli
