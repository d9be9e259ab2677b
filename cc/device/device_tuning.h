// The device layer's tuning knobs, process-wide.
//
// hetjax's Python side reads them from the environment (HETJAX_* variables,
// hetjax/bridge/tuning.py, docs/environment.md) and the native module's
// start hands them over before the bridge runs; the C++ tests set them
// directly. Until then the defaults hold. Set them only while no copy or
// GPU op runs: readers take no lock.
#pragma once

#include <cstdint>

namespace hetjax::device {

// min(16, cores), at least 1. Up to 16: on a 16-core host with one H100 a
// GPU -> CPU receive of 256 MiB, which must fault in XLA's fresh result
// buffer, ran at 11-15 GB/s with 8 or 12 threads and 19-20 GB/s with 16
// (docs/gpu.md). The receive blocks its XLA thread anyway.
int DefaultHostCopyThreads();

struct DeviceTuning {
  // Threads of the host copy pool (host_copy.h, HostCopyThreads()), the
  // caller among them; the pool takes it when it is built, at the first
  // large copy of the process.
  int host_copy_threads = DefaultHostCopyThreads();
  // Large host copies with non-temporal stores (HostCopyStreaming()).
  bool host_copy_streaming = true;
  // Most thread blocks of a copy out of peer GPU memory (GPU flavours): a
  // share of the SMs like NCCL's P2P channels take.
  uint32_t peer_copy_blocks = 32;
  // Stream-ordered flags raised by a host function the stream runs instead
  // of a one-thread kernel (GPU flavours): slower to fire (tens of us), for
  // comparison. Fused hand-offs then fall back to separate ops.
  bool signal_flags_from_host = false;
};

void SetDeviceTuning(const DeviceTuning& tuning);
const DeviceTuning& GetDeviceTuning();

}  // namespace hetjax::device
