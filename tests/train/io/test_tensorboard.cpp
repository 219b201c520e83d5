// The TensorBoard event writer (dion/train/tensorboard.h): CRC-32C against published vectors,
// the file's name and framing, and every scalar read back by an independent reader
// (event_reader.h) that checks both CRCs of every record and decodes the protobuf fields.
// Errors: a log folder that cannot be created, and a write that fails (the file-size limit of
// this process stands in for a full disk) throw naming the path.
// The `tensorboard` package reading the same files is tests/train/io/test_formats.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

#include "dion/train/tensorboard.h"
#include "event_reader.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using dion::test::read_event_file;
using dion::test::ScratchDir;
using dion::train::crc32c;
using dion::train::crc32c_masked;
using dion::train::EventWriter;

namespace {

std::vector<std::string> event_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------- CRC-32C

// RFC 3720 (iSCSI) appendix B.4 test vectors, and the customary "123456789" check value.
TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<unsigned char> b(32, 0x00);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x8A9136AAu);
  std::fill(b.begin(), b.end(), 0xFF);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) b[i] = static_cast<unsigned char>(31 - i);
  EXPECT_EQ(crc32c(b.data(), b.size()), 0x113FDB5Cu);
}

TEST(Crc32c, ContinuesAcrossChunks) {
  const std::string s = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = crc32c(s.data(), s.size());
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    EXPECT_EQ(crc32c(s.data() + cut, s.size() - cut, crc32c(s.data(), cut)), whole) << cut;
  }
}

TEST(Crc32c, Mask) {
  const uint32_t crc = crc32c("123456789", 9);
  EXPECT_EQ(crc32c_masked("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
}

// ---------------------------------------------------------------------------- the file

TEST(EventWriter, NameAndFileVersionRecord) {
  ScratchDir dir;
  std::string path;
  {
    EventWriter w(dir / "run/tb");  // parents are created
    path = w.path();
  }
  const auto names = event_files(dir.path() / "run/tb");
  ASSERT_EQ(names.size(), 1u);
  EXPECT_EQ(fs::path(path).filename().string(), names[0]);
  // events.out.tfevents.<seconds>.<hostname>
  char host[256] = {};
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const std::string prefix = "events.out.tfevents.";
  ASSERT_EQ(names[0].rfind(prefix, 0), 0u) << names[0];
  const std::string rest = names[0].substr(prefix.size());
  const size_t dot = rest.find('.');
  ASSERT_NE(dot, std::string::npos);
  const long long secs = std::stoll(rest.substr(0, dot));
  EXPECT_GT(secs, 1'600'000'000LL);  // after 2020: a Unix time, not a counter
  EXPECT_EQ(rest.substr(dot + 1), host);

  const auto events = read_event_file(path);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  ASSERT_TRUE(events[0].wall_time.has_value());
  EXPECT_NEAR(*events[0].wall_time, static_cast<double>(secs), 2.0);
  EXPECT_FALSE(events[0].step.has_value());
  EXPECT_TRUE(events[0].values.empty());
}

TEST(EventWriter, ScalarsReadBack) {
  ScratchDir dir;
  struct Point {
    std::string tag;
    double value;
    int64_t step;
  };
  std::vector<Point> points;
  for (int64_t s = 0; s < 300; ++s) {
    points.push_back({"train/loss", 10.0 / (1.0 + static_cast<double>(s)), s});
    points.push_back({"train/lr", 1e-3 * static_cast<double>(s % 7), s});
  }
  // Edge values: large and negative steps (10-byte varint), a long UTF-8 tag, non-finite values.
  points.push_back({"val/loss", 3.25, int64_t{1} << 40});
  points.push_back({"val/loss", -0.5, -3});
  points.push_back({std::string(200, 'x') + "/λ", 1e30, 7});
  points.push_back({"nan", std::numeric_limits<double>::quiet_NaN(), 1});
  points.push_back({"inf", -std::numeric_limits<double>::infinity(), 1});

  std::string path;
  {
    EventWriter w(dir.path().string());
    path = w.path();
    for (const auto& p : points) w.add_scalar(p.tag, p.value, p.step);
    w.flush();
    // After flush() everything is in the file (TensorBoard can show it while the run goes on).
    EXPECT_EQ(read_event_file(path).size(), points.size() + 1);
    w.add_scalar("after_flush", 1.0, 0);
  }  // the destructor writes the last point
  const auto events = read_event_file(path);
  ASSERT_EQ(events.size(), points.size() + 2);
  for (size_t i = 0; i < points.size(); ++i) {
    const auto& e = events[i + 1];
    SCOPED_TRACE("point " + std::to_string(i));
    ASSERT_EQ(e.values.size(), 1u);
    EXPECT_FALSE(e.file_version.has_value());
    EXPECT_EQ(e.step, points[i].step);
    EXPECT_EQ(e.values[0].tag, points[i].tag);
    const float want = static_cast<float>(points[i].value);  // stored as float, by design
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(e.values[0].value));
    } else {
      EXPECT_EQ(e.values[0].value, want);
    }
    ASSERT_TRUE(e.wall_time.has_value());
    EXPECT_GE(*e.wall_time, *events[0].wall_time);
  }
  EXPECT_EQ(events.back().values.at(0).tag, "after_flush");
}

TEST(EventWriter, TwoWritersInOneFolderGetTwoFiles) {
  ScratchDir dir;
  EventWriter a(dir.path().string());
  EventWriter b(dir.path().string());
  a.add_scalar("a", 1, 1);
  b.add_scalar("b", 2, 1);
  a.flush();
  b.flush();
  EXPECT_NE(a.path(), b.path());
  EXPECT_EQ(event_files(dir.path()).size(), 2u);
  EXPECT_EQ(read_event_file(a.path()).back().values.at(0).tag, "a");
  EXPECT_EQ(read_event_file(b.path()).back().values.at(0).tag, "b");
}

// ---------------------------------------------------------------------------- errors

TEST(EventWriter, FolderThatCannotBeCreated) {
  ScratchDir dir;
  std::ofstream(dir / "file") << "x";
  for (const std::string& bad : {dir / "file", dir / "file/sub"}) {
    try {
      EventWriter w(bad);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("cannot create"), std::string::npos) << e.what();
    }
  }
}

// A failing write (here: the file-size limit, which fails write(2) with EFBIG just as a full
// disk fails it with ENOSPC) throws naming the event file; the limit is restored afterwards.
TEST(EventWriter, WriteFailureNamesTheFile) {
  ScratchDir dir;
  EventWriter w(dir.path().string());
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);  // else the kernel kills the process
  struct rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    for (int i = 0; i < 1000; ++i) w.add_scalar("train/loss", 1.0, i);  // ~40 KB
    w.flush();
  } catch (const std::runtime_error& e) {
    message = e.what();
  }
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find(w.path()), std::string::npos) << message;
  EXPECT_NE(message.find("write failed"), std::string::npos) << message;
  // What was written before the limit is still readable up to the torn record.
  EXPECT_LE(fs::file_size(w.path()), 4096u);
}
