// src/train/io/tensorboard.cpp — see dion/train/tensorboard.h: CRC-32C, TFRecord framing, the
// hand-encoded Event protobuf, and the buffered file writer. Plain POSIX calls.
#include "dion/train/tensorboard.h"

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdexcept>
#include <unistd.h>

namespace dion::train {

namespace {

// ---------------------------------------------------------------------------- CRC-32C

constexpr std::array<uint32_t, 256> make_crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = make_crc32c_table();

// ---------------------------------------------------------------------------- protobuf encoding
// Only what an Event with a scalar summary needs. Wire types: 0 varint, 1 fixed64,
// 2 length-delimited, 5 fixed32. Fixed-width values are little-endian (this code assumes a
// little-endian host, as LibTorch's CPU builds do).
static_assert(std::endian::native == std::endian::little, "the event encoder assumes little-endian");

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, uint32_t field, uint32_t wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}
void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
void put_double(std::string& out, uint32_t field, double v) {
  put_tag(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);
  out.append(b, 8);
}
void put_float(std::string& out, uint32_t field, float v) {
  put_tag(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}
void put_int64(std::string& out, uint32_t field, int64_t v) {
  put_tag(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));  // protobuf int64: two's complement, 10 bytes if < 0
}

double wall_time_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

// tensorflow.Event: wall_time = 1, step = 2, file_version = 3, summary = 5.
// tensorflow.Summary: value = 1 (repeated). Summary.Value: tag = 1, simple_value = 2.
std::string event_file_version(double wall_time) {
  std::string e;
  put_double(e, 1, wall_time);
  put_bytes(e, 3, "brain.Event:2");
  return e;
}
std::string event_scalar(double wall_time, int64_t step, const std::string& tag, float value) {
  std::string v;
  put_bytes(v, 1, tag);
  put_float(v, 2, value);
  std::string summary;
  put_bytes(summary, 1, v);
  std::string e;
  put_double(e, 1, wall_time);
  put_int64(e, 2, step);
  put_bytes(e, 5, summary);
  return e;
}

std::string errno_text(int err) { return std::strerror(err); }

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// mkdir -p with POSIX calls. (Not std::filesystem: in a binary that also links the torch wheel,
// its exported copy of those functions is what runs — pytorch/pytorch#133437.)
void make_dirs(const std::string& dir) {
  auto fail = [&](const std::string& why) {
    throw std::runtime_error("TensorBoard log folder " + dir + ": cannot create it: " + why);
  };
  if (dir.empty()) fail("empty path");
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos < dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0777) != 0 && errno != EEXIST) fail(prefix + ": " + errno_text(errno));
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) fail(errno_text(errno));
  if (!S_ISDIR(st.st_mode)) fail("it exists and is not a folder");
}

constexpr size_t kFlushBytes = 64 * 1024;
constexpr auto kFlushInterval = std::chrono::seconds(2);

}  // namespace

// ---------------------------------------------------------------------------- CRC + framing

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = kCrc32cTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t crc32c_masked(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string tfrecord_frame(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 16);
  const uint64_t length = data.size();
  char len_bytes[8];
  std::memcpy(len_bytes, &length, 8);
  const uint32_t len_crc = crc32c_masked(len_bytes, 8);
  const uint32_t data_crc = crc32c_masked(data.data(), data.size());
  out.append(len_bytes, 8);
  out.append(reinterpret_cast<const char*>(&len_crc), 4);
  out.append(data);
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

// ---------------------------------------------------------------------------- EventWriter

EventWriter::EventWriter(const std::string& log_dir) {
  make_dirs(log_dir);
  const long long secs = static_cast<long long>(wall_time_now());
  const std::string base = log_dir + "/events.out.tfevents." + std::to_string(secs) + "." + host_name();
  // Two writers started in the same second on one host (a quick restart) must not share a
  // file: O_EXCL, and ".1", ".2", ... on a clash.
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0 && (errno != EEXIST || n >= 1000)) {
      throw std::runtime_error("TensorBoard event file " + path_ + ": cannot create it: " + errno_text(errno));
    }
  }
  last_write_ = std::chrono::steady_clock::now();
  write_record(event_file_version(wall_time_now()));
  flush();
}

EventWriter::~EventWriter() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: %s\n", e.what());
  }
  if (fd_ >= 0) ::close(fd_);
}

void EventWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  write_record(event_scalar(wall_time_now(), step, tag, static_cast<float>(value)));
  if (buffer_.size() >= kFlushBytes || std::chrono::steady_clock::now() - last_write_ >= kFlushInterval) {
    flush();
  }
}

void EventWriter::write_record(const std::string& event) { buffer_ += tfrecord_frame(event); }

void EventWriter::flush() {
  // The buffer is dropped whether or not the write succeeds: after a failed write the points
  // are lost (the error says so), and a retry would only repeat the error or tear a record.
  std::string data;
  data.swap(buffer_);
  last_write_ = std::chrono::steady_clock::now();
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      throw std::runtime_error("TensorBoard event file " + path_ + ": write failed: " + errno_text(errno) +
                               " (disk full?); " + std::to_string(data.size() - done) + " bytes of events lost");
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace dion::train
