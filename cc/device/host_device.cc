// The host "device": device memory is host memory, every stream operation
// runs at once on the calling thread, so an event is complete as soon as it
// is recorded and a flag wait blocks the caller. That is enough to run the
// GPU staging logic (chunking, gating, pools, error paths) on a CPU machine,
// and it is the CPU island's end of a slot channel to a GPU island
// (cc/ffi/gpu/host_channel.h): its copies run on several threads
// (host_copy.h) and its flag waits spin before they sleep.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "cc/device/device.h"
#include "cc/device/host_copy.h"
#include "cc/transport/spin_policy.h"

namespace hetjax::device {

void ResetFlag(WaitFlag* flag_host) {
  __atomic_store_n(&flag_host->ready, 0u, __ATOMIC_RELAXED);
  __atomic_store_n(&flag_host->abort, 0u, __ATOMIC_RELAXED);
  __atomic_store_n(&flag_host->timed_out, 0u, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}

void SignalFlag(WaitFlag* flag_host, uint32_t ready) {
  // Progress callbacks of one message may race (several tcp streams); a
  // late, smaller report must not take back what a waiter may have seen.
  uint32_t seen = __atomic_load_n(&flag_host->ready, __ATOMIC_RELAXED);
  while (seen < ready &&
         !__atomic_compare_exchange_n(&flag_host->ready, &seen, ready, false,
                                      __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
  }
}

void AbortFlag(WaitFlag* flag_host) {
  __atomic_store_n(&flag_host->abort, 1u, __ATOMIC_RELEASE);
}

bool FlagTimedOut(const WaitFlag* flag_host) {
  return __atomic_load_n(&flag_host->timed_out, __ATOMIC_ACQUIRE) != 0;
}

namespace {

Status Invalid(const std::string& what) {
  return Status(StatusCode::kInvalidArgument, "host device: " + what);
}

Status AllocHost(size_t bytes, void** out) {
  // 64-byte alignment: what the GPU allocators give, and a cache line, so
  // flags in one block never share a line with unrelated data.
  size_t rounded = (bytes + 63) / 64 * 64;
  *out = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (*out == nullptr) {
    return Status(StatusCode::kResourceExhausted,
                  "host device: out of memory allocating " +
                      std::to_string(bytes) + " bytes");
  }
  return Status::Ok();
}

class HostDeviceImpl final : public Device {
 public:
  const char* name() const override { return "host"; }

  Status StreamDevice(Stream, int* ordinal) override {
    *ordinal = 0;
    return Status::Ok();
  }
  Status CurrentDevice(int* ordinal) override {
    *ordinal = 0;
    return Status::Ok();
  }
  Status SetCurrentDevice(int ordinal) override {
    return ordinal == 0 ? Status::Ok()
                        : Invalid("only device 0 exists, asked for " +
                                  std::to_string(ordinal));
  }

  Status CopyToDeviceAsync(void* dst, const void* src, size_t bytes,
                           Stream) override {
    ParallelCopy(dst, src, bytes);
    return Status::Ok();
  }
  Status CopyToHostAsync(void* dst, const void* src, size_t bytes,
                         Stream) override {
    ParallelCopy(dst, src, bytes);
    return Status::Ok();
  }
  Status MemsetAsync(void* dst, int value, size_t bytes, Stream) override {
    if (bytes) std::memset(dst, value, bytes);
    return Status::Ok();
  }
  Status SynchronizeStream(Stream) override { return Status::Ok(); }

  Status AllocPinned(size_t bytes, void** host) override {
    return AllocHost(bytes, host);
  }
  Status FreePinned(void* host) override {
    std::free(host);
    return Status::Ok();
  }
  Status AllocMapped(size_t bytes, void** host, void** device) override {
    Status status = AllocHost(bytes, host);
    *device = *host;
    return status;
  }
  Status FreeMapped(void* host) override {
    std::free(host);
    return Status::Ok();
  }
  Status AllocDevice(size_t bytes, void** device) override {
    return AllocHost(bytes, device);
  }
  Status FreeDevice(void* device) override {
    std::free(device);
    return Status::Ok();
  }

  // Events carry no state: whatever was enqueued before has already run.
  // A distinct non-null handle per event keeps callers' bookkeeping honest.
  Status CreateEvent(Event* event) override {
    *event = new char;
    return Status::Ok();
  }
  Status RecordEvent(Event event, Stream) override {
    return event ? Status::Ok() : Invalid("RecordEvent on a null event");
  }
  Status QueryEvent(Event event, bool* done) override {
    *done = true;
    return event ? Status::Ok() : Invalid("QueryEvent on a null event");
  }
  Status SynchronizeEvent(Event event) override {
    return event ? Status::Ok() : Invalid("SynchronizeEvent on a null event");
  }
  Status DestroyEvent(Event event) override {
    delete static_cast<char*>(event);
    return Status::Ok();
  }

  // The stream is the calling thread, so waiting on the stream means
  // blocking here, with the same release rules as the GPU kernel. It spins
  // first (spin_policy.h): a GPU peer hands over a chunk every few hundred
  // us, and a sleep costs more than that gap on a virtual machine.
  Status WaitFlagAsync(const WaitFlag* flag, uint32_t target,
                       uint64_t timeout_ns, Stream) override {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    auto* words = const_cast<WaitFlag*>(flag);
    while (__atomic_load_n(&words->ready, __ATOMIC_ACQUIRE) < target &&
           __atomic_load_n(&words->abort, __ATOMIC_ACQUIRE) == 0) {
      const Clock::duration waited = Clock::now() - start;
      if (timeout_ns != 0 &&
          static_cast<uint64_t>(
              std::chrono::duration_cast<std::chrono::nanoseconds>(waited)
                  .count()) > timeout_ns) {
        __atomic_store_n(&words->timed_out, 1u, __ATOMIC_RELEASE);
        break;
      }
      if (waited < SpinBudget()) {
        SpinPause();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
    return Status::Ok();
  }

  Status SignalFlagAsync(WaitFlag* flag, WaitFlag*, uint32_t value,
                         Stream) override {
    SignalFlag(flag, value);
    return Status::Ok();
  }
  Status CopyDeviceAsync(void* dst, const void* src, size_t bytes,
                         Stream) override {
    ParallelCopy(dst, src, bytes);
    return Status::Ok();
  }
  // One stream: the calling thread, where everything before has run.
  Status CreateStream(Stream* stream) override {
    *stream = nullptr;
    return Status::Ok();
  }
  Status StreamWaitEvent(Stream, Event event) override {
    return event ? Status::Ok() : Invalid("StreamWaitEvent on a null event");
  }
  Status RegisterHost(void* host, size_t, void** device) override {
    *device = host;
    return Status::Ok();
  }
  Status UnregisterHost(void*) override { return Status::Ok(); }

  // "Device" memory is this process's heap, so a handle is an address plus
  // the pid it is valid in: opening works within the exporting process
  // (tests), and is refused clearly anywhere else.
  Status ExportIpc(void* device, IpcHandle* handle) override {
    std::memset(handle->bytes, 0, sizeof(handle->bytes));
    const uint64_t words[2] = {reinterpret_cast<uint64_t>(device),
                               static_cast<uint64_t>(getpid())};
    std::memcpy(handle->bytes, words, sizeof(words));
    return Status::Ok();
  }
  Status OpenIpc(const IpcHandle& handle, void** device) override {
    uint64_t words[2];
    std::memcpy(words, handle.bytes, sizeof(words));
    if (words[1] != static_cast<uint64_t>(getpid())) {
      return Invalid("IPC handle of process " + std::to_string(words[1]) +
                     " opened in process " + std::to_string(getpid()) +
                     ": host memory is not shared between processes");
    }
    *device = reinterpret_cast<void*>(words[0]);
    return Status::Ok();
  }
  Status CloseIpc(void*) override { return Status::Ok(); }
};

}  // namespace

Device& HostDevice() {
  static HostDeviceImpl* device = new HostDeviceImpl();  // never destroyed
  return *device;
}

}  // namespace hetjax::device
