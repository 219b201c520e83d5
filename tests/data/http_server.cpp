// tests/data/http_server.cpp — see http_server.h.
#include "http_server.h"

#include <arpa/inet.h>
#include <chrono>
#include <netinet/in.h>
#include <poll.h>
#include <stdexcept>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dion::test {

TestHttpServer::TestHttpServer(double lifetime_s) : lifetime_s_(lifetime_s) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw std::runtime_error("test server: socket() failed");
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // 127.0.0.1 only
  addr.sin_port = 0;                              // ephemeral
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(listen_fd_, 16) != 0) {
    ::close(listen_fd_);
    throw std::runtime_error("test server: bind/listen on 127.0.0.1 failed");
  }
  socklen_t len = sizeof(addr);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

TestHttpServer::~TestHttpServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

std::string TestHttpServer::base_url() const { return "http://127.0.0.1:" + std::to_string(port_); }

void TestHttpServer::add_file(const std::string& path, std::string content, Rules rules) {
  std::lock_guard<std::mutex> lock(mu_);
  files_[path] = {std::move(content), rules};
}

void TestHttpServer::add_redirect(const std::string& from, const std::string& to) {
  std::lock_guard<std::mutex> lock(mu_);
  redirects_[from] = to;
}

std::vector<TestHttpServer::Request> TestHttpServer::requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

void TestHttpServer::serve() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(lifetime_s_);
  while (!stop_ && std::chrono::steady_clock::now() < deadline) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{5, 0};  // a stuck client cannot hold the server
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    handle(fd);
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
}

namespace {
bool send_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}
}  // namespace

void TestHttpServer::handle(int fd) {
  std::string req;
  char buf[4096];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 65536) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return;
    req.append(buf, static_cast<size_t>(n));
  }
  Request r;
  const size_t sp1 = req.find(' '), sp2 = req.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) return;
  r.path = req.substr(sp1 + 1, sp2 - sp1 - 1);
  for (size_t pos = req.find("\r\n"); pos != std::string::npos && pos + 2 < req.size();) {
    const size_t end = req.find("\r\n", pos + 2);
    const std::string line = req.substr(pos + 2, end - pos - 2);
    long long start = -1;
    if (line.size() > 6 && strncasecmp(line.c_str(), "range:", 6) == 0 &&
        std::sscanf(line.c_str() + 6, " bytes=%lld-", &start) == 1) {
      r.range_start = start;
    }
    if (line.size() > 9 && strncasecmp(line.c_str(), "if-range:", 9) == 0) {
      r.if_range = line.substr(line.find_first_not_of(' ', 9));
    }
    pos = end;
  }

  std::string head, body;
  int64_t cut = -1;
  int trickle_ms = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto redirect = redirects_.find(r.path);
    auto file = files_.find(r.path);
    if (redirect != redirects_.end()) {
      r.status = 302;
      head = "HTTP/1.1 302 Found\r\nLocation: " + redirect->second + "\r\nContent-Length: 0\r\n";
    } else if (file == files_.end()) {
      r.status = 404;
      body = "no such file\n";
      head = "HTTP/1.1 404 Not Found\r\n";
    } else {
      const std::string& content = file->second.first;
      Rules& rules = file->second.second;
      const auto size = static_cast<int64_t>(content.size());
      std::string extra;  // validators and padding, added to every answer for this file
      if (!rules.etag.empty()) extra += "ETag: " + rules.etag + "\r\n";
      if (!rules.last_modified.empty()) extra += "Last-Modified: " + rules.last_modified + "\r\n";
      if (rules.one_header_line) {
        extra += "X-Padding: " + std::string(rules.header_padding, 'p') + "\r\n";
      } else {
        for (size_t i = 0; i < rules.header_padding; i += 1000)
          extra += "X-Padding-" + std::to_string(i) + ": " + std::string(980, 'p') + "\r\n";
      }
      trickle_ms = rules.trickle_ms;
      int64_t range = r.range_start;  // what is served (the log keeps what was asked)
      // If-Range: the range only if the validator still matches the file.
      if (!r.if_range.empty() && r.if_range != rules.etag && r.if_range != rules.last_modified) range = -1;
      if (rules.fail_times > 0) {
        --rules.fail_times;
        r.status = rules.fail_status;
        body = "try again later\n";
        head = "HTTP/1.1 " + std::to_string(r.status) + " Failing On Purpose\r\n";
      } else if (range >= 0 && !rules.ignore_range && range >= size) {
        r.status = 416;
        head = "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */" + std::to_string(size) + "\r\n";
      } else {
        int64_t start = range >= 0 && !rules.ignore_range ? range : 0;
        if (start > 0 && rules.wrong_range) start = 0;
        if (range >= 0 && !rules.ignore_range) {
          r.status = 206;
          head = "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(start) + "-" +
                 std::to_string(size - 1) + "/" + std::to_string(size) + "\r\n";
        } else {
          r.status = 200;
          head = "HTTP/1.1 200 OK\r\n";
        }
        head += extra;
        body = content.substr(static_cast<size_t>(start));
        if (rules.cut_times > 0) {
          --rules.cut_times;
          cut = rules.cut_after;
        }
      }
    }
    log_.push_back(r);
  }
  if (r.status != 302) head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  head += "Connection: close\r\n\r\n";
  if (!send_all(fd, head.data(), head.size())) return;
  const size_t n = cut >= 0 ? std::min(body.size(), static_cast<size_t>(cut)) : body.size();
  if (trickle_ms <= 0) {
    send_all(fd, body.data(), n);
    return;
  }
  for (size_t i = 0; i < n && !stop_; ++i) {  // until the client gives up (send fails)
    if (!send_all(fd, body.data() + i, 1)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(trickle_ms));
  }
}

}  // namespace dion::test
