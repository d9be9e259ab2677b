// Two processes (fork), one bridge each, over socketpairs or shm rings:
// 4 KiB round-trip latency and 64 MiB one-way bandwidth, next to a plain
// single-thread memcpy of the same size. Not a test: a quick local gauge
// (the reference numbers come from the Python benchmark on the GPU hosts).
//   transport_bench [shm|tcp] [streams] [shm ring KiB]
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "cc/transport/bridge.h"

namespace {

using hetjax::Bridge;
using hetjax::BridgeOptions;
using hetjax::DType;
using hetjax::TensorSpec;
using Clock = std::chrono::steady_clock;

TensorSpec Bytes(int64_t n) {
  TensorSpec spec;
  spec.dtype = DType::kU8;
  spec.rank = 1;
  spec.dims[0] = n;
  return spec;
}

void Check(const hetjax::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.message().c_str());
    std::exit(1);
  }
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "shm";
  const int streams = argc > 2 ? std::atoi(argv[2]) : 1;
  const uint64_t ring_bytes =
      argc > 3 ? std::strtoull(argv[3], nullptr, 10) << 10 : 16 << 20;
  constexpr int64_t kSmall = 4096, kLarge = 64 << 20;
  constexpr int kPings = 2000, kBulk = 8;

  std::vector<int> ends0, ends1;
  for (int i = 0; i < streams; ++i) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 1;
    ends0.push_back(fds[0]);
    ends1.push_back(fds[1]);
  }
  const std::string base = "/hetjax-bench-" + std::to_string(::getpid());
  pid_t child = ::fork();
  const int rank = child == 0 ? 1 : 0;
  const int peer = 1 - rank;
  for (int fd : rank == 0 ? ends1 : ends0) ::close(fd);

  BridgeOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.timeout_seconds = 30;
  auto bridge = Bridge::Create(options);
  Check(bridge->AddTcpPeer(peer, rank == 0 ? ends0 : ends1), "AddTcpPeer");
  if (mode == "shm") {
    std::string mine = base + "-" + std::to_string(rank);
    std::string theirs = base + "-" + std::to_string(peer);
    Check(bridge->AddShmPeer(peer, mine, theirs, ring_bytes), "AddShmPeer");
  }

  std::vector<uint8_t> small(kSmall, 1), large(kLarge, 2);
  std::vector<double> rtts;
  for (int i = 0; i < kPings; ++i) {
    auto start = Clock::now();
    if (rank == 0) {
      Check(bridge->Send(peer, 1, Bytes(kSmall), small.data()), "send");
      Check(bridge->Recv(peer, 2, Bytes(kSmall), small.data()), "recv");
      rtts.push_back(Seconds(start) * 1e6);
    } else {
      Check(bridge->Recv(peer, 1, Bytes(kSmall), small.data()), "recv");
      Check(bridge->Send(peer, 2, Bytes(kSmall), small.data()), "send");
    }
  }
  uint8_t ack = 0;
  double bulk_seconds = 0;
  for (int i = 0; i < kBulk + 1; ++i) {  // the first one warms up
    auto start = Clock::now();
    if (rank == 0) {
      Check(bridge->Send(peer, 3, Bytes(kLarge), large.data()), "send");
      Check(bridge->Recv(peer, 4, Bytes(1), &ack), "ack");
      if (i > 0) bulk_seconds += Seconds(start);
    } else {
      Check(bridge->Recv(peer, 3, Bytes(kLarge), large.data()), "recv");
      Check(bridge->Send(peer, 4, Bytes(1), &ack), "ack");
    }
  }
  if (rank == 1) {
    bridge.reset();
    return 0;
  }
  std::vector<uint8_t> copy(kLarge);
  auto start = Clock::now();
  for (int i = 0; i < kBulk; ++i) {
    std::memcpy(copy.data(), large.data(), kLarge);
    large[i] = copy[kLarge - 1 - i];  // keep the copies observable
  }
  double memcpy_gbs = kBulk * double(kLarge) / Seconds(start) / 1e9;
  std::sort(rtts.begin(), rtts.end());
  double gbs = kBulk * double(kLarge) / bulk_seconds / 1e9;
  std::printf(
      "%s streams=%d: 4 KiB round trip median %.1f us (p10 %.1f, p90 %.1f); "
      "64 MiB %.2f GB/s; memcpy %.2f GB/s (%.0f%%)\n",
      mode.c_str(), streams, rtts[rtts.size() / 2], rtts[rtts.size() / 10],
      rtts[rtts.size() * 9 / 10], gbs, memcpy_gbs, 100 * gbs / memcpy_gbs);
  int status = 0;
  ::waitpid(child, &status, 0);
  bridge.reset();
  return 0;
}
