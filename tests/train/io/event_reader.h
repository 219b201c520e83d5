// tests/train/io/event_reader.h — a small, independent reader of TensorBoard event files for the
// writer's tests: TFRecord frames with both CRCs checked, and the few Event / Summary fields
// the writer emits, decoded with a generic protobuf wire-format walker (so an unexpected
// field or wire type shows up as a failure, not as silence).
//
// Not a general protobuf decoder: nested messages are decoded only where Event has them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dion::test {

struct ScalarValue {
  std::string tag;
  float value = 0;
};

struct Event {
  std::optional<double> wall_time;
  std::optional<int64_t> step;
  std::optional<std::string> file_version;
  std::vector<ScalarValue> values;  // summary.value[*] with simple_value
};

// The records of `bytes` (a whole event file). Throws std::runtime_error on a bad length CRC,
// data CRC or a truncated frame, naming the record index.
std::vector<std::string> read_tfrecords(const std::string& bytes);

// Decodes one serialized Event. Throws std::runtime_error on malformed protobuf or a field the
// writer is not expected to produce.
Event decode_event(const std::string& record);

// read_tfrecords + decode_event over the file at `path`.
std::vector<Event> read_event_file(const std::string& path);

}  // namespace dion::test
