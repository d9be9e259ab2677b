#include "cc/transport/tcp_stream.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

namespace hetjax {
namespace {

// Big buffers let one stream keep a fast link busy across the I/O
// threads' scheduling gaps.
constexpr int kSocketBufferBytes = 8 << 20;

// Setting SO_RCVBUF/SO_SNDBUF turns off Linux's buffer autotuning, and the
// value is capped at net.core.{r,w}mem_max (often only 208 KiB). So we set a
// size only where the cap lets it beat what autotuning would reach.
bool KernelAllows(const char* sysctl_path, long bytes) {
  FILE* f = std::fopen(sysctl_path, "r");
  if (f == nullptr) return false;
  long cap = 0;
  bool ok = std::fscanf(f, "%ld", &cap) == 1 && cap >= bytes;
  std::fclose(f);
  return ok;
}

class TcpStream final : public ByteStream {
 public:
  explicit TcpStream(int fd) : fd_(fd) {}
  ~TcpStream() override { ::close(fd_); }

  Status ReadSome(void* dst, size_t max, int wait_ms, size_t* got) override {
    *got = 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      ssize_t n = ::recv(fd_, dst, max, MSG_DONTWAIT);
      if (n > 0) {
        *got = static_cast<size_t>(n);
        return Status::Ok();
      }
      if (n == 0) return Lost("connection closed by the peer");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Lost(std::string("recv failed: ") + std::strerror(errno));
      }
      if (attempt == 0 && !Wait(POLLIN, wait_ms)) return ShutdownOr();
    }
    return ShutdownOr();
  }

  Status WriteSome(const void* src, size_t len, int wait_ms,
                   size_t* put) override {
    *put = 0;
    for (int attempt = 0; attempt < 2; ++attempt) {
      ssize_t n = ::send(fd_, src, len, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n >= 0) {
        *put = static_cast<size_t>(n);
        return Status::Ok();
      }
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Lost(std::string("send failed: ") + std::strerror(errno));
      }
      if (attempt == 0 && !Wait(POLLOUT, wait_ms)) return ShutdownOr();
    }
    return ShutdownOr();
  }

  void Shutdown() override {
    shut_down_.store(true);
    ::shutdown(fd_, SHUT_RDWR);
  }

  std::string Describe() const override {
    return "tcp fd " + std::to_string(fd_);
  }

 private:
  // False when the wait ran out without the event.
  bool Wait(short events, int wait_ms) {
    pollfd p{fd_, events, 0};
    int n = ::poll(&p, 1, wait_ms);
    return n > 0;
  }
  Status ShutdownOr() {
    if (shut_down_.load()) {
      return Status(StatusCode::kAborted, Describe() + " was shut down");
    }
    return Status::Ok();
  }
  Status Lost(const std::string& why) {
    if (shut_down_.load()) {
      return Status(StatusCode::kAborted, Describe() + " was shut down");
    }
    return Status(StatusCode::kPeerLost, Describe() + ": " + why);
  }

  const int fd_;
  std::atomic<bool> shut_down_{false};
};

}  // namespace

Status MakeTcpStream(int fd, std::unique_ptr<ByteStream>* stream) {
  auto owned = std::make_unique<TcpStream>(fd);  // closes fd on every path
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Status(StatusCode::kInvalidArgument,
                  "fd " + std::to_string(fd) +
                      " is not a usable socket: " + std::strerror(errno));
  }
  int type = 0;
  socklen_t type_len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) != 0 ||
      type != SOCK_STREAM) {
    return Status(StatusCode::kInvalidArgument,
                  "fd " + std::to_string(fd) + " is not a stream socket");
  }
  int one = 1;
  // Fails harmlessly on AF_UNIX socketpairs (tests).
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int bytes = kSocketBufferBytes;
  if (KernelAllows("/proc/sys/net/core/wmem_max", bytes)) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  if (KernelAllows("/proc/sys/net/core/rmem_max", bytes)) {
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
  *stream = std::move(owned);
  return Status::Ok();
}

}  // namespace hetjax
