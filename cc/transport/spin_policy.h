// How long a waiting thread spins before it sleeps, and how it spins.
//
// Why spin at all: a sleeping waiter costs a wake-up on every message, and on
// virtual machines a wake-up of an idle vCPU goes through the hypervisor
// (measured on the 2-core CI machine: ~30 us each, two per one-way shm
// message). Why yield on small machines: there, pause-spinning waiters take
// the cores the peer process needs to answer (measured: 2 cores, 4 KiB shm
// round trip 128 us with pause-spinning, 82 us without); yielding spinners
// hand the core over at once yet never halt it.
//
// HETJAX_SPIN_US overrides the budget (0 turns spinning off).
#pragma once

#include <sched.h>

#include <chrono>
#include <thread>

#include "cc/transport/env_number.h"

namespace hetjax {

inline bool ManyCores() {
  static const bool many = std::thread::hardware_concurrency() >= 8;
  return many;
}

inline std::chrono::microseconds SpinBudget() {
  static const std::chrono::microseconds budget = [] {
    return std::chrono::microseconds(
        EnvNumber("HETJAX_SPIN_US", ManyCores() ? 50 : 200));
  }();
  return budget;
}

// One step of a spin-wait.
inline void SpinPause() {
  if (!ManyCores()) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace hetjax
