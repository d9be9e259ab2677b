// How fast can the CPU end of a GPU <-> CPU slot channel copy between two
// host buffers already in use (a receive into a donated buffer: the slots
// -> XLA's buffer), with plain memcpy against non-temporal stores
// (StreamCopy, cc/device/host_copy.h), per thread count? Prints GB/s as
// JSON lines. Standalone apart from host_copy.cc: build it with
//   g++ -O2 -pthread -I. cc/device/probe/host_stream_probe.cc \
//       cc/device/host_copy.cc -o host_stream_probe
// and run it with the buffer size in MiB (256) and the repetitions (10).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cc/device/host_copy.h"

namespace {

double Run(uint8_t* dst, const uint8_t* src, size_t bytes, int threads,
           bool stream, int reps) {
  const size_t piece = (bytes / threads + 4095) / 4096 * 4096;
  const auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      const size_t begin = std::min(bytes, t * piece);
      const size_t end = std::min(bytes, begin + piece);
      workers.emplace_back([=] {
        if (stream) {
          hetjax::device::StreamCopy(dst + begin, src + begin, end - begin);
        } else {
          std::memcpy(dst + begin, src + begin, end - begin);
        }
      });
    }
    for (std::thread& w : workers) w.join();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return double(bytes) * reps / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = size_t(argc > 1 ? std::atoi(argv[1]) : 256) << 20;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (int threads : {1, 4, 8, 12, 16}) {
    for (bool stream : {false, true}) {
      Run(dst.data(), src.data(), bytes, threads, stream, 1);  // warm
      const double gbps =
          Run(dst.data(), src.data(), bytes, threads, stream, reps);
      std::printf(
          "{\"bytes\": %zu, \"threads\": %d, \"stores\": \"%s\", "
          "\"gbps\": %.2f}\n",
          bytes, threads, stream ? "non-temporal" : "memcpy", gbps);
    }
  }
  return 0;
}
