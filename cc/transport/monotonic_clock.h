// Timestamps that fit in one atomic: monotonic nanoseconds, for "how long
// since the last progress / the last byte heard" checks.
#pragma once

#include <chrono>
#include <cstdint>

namespace hetjax {

inline int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double SecondsSince(int64_t monotonic_ns) {
  return static_cast<double>(MonotonicNs() - monotonic_ns) * 1e-9;
}

}  // namespace hetjax
