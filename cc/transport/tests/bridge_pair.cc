#include "cc/transport/tests/bridge_pair.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <thread>

#include "gtest/gtest.h"

namespace hetjax::testing {

BridgeOptions TestOptions(int rank) {
  BridgeOptions options;
  options.rank = rank;
  options.world_size = 2;
  options.timeout_seconds = 10;
  options.unexpected_limit_bytes = 16 << 20;
  options.max_message_bytes = 256 << 20;
  options.chunk_bytes = 64 << 10;
  options.eager_limit_bytes = 16 << 10;
  return options;
}

BridgePair ConnectTcp(int streams, BridgeOptions options0,
                      BridgeOptions options1) {
  BridgePair pair;
  pair.rank0 = Bridge::Create(options0);
  pair.rank1 = Bridge::Create(options1);
  std::vector<int> ends0, ends1;
  for (int i = 0; i < streams; ++i) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    ends0.push_back(fds[0]);
    ends1.push_back(fds[1]);
  }
  EXPECT_TRUE(pair.rank0->AddTcpPeer(1, ends0).ok());
  EXPECT_TRUE(pair.rank1->AddTcpPeer(0, ends1).ok());
  return pair;
}

std::vector<std::string> AttachShm(BridgePair& pair, uint64_t ring_bytes,
                                   int stagger_ms) {
  static int counter = 0;
  std::string base = "/hetjax-test-" + std::to_string(::getpid()) + "-" +
                     std::to_string(counter++);
  std::string to1 = base + "-0to1", to0 = base + "-1to0";
  Status status0, status1;
  std::thread side0(
      [&] { status0 = pair.rank0->AddShmPeer(1, to1, to0, ring_bytes); });
  std::this_thread::sleep_for(std::chrono::milliseconds(stagger_ms));
  status1 = pair.rank1->AddShmPeer(0, to0, to1, ring_bytes);
  side0.join();
  EXPECT_TRUE(status0.ok()) << status0.message();
  EXPECT_TRUE(status1.ok()) << status1.message();
  return {to1, to0};
}

RawPeer ConnectRaw(BridgeOptions options) {
  RawPeer raw;
  raw.bridge = Bridge::Create(options);
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  EXPECT_TRUE(raw.bridge->AddTcpPeer(1, {fds[0]}).ok());
  raw.fd = fds[1];
  return raw;
}

TensorSpec Spec(DType dtype, std::vector<int64_t> dims) {
  return MakeSpec(dtype, dims);
}

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : out) {
    x = x * 1664525u + 1013904223u;
    b = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

bool WaitFor(const std::function<bool()>& condition, double seconds) {
  auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return condition();
}

}  // namespace hetjax::testing
