// The GPU channel collectives on the host device: members in one process
// (a bridge, a thread and a set of slot channels each), over both channel
// paths, and with members on "other hosts" (no slot channel between them:
// their messages go as staged bridge messages), against the host
// algorithms run on the same inputs. On the host
// device streams run inline, so this checks the schedule: every message is
// sent and received in an order no member waits forever on, and the results
// equal the host path's bitwise (same ring schedule, same operand order,
// same rounding); the ordered all-reduce also equals a sequential
// island-order reduction written out here. Pieces are made tiny so even
// small payloads pipeline.
#include "cc/ffi/collectives/channel_collective.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cc/ffi/collectives/collective_tuning.h"
#include "cc/ffi/collectives/tests/bridge_mesh.h"
#include "gtest/gtest.h"

namespace hetjax::collectives {
namespace {

using testing::ConnectMesh;
using testing::OnEveryRank;

constexpr uint64_t kBase =
    kCollectiveTagBit | (uint64_t{9} << 52) | (uint64_t{1} << 32);
constexpr uint64_t kPieceBytes = 4096;

// Small pieces, so that every test's messages take several: before any
// test runs.
const bool kPiecesSet = [] {
  CollectiveTuning tuning;
  tuning.piece_bytes = kPieceBytes;
  SetCollectiveTuning(tuning);
  return true;
}();

// Where the members live: a slot channel joins two members of one host.
enum class Hosts {
  kOne,        // every pair has a slot channel
  kAlternate,  // members 0, 2, ... on one host, 1, 3, ... on another
  kEach,       // no slot channel at all: every message is a bridge message
  // As kEach, the odd members CPU islands: their buffers in host memory,
  // their bridge messages straight from and into them (Buffers::kHost).
  kEachOddOnCpu,
};

bool SameHost(Hosts hosts, int a, int b) {
  switch (hosts) {
    case Hosts::kOne:
      return true;
    case Hosts::kAlternate:
      return a % 2 == b % 2;
    case Hosts::kEach:
    case Hosts::kEachOddOnCpu:
      return false;
  }
  return false;
}

const char* HostsName(Hosts hosts) {
  switch (hosts) {
    case Hosts::kOne:
      return "one_host";
    case Hosts::kAlternate:
      return "two_hosts";
    case Hosts::kEach:
      return "a_host_each";
    case Hosts::kEachOddOnCpu:
      return "a_host_each_odd_members_cpu";
  }
  return "?";
}

// Slot channels between every pair of n members of one process that share
// a host.
struct ChannelMesh {
  ChannelMesh(int n, gpu::SlotPath path, Hosts hosts) : channels(n) {
    static int counter = 0;
    const std::string base = "/hetjax-coll-test-" + std::to_string(getpid()) +
                             "-" + std::to_string(counter++);
    for (int a = 0; a < n; ++a) {
      for (int b = 0; b < n; ++b) {
        if (a == b || !SameHost(hosts, a, b)) continue;
        // One slot of a piece: a piece is one chunk, and 8 slots hold 8.
        gpu::SlotChannelConfig config{
            b,
            path,
            base + "-" + std::to_string(a) + "-" + std::to_string(b),
            base + "-" + std::to_string(b) + "-" + std::to_string(a),
            8,
            kPieceBytes};
        EXPECT_TRUE(gpu::SlotChannel::Create(config, &channels[a][b]).ok());
      }
    }
  }
  // nullptr where no channel joins the two (the members' threads only read
  // the maps).
  ChannelCollective::FindChannel For(int rank) {
    return [this, rank](int peer) -> std::shared_ptr<gpu::SlotChannel> {
      auto it = channels[rank].find(peer);
      return it == channels[rank].end() ? nullptr : it->second;
    };
  }
  std::vector<std::map<int, std::shared_ptr<gpu::SlotChannel>>> channels;
};

SlotOp OpFor(const std::vector<std::unique_ptr<Bridge>>& bridges, int rank) {
  Group group;
  for (int r = 0; r < static_cast<int>(bridges.size()); ++r)
    group.ranks.push_back(r);
  group.me = rank;
  return SlotOp{bridges[rank].get(), group, kBase, 0};
}

// Bytes whose float32 / bfloat16 sums depend on the order of additions,
// for three and more members too. Even elements: members 0 and 1 hold +-B
// (B so large that float32 keeps nothing of the rest beside it), the others
// small values, so only an order that combines x_0 and x_1 first keeps the
// small ones. Odd elements: magnitudes graded by member, so where a
// contribution joins changes the float32 rounding.
std::vector<uint8_t> MemberBytes(int member, size_t count, DType dtype) {
  constexpr float kScale[] = {1.0f, 1e3f, 1e5f, 30.0f};
  std::vector<uint8_t> bytes(count * DTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float small =
        0.1f + 3.7f * float((i * 7919 + size_t(member) * 104729) % 997) / 997;
    const float big = 3.0f * float(1 << 24) * float(1 + i % 5);
    float v = kScale[member % 4] * small * (member % 2 ? -1.0f : 1.0f);
    if (i % 2 == 0) v = member == 0 ? big : member == 1 ? -big : small;
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[i * 4], &v, 4);
    } else if (dtype == DType::kBF16) {
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t half = uint16_t(bits >> 16);
      std::memcpy(&bytes[i * 2], &half, 2);
    } else {  // int32
      const int32_t k = int32_t(i * 7) - 100 * member;
      std::memcpy(&bytes[i * 4], &k, 4);
    }
  }
  return bytes;
}

float WidenBF16(uint16_t half) {
  const uint32_t bits = uint32_t(half) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Round to nearest even; the inputs here are never NaN.
uint16_t RoundBF16(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// The deterministic all-reduce by definition, element by element:
// ((x_0 op x_1) op x_2) ... in float32 (int32 for kS32), divided once, then
// rounded once to the dtype. Written apart from reduce_kernels so the test
// does not check the algorithms against themselves.
std::vector<uint8_t> SequentialReduce(int n, size_t count, const Reduction& r) {
  std::vector<std::vector<uint8_t>> xs;
  for (int q = 0; q < n; ++q) xs.push_back(MemberBytes(q, count, r.in_dtype));
  std::vector<uint8_t> want(count * DTypeSize(r.in_dtype));
  for (size_t i = 0; i < count; ++i) {
    if (r.in_dtype == DType::kS32) {
      int32_t most, v;
      std::memcpy(&most, &xs[0][i * 4], 4);
      for (int q = 1; q < n; ++q) {
        std::memcpy(&v, &xs[q][i * 4], 4);
        most = std::max(most, v);
      }
      std::memcpy(&want[i * 4], &most, 4);
      continue;
    }
    auto element = [&](int q) {
      if (r.in_dtype == DType::kF32) {
        float v;
        std::memcpy(&v, &xs[q][i * 4], 4);
        return v;
      }
      uint16_t half;
      std::memcpy(&half, &xs[q][i * 2], 2);
      return WidenBF16(half);
    };
    float acc = element(0);
    for (int q = 1; q < n; ++q) acc = acc + element(q);
    if (r.divisor != 1.0) acc = acc / float(r.divisor);
    if (r.in_dtype == DType::kF32) {
      std::memcpy(&want[i * 4], &acc, 4);
    } else {
      const uint16_t half = RoundBF16(acc);
      std::memcpy(&want[i * 2], &half, 2);
    }
  }
  return want;
}

using Run = std::function<Status(SlotAlgorithms&, const SlotOp&, int rank)>;

// Runs `run` on every member twice: over the channels (ChannelCollective on
// the host device) and with the host algorithms; returns both outcomes.
void RunBothWays(int n, gpu::SlotPath path, Hosts hosts, const Run& run) {
  ChannelMesh mesh(n, path, hosts);
  // Declared before the bridges, so destroyed after them: a staged bridge
  // message hands its staging back from the bridge's writer thread, which
  // may still be finishing when the op has returned.
  std::vector<std::unique_ptr<gpu::StagingContext>> contexts;
  for (int rank = 0; rank < n; ++rank) {
    contexts.push_back(std::make_unique<gpu::StagingContext>(
        device::HostDevice(), size_t{16} << 20));
  }
  auto channel_bridges = ConnectMesh(n);
  std::vector<Status> channel_status(n);
  OnEveryRank(n, [&](int rank) {
    gpu::StagingContext& context = *contexts[rank];
    const bool cpu = hosts == Hosts::kEachOddOnCpu && rank % 2 == 1;
    ChannelCollective collective(context, nullptr, mesh.For(rank),
                                 cpu ? ChannelCollective::Buffers::kHost
                                     : ChannelCollective::Buffers::kDevice);
    Status s = collective.Begin();
    if (s.ok()) s = run(collective, OpFor(channel_bridges, rank), rank);
    uint8_t token = 0xAB;
    if (s.ok()) s = collective.Finish(&token, 1);
    if (s.ok() && token != 0) s = Status(StatusCode::kInternal, "no token");
    context.retired.Drain();
    channel_status[rank] = s;
  });
  auto host_bridges = ConnectMesh(n);
  std::vector<Status> host_status(n);
  OnEveryRank(n, [&](int rank) {
    host_status[rank] = run(HostAlgorithms(), OpFor(host_bridges, rank), rank);
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(channel_status[r].ok())
        << r << ": " << channel_status[r].message();
    EXPECT_TRUE(host_status[r].ok()) << r << ": " << host_status[r].message();
  }
}

using Case = std::tuple<int /*members*/, gpu::SlotPath, Hosts>;

class ChannelCollectiveTest : public ::testing::TestWithParam<Case> {
 protected:
  int n() const { return std::get<0>(GetParam()); }
  gpu::SlotPath path() const { return std::get<1>(GetParam()); }
  Hosts hosts() const { return std::get<2>(GetParam()); }
};

TEST_P(ChannelCollectiveTest, AllReduceEqualsTheHostPathBitwise) {
  const int n = this->n();
  // A piece holds 1024 accumulator elements: n * 1024 + 1 gives the last
  // segment one piece more than the others.
  const size_t per_piece = kPieceBytes / 4;
  for (size_t count :
       {size_t{1}, size_t{2}, size_t{7}, size_t{9001}, n * per_piece + 1}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kS32}) {
      for (Algorithm algorithm : {Algorithm::kRing, Algorithm::kOrdered}) {
        // Sum, and mean (divided once before the final rounding).
        for (double divisor : {1.0, double(n)}) {
          const bool is_int = dtype == DType::kS32;
          if (is_int && divisor != 1.0) continue;
          SCOPED_TRACE(std::to_string(count) + " " + DTypeName(dtype) + " " +
                       AlgorithmName(algorithm) + " divisor " +
                       std::to_string(divisor));
          const Reduction r{dtype, dtype,
                            is_int ? ReduceOp::kMax : ReduceOp::kSum, divisor};
          // [way][rank]: 0 channels, 1 host.
          std::vector<std::vector<std::vector<uint8_t>>> out(
              2, std::vector<std::vector<uint8_t>>(
                     n, std::vector<uint8_t>(count * DTypeSize(dtype), 0xEE)));
          RunBothWays(
              n, path(), hosts(),
              [&](SlotAlgorithms& algorithms, const SlotOp& op, int rank) {
                const int w = algorithms.path() == DataPath::kHost ? 1 : 0;
                const std::vector<uint8_t> in = MemberBytes(rank, count, dtype);
                return algorithms.AllReduce(op, algorithm, r, in.data(),
                                            out[w][rank].data(), count);
              });
          for (int rank = 0; rank < n; ++rank) {
            EXPECT_EQ(out[0][rank], out[1][rank]) << "rank " << rank;
            EXPECT_EQ(out[0][rank], out[0][0]) << "rank " << rank;
          }
          if (algorithm == Algorithm::kOrdered) {
            EXPECT_EQ(out[0][0], SequentialReduce(n, count, r));
          }
        }
      }
    }
  }
}

TEST_P(ChannelCollectiveTest, ReduceScatterEqualsTheHostPathBitwise) {
  const int n = this->n();
  for (size_t count : {size_t{1}, size_t{5}, size_t{2500}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::to_string(count) + " " + DTypeName(dtype));
      const Reduction r{dtype, dtype, ReduceOp::kSum, 1.0};
      std::vector<std::vector<std::vector<uint8_t>>> out(
          2, std::vector<std::vector<uint8_t>>(
                 n, std::vector<uint8_t>(count * DTypeSize(dtype), 0xEE)));
      RunBothWays(n, path(), hosts(),
                  [&](SlotAlgorithms& algorithms, const SlotOp& op, int rank) {
                    const int w = algorithms.path() == DataPath::kHost ? 1 : 0;
                    const std::vector<uint8_t> in =
                        MemberBytes(rank, n * count, dtype);
                    return algorithms.ReduceScatter(op, r, in.data(),
                                                    out[w][rank].data(), count);
                  });
      for (int rank = 0; rank < n; ++rank) {
        EXPECT_EQ(out[0][rank], out[1][rank]) << "rank " << rank;
      }
    }
  }
}

TEST_P(ChannelCollectiveTest, AllGatherAndBroadcastMoveEveryByte) {
  const int n = this->n();
  std::vector<size_t> counts;
  for (int q = 0; q < n; ++q) counts.push_back(q == 0 ? 1 : 1500 * q + 3);
  size_t total = 0;
  for (size_t c : counts) total += c;
  std::vector<std::vector<std::vector<uint8_t>>> gathered(
      2, std::vector<std::vector<uint8_t>>(n, std::vector<uint8_t>(total * 4)));
  std::vector<std::vector<std::vector<uint8_t>>> broadcast(
      2, std::vector<std::vector<uint8_t>>(n, std::vector<uint8_t>(2049 * 2)));
  RunBothWays(
      n, path(), hosts(),
      [&](SlotAlgorithms& algorithms, const SlotOp& op, int rank) {
        const int w = algorithms.path() == DataPath::kHost ? 1 : 0;
        const std::vector<uint8_t> mine =
            MemberBytes(rank, counts[rank], DType::kF32);
        Status s = algorithms.AllGather(op, DType::kF32, mine.data(), counts,
                                        gathered[w][rank].data());
        const std::vector<uint8_t> value =
            MemberBytes(rank, 2049, DType::kBF16);
        if (s.ok()) {
          s = algorithms.Broadcast(op, n - 1, DType::kBF16, value.data(),
                                   broadcast[w][rank].data(), 2049);
        }
        return s;
      });
  const std::vector<uint8_t> root = MemberBytes(n - 1, 2049, DType::kBF16);
  for (int rank = 0; rank < n; ++rank) {
    EXPECT_EQ(gathered[0][rank], gathered[1][rank]) << "rank " << rank;
    EXPECT_EQ(broadcast[0][rank], root) << "rank " << rank;
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::to_string(std::get<0>(info.param)) + "_members_" +
         gpu::SlotPathName(std::get<1>(info.param)) + "_" +
         HostsName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    MembersAndPaths, ChannelCollectiveTest,
    ::testing::Combine(::testing::Values(2, 3, 4),
                       ::testing::Values(gpu::SlotPath::kHost,
                                         gpu::SlotPath::kIpc),
                       ::testing::Values(Hosts::kOne)),
    CaseName);

// Members beyond a slot channel: bridge messages alone, mixed with
// slot-channel messages in one op, and between GPU-style members (staged)
// and CPU islands' (straight from their host buffers).
INSTANTIATE_TEST_SUITE_P(
    MembersOnSeveralHosts, ChannelCollectiveTest,
    ::testing::Combine(::testing::Values(2, 3, 4),
                       ::testing::Values(gpu::SlotPath::kHost),
                       ::testing::Values(Hosts::kAlternate, Hosts::kEach,
                                         Hosts::kEachOddOnCpu)),
    CaseName);

TEST(ChannelCollective, ADescriptorNamesTheGpuPathAndItsPieces) {
  OpDescriptor d;
  d.path = DataPath::kGpuChannels;
  d.piece_bytes = GpuPieceBytes();
  EXPECT_NE(d.ToString().find("gpu channels, pieces of 4096 bytes"),
            std::string::npos)
      << d.ToString();
  OpDescriptor host = d;
  host.path = DataPath::kHost;
  EXPECT_FALSE(host == d);  // members on different paths disagree
}

}  // namespace
}  // namespace hetjax::collectives
