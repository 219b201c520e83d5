// tests/data/test_download.cpp — the downloader against a local server on 127.0.0.1
// (http_server.h): whole files, resume after a cut connection or from an old .part, servers that
// ignore or botch Range, transient and permanent HTTP errors, bad content, redirects. Backoff
// is shortened to milliseconds; nothing here leaves loopback.
#include <gtest/gtest.h>

#include "dion/data/download.h"
#include "dion/data/error.h"
#include "http_server.h"
#include "test_util.h"

namespace dion::test {
namespace {

namespace fs = std::filesystem;
using data::DataError;

std::string make_shard(size_t tokens, uint16_t seed) {
  std::vector<uint16_t> t(tokens);
  for (size_t i = 0; i < tokens; ++i) t[i] = static_cast<uint16_t>((i * 31 + seed) % 50257);
  return shard_bytes(t);
}

data::DownloadOptions options_for(const TestHttpServer& server, const fs::path& dir) {
  data::DownloadOptions o;
  o.base_url = server.base_url() + "/files/";  // trailing slash is fine
  o.dir = dir;
  o.max_attempts = 4;
  o.backoff_initial_s = 0.01;
  o.backoff_max_s = 0.05;
  o.connect_timeout_s = 5;
  o.stall_timeout_s = 5;
  return o;
}

void expect_contains(const std::string& msg, const std::vector<std::string>& parts) {
  EXPECT_FALSE(msg.empty()) << "expected an error";
  for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
}

std::string download_error(const std::string& name, const data::DownloadOptions& o) {
  try {
    data::download_file(name, o);
  } catch (const DataError& e) {
    return e.what();
  }
  return "";
}

TEST(Download, DatasetsMirrorTheReferenceScripts) {
  const auto& d = data::download_dataset("fineweb10B");
  EXPECT_EQ(d.repo_id, "kjj0/fineweb10B-gpt2");
  EXPECT_EQ(d.train_chunks, 103);
  EXPECT_EQ(data::download_dataset("fineweb100B").train_chunks, 1030);
  const auto& edu = data::download_dataset("finewebedu10B");
  EXPECT_EQ(edu.train_chunks, 99);
  EXPECT_EQ(data::download_file_names(edu, 2),
            (std::vector<std::string>{"finewebedu_val_000000.bin", "finewebedu_train_000001.bin",
                                      "finewebedu_train_000002.bin"}));
  EXPECT_EQ(data::download_default_base_url(d), "https://huggingface.co/datasets/kjj0/fineweb10B-gpt2/resolve/main");
  EXPECT_THROW(data::download_dataset("fineweb1T"), DataError);
  EXPECT_THROW(data::download_file_names(d, 104), DataError);
}

TEST(Download, WholeFilesThenSkipsThem) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(5000, 1), b = make_shard(0, 0);
  server.add_file("/files/fineweb_val_000000.bin", a);
  server.add_file("/files/fineweb_train_000001.bin", b);
  auto o = options_for(server, dir.path());
  int progress_calls = 0;
  o.on_progress = [&](const data::DownloadProgress&) { ++progress_calls; };
  const auto r = data::download_file("fineweb_val_000000.bin", o);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.bytes, static_cast<int64_t>(a.size()));
  EXPECT_EQ(read_file(r.path), a);
  EXPECT_GT(progress_calls, 0);
  EXPECT_EQ(read_file(data::download_file("fineweb_train_000001.bin", o).path), b);
  EXPECT_EQ(list_dir(dir.path()), (std::vector<std::string>{"fineweb_train_000001.bin", "fineweb_val_000000.bin"}));
  // Again: already complete, no request.
  const size_t before = server.requests().size();
  EXPECT_TRUE(data::download_file("fineweb_val_000000.bin", o).already_present);
  EXPECT_EQ(server.requests().size(), before);
}

TEST(Download, ResumesWithRangeAfterTheConnectionIsCut) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(20000, 2);
  server.add_file("/files/x.bin", a, {.cut_after = 12345, .cut_times = 1});
  const auto r = data::download_file("x.bin", options_for(server, dir.path()));
  EXPECT_EQ(read_file(r.path), a);
  EXPECT_EQ(r.attempts, 2);
  const auto log = server.requests();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].range_start, -1);
  EXPECT_EQ(log[1].range_start, 12345);
  EXPECT_EQ(log[1].status, 206);
  EXPECT_FALSE(fs::exists(dir / "x.bin.part"));
}

TEST(Download, ResumesAnOldPartFile) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(3000, 3);
  server.add_file("/files/x.bin", a);
  write_file(dir / "x.bin.part", a.substr(0, 2500));
  write_file(dir / "x.bin.part.validator", "none\n");  // the server sends no ETag
  const auto r = data::download_file("x.bin", options_for(server, dir.path()));
  EXPECT_EQ(read_file(r.path), a);
  EXPECT_EQ(r.resumed_from, 2500);
  EXPECT_EQ(server.requests().at(0).range_start, 2500);
}

TEST(Download, ServerThatIgnoresOrBotchesRangeRestarts) {
  TempDir dir;
  const std::string a = make_shard(3000, 4);
  {
    TestHttpServer server;
    server.add_file("/files/x.bin", a, {.ignore_range = true});
    write_file(dir / "x.bin.part", std::string(2000, 'j'));  // junk, replaced by the 200 body
    EXPECT_EQ(read_file(data::download_file("x.bin", options_for(server, dir.path())).path), a);
  }
  fs::remove(dir / "x.bin");
  {
    TestHttpServer server;
    server.add_file("/files/x.bin", a, {.wrong_range = true});
    write_file(dir / "x.bin.part", a.substr(0, 1000));
    write_file(dir / "x.bin.part.validator", "none\n");
    const auto r = data::download_file("x.bin", options_for(server, dir.path()));
    EXPECT_EQ(read_file(r.path), a);
    EXPECT_EQ(r.attempts, 2);  // the mismatched 206 is dropped, then a fresh start
  }
  fs::remove(dir / "x.bin");
  {
    TestHttpServer server;  // .part longer than the file: 416, then a fresh start
    server.add_file("/files/x.bin", a);
    write_file(dir / "x.bin.part", a + "extra");
    write_file(dir / "x.bin.part.validator", "none\n");
    EXPECT_EQ(read_file(data::download_file("x.bin", options_for(server, dir.path())).path), a);
    EXPECT_EQ(server.requests().at(0).status, 416);
  }
}

TEST(Download, TransientErrorsAreRetriedPermanentOnesAreNot) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(100, 5);
  server.add_file("/files/busy.bin", a, {.fail_status = 503, .fail_times = 2});
  const auto o = options_for(server, dir.path());
  const auto r = data::download_file("busy.bin", o);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(read_file(r.path), a);

  const std::string msg = download_error("missing.bin", o);
  EXPECT_NE(msg.find("HTTP 404"), std::string::npos) << msg;
  EXPECT_NE(msg.find(server.base_url() + "/files/missing.bin"), std::string::npos) << msg;
  size_t tries = 0;
  for (const auto& req : server.requests()) tries += req.path == "/files/missing.bin";
  EXPECT_EQ(tries, 1u);
  EXPECT_FALSE(fs::exists(dir / "missing.bin"));
  EXPECT_FALSE(fs::exists(dir / "missing.bin.part"));
}

TEST(Download, GivesUpAfterMaxAttemptsAndKeepsThePart) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(50000, 6);
  server.add_file("/files/flaky.bin", a, {.cut_after = 1000, .cut_times = 100});
  auto o = options_for(server, dir.path());
  o.max_attempts = 3;
  const std::string msg = download_error("flaky.bin", o);
  EXPECT_NE(msg.find("gave up after 3 attempts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("run again to resume"), std::string::npos) << msg;
  EXPECT_EQ(server.requests().size(), 3u);
  EXPECT_FALSE(fs::exists(dir / "flaky.bin"));
  EXPECT_EQ(fs::file_size(dir / "flaky.bin.part"), 3000u);  // three resumed pieces
}

TEST(Download, BadContentIsRemovedAndReported) {
  TestHttpServer server;
  TempDir dir;
  std::string wrong_count = make_shard(100, 7);
  wrong_count[8] = 101;  // header says 101 tokens, body has 100
  server.add_file("/files/badmagic.bin", shard_bytes({1, 2, 3}, 777));
  server.add_file("/files/wrongcount.bin", wrong_count);
  server.add_file("/files/page.bin", "<html>not a shard</html>");
  const auto o = options_for(server, dir.path());
  for (const auto& [name, expect] : std::vector<std::pair<std::string, std::string>>{
           {"badmagic.bin", "bad magic 777"}, {"wrongcount.bin", "101 tokens"}, {"page.bin", "truncated"}}) {
    const std::string msg = download_error(name, o);
    EXPECT_NE(msg.find("not a valid shard"), std::string::npos) << msg;
    EXPECT_NE(msg.find(expect), std::string::npos) << msg;
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
  }
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(Download, ExistingCorruptFileIsNotOverwritten) {
  TestHttpServer server;
  TempDir dir;
  write_file(dir / "x.bin", "garbage");
  const std::string msg = download_error("x.bin", options_for(server, dir.path()));
  EXPECT_NE(msg.find("delete it"), std::string::npos) << msg;
  EXPECT_TRUE(server.requests().empty());
  EXPECT_EQ(read_file(dir / "x.bin"), "garbage");
}

TEST(Download, FollowsRedirects) {
  TestHttpServer server;
  TempDir dir;
  const std::string a = make_shard(700, 8);
  server.add_redirect("/files/x.bin", "/cdn/blob-123");
  server.add_file("/cdn/blob-123", a, {.cut_after = 500, .cut_times = 1});
  const auto r = data::download_file("x.bin", options_for(server, dir.path()));
  EXPECT_EQ(read_file(r.path), a);
  EXPECT_EQ(r.attempts, 2);
}

TEST(Download, UnreachableServerFailsBounded) {
  TempDir dir;
  int port = 0;
  {
    TestHttpServer closed;  // take a free port, then close it
    port = std::stoi(closed.base_url().substr(closed.base_url().rfind(':') + 1));
  }
  data::DownloadOptions o;
  o.base_url = "http://127.0.0.1:" + std::to_string(port);
  o.dir = dir.path();
  o.max_attempts = 2;
  o.backoff_initial_s = 0.01;
  const std::string msg = download_error("x.bin", o);
  EXPECT_NE(msg.find("gave up after 2 attempts"), std::string::npos) << msg;
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

// ---------------------------------------------------------------------------- hostile input

TEST(Download, TricklingServerIsAbortedAndRetried) {
  TestHttpServer server;
  TempDir dir;
  server.add_file("/files/slow.bin", make_shard(2000, 9), {.trickle_ms = 100});  // 10 B/s
  auto o = options_for(server, dir.path());
  o.max_attempts = 2;
  o.min_speed_bytes_per_s = 1000;
  o.stall_timeout_s = 1;
  const std::string msg = download_error("slow.bin", o);
  expect_contains(msg, {"gave up after 2 attempts", "too slow"});
  EXPECT_EQ(server.requests().size(), 2u);
}

TEST(Download, DeadlineBoundsTheWholeFile) {
  TestHttpServer server;
  TempDir dir;
  server.add_file("/files/slow.bin", make_shard(2000, 9), {.trickle_ms = 20});  // 50 B/s
  auto o = options_for(server, dir.path());
  o.min_speed_bytes_per_s = 1;  // fast enough for the low-speed limit: only the deadline stops it
  o.deadline_s = 1.5;
  const std::string msg = download_error("slow.bin", o);
  expect_contains(msg, {"slow.bin", "deadline of 1.5 s"});
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(Download, BodyPastTheSizeInItsHeaderIsRefused) {
  TestHttpServer server;
  TempDir dir;
  const std::string shard = make_shard(100, 10);  // 1224 bytes
  server.add_file("/files/long.bin", shard + std::string(4 << 20, 'z'));
  const std::string msg = download_error("long.bin", options_for(server, dir.path()));
  expect_contains(msg, {"more than the 1224 bytes its shard header allows", "removed"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
  EXPECT_EQ(server.requests().size(), 1u);  // not retried
}

TEST(Download, StalePartOfAnotherVersionIsNotResumed) {
  const std::string old_file = make_shard(3000, 11), new_file = make_shard(3000, 12);
  ASSERT_EQ(old_file.substr(0, 1024), new_file.substr(0, 1024));  // same header, other body
  {  // ETag: the .part was begun from "v1", the server now has "v2": If-Range gets a 200.
    TestHttpServer server;
    TempDir dir;
    server.add_file("/files/x.bin", new_file, {.etag = "\"v2\""});
    write_file(dir / "x.bin.part", old_file.substr(0, 4000));
    write_file(dir / "x.bin.part.validator", "etag \"v1\"\n");
    const auto r = data::download_file("x.bin", options_for(server, dir.path()));
    EXPECT_EQ(read_file(r.path), new_file);
    ASSERT_EQ(server.requests().size(), 1u);
    EXPECT_EQ(server.requests()[0].if_range, "\"v1\"");
    EXPECT_EQ(server.requests()[0].status, 200);
    EXPECT_EQ(list_dir(dir.path()), std::vector<std::string>{"x.bin"});
  }
  {  // Last-Modified, the same.
    TestHttpServer server;
    TempDir dir;
    server.add_file("/files/x.bin", new_file, {.last_modified = "Tue, 02 Jan 2024 00:00:00 GMT"});
    write_file(dir / "x.bin.part", old_file.substr(0, 4000));
    write_file(dir / "x.bin.part.validator", "last-modified Mon, 01 Jan 2024 00:00:00 GMT\n");
    EXPECT_EQ(read_file(data::download_file("x.bin", options_for(server, dir.path())).path), new_file);
  }
  {  // A .part with no record of its version is not trusted: no Range at all.
    TestHttpServer server;
    TempDir dir;
    server.add_file("/files/x.bin", new_file);
    write_file(dir / "x.bin.part", old_file.substr(0, 4000));
    EXPECT_EQ(read_file(data::download_file("x.bin", options_for(server, dir.path())).path), new_file);
    EXPECT_EQ(server.requests().at(0).range_start, -1);
  }
  {  // The same version resumes: the cut transfer continues with If-Range = its ETag.
    TestHttpServer server;
    TempDir dir;
    server.add_file("/files/x.bin", new_file, {.cut_after = 2500, .cut_times = 1, .etag = "\"v2\""});
    const auto r = data::download_file("x.bin", options_for(server, dir.path()));
    EXPECT_EQ(read_file(r.path), new_file);
    const auto log = server.requests();
    ASSERT_EQ(log.size(), 2u);
    EXPECT_EQ(log[1].if_range, "\"v2\"");
    EXPECT_EQ(log[1].range_start, 2500);
    EXPECT_EQ(log[1].status, 206);
  }
}

TEST(Download, RedirectLoopFailsAtOnce) {
  TestHttpServer server;
  TempDir dir;
  server.add_redirect("/files/loop.bin", "/files/loop.bin");
  const std::string msg = download_error("loop.bin", options_for(server, dir.path()));
  expect_contains(msg, {"redirect loop", "loop.bin"});
  EXPECT_EQ(server.requests().size(), 11u);  // one attempt: the request and 10 redirects
}

TEST(Download, HugeResponseHeadersAreAClearError) {
  TestHttpServer server;
  TempDir dir;
  server.add_file("/files/many.bin", make_shard(10, 1), {.header_padding = 200000});
  server.add_file("/files/long.bin", make_shard(10, 1), {.header_padding = 200000, .one_header_line = true});
  const auto o = options_for(server, dir.path());
  expect_contains(download_error("many.bin", o), {"response headers", "larger than 64 kB"});
  expect_contains(download_error("long.bin", o), {"header line longer than libcurl's 100 kB"});
  EXPECT_EQ(server.requests().size(), 2u);  // neither retried
}

TEST(Download, EmptyBodyIsAClearError) {
  TestHttpServer server;
  TempDir dir;
  server.add_file("/files/empty.bin", "");
  const std::string msg = download_error("empty.bin", options_for(server, dir.path()));
  expect_contains(msg, {"empty file (HTTP 200, 0 bytes)", "--base-url"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

TEST(Download, TokensOutsideTheVocabularyAreRefused) {
  TestHttpServer server;
  TempDir dir;
  server.add_file("/files/vocab.bin", shard_bytes({50256, 1, 60000}));
  const std::string msg = download_error("vocab.bin", options_for(server, dir.path()));
  expect_contains(msg, {"not a valid shard", "token 60000 at index 2", "< 50257"});
  EXPECT_TRUE(list_dir(dir.path()).empty());
}

}  // namespace
}  // namespace dion::test
