// dion/train/tensorboard.h — a TensorBoard event-file writer for scalars (train loss, lr, ...).
//
// What it is: the few bytes TensorBoard needs to draw scalar curves, written without TensorFlow
// or protobuf. A log folder holds files named events.out.tfevents.<unix seconds>.<hostname>
// (".<n>" is appended when that name exists already); TensorBoard reads every such file in the
// folder, so a resumed run simply adds a new file beside the old one.
//
// Format (docs/formats.md has the byte layout): TFRecord framing —
//     uint64 length (LE) | uint32 masked_crc32c(length bytes) | data | uint32 masked_crc32c(data)
// around serialized `tensorflow.Event` protobufs: the first record holds
// file_version = "brain.Event:2"; each add_scalar() writes one Event
//     { wall_time (1, double), step (2, int64), summary (5) { value (1) { tag (1),
//       simple_value (2, float) } } }.
// The protobuf fields are encoded by hand in tensorboard.cpp: five fields of two messages do not
// justify a protobuf build dependency (generated code, protoc at build time).
//
// What it is not: images, histograms, hparams, or a reader (the tests hold a small one).
// Values are stored as float (TensorBoard's simple_value), so a double loses precision beyond
// about 7 significant digits.
//
// Writes are buffered: add_scalar() appends to memory and writes the buffer out when it holds
// 64 KiB or when 2 s have passed since the last write; flush() (and the destructor) write
// everything. Errors (the folder cannot be created, the file cannot be opened, a write fails,
// e.g. the disk is full) throw std::runtime_error naming the path and the system's reason; the
// destructor reports a failing final flush on stderr instead of throwing.
//
// One writer is used from one thread (no locking). No LibTorch: the CMake target `dion_tb` is
// plain C++.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dion::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord uses it.
// crc32c("123456789") == 0xE3069283 (RFC 3720, B.4). `crc` continues a previous value.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);
// TFRecord's mask: ((crc >> 15) | (crc << 17)) + 0xA282EAD8.
uint32_t crc32c_masked(const void* data, size_t size);

// One TFRecord frame around `data`: length, masked CRC of the length, data, masked CRC of data.
std::string tfrecord_frame(std::string_view data);

class EventWriter {
 public:
  // Creates `log_dir` (and its parents) if needed and a new event file in it, and writes the
  // file_version record. Throws std::runtime_error naming the folder or file on failure.
  explicit EventWriter(const std::string& log_dir);
  ~EventWriter();  // flushes; a failure there is printed on stderr
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One scalar point of the curve `tag` (e.g. "train/loss") at `step`, stamped with the current
  // wall time. TensorBoard shows it as a float.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // Writes everything buffered to the file (write(2); no fsync).
  void flush();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::string path_;
  int fd_ = -1;
  std::string buffer_;  // framed records not yet written
  std::chrono::steady_clock::time_point last_write_;
};

}  // namespace dion::train
