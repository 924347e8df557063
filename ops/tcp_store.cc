// The TCP key-value store (see tcp_store.h). Requests are [op][key length][key][value length]
// [value][timeout ms]; replies [status][value length][value]. The server runs one thread for
// accepting and one per connection (a group has few ranks); Get blocks on a condition variable
// until the key is set or the request's timeout passes.
#include "ops/tcp_store.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/status.h"

namespace kiln {
namespace {

constexpr char kSet = 'S', kGet = 'G', kDelete = 'D';
constexpr char kOk = 0, kTimedOut = 1;
// The longest key or value a message may carry: larger lengths are refused by the sender and
// end the connection on the server (a stray client cannot make it allocate more).
constexpr uint32_t kMaxBytes = 1u << 30;
// How long a client waits for a reply beyond the request's own timeout (a server host that
// vanished without closing the connection).
constexpr std::chrono::milliseconds kReplyMargin{30000};
constexpr int64_t kMaxTimeoutMs = int64_t{1} << 31;  // ~25 days

// Whole reads and writes; false when the peer closed or the socket failed.
bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool WriteString(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return WriteAll(fd, &n, 4) && WriteAll(fd, s.data(), s.size());
}

bool ReadString(int fd, std::string* s) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, 4) || n > kMaxBytes) return false;
  s->resize(n);
  return ReadAll(fd, s->data(), n);
}

// A socket connected to host:port, or -1.
int Connect(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

class TcpStore::Server {
 public:
  explicit Server(int port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    KILN_CHECK(listen_fd_ >= 0, "TcpStore: socket() failed: ", std::strerror(errno));
    const int one = 1;
    setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(listen_fd_, 128) != 0) {
      const std::string why = std::strerror(errno);
      close(listen_fd_);
      KILN_FAIL("TcpStore: cannot serve on port ", port, ": ", why);
    }
    socklen_t len = sizeof(addr);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    accept_ = std::thread([this] { AcceptLoop(); });
  }

  ~Server() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (int fd : clients_) shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept(); closed after, so its number is not reused
    accept_.join();
    close(listen_fd_);
    for (std::thread& t : handlers_) t.join();
    for (int fd : clients_) close(fd);
  }

  int port() const { return port_; }

 private:
  void AcceptLoop() {
    while (true) {
      const int fd = accept(listen_fd_, nullptr, nullptr);
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) {
        if (fd >= 0) close(fd);
        return;
      }
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      clients_.push_back(fd);
      handlers_.emplace_back([this, fd] {
        try {
          Serve(fd);
        } catch (...) {
          // (bad_alloc): this connection ends; the store and its other clients go on.
        }
      });
    }
  }

  void Serve(int fd) {
    while (true) {
      char op = 0;
      std::string key, value;
      uint32_t timeout_ms = 0;
      if (!ReadAll(fd, &op, 1) || !ReadString(fd, &key) || !ReadString(fd, &value) ||
          !ReadAll(fd, &timeout_ms, 4)) {
        return;
      }
      char status = kOk;
      std::string reply;
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (op == kSet) {
          data_[key] = std::move(value);
          cv_.notify_all();
        } else if (op == kDelete) {
          data_.erase(key);
        } else {
          const bool found = cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                          [&] { return stopping_ || data_.count(key) > 0; });
          if (found && !stopping_) {
            reply = data_[key];
          } else {
            status = kTimedOut;
          }
        }
      }
      if (!WriteAll(fd, &status, 1) || !WriteString(fd, reply)) return;
    }
  }

  int listen_fd_ = -1, port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::vector<int> clients_;
  std::vector<std::thread> handlers_;
  std::thread accept_;
  bool stopping_ = false;
};

TcpStore::TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout)
    : host_(host), port_(port), timeout_(timeout) {
  KILN_CHECK(port >= 0 && port < 65536 && (serve || port > 0) && timeout.count() > 0 &&
                 timeout.count() <= kMaxTimeoutMs,
             "TcpStore: port ", port, " and timeout ", timeout.count(),
             " ms are not usable (ports 0..65535, a client needs the server's port; timeouts 1..",
             kMaxTimeoutMs, " ms)");
  if (serve) {
    server_ = std::make_unique<Server>(port);
    port_ = server_->port();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while ((fd_ = Connect(host_, port_)) < 0) {
    KILN_CHECK(std::chrono::steady_clock::now() < deadline, "TcpStore: could not reach ", host_,
               ":", port_, " within ", timeout.count(), " ms (is rank 0 running?)");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) close(fd_);
}

int TcpStore::port() const { return port_; }

std::string TcpStore::Request(char op, const std::string& key, const std::string& value,
                              std::chrono::milliseconds timeout) {
  KILN_CHECK(timeout.count() >= 0 && timeout.count() <= kMaxTimeoutMs, "TcpStore: a timeout of ",
             timeout.count(), " ms for key '", key, "' is not in 0..", kMaxTimeoutMs);
  KILN_CHECK(key.size() <= kMaxBytes && value.size() <= kMaxBytes, "TcpStore: key '",
             key.substr(0, 64), "' with a value of ", value.size(), " bytes: at most ", kMaxBytes,
             " bytes each");
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t ms = static_cast<uint32_t>(timeout.count());
  const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(timeout + kReplyMargin);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(wait.count() / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(wait.count() % 1000000);
  setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char status = kOk;
  std::string reply;
  const bool ok = WriteAll(fd_, &op, 1) && WriteString(fd_, key) && WriteString(fd_, value) &&
                  WriteAll(fd_, &ms, 4) && ReadAll(fd_, &status, 1) && ReadString(fd_, &reply);
  KILN_CHECK(ok, "TcpStore: the connection to ", host_, ":", port_,
             " broke or gave no reply (the serving process, rank 0, exited or its host is gone?)");
  if (status == kTimedOut) {
    throw Error(absl::DeadlineExceededError(
        absl::StrCat("TcpStore: key '", key, "' was not set within ", timeout.count(), " ms")));
  }
  return reply;
}

void TcpStore::Set(const std::string& key, const std::string& value) {
  Request(kSet, key, value, timeout_);
}

std::string TcpStore::Get(const std::string& key) { return Get(key, timeout_); }

std::string TcpStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  return Request(kGet, key, "", timeout);
}

void TcpStore::Delete(const std::string& key) { Request(kDelete, key, "", timeout_); }

}  // namespace kiln
