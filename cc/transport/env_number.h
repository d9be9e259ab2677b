// Tuning knobs read from the environment, once, by every layer.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace hetjax {

// `name` as a non-negative decimal integer; `fallback` when it is unset,
// empty or not entirely such a number.
inline uint64_t EnvNumber(const char* name, uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text < '0' || *text > '9') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  return *end == '\0' ? static_cast<uint64_t>(value) : fallback;
}

}  // namespace hetjax
