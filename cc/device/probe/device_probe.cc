// Measures what the GPU data path is built on and prints one JSON object:
// pinned copy bandwidth both ways, how fast a flag wait lets the stream go
// once the host signals, and how fast a signal kernel's flag reaches the
// host, for flags in AllocMapped memory (the staged path) and in a /dev/shm
// segment page-locked with RegisterHost (the slot channels). Run on the GPU
// machine by scripts/gpu_smoke.sh.
//
//   hetjax_device_probe [--bytes N] [--reps R]
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cc/device/device.h"

namespace {

using hetjax::Status;
using hetjax::device::Device;
using hetjax::device::Event;
using hetjax::device::WaitFlag;
using Clock = std::chrono::steady_clock;

void Die(const Status& status, const char* what) {
  if (status.ok()) return;
  std::fprintf(stderr, "device_probe: %s: %s\n", what,
               status.message().c_str());
  std::exit(1);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> xs) {
  std::sort(xs.begin(), xs.end());
  return xs[xs.size() / 2];
}

// Best-of-reps bandwidth in GB/s of one whole-buffer copy.
double CopyBandwidth(Device& dev, bool to_device, void* host, void* device,
                     size_t bytes, int reps) {
  double best = 0;
  for (int i = 0; i < reps + 1; ++i) {  // the first run warms up
    const auto t0 = Clock::now();
    Die(to_device ? dev.CopyToDeviceAsync(device, host, bytes, nullptr)
                  : dev.CopyToHostAsync(host, device, bytes, nullptr),
        "copy");
    Die(dev.SynchronizeStream(nullptr), "synchronize");
    const double gbps = bytes / Seconds(t0, Clock::now()) / 1e9;
    if (i > 0) best = std::max(best, gbps);
  }
  return best;
}

// Time from the host's signal until an event recorded behind the wait
// completes, in microseconds (median of reps).
double FlagReleaseMicros(Device& dev, WaitFlag* host_flag,
                         const WaitFlag* device_flag, int reps) {
  Event event = nullptr;
  Die(dev.CreateEvent(&event), "create event");
  std::vector<double> micros;
  for (int i = 0; i < reps; ++i) {
    hetjax::device::ResetFlag(host_flag);
    Die(dev.WaitFlagAsync(device_flag, 1, /*timeout_ns=*/5000000000ull,
                          nullptr),
        "enqueue wait");
    Die(dev.RecordEvent(event, nullptr), "record event");
    // Let the kernel start polling before we release it.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    bool done = false;
    Die(dev.QueryEvent(event, &done), "query event");
    if (done) {
      std::fprintf(stderr,
                   "device_probe: the flag wait did not hold the "
                   "stream (released before the signal)\n");
      std::exit(1);
    }
    const auto t0 = Clock::now();
    hetjax::device::SignalFlag(host_flag, 1);
    while (!done) Die(dev.QueryEvent(event, &done), "query event");
    micros.push_back(Seconds(t0, Clock::now()) * 1e6);
  }
  Die(dev.DestroyEvent(event), "destroy event");
  return Median(micros);
}

// Time from enqueuing a signal kernel until the host sees the flag.
double SignalSeenMicros(Device& dev, WaitFlag* host_flag, WaitFlag* device_flag,
                        int reps) {
  std::vector<double> micros;
  for (int i = 0; i < reps; ++i) {
    hetjax::device::ResetFlag(host_flag);
    const auto t0 = Clock::now();
    Die(dev.SignalFlagAsync(host_flag, device_flag, 1, nullptr), "signal");
    while (__atomic_load_n(&host_flag->ready, __ATOMIC_ACQUIRE) < 1) {
    }
    micros.push_back(Seconds(t0, Clock::now()) * 1e6);
    Die(dev.SynchronizeStream(nullptr), "synchronize");
  }
  return Median(micros);
}

// A /dev/shm page, page-locked: where the slot channels keep their flags.
void RegisteredShmFlag(Device& dev, WaitFlag** host_flag,
                       WaitFlag** device_flag) {
  const std::string name = "/hetjax-probe-" + std::to_string(::getpid());
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ::ftruncate(fd, 4096) != 0)
    Die(Status(hetjax::StatusCode::kInvalidArgument, "shm_open"), "shm");
  void* base = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ::shm_unlink(name.c_str());
  void* device = nullptr;
  Die(dev.RegisterHost(base, 4096, &device), "register shm");
  *host_flag = static_cast<WaitFlag*>(base);
  *device_flag = static_cast<WaitFlag*>(device);
}

// A wait nobody signals must still end: at its deadline, with timed_out set.
bool DeadlineReleases(Device& dev, WaitFlag* host_flag,
                      const WaitFlag* device_flag, double* waited_ms) {
  hetjax::device::ResetFlag(host_flag);
  const auto t0 = Clock::now();
  Die(dev.WaitFlagAsync(device_flag, 1, /*timeout_ns=*/20000000, nullptr),
      "enqueue wait");
  Die(dev.SynchronizeStream(nullptr), "synchronize");
  *waited_ms = Seconds(t0, Clock::now()) * 1e3;
  return hetjax::device::FlagTimedOut(host_flag);
}

// Abort releases at once and is not reported as a timeout.
bool AbortReleases(Device& dev, WaitFlag* host_flag,
                   const WaitFlag* device_flag) {
  hetjax::device::ResetFlag(host_flag);
  Die(dev.WaitFlagAsync(device_flag, 1, /*timeout_ns=*/5000000000ull, nullptr),
      "enqueue wait");
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  hetjax::device::AbortFlag(host_flag);
  Die(dev.SynchronizeStream(nullptr), "synchronize");
  return !hetjax::device::FlagTimedOut(host_flag);
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = size_t{256} << 20;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--bytes") == 0)
      bytes = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  }
  Device* dev = hetjax::device::GpuDevice();
  if (dev == nullptr) {
    std::fprintf(stderr, "device_probe: built without a GPU flavour\n");
    return 1;
  }
  void* host = nullptr;
  void* device = nullptr;
  Die(dev->AllocPinned(bytes, &host), "pinned alloc");
  Die(dev->AllocDevice(bytes, &device), "device alloc");
  std::memset(host, 0x5a, bytes);
  const double h2d = CopyBandwidth(*dev, true, host, device, bytes, reps);
  const double d2h = CopyBandwidth(*dev, false, host, device, bytes, reps);

  void* flag_host = nullptr;
  void* flag_device = nullptr;
  Die(dev->AllocMapped(sizeof(WaitFlag), &flag_host, &flag_device),
      "mapped alloc");
  auto* hf = static_cast<WaitFlag*>(flag_host);
  auto* df = static_cast<const WaitFlag*>(flag_device);
  const double release_us = FlagReleaseMicros(*dev, hf, df, 4 * reps);
  double deadline_ms = 0;
  const bool deadline_ok = DeadlineReleases(*dev, hf, df, &deadline_ms);
  const bool abort_ok = AbortReleases(*dev, hf, df);
  const double seen_us =
      SignalSeenMicros(*dev, hf, static_cast<WaitFlag*>(flag_device), 4 * reps);
  WaitFlag *shm_host = nullptr, *shm_device = nullptr;
  RegisteredShmFlag(*dev, &shm_host, &shm_device);
  const double shm_release_us =
      FlagReleaseMicros(*dev, shm_host, shm_device, 4 * reps);
  const double shm_seen_us =
      SignalSeenMicros(*dev, shm_host, shm_device, 4 * reps);

  std::printf(
      "{\"flavour\": \"%s\", \"bytes\": %zu, \"h2d_GBps\": %.2f, "
      "\"d2h_GBps\": %.2f, \"flag_release_us_median\": %.1f, "
      "\"deadline_sets_timed_out\": %s, \"deadline_20ms_waited_ms\": %.2f, "
      "\"abort_releases\": %s, \"signal_seen_us_median\": %.1f, "
      "\"shm_flag_release_us_median\": %.1f, "
      "\"shm_signal_seen_us_median\": %.1f}\n",
      dev->name(), bytes, h2d, d2h, release_us, deadline_ok ? "true" : "false",
      deadline_ms, abort_ok ? "true" : "false", seen_us, shm_release_us,
      shm_seen_us);
  dev->FreeMapped(flag_host);
  dev->FreeDevice(device);
  dev->FreePinned(host);
  return deadline_ok && abort_ok ? 0 : 2;
}
