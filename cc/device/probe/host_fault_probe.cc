// How fast can a CPU island's receive fill a fresh 256 MiB buffer (as
// XLA:CPU hands it one: a new mapping whose pages fault in on first write)?
// Copies from a buffer in use into a fresh mapping, per strategy and thread
// count, and prints GB/s as JSON lines. Standalone (no hetjax code): build
// it with g++ -O2 -pthread into a binary of its own and run it with the
// buffer size in MiB (256) and the repetitions (5) as arguments.
//
// Strategies: "4k": plain first-touch faults; "huge": madvise(MADV_HUGEPAGE)
// first; "populate": each thread MADV_POPULATE_WRITEs its piece, then
// copies; "huge+populate": both. Pieces are 2 MiB-aligned.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {

constexpr size_t kHuge = size_t{2} << 20;

double Run(const uint8_t* src, size_t bytes, int threads, bool huge,
           bool populate) {
  void* map = mmap(nullptr, bytes + kHuge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) std::abort();
  auto* dst = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(map) + kHuge - 1) / kHuge * kHuge);
  const auto start = std::chrono::steady_clock::now();
  if (huge) madvise(dst, bytes, MADV_HUGEPAGE);
  const size_t piece =
      std::max(kHuge, (bytes / threads + kHuge - 1) / kHuge * kHuge);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const size_t begin = std::min(bytes, size_t(t) * piece);
      const size_t end = std::min(bytes, begin + piece);
      if (end <= begin) return;
      if (populate) madvise(dst + begin, end - begin, MADV_POPULATE_WRITE);
      std::memcpy(dst + begin, src + begin, end - begin);
    });
  }
  for (std::thread& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  if (std::memcmp(dst, src, bytes) != 0) std::abort();
  munmap(map, bytes + kHuge);
  return bytes / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = size_t(argc > 1 ? std::atoi(argv[1]) : 256) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<uint8_t> src(bytes);
  for (size_t i = 0; i < bytes; ++i) src[i] = uint8_t(i * 2654435761u >> 24);
  const int cores = int(std::thread::hardware_concurrency());
  struct Strategy {
    const char* name;
    bool huge, populate;
  } strategies[] = {{"4k", false, false},
                    {"huge", true, false},
                    {"populate", false, true},
                    {"huge+populate", true, true}};
  for (const Strategy& s : strategies) {
    for (int threads : {1, 4, 8, 12, 16}) {
      if (threads > cores) continue;
      double best = 0, sum = 0;
      for (int r = 0; r < reps; ++r) {
        const double gbps = Run(src.data(), bytes, threads, s.huge, s.populate);
        best = std::max(best, gbps);
        sum += gbps;
      }
      std::printf(
          "{\"strategy\": \"%s\", \"threads\": %d, \"mib\": %zu, "
          "\"mean_gbps\": %.2f, \"best_gbps\": %.2f}\n",
          s.name, threads, bytes >> 20, sum / reps, best);
      std::fflush(stdout);
    }
  }
  return 0;
}
