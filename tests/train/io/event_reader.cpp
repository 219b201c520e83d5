// tests/train/io/event_reader.cpp — see event_reader.h.
#include "event_reader.h"

#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "dion/train/tensorboard.h"

namespace dion::test {

namespace {

struct Cursor {
  const std::string& s;
  size_t pos = 0;
  bool done() const { return pos >= s.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos >= s.size()) throw std::runtime_error("protobuf: truncated varint");
      const auto b = static_cast<uint8_t>(s[pos++]);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    throw std::runtime_error("protobuf: varint longer than 10 bytes");
  }
  std::string bytes(size_t n) {
    if (pos + n > s.size()) throw std::runtime_error("protobuf: truncated field");
    std::string out = s.substr(pos, n);
    pos += n;
    return out;
  }
  template <class T>
  T fixed() {
    T v;
    const std::string b = bytes(sizeof(T));
    std::memcpy(&v, b.data(), sizeof(T));
    return v;
  }
};

ScalarValue decode_value(const std::string& msg) {
  ScalarValue v;
  bool has_tag = false, has_value = false;
  Cursor c{msg};
  while (!c.done()) {
    const uint64_t key = c.varint();
    if (key == ((1 << 3) | 2)) {
      v.tag = c.bytes(c.varint());
      has_tag = true;
    } else if (key == ((2 << 3) | 5)) {
      v.value = c.fixed<float>();
      has_value = true;
    } else {
      throw std::runtime_error("Summary.Value: unexpected field key " + std::to_string(key));
    }
  }
  if (!has_tag || !has_value) throw std::runtime_error("Summary.Value: tag or simple_value missing");
  return v;
}

}  // namespace

std::vector<std::string> read_tfrecords(const std::string& bytes) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    const std::string where = "record " + std::to_string(out.size());
    if (bytes.size() - pos < 12) throw std::runtime_error(where + ": truncated length");
    uint64_t len = 0;
    uint32_t len_crc = 0, data_crc = 0;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    if (len_crc != dion::train::crc32c_masked(bytes.data() + pos, 8)) {
      throw std::runtime_error(where + ": length CRC mismatch");
    }
    if (bytes.size() - pos - 12 < len + 4) throw std::runtime_error(where + ": truncated data");
    std::string data = bytes.substr(pos + 12, len);
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    if (data_crc != dion::train::crc32c_masked(data.data(), data.size())) {
      throw std::runtime_error(where + ": data CRC mismatch");
    }
    out.push_back(std::move(data));
    pos += 12 + len + 4;
  }
  return out;
}

Event decode_event(const std::string& record) {
  Event e;
  Cursor c{record};
  while (!c.done()) {
    const uint64_t key = c.varint();
    switch (key) {
      case (1 << 3) | 1:
        e.wall_time = c.fixed<double>();
        break;
      case (2 << 3) | 0:
        e.step = static_cast<int64_t>(c.varint());
        break;
      case (3 << 3) | 2:
        e.file_version = c.bytes(c.varint());
        break;
      case (5 << 3) | 2: {
        const std::string summary = c.bytes(c.varint());
        Cursor s{summary};
        while (!s.done()) {
          if (s.varint() != ((1 << 3) | 2)) throw std::runtime_error("Summary: unexpected field");
          e.values.push_back(decode_value(s.bytes(s.varint())));
        }
        break;
      }
      default:
        throw std::runtime_error("Event: unexpected field key " + std::to_string(key));
    }
  }
  return e;
}

std::vector<Event> read_event_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<Event> events;
  for (const auto& r : read_tfrecords(ss.str())) events.push_back(decode_event(r));
  return events;
}

}  // namespace dion::test
