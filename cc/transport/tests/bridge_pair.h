// Two Bridge instances in one process, wired with socketpairs (and shm
// rings), for the transport tests.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cc/transport/bridge.h"

// gmock is not on every CI image; this is the one matcher we need.
#define EXPECT_CONTAINS(text, part)                                        \
  do {                                                                     \
    const std::string contains_text_ = (text);                             \
    EXPECT_NE(contains_text_.find(part), std::string::npos)                \
        << "expected to find \"" << (part) << "\" in: " << contains_text_; \
  } while (0)

namespace hetjax::testing {

// Small, test-sized options for `rank` of a world of 2.
BridgeOptions TestOptions(int rank);

struct BridgePair {
  std::unique_ptr<Bridge> rank0, rank1;
};

// rank0 and rank1 joined by `streams` socketpairs.
BridgePair ConnectTcp(int streams, BridgeOptions options0,
                      BridgeOptions options1);
inline BridgePair ConnectTcp(int streams) {
  return ConnectTcp(streams, TestOptions(0), TestOptions(1));
}

// Adds shm rings to a connected pair; both sides attach concurrently, the
// second `stagger_ms` after the first. Returns the two segment names.
std::vector<std::string> AttachShm(BridgePair& pair, uint64_t ring_bytes,
                                   int stagger_ms = 0);

// A bridge whose peer 1 is a raw socket end the test writes frames into.
struct RawPeer {
  std::unique_ptr<Bridge> bridge;
  int fd = -1;  // our end; the test closes it
};
RawPeer ConnectRaw(BridgeOptions options);

TensorSpec Spec(DType dtype, std::vector<int64_t> dims);
// Deterministic bytes that differ per seed, so swapped messages show.
std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed);
bool WaitFor(const std::function<bool()>& condition, double seconds);

}  // namespace hetjax::testing
