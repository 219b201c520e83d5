// tests/data/http_server.h — a tiny HTTP/1.1 file server on 127.0.0.1 for the download
// tests: serves in-memory files, honours "Range: bytes=N-" and If-Range (ETag or
// Last-Modified), and can misbehave on purpose (cut the connection mid-body, fail with a status,
// ignore Range, answer the wrong range, redirect, trickle the body, send huge headers).
//
// One thread accepts and answers one request per connection ("Connection: close"). It binds an
// ephemeral port on loopback only, and stops by itself after `lifetime_s` even if the test
// forgets it. Not a general server: GET only, no keep-alive, no chunked bodies.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dion::test {

class TestHttpServer {
 public:
  struct Rules {
    int64_t cut_after = -1;        // send only this many body bytes, then close ...
    int cut_times = 0;             // ... for this many requests
    int fail_status = 0;           // answer this status (e.g. 503) ...
    int fail_times = 0;            // ... for this many requests
    bool ignore_range = false;     // always 200 + the whole file
    bool wrong_range = false;      // answer a Range request with 206 for bytes 0-
    std::string etag{};            // sent as ETag; an If-Range that differs gets 200 + everything
    std::string last_modified{};   // sent as Last-Modified (also matched by If-Range)
    int trickle_ms = 0;            // > 0: send the body one byte per this many milliseconds
    size_t header_padding = 0;     // extra header bytes, in lines of 1000 ...
    bool one_header_line = false;  // ... or as one line
  };
  struct Request {
    std::string path;
    int64_t range_start = -1;  // -1: no Range header
    std::string if_range;      // "" = none
    int status = 0;
  };

  explicit TestHttpServer(double lifetime_s = 120);
  ~TestHttpServer();
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  std::string base_url() const;  // "http://127.0.0.1:<port>"
  void add_file(const std::string& path, std::string content, Rules rules);
  void add_file(const std::string& path, std::string content) { add_file(path, std::move(content), Rules()); }
  void add_redirect(const std::string& from, const std::string& to);  // 302
  std::vector<Request> requests() const;

 private:
  void serve();
  void handle(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  double lifetime_s_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::map<std::string, std::pair<std::string, Rules>> files_;
  std::map<std::string, std::string> redirects_;
  std::vector<Request> log_;
};

}  // namespace dion::test
