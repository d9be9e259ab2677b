// ParallelCopy must equal memcpy whatever the size, alignment and number of
// callers, ParallelFor run every index once; PrepareFreshDestination faults a
// fresh buffer in and never touches one in use.
#include "cc/device/host_copy.h"

#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device {
namespace {

std::vector<uint8_t> Pattern(size_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < bytes; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<uint8_t>(x >> 24);
  }
  return out;
}

TEST(ParallelCopy, EqualsMemcpyAtEverySizeAndOffset) {
  EXPECT_GE(HostCopyThreads(), 1);
  // Around the piece minimum and alignment, and well above them.
  const size_t sizes[] = {0,
                          1,
                          4095,
                          4097,
                          (512 << 10),
                          (1 << 20) + 7,
                          (3 << 20) + 4093,
                          17 << 20,
                          (40 << 20) + 5};
  uint32_t seed = 1;
  for (size_t bytes : sizes) {
    for (size_t offset : {size_t{0}, size_t{3}}) {
      std::vector<uint8_t> src = Pattern(bytes + offset, seed++);
      // A guard byte on each side catches a piece that overruns.
      std::vector<uint8_t> dst(bytes + offset + 2, 0xAB);
      ParallelCopy(dst.data() + 1 + offset, src.data() + offset, bytes);
      ASSERT_EQ(dst.front(), 0xAB) << bytes;
      ASSERT_EQ(dst.back(), 0xAB) << bytes;
      ASSERT_EQ(
          std::memcmp(dst.data() + 1 + offset, src.data() + offset, bytes), 0)
          << bytes << " bytes at offset " << offset;
    }
  }
}

TEST(StreamCopy, EqualsMemcpyAtEverySizeAndAlignment) {
  uint32_t seed = 100;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{15}, size_t{63}, size_t{64},
                       size_t{65}, size_t{4097}, (size_t{1} << 20) + 13}) {
    for (size_t dst_offset : {size_t{0}, size_t{1}, size_t{8}, size_t{15}}) {
      for (size_t src_offset : {size_t{0}, size_t{3}}) {
        std::vector<uint8_t> src = Pattern(bytes + src_offset, seed++);
        std::vector<uint8_t> dst(bytes + dst_offset + 2, 0xAB);
        StreamCopy(dst.data() + 1 + dst_offset, src.data() + src_offset, bytes);
        ASSERT_EQ(dst[dst_offset], 0xAB) << bytes;
        ASSERT_EQ(dst.back(), 0xAB) << bytes;
        ASSERT_EQ(std::memcmp(dst.data() + 1 + dst_offset,
                              src.data() + src_offset, bytes),
                  0)
            << bytes << " bytes, dst offset " << dst_offset << ", src offset "
            << src_offset;
      }
    }
  }
}

TEST(ParallelCopy, SeveralCallersAtOnceEachGetTheirOwnBytes) {
  constexpr size_t kBytes = (5 << 20) + 123;
  constexpr int kCallers = 4;
  std::vector<std::vector<uint8_t>> src, dst;
  for (int c = 0; c < kCallers; ++c) {
    src.push_back(Pattern(kBytes, 100 + c));
    dst.emplace_back(kBytes, 0);
  }
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 5; ++round) {
        ParallelCopy(dst[c].data(), src[c].data(), kBytes);
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(dst[c], src[c]) << "caller " << c;
  }
}

TEST(ParallelFor, RunsEveryIndexOnceFromSeveralCallers) {
  constexpr int kCallers = 3;
  std::vector<std::thread> callers;
  std::vector<bool> ok(kCallers, false);
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      bool all = true;
      for (size_t count : {size_t{0}, size_t{1}, size_t{4095}, size_t{1} << 20,
                           (size_t{3} << 20) + 17}) {
        std::vector<std::atomic<uint8_t>> seen(count);
        ParallelFor(count, 1000, [&](size_t begin, size_t end) {
          for (size_t i = begin; i < end; ++i) seen[i].fetch_add(1);
        });
        for (size_t i = 0; i < count; ++i) all = all && seen[i].load() == 1;
      }
      ok[c] = all;
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_TRUE(ok[c]) << "caller " << c;
}

TEST(ParallelCopy, TheHostDeviceCopiesThroughIt) {
  const std::vector<uint8_t> src = Pattern(3 << 20, 7);
  std::vector<uint8_t> dst(src.size());
  ASSERT_TRUE(HostDevice()
                  .CopyToHostAsync(dst.data(), src.data(), src.size(), nullptr)
                  .ok());
  EXPECT_EQ(dst, src);
}

TEST(PrepareFreshDestination, KeepsContentsAndIgnoresOddRanges) {
  constexpr size_t kBytes = size_t{9} << 20;
  void* fresh = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(fresh, MAP_FAILED);
  // Never touched: advised and faulted in, then written by the copy.
  PrepareFreshDestination(fresh, kBytes);
  std::vector<unsigned char> resident(kBytes / 4096);
  ASSERT_EQ(mincore(fresh, kBytes, resident.data()), 0);
  for (size_t page = 0; page < resident.size(); ++page) {
    ASSERT_TRUE(resident[page] & 1) << "page " << page << " not faulted in";
  }
  const std::vector<uint8_t> src = Pattern(kBytes, 9);
  ParallelCopy(fresh, src.data(), kBytes);
  EXPECT_EQ(std::memcmp(fresh, src.data(), kBytes), 0);
  // In use already: left alone, contents unchanged.
  PrepareFreshDestination(fresh, kBytes);
  EXPECT_EQ(std::memcmp(fresh, src.data(), kBytes), 0);
  munmap(fresh, kBytes);
  // Smaller than a huge page, unaligned, empty: nothing to do, no crash.
  std::vector<uint8_t> small(4096, 1);
  PrepareFreshDestination(small.data() + 1, small.size() - 1);
  PrepareFreshDestination(small.data(), 0);
  EXPECT_EQ(small[10], 1);
}

}  // namespace
}  // namespace hetjax::device
