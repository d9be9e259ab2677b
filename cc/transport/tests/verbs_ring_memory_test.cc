// The inbound ring of a verbs queue pair in memory that is not plain host
// memory (VerbsLinkOptions::inbound_memory), registered by the GPU path
// order: dma-buf, then ibv_reg_mr on the pointer, then a host ring.
//
// No GPU sits beside an RDMA device here, so the "device memory" is a sealed
// memfd mapped into the process, which Linux can export as a dma-buf through
// /dev/udmabuf. Each test prints one `RING_REGISTRATION {json}` line per
// queue pair; tests/rdma/guest_suite.py keeps them for docs/rdma.md. Needs an
// RDMA device: skipped where there is none (CI runs it inside the soft-RoCE
// guest, tests/rdma).
#include <fcntl.h>
#include <linux/udmabuf.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <iostream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cc/transport/tests/bridge_pair.h"
#include "cc/transport/verbs_gpu_registration.h"
#include "cc/transport/verbs_link.h"
#include "gtest/gtest.h"

namespace hetjax {
namespace {

using testing::ConnectTcp;
using testing::Pattern;
using testing::Spec;

Status Errno(const std::string& what) {
  return Status(StatusCode::kInternal, what + ": " + std::strerror(errno) +
                                           " (errno " + std::to_string(errno) +
                                           ")");
}

// What the hooks did, shared by every queue pair of a test.
struct MemoryLog {
  std::mutex mu;
  std::map<void*, std::pair<int, size_t>> memfds;  // ptr -> (memfd, bytes)
  std::atomic<int> allocs{0}, frees{0};
  std::atomic<size_t> bytes_copied_out{0};
};

// Sealed memfd pages (what udmabuf requires), mapped shared.
GpuMemoryHooks MemfdHooks(MemoryLog* log) {
  GpuMemoryHooks hooks;
  hooks.alloc = [log](size_t bytes, void** ptr) {
    int fd = memfd_create("hetjax-ring", MFD_ALLOW_SEALING | MFD_CLOEXEC);
    if (fd < 0) return Errno("memfd_create");
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      Status failed = Errno("sizing the memfd");
      close(fd);
      return failed;
    }
    void* mapped =
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      Status failed = Errno("mmap(memfd)");
      close(fd);
      return failed;
    }
    std::lock_guard<std::mutex> lock(log->mu);
    log->memfds[mapped] = {fd, bytes};
    ++log->allocs;
    *ptr = mapped;
    return Status::Ok();
  };
  hooks.free = [log](void* ptr) {
    std::lock_guard<std::mutex> lock(log->mu);
    auto [fd, bytes] = log->memfds.at(ptr);
    munmap(ptr, bytes);
    close(fd);
    log->memfds.erase(ptr);
    ++log->frees;
  };
  // Linux's udmabuf: a dma-buf over the memfd's pages.
  hooks.export_dmabuf = [log](void* ptr, size_t bytes, int* fd) {
    int memfd;
    {
      std::lock_guard<std::mutex> lock(log->mu);
      memfd = log->memfds.at(ptr).first;
    }
    int dev = open("/dev/udmabuf", O_RDWR | O_CLOEXEC);
    if (dev < 0) return Errno("open(/dev/udmabuf)");
    udmabuf_create create{};
    create.memfd = static_cast<uint32_t>(memfd);
    create.flags = UDMABUF_FLAGS_CLOEXEC;
    create.size = bytes;
    *fd = ioctl(dev, UDMABUF_CREATE, &create);
    Status result = *fd < 0 ? Errno("ioctl(UDMABUF_CREATE)") : Status::Ok();
    close(dev);
    return result;
  };
  hooks.copy_to_host = [log](void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    log->bytes_copied_out += bytes;
    return Status::Ok();
  };
  return hooks;
}

// Pages the NIC cannot pin (PROT_NONE) and no exporter: nothing registers.
GpuMemoryHooks UnregistrableHooks(MemoryLog* log) {
  GpuMemoryHooks hooks;
  hooks.alloc = [log](size_t bytes, void** ptr) {
    void* mapped =
        mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return Errno("mmap(PROT_NONE)");
    std::lock_guard<std::mutex> lock(log->mu);
    log->memfds[mapped] = {-1, bytes};
    ++log->allocs;
    *ptr = mapped;
    return Status::Ok();
  };
  hooks.free = [log](void* ptr) {
    std::lock_guard<std::mutex> lock(log->mu);
    munmap(ptr, log->memfds.at(ptr).second);
    log->memfds.erase(ptr);
    ++log->frees;
  };
  hooks.copy_to_host = [log](void*, const void*, size_t bytes) {
    log->bytes_copied_out += bytes;
    return Status(StatusCode::kInternal, "never: the ring is not here");
  };
  return hooks;
}

std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

struct Recorded {
  std::mutex mu;
  std::vector<GpuRegistrationReport> reports;
};

// Small rings over every active port; each ring registration is printed.
VerbsLinkOptions RingOptions(const std::vector<std::string>& devices,
                             const GpuMemoryHooks& memory, Recorded* recorded,
                             const std::string& test) {
  VerbsLinkOptions options;
  options.devices = devices;
  options.ring_bytes = 64 << 10;
  options.max_write_bytes = 8 << 10;
  options.max_writes_in_flight = 4;
  options.inbound_memory = memory;
  options.on_ring_registered = [recorded, test](
                                   const std::string& qp,
                                   const GpuRegistrationReport& report) {
    std::string rejected;
    for (const auto& [path, why] : report.rejected) {
      rejected += (rejected.empty() ? "" : ", ") + JsonString(path) + ": " +
                  JsonString(why);
    }
    std::cout << "RING_REGISTRATION {\"test\": " << JsonString(test)
              << ", \"queue_pair\": " << JsonString(qp)
              << ", \"path\": " << JsonString(report.path)
              << ", \"rejected\": {" << rejected << "}}" << std::endl;
    std::lock_guard<std::mutex> lock(recorded->mu);
    recorded->reports.push_back(report);
  };
  return options;
}

// Sizes that wrap 64 KiB rings, both ways at once; returns payload bytes
// each side received.
int64_t ExchangeBothWays(testing::BridgePair& pair) {
  const std::vector<int64_t> sizes = {1, 8191, 65537, 300001};
  auto send_all = [&](Bridge* from, int to) {
    for (size_t i = 0; i < sizes.size(); ++i) {
      auto data = Pattern(sizes[i], i + 10 * to);
      Status s =
          from->Send(to, 50 + i, Spec(DType::kU8, {sizes[i]}), data.data());
      EXPECT_TRUE(s.ok()) << s.message();
    }
  };
  std::thread a([&] { send_all(pair.rank0.get(), 1); });
  std::thread b([&] { send_all(pair.rank1.get(), 0); });
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int me : {0, 1}) {
      Bridge* bridge = me == 0 ? pair.rank0.get() : pair.rank1.get();
      std::vector<uint8_t> out(sizes[k]);
      Status s = bridge->Recv(1 - me, 50 + k, Spec(DType::kU8, {sizes[k]}),
                              out.data());
      EXPECT_TRUE(s.ok()) << s.message();
      EXPECT_EQ(out, Pattern(sizes[k], k + 10 * me)) << "size " << sizes[k];
    }
  }
  a.join();
  b.join();
  int64_t total = 0;
  for (int64_t n : sizes) total += n;
  return total;
}

void Connect(testing::BridgePair& pair, const VerbsLinkOptions& options) {
  std::string ep0, ep1;
  Status s = pair.rank0->PrepareVerbsPeer(1, options, &ep0);
  ASSERT_TRUE(s.ok()) << s.message();
  s = pair.rank1->PrepareVerbsPeer(0, options, &ep1);
  ASSERT_TRUE(s.ok()) << s.message();
  s = pair.rank0->ConnectVerbsPeer(1, ep1);
  ASSERT_TRUE(s.ok()) << s.message();
  s = pair.rank1->ConnectVerbsPeer(0, ep0);
  ASSERT_TRUE(s.ok()) << s.message();
}

class VerbsRingMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!VerbsCompiledIn()) GTEST_SKIP() << "built without libibverbs";
    for (const VerbsPort& port : ListVerbsPorts()) {
      if (port.active) {
        devices_.push_back(port.device + ":" + std::to_string(port.port));
      }
    }
    if (devices_.empty()) GTEST_SKIP() << "no active RDMA port here";
  }
  std::vector<std::string> devices_;
};

// The dma-buf path when this kernel and provider have it (udmabuf exporter,
// ibv_reg_dmabuf_mr); else ibv_reg_mr on the same pointer, with the reason
// dma-buf was rejected. Either way the peer's writes land in that memory
// and every byte read comes out through the hooks' copy.
TEST_F(VerbsRingMemoryTest, TheInboundRingLivesInExportableMemory) {
  MemoryLog log;
  Recorded recorded;
  auto pair = ConnectTcp(1);
  Connect(pair,
          RingOptions(devices_, MemfdHooks(&log), &recorded, "exportable"));
  ASSERT_EQ(recorded.reports.size(), 2 * devices_.size());
  const bool have_udmabuf = access("/dev/udmabuf", F_OK) == 0;
  for (const GpuRegistrationReport& report : recorded.reports) {
    if (report.path == kGpuPathDmabuf) {
      EXPECT_TRUE(have_udmabuf);
      continue;
    }
    EXPECT_EQ(report.path, kGpuPathPeerMemory);
    ASSERT_EQ(report.rejected.size(), 1u);
    EXPECT_CONTAINS(report.rejected[0].second,
                    have_udmabuf ? "ibv_reg_dmabuf_mr failed"
                                 : "open(/dev/udmabuf): No such file");
  }
  EXPECT_EQ(log.allocs.load(), static_cast<int>(2 * devices_.size()));
  const int64_t payload = ExchangeBothWays(pair);
  // Both sides read every payload byte (plus frame headers) out of the ring.
  EXPECT_GE(log.bytes_copied_out.load(), static_cast<size_t>(2 * payload));
  pair.rank0.reset();
  pair.rank1.reset();
  EXPECT_EQ(log.frees.load(), log.allocs.load());
}

// Memory nothing can register: the ring falls back to host memory, says
// why, gives the memory back at once, and messages flow as ever.
TEST_F(VerbsRingMemoryTest, UnregistrableMemoryFallsBackToAHostRing) {
  MemoryLog log;
  Recorded recorded;
  auto pair = ConnectTcp(1);
  Connect(pair, RingOptions(devices_, UnregistrableHooks(&log), &recorded,
                            "unregistrable"));
  ASSERT_EQ(recorded.reports.size(), 2 * devices_.size());
  for (const GpuRegistrationReport& report : recorded.reports) {
    EXPECT_EQ(report.path, kGpuPathHostStaging);
    ASSERT_EQ(report.rejected.size(), 2u);
    EXPECT_CONTAINS(report.rejected[0].second, "no dma-buf exporter");
    EXPECT_CONTAINS(report.rejected[1].second, "ibv_reg_mr");
  }
  EXPECT_EQ(log.frees.load(), log.allocs.load());
  ExchangeBothWays(pair);
  EXPECT_EQ(log.bytes_copied_out.load(), 0u);
}

// What this provider says to ibv_reg_dmabuf_mr, whatever the exporter: fed
// a memfd, which is not a dma-buf, it must refuse; the reason tells
// "provider lacks the verb" (EOPNOTSUPP) from "kernel rejected the fd".
TEST_F(VerbsRingMemoryTest, AFdThatIsNoDmabufIsRefusedWithTheReason) {
  MemoryLog log;
  GpuMemoryHooks hooks = MemfdHooks(&log);
  hooks.export_dmabuf = [&log](void* ptr, size_t, int* fd) {
    std::lock_guard<std::mutex> lock(log.mu);
    *fd = dup(log.memfds.at(ptr).first);
    return Status::Ok();
  };
  for (const std::string& device : devices_) {
    GpuRegistrationReport report = GpuRegistrationPath(device, hooks);
    std::cout << "RING_REGISTRATION {\"test\": \"memfd_as_dmabuf\", "
              << "\"queue_pair\": " << JsonString(device)
              << ", \"path\": " << JsonString(report.path)
              << ", \"rejected\": {" << JsonString(report.rejected.at(0).first)
              << ": " << JsonString(report.rejected.at(0).second) << "}}"
              << std::endl;
    EXPECT_NE(report.path, kGpuPathDmabuf);
    EXPECT_CONTAINS(report.rejected.at(0).second, "ibv_reg_dmabuf_mr failed");
  }
  EXPECT_EQ(log.frees.load(), log.allocs.load());
}

}  // namespace
}  // namespace hetjax
