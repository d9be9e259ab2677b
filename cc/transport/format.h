// Small text helpers shared by the transport's error messages.
#pragma once

#include <cstdio>
#include <string>

namespace hetjax {

// 0.5 -> "0.5 s", 300 -> "300 s".
inline std::string FormatSeconds(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", seconds);
  return buf;
}

}  // namespace hetjax
