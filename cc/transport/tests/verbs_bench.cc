// A gauge, not a test: bandwidth of the bridge over one verbs queue pair
// between two bridges of this process, for bench/bench_verbs.py to set
// beside ib_write_bw in the same guest.
//   verbs_bench DEVICE MESSAGE_BYTES COUNT   -> one JSON line
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"

using namespace hetjax;

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DEVICE MESSAGE_BYTES COUNT\n", argv[0]);
    return 2;
  }
  const std::string device = argv[1];
  const int64_t bytes = std::atoll(argv[2]);
  const int count = std::atoi(argv[3]);
  BridgeOptions o0 = testing::TestOptions(0), o1 = testing::TestOptions(1);
  for (BridgeOptions* o : {&o0, &o1}) {
    o->chunk_bytes = 4 << 20;
    o->timeout_seconds = 60;
  }
  auto pair = testing::ConnectTcp(1, o0, o1);
  VerbsLinkOptions verbs;
  verbs.devices = {device};
  std::string ep0, ep1;
  Status s = pair.rank0->PrepareVerbsPeer(1, verbs, &ep0);
  if (s.ok()) s = pair.rank1->PrepareVerbsPeer(0, verbs, &ep1);
  if (s.ok()) s = pair.rank0->ConnectVerbsPeer(1, ep1);
  if (s.ok()) s = pair.rank1->ConnectVerbsPeer(0, ep0);
  if (!s.ok()) {
    std::fprintf(stderr, "verbs set-up failed: %s\n", s.message().c_str());
    return 1;
  }
  const TensorSpec spec = testing::Spec(DType::kU8, {bytes});
  std::vector<uint8_t> src = testing::Pattern(bytes, 1), dst(bytes);
  auto run = [&](int n) {
    std::thread sender([&] {
      for (int i = 0; i < n; ++i) pair.rank0->Send(1, i, spec, src.data());
    });
    for (int i = 0; i < n; ++i) {
      Status r = pair.rank1->Recv(0, i, spec, dst.data());
      if (!r.ok()) {
        std::fprintf(stderr, "recv failed: %s\n", r.message().c_str());
        std::exit(1);
      }
    }
    sender.join();
  };
  run(2);  // warm-up: first-touch of rings and buffers
  auto start = std::chrono::steady_clock::now();
  run(count);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  std::printf(
      "{\"device\": \"%s\", \"message_bytes\": %lld, \"count\": %d, "
      "\"seconds\": %.3f, \"mb_per_s\": %.2f}\n",
      device.c_str(), static_cast<long long>(bytes), count, seconds,
      bytes * static_cast<double>(count) / seconds / 1e6);
  return 0;
}
