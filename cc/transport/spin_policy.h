// How long a waiting thread spins before it sleeps, and how it spins.
//
// Why spin at all: a sleeping waiter costs a wake-up on every message, and on
// virtual machines a wake-up of an idle vCPU goes through the hypervisor
// (measured on a 2-core virtual machine: ~30 us each, two per one-way shm
// message). Why yield on small machines: there, pause-spinning waiters take
// the cores the peer process needs to answer (measured: 2 cores, 4 KiB shm
// round trip 128 us with pause-spinning, 82 us without); yielding spinners
// hand the core over at once yet never halt it.
//
// SetSpinBudget overrides the budget (0 turns spinning off): hetjax's Python
// side reads HETJAX_SPIN_US and the native module's start hands it over
// before the bridge's threads run.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace hetjax {

inline bool ManyCores() {
  static const bool many = std::thread::hardware_concurrency() >= 8;
  return many;
}

// 50 us, or 200 us (yielding) under 8 cores.
inline std::chrono::microseconds DefaultSpinBudget() {
  return std::chrono::microseconds(ManyCores() ? 50 : 200);
}

namespace spin_internal {
// Microseconds; negative: DefaultSpinBudget(). Atomic: waiting threads read
// it on every wait.
inline std::atomic<int64_t> budget_us{-1};
}  // namespace spin_internal

// Process-wide, for every waiting thread from then on.
inline void SetSpinBudget(std::chrono::microseconds budget) {
  spin_internal::budget_us.store(budget.count(), std::memory_order_relaxed);
}

inline std::chrono::microseconds SpinBudget() {
  const int64_t us = spin_internal::budget_us.load(std::memory_order_relaxed);
  return us < 0 ? DefaultSpinBudget() : std::chrono::microseconds(us);
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
