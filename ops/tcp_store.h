// A small key-value store over TCP (torch.distributed's TCPStore, its few calls kiln needs): the
// rendezvous of one-process-per-rank groups (InitProcessGroup in distributed.h) and the exchange
// the CPU backend's collectives use. Rank 0's process serves it; every rank (rank 0 included)
// talks to it through a client connection.
//
//   TcpStore store("127.0.0.1", 29500, /*serve=*/rank == 0, std::chrono::seconds(30));
//   store.Set("nccl_id", bytes);
//   std::string id = store.Get("nccl_id");   // waits until some rank has set it
//
// Get waits up to the store's timeout and then throws kiln::Error naming the key; a client that
// cannot reach the server within the timeout throws naming the address. Values are bytes. Thread
// safe (one request at a time per store object).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

namespace kiln {

class TcpStore {
 public:
  // serve: also run the server, listening on `port` (0: any free port; port() says which).
  TcpStore(const std::string& host, int port, bool serve, std::chrono::milliseconds timeout);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  int port() const;
  std::chrono::milliseconds timeout() const { return timeout_; }
  void Set(const std::string& key, const std::string& value);
  // The value of `key`, waiting until it is set (at most `timeout`, default the store's).
  std::string Get(const std::string& key);
  std::string Get(const std::string& key, std::chrono::milliseconds timeout);
  void Delete(const std::string& key);

 private:
  class Server;
  std::string Request(char op, const std::string& key, const std::string& value,
                      std::chrono::milliseconds timeout);

  std::unique_ptr<Server> server_;
  std::string host_;
  int port_ = 0;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;
  std::mutex mu_;  // one request at a time on fd_
};

}  // namespace kiln
