// The device layer: the few things the bridge needs from an accelerator,
// behind one vendor-neutral interface. Streams and events are opaque
// (cudaStream_t / hipStream_t, cudaEvent_t / hipEvent_t as void*), so code
// above this layer compiles once for every flavour and never includes a
// vendor header.
//
// Implementations: HostDevice() (plain memcpy, synchronous "streams"; lets the
// staging logic above run and be tested on a CPU machine) and GpuDevice()
// (CUDA or HIP, whichever flavour was built; nullptr when none was).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cc/device/combine.h"
#include "cc/device/pair_exchange.h"
#include "cc/transport/status.h"

namespace hetjax::device {

using Stream = void*;  // nullptr is the host device's only stream
using Event = void*;

// A word block in mapped pinned memory: a host thread writes it, a wait
// enqueued on a device stream reads it. We do not use cuStreamWaitValue32 or
// a host function for this: on H200 hosts (driver 580, CUDA 13) both hang
// the stream; a one-thread polling kernel is what releases reliably.
struct WaitFlag {
  // Host: a count that only grows. A wait for `target` releases once
  // ready >= target, so one flag serves every chunk of a message.
  uint32_t ready;
  // Host: nonzero releases every waiter at once (the message failed).
  uint32_t abort;
  // Device: set to 1 by a waiter whose deadline passed before release.
  uint32_t timed_out;
  uint32_t reserved;
};

class Device {
 public:
  virtual ~Device() = default;
  // "host", "cuda" or "rocm".
  virtual const char* name() const = 0;

  // Device selection: GPU calls act on the calling thread's current device;
  // a stream belongs to one device. Callers make the stream's device current
  // before using pooled events (which belong to a device too).
  virtual Status StreamDevice(Stream stream, int* ordinal) = 0;
  virtual Status CurrentDevice(int* ordinal) = 0;
  virtual Status SetCurrentDevice(int ordinal) = 0;

  // Stream-ordered copies between pinned host memory and device memory.
  virtual Status CopyToDeviceAsync(void* device_dst, const void* host_src,
                                   size_t bytes, Stream stream) = 0;
  virtual Status CopyToHostAsync(void* host_dst, const void* device_src,
                                 size_t bytes, Stream stream) = 0;
  virtual Status MemsetAsync(void* device_dst, int value, size_t bytes,
                             Stream stream) = 0;
  virtual Status SynchronizeStream(Stream stream) = 0;

  // Page-locked host memory (portable: usable from every device).
  virtual Status AllocPinned(size_t bytes, void** host) = 0;
  virtual Status FreePinned(void* host) = 0;
  // Pinned and mapped into the device address space: `device` is the
  // address kernels use for the same bytes.
  virtual Status AllocMapped(size_t bytes, void** host, void** device) = 0;
  virtual Status FreeMapped(void* host) = 0;
  // Plain device memory (probes and tests).
  virtual Status AllocDevice(size_t bytes, void** device) = 0;
  virtual Status FreeDevice(void* device) = 0;

  // Events mark a point in a stream. Created on the current device.
  virtual Status CreateEvent(Event* event) = 0;
  virtual Status RecordEvent(Event event, Stream stream) = 0;
  virtual Status QueryEvent(Event event, bool* done) = 0;
  virtual Status SynchronizeEvent(Event event) = 0;
  virtual Status DestroyEvent(Event event) = 0;

  // Enqueue a wait: work enqueued on `stream` after this runs only once
  // flag->ready >= target or flag->abort != 0, or after `timeout_ns` (0: no
  // limit), in which case the waiter sets flag->timed_out = 1 and releases.
  // `flag_device` is the device address of the flag (see AllocMapped).
  virtual Status WaitFlagAsync(const WaitFlag* flag_device, uint32_t target,
                               uint64_t timeout_ns, Stream stream) = 0;
  // Enqueue a signal: once the work before it on `stream` is done, raise
  // flag->ready to `value` (never lowers it), visible system-wide. This is
  // how one process's stream releases another process's wait without a host
  // thread in between (slot channels, cc/ffi/gpu/slot_channel.h).
  // Both views of the flag: a GPU may signal from the device or, in stream
  // order, from a host thread (HETJAX_FLAG_SIGNAL=host, docs/gpu.md).
  virtual Status SignalFlagAsync(WaitFlag* flag_host, WaitFlag* flag_device,
                                 uint32_t value, Stream stream) = 0;

  // One chunk's hand-off between two streams: wait for every flag in
  // `waits` (as WaitFlagAsync, sharing one deadline), copy `bytes`, then
  // raise `signal` to `signal_value` (as SignalFlagAsync; none when
  // signal_device is null). The default enqueues those as separate ops, the
  // copy on the copy engine. With `fuse`, a GPU runs all of it as one kernel
  // instead: each separate op costs a launch and a scheduling gap of
  // several us, most of a small message's time, while for large copies one
  // block of threads cannot match the copy engine.
  struct FlagTarget {
    const WaitFlag* flag_device = nullptr;  // null: no wait
    uint32_t target = 0;
  };
  enum class CopyKind : uint8_t {
    kDeviceToDevice,
    kDeviceToHost,
    kHostToDevice
  };
  struct Handoff {
    static constexpr int kMaxWaits = 2;
    FlagTarget waits[kMaxWaits];
    // The copy, in two views of the same bytes: the addresses the copy
    // engine is given (host addresses for host memory), and the ones a
    // kernel dereferences (device views of mapped or registered host
    // memory, device memory, peer memory from OpenIpc).
    CopyKind kind = CopyKind::kDeviceToDevice;
    void* dst = nullptr;
    const void* src = nullptr;
    void* dst_device = nullptr;
    const void* src_device = nullptr;
    size_t bytes = 0;
    WaitFlag* signal_host = nullptr;
    WaitFlag* signal_device = nullptr;
    uint32_t signal_value = 0;
    uint64_t timeout_ns = 0;
    bool fuse = false;
    // The source is another GPU's memory opened with OpenIpc, possibly of a
    // GPU this process cannot see. A GPU then copies with its own threads
    // (loads over NVLink, ~320 GB/s measured on H200), which needs no peer
    // access set up between devices of this process.
    bool peer_source = false;
  };
  virtual Status HandoffAsync(const Handoff& handoff, Stream stream);
  // The copy step of an unfused hand-off (the default: the copy engine, by
  // `kind`).
  virtual Status HandoffCopyAsync(const Handoff& handoff, Stream stream);

  // Stream-ordered copy between device buffers, also across devices (peer
  // memory opened with OpenIpc).
  virtual Status CopyDeviceAsync(void* device_dst, const void* device_src,
                                 size_t bytes, Stream stream) = 0;

  // A second stream of the current device, for work that must overlap the
  // caller's stream (a GPU collective receives on one while it reduces on
  // the other), ordered against it with events. Never destroyed by the
  // caller: such streams are cached for the life of the process. The host
  // device has one stream (nullptr) and returns it.
  virtual Status CreateStream(Stream* stream);
  // Work enqueued on `stream` after this runs once `event` has completed.
  virtual Status StreamWaitEvent(Stream stream, Event event);
  // Enqueues `combine` (combine.h) on `stream`. Only GPU devices run it: on
  // the host device the collectives use their host kernels instead.
  virtual Status CombineAsync(const Combine& combine, Stream stream);
  // Enqueues a two-member collective's exchange (pair_exchange.h) on
  // `stream`. Only GPU devices run it.
  virtual Status PairExchangeAsync(const PairExchange& exchange, Stream stream);
  // How many pair exchanges that only move bytes (a combine of kU8 into the
  // output, no publish_copy) the current device runs at once, every block
  // of each resident: moves on several streams that wait for each other's
  // peers must never wait for a multiprocessor. 1 where it has no kernels.
  virtual Status ConcurrentPairMoves(int* count);

  // Page-locks and maps memory this process already has (a shared-memory
  // segment), so copies use it at pinned speed and kernels can read it.
  virtual Status RegisterHost(void* host, size_t bytes, void** device) = 0;
  virtual Status UnregisterHost(void* host) = 0;

  // Device memory shared between processes of one host. ExportIpc writes an
  // opaque handle for memory from AllocDevice; another process opens it with
  // OpenIpc (its devices must include the owner's, see docs/gpu.md).
  static constexpr size_t kIpcHandleBytes = 64;
  struct IpcHandle {
    uint8_t bytes[kIpcHandleBytes];
  };
  virtual Status ExportIpc(void* device, IpcHandle* handle) = 0;
  virtual Status OpenIpc(const IpcHandle& handle, void** device) = 0;
  virtual Status CloseIpc(void* device) = 0;

  // Exports [device, device + bytes) of memory from AllocDevice as a
  // dma-buf file descriptor (the caller closes it), so an RDMA NIC can
  // register GPU memory directly (cc/transport/verbs_gpu_registration.h).
  // Both ends must be aligned to the host page size. Devices that cannot
  // (host memory, ROCm without hsa_amd_portable_export_dmabuf) say so.
  virtual Status ExportDmabuf(void* device, size_t bytes, int* fd) {
    (void)device;
    (void)bytes;
    *fd = -1;
    return Status(StatusCode::kInvalidArgument,
                  std::string("unsupported: the ") + name() +
                      " device layer cannot export memory as dma-buf");
  }
};

Device& HostDevice();
// The CUDA or HIP device layer of this build, or nullptr (flavour none).
Device* GpuDevice();

// Host-side flag writes. Stores are release-ordered: bytes the host wrote
// before signalling are visible to whoever sees the new value.
void ResetFlag(WaitFlag* flag_host);
void SignalFlag(WaitFlag* flag_host, uint32_t ready);  // never lowers ready
void AbortFlag(WaitFlag* flag_host);
bool FlagTimedOut(const WaitFlag* flag_host);

}  // namespace hetjax::device
