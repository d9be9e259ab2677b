// The GPU device layer, one source for CUDA and HIP (gpu_vendor.h maps the
// calls). Compiled by nvcc for the cuda flavour and as HIP for rocm.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "cc/device/device.h"
#include "cc/device/device_tuning.h"
#include "cc/device/gpu_combine.h"
#include "cc/device/gpu_pair_exchange.h"
#include "cc/device/gpu_vendor.h"

namespace hetjax::device {
namespace {

namespace v = vendor;

Status Check(v::Error error, const char* call, const std::string& detail) {
  if (error == v::kSuccess) return Status::Ok();
  return Status(StatusCode::kInternal, std::string(v::kName) + " " + call +
                                           "(" + detail +
                                           "): " + v::ErrorString(error));
}

std::string Bytes(size_t n) { return std::to_string(n) + " bytes"; }

using v::TimeoutTicks;

// One thread polls the flag in mapped host memory. volatile makes every
// iteration read through to host memory; the back-off keeps the poll from
// saturating the link. The deadline (counted from `start`) bounds the wait
// even if the host side dies without aborting, so a stream is never held
// forever.
__device__ void PollFlag(const WaitFlag* flag, uint32_t target, uint64_t start,
                         uint64_t timeout_ticks) {
  volatile const WaitFlag* words = flag;
  while (words->ready < target && words->abort == 0) {
    if (timeout_ticks != 0 && v::NowTicks() - start > timeout_ticks) {
      const_cast<volatile WaitFlag*>(words)->timed_out = 1;
      __threadfence_system();
      return;
    }
    v::Backoff();
  }
}

// A release store at system scope, so the bytes written before it and the
// new count reach host memory, not only our L2.
__device__ void RaiseFlag(WaitFlag* flag, uint32_t value) {
  __threadfence_system();
#if defined(HETJAX_ROCM)
  __atomic_store_n(&flag->ready, value, __ATOMIC_RELEASE);
#else
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(&flag->ready),
               "r"(value)
               : "memory");
#endif
  __threadfence_system();
}

__global__ void WaitFlagKernel(const WaitFlag* flag, uint32_t target,
                               uint64_t timeout_ticks) {
  PollFlag(flag, target, v::NowTicks(), timeout_ticks);
}

// The other half of a cross-process hand-off: runs after the stream's
// earlier work (copies into a slot, or out of it) and raises the count a
// waiter in another process polls.
__global__ void SignalFlagKernel(WaitFlag* flag, uint32_t value) {
  RaiseFlag(flag, value);
}

// This thread's share of copying `bytes`: 16-byte vectors where both ends
// allow it (four loads in flight per thread), single bytes otherwise.
// `index` counts threads across every block taking part, `threads` is their
// number.
__device__ void CopyShare(void* dst_device, const void* src_device,
                          size_t bytes, size_t index, size_t threads) {
  const auto src = reinterpret_cast<uintptr_t>(src_device);
  const auto dst = reinterpret_cast<uintptr_t>(dst_device);
  size_t done = 0;
  if (((src | dst) & 15) == 0) {
    const auto* from = static_cast<const int4*>(src_device);
    auto* to = static_cast<int4*>(dst_device);
    const size_t vectors = bytes / 16;
    constexpr int kUnroll = 4;
    const size_t step = threads * kUnroll;
    size_t base = 0;
    for (; base + step <= vectors; base += step) {
      int4 held[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        held[u] = v::LoadFresh(from + base + u * threads + index);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        to[base + u * threads + index] = held[u];
      }
    }
    for (size_t i = base + index; i < vectors; i += threads) {
      to[i] = v::LoadFresh(from + i);
    }
    done = vectors * 16;
  }
  const auto* from = static_cast<const uint8_t*>(src_device);
  auto* to = static_cast<uint8_t*>(dst_device);
  for (size_t i = done + index; i < bytes; i += threads) {
    to[i] = v::LoadFresh(from + i);
  }
}

// An unfused hand-off's copy out of peer GPU memory, by every thread of the
// grid (HandoffCopyAsync, peer_source), at most
// DeviceTuning::peer_copy_blocks blocks.
size_t PeerCopyBlocks() {
  return std::max<size_t>(1, GetDeviceTuning().peer_copy_blocks);
}

__global__ void __launch_bounds__(512)
    PeerCopyKernel(void* dst, const void* src, size_t bytes) {
  CopyShare(dst, src, bytes, size_t{blockIdx.x} * blockDim.x + threadIdx.x,
            size_t{gridDim.x} * blockDim.x);
}

// Device::HandoffAsync as one block: thread 0 waits, every thread copies a
// share, thread 0 signals once all shares are written. Source loads bypass
// the caches (ld.cv): the bytes may sit in host or peer memory that another
// agent wrote since this GPU last looked. Every thread fences its own
// stores at system scope before the barrier, so the signal cannot overtake
// any of them.
constexpr int kHandoffThreads = 512;

__global__ void __launch_bounds__(kHandoffThreads)
    HandoffKernel(Device::Handoff h, uint64_t timeout_ticks) {
  if (threadIdx.x == 0) {
    const uint64_t start = v::NowTicks();
    for (const Device::FlagTarget& wait : h.waits) {
      if (wait.flag_device != nullptr) {
        PollFlag(wait.flag_device, wait.target, start, timeout_ticks);
      }
    }
    __threadfence_system();
  }
  __syncthreads();
  CopyShare(h.dst_device, h.src_device, h.bytes, threadIdx.x, kHandoffThreads);
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0 && h.signal_device != nullptr) {
    RaiseFlag(h.signal_device, h.signal_value);
  }
}

// The same signal from a host thread, in stream order (a host function that
// only writes, never waits). Slower to fire (tens of us), but a host write
// is what the wait kernel is measured to see within microseconds.
struct HostSignal {
  WaitFlag* flag;
  uint32_t value;
};
void RunHostSignal(void* arg) {
  auto* signal = static_cast<HostSignal*>(arg);
  SignalFlag(signal->flag, signal->value);
  delete signal;
}

bool SignalFromHost() { return GetDeviceTuning().signal_flags_from_host; }

class GpuDeviceImpl final : public Device {
 public:
  const char* name() const override { return v::kName; }

  Status StreamDevice(Stream stream, int* ordinal) override {
    return Check(v::StreamGetDevice(static_cast<v::StreamT>(stream), ordinal),
                 "StreamGetDevice", "");
  }
  Status CurrentDevice(int* ordinal) override {
    return Check(v::GetDevice(ordinal), "GetDevice", "");
  }
  Status SetCurrentDevice(int ordinal) override {
    return Check(v::SetDevice(ordinal), "SetDevice", std::to_string(ordinal));
  }

  Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes,
                           Stream stream) override {
    return Check(v::MemcpyAsync(dst, src, bytes, v::kHostToDevice,
                                static_cast<v::StreamT>(stream)),
                 "MemcpyAsync", "host->device, " + Bytes(bytes));
  }
  Status CopyToHostAsync(void* dst, const void* src, size_t bytes,
                         Stream stream) override {
    return Check(v::MemcpyAsync(dst, src, bytes, v::kDeviceToHost,
                                static_cast<v::StreamT>(stream)),
                 "MemcpyAsync", "device->host, " + Bytes(bytes));
  }
  Status MemsetAsync(void* dst, int value, size_t bytes,
                     Stream stream) override {
    return Check(
        v::MemsetAsync(dst, value, bytes, static_cast<v::StreamT>(stream)),
        "MemsetAsync", Bytes(bytes));
  }
  Status SynchronizeStream(Stream stream) override {
    return Check(v::StreamSynchronize(static_cast<v::StreamT>(stream)),
                 "StreamSynchronize", "");
  }

  Status AllocPinned(size_t bytes, void** host) override {
    return Check(v::HostAlloc(host, bytes, v::kPinnedFlags), "HostAlloc",
                 "pinned, " + Bytes(bytes));
  }
  Status FreePinned(void* host) override {
    return Check(v::HostFree(host), "HostFree", "");
  }
  Status AllocMapped(size_t bytes, void** host, void** device) override {
    Status status = Check(v::HostAlloc(host, bytes, v::kMappedFlags),
                          "HostAlloc", "mapped, " + Bytes(bytes));
    if (!status.ok()) return status;
    status =
        Check(v::HostDevicePointer(device, *host), "HostGetDevicePointer", "");
    if (!status.ok()) (void)v::HostFree(*host);
    return status;
  }
  Status FreeMapped(void* host) override { return FreePinned(host); }
  Status AllocDevice(size_t bytes, void** device) override {
    return Check(v::Malloc(device, bytes), "Malloc", Bytes(bytes));
  }
  Status FreeDevice(void* device) override {
    return Check(v::Free(device), "Free", "");
  }

  Status CreateEvent(Event* event) override {
    v::EventT e = nullptr;
    Status status = Check(v::EventCreate(&e), "EventCreate", "");
    *event = e;
    return status;
  }
  Status RecordEvent(Event event, Stream stream) override {
    return Check(v::EventRecord(static_cast<v::EventT>(event),
                                static_cast<v::StreamT>(stream)),
                 "EventRecord", "");
  }
  Status QueryEvent(Event event, bool* done) override {
    v::Error error = v::EventQuery(static_cast<v::EventT>(event));
    *done = error == v::kSuccess;
    if (error == v::kNotReady) return Status::Ok();
    return Check(error, "EventQuery", "");
  }
  Status SynchronizeEvent(Event event) override {
    return Check(v::EventSynchronize(static_cast<v::EventT>(event)),
                 "EventSynchronize", "");
  }
  Status DestroyEvent(Event event) override {
    return Check(v::EventDestroy(static_cast<v::EventT>(event)), "EventDestroy",
                 "");
  }

  Status WaitFlagAsync(const WaitFlag* flag_device, uint32_t target,
                       uint64_t timeout_ns, Stream stream) override {
    WaitFlagKernel<<<1, 1, 0, static_cast<v::StreamT>(stream)>>>(
        flag_device, target, TimeoutTicks(timeout_ns));
    return Check(v::GetLastError(), "launch WaitFlagKernel",
                 "target " + std::to_string(target));
  }

  Status SignalFlagAsync(WaitFlag* flag_host, WaitFlag* flag_device,
                         uint32_t value, Stream stream) override {
    if (SignalFromHost()) {
      auto* signal = new HostSignal{flag_host, value};
      v::Error error = v::LaunchHostFunc(static_cast<v::StreamT>(stream),
                                         RunHostSignal, signal);
      if (error != v::kSuccess) delete signal;
      return Check(error, "LaunchHostFunc", "signal " + std::to_string(value));
    }
    SignalFlagKernel<<<1, 1, 0, static_cast<v::StreamT>(stream)>>>(flag_device,
                                                                   value);
    return Check(v::GetLastError(), "launch SignalFlagKernel",
                 "value " + std::to_string(value));
  }
  Status HandoffAsync(const Handoff& handoff, Stream stream) override {
    if (!handoff.fuse || SignalFromHost()) {
      return Device::HandoffAsync(handoff, stream);
    }
    HandoffKernel<<<1, kHandoffThreads, 0, static_cast<v::StreamT>(stream)>>>(
        handoff, TimeoutTicks(handoff.timeout_ns));
    return Check(v::GetLastError(), "launch HandoffKernel",
                 Bytes(handoff.bytes));
  }
  Status HandoffCopyAsync(const Handoff& handoff, Stream stream) override {
    if (!handoff.peer_source) return Device::HandoffCopyAsync(handoff, stream);
    // Enough blocks to keep NVLink busy (each holds 32 KiB of loads in
    // flight), no more than a copy of this size needs.
    constexpr size_t kThreads = 512;
    constexpr size_t kBytesPerBlockRound = kThreads * 16 * 4;
    const size_t blocks = std::max<size_t>(
        1, std::min<size_t>(PeerCopyBlocks(),
                            (handoff.bytes + kBytesPerBlockRound - 1) /
                                kBytesPerBlockRound));
    PeerCopyKernel<<<static_cast<unsigned>(blocks), kThreads, 0,
                     static_cast<v::StreamT>(stream)>>>(
        handoff.dst_device, handoff.src_device, handoff.bytes);
    return Check(v::GetLastError(), "launch PeerCopyKernel",
                 Bytes(handoff.bytes));
  }
  Status CopyDeviceAsync(void* dst, const void* src, size_t bytes,
                         Stream stream) override {
    return Check(v::MemcpyAsync(dst, src, bytes, v::kDeviceToDevice,
                                static_cast<v::StreamT>(stream)),
                 "MemcpyAsync", "device->device, " + Bytes(bytes));
  }
  Status CreateStream(Stream* stream) override {
    v::StreamT st = nullptr;
    Status status = Check(v::StreamCreate(&st), "StreamCreate", "non-blocking");
    *stream = st;
    return status;
  }
  Status StreamWaitEvent(Stream stream, Event event) override {
    return Check(v::StreamWaitEvent(static_cast<v::StreamT>(stream),
                                    static_cast<v::EventT>(event)),
                 "StreamWaitEvent", "");
  }
  Status CombineAsync(const Combine& combine, Stream stream) override {
    return LaunchCombine(combine, stream);
  }
  Status PairExchangeAsync(const PairExchange& exchange,
                           Stream stream) override {
    return LaunchPairExchange(exchange, stream);
  }
  Status ConcurrentPairMoves(int* count) override {
    return PairMovesResident(count);
  }
  Status RegisterHost(void* host, size_t bytes, void** device) override {
    Status status = Check(v::HostRegister(host, bytes), "HostRegister",
                          "mapped, " + Bytes(bytes));
    if (!status.ok()) return status;
    status = Check(v::HostDevicePointer(device, host), "HostGetDevicePointer",
                   "registered");
    if (!status.ok()) (void)v::HostUnregister(host);
    return status;
  }
  Status UnregisterHost(void* host) override {
    return Check(v::HostUnregister(host), "HostUnregister", "");
  }
  Status ExportIpc(void* device, IpcHandle* handle) override {
    static_assert(sizeof(v::IpcHandleT) <= kIpcHandleBytes);
    v::IpcHandleT h;
    Status status =
        Check(v::IpcGetMemHandle(&h, device), "IpcGetMemHandle", "");
    std::memset(handle->bytes, 0, sizeof(handle->bytes));
    std::memcpy(handle->bytes, &h, sizeof(h));
    return status;
  }
  Status OpenIpc(const IpcHandle& handle, void** device) override {
    v::IpcHandleT h;
    std::memcpy(&h, handle.bytes, sizeof(h));
    return Check(v::IpcOpenMemHandle(device, h), "IpcOpenMemHandle",
                 "peer device memory");
  }
  Status CloseIpc(void* device) override {
    return Check(v::IpcCloseMemHandle(device), "IpcCloseMemHandle", "");
  }
  Status ExportDmabuf(void* device, size_t bytes, int* fd) override {
    const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto address = reinterpret_cast<uintptr_t>(device);
    if (address % page != 0 || bytes % page != 0 || bytes == 0) {
      *fd = -1;
      return Status(StatusCode::kInvalidArgument,
                    std::string(v::kName) +
                        " ExportDmabuf: expected a range "
                        "aligned to the " +
                        std::to_string(page) + "-byte host page, got address " +
                        std::to_string(address) + " and " + Bytes(bytes));
    }
    std::string error;
    if (v::ExportDmabufFd(device, bytes, fd, &error)) return Status::Ok();
    return Status(StatusCode::kInvalidArgument,
                  std::string(v::kName) + " ExportDmabuf(" + Bytes(bytes) +
                      "): " + error);
  }
};

}  // namespace

Device* GpuDevice() {
  static GpuDeviceImpl* device = new GpuDeviceImpl();  // never destroyed
  return device;
}

}  // namespace hetjax::device
