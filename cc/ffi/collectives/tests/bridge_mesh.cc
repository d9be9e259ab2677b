#include "cc/ffi/collectives/tests/bridge_mesh.h"

#include <sys/socket.h>

#include <thread>

#include "gtest/gtest.h"

namespace hetjax::collectives::testing {

std::vector<std::unique_ptr<Bridge>> ConnectMesh(int world_size,
                                                 uint64_t chunk_bytes) {
  std::vector<std::unique_ptr<Bridge>> bridges;
  for (int rank = 0; rank < world_size; ++rank) {
    BridgeOptions options;
    options.rank = rank;
    options.world_size = world_size;
    // A test that hangs fails within this, instead of stalling CI.
    options.timeout_seconds = 10;
    options.unexpected_limit_bytes = 16 << 20;
    options.max_message_bytes = 64 << 20;
    options.chunk_bytes = chunk_bytes;
    options.eager_limit_bytes = 16 << 10;
    Status status;
    bridges.push_back(Bridge::Create(options, &status));
    EXPECT_TRUE(bridges.back() != nullptr) << status.message();
  }
  for (int a = 0; a < world_size; ++a) {
    for (int b = a + 1; b < world_size; ++b) {
      int fds[2];
      EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
      EXPECT_TRUE(bridges[a]->AddTcpPeer(b, {fds[0]}).ok());
      EXPECT_TRUE(bridges[b]->AddTcpPeer(a, {fds[1]}).ok());
    }
  }
  return bridges;
}

void OnEveryRank(int world_size, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) threads.emplace_back(fn, rank);
  for (std::thread& t : threads) t.join();
}

}  // namespace hetjax::collectives::testing
