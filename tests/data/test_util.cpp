// tests/data/test_util.cpp — see test_util.h.
#include "test_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <csignal>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

namespace dion::test {

namespace fs = std::filesystem;

fs::path source_dir() { return DION_SOURCE_DIR; }

fs::path data_dir() {
  if (const char* env = std::getenv("DION_DATA_DIR"); env != nullptr && *env != '\0') return env;
  return DION_DATA_DIR;
}

fs::path data_file(const std::string& relative) {
  const fs::path p = data_dir() / relative;
  if (!fs::exists(p))
    throw std::runtime_error("test data missing: " + p.string() +
                             " (the repository's data/ holds it, listed in data/SHA256SUMS; restore it "
                             "with `git checkout -- data/`, or point DION_DATA_DIR at a folder that has it)");
  return p;
}

const data::Gpt2Tokenizer& gpt2_tokenizer() {
  static const data::Gpt2Tokenizer tok = [] {
    data_file("gpt2/encoder.json");
    data_file("gpt2/vocab.bpe");
    return data::Gpt2Tokenizer::from_dir(data_dir() / "gpt2");
  }();
  return tok;
}

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/dion-data-test-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed: " + templ);
  path_ = templ;
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("test: cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("test: cannot write " + path.string());
}

std::vector<std::string> list_dir(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string shard_bytes(const std::vector<uint16_t>& tokens, int32_t magic, int32_t version, int64_t count) {
  std::string out(1024, '\0');
  auto put = [&](size_t i, int32_t v) {
    for (int b = 0; b < 4; ++b) out[i * 4 + b] = static_cast<char>((static_cast<uint32_t>(v) >> (8 * b)) & 0xFF);
  };
  put(0, magic);
  put(1, version);
  put(2, static_cast<int32_t>(count == INT64_MIN ? static_cast<int64_t>(tokens.size()) : count));
  for (uint16_t t : tokens) {
    out += static_cast<char>(t & 0xFF);
    out += static_cast<char>(t >> 8);
  }
  return out;
}

uint64_t fnv1a64(const std::string& bytes) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t fnv1a64_ids(const std::vector<uint32_t>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (uint32_t id : ids) {
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((id >> (8 * b)) & 0xFF);
  }
  return fnv1a64(bytes);
}

std::string fmt_hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

namespace {
std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

RunResult run_dion_data(const std::vector<std::string>& args, const std::string& stdin_data) {
  return run_dion_data(args, RunOptions{stdin_data, {}, ""});
}

RunResult run_dion_data(const std::vector<std::string>& args, const RunOptions& options) {
  TempDir io;
  write_file(io / "stdin", options.stdin_data);
  // DION_GPT2_DIR is removed so that every test says where the GPT-2 files are. `timeout`
  // bounds a hang (exit 124) so that a regression fails the test instead of stalling ctest.
  std::string cmd = options.shell_prefix + " exec timeout -k 5 120 env -u DION_GPT2_DIR";
  for (const std::string& e : options.env) cmd += " " + shell_quote(e);
  cmd += " " + shell_quote(DION_DATA_EXE);
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  cmd += " < " + shell_quote((io / "stdin").string()) + " > " + shell_quote((io / "stdout").string()) + " 2> " +
         shell_quote((io / "stderr").string());
  const int status = std::system(cmd.c_str());
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(io / "stdout");
  r.err = read_file(io / "stderr");
  return r;
}

Background::Background(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s{DION_DATA_EXE};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const std::string out = (io_ / "stdout").string(), err = (io_ / "stderr").string();
  // Everything the child needs is built before fork: after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;  // ours without DION_GPT2_DIR (each test names the GPT-2 files)
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string_view(*e).starts_with("DION_GPT2_DIR=")) continue;
    envp.push_back(*e);
  }
  envp.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("test: fork failed");
  if (pid_ == 0) {
    const int in_fd = ::open("/dev/null", O_RDONLY);
    const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in_fd, 0);
    ::dup2(out_fd, 1);
    ::dup2(err_fd, 2);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
}

Background::~Background() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

void Background::signal(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

RunResult Background::wait() {
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
  RunResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = read_file(io_ / "stdout");
  r.err = read_file(io_ / "stderr");
  return r;
}

}  // namespace dion::test
