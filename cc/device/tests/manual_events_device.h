// Test double: the host device, except that events complete only when the
// test says so. Lets CPU tests see what the code does while a GPU copy is
// still "in flight" (gating, deferred release), which the always-finished
// host device cannot show.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <set>
#include <vector>

#include "cc/device/device.h"

namespace hetjax::device::testing {

class ManualEventsDevice final : public Device {
 public:
  // Completes every event recorded so far, and future ones too if `sticky`.
  void CompleteAll(bool sticky = false) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.clear();
    sticky_ = sticky;
    cv_.notify_all();
  }
  void Complete(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(event);
    cv_.notify_all();
  }
  size_t pending_events() {
    std::lock_guard<std::mutex> lock(mu_);
    return pending_.size();
  }
  // Every event recorded so far, in order.
  std::vector<Event> recorded() {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }
  uint64_t synchronize_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return synchronize_calls_;
  }

  const char* name() const override { return "manual-events"; }
  Status StreamDevice(Stream s, int* o) override {
    return host().StreamDevice(s, o);
  }
  Status CurrentDevice(int* o) override { return host().CurrentDevice(o); }
  Status SetCurrentDevice(int o) override { return host().SetCurrentDevice(o); }
  Status CopyToDeviceAsync(void* d, const void* s, size_t n,
                           Stream st) override {
    return host().CopyToDeviceAsync(d, s, n, st);
  }
  Status CopyToHostAsync(void* d, const void* s, size_t n, Stream st) override {
    return host().CopyToHostAsync(d, s, n, st);
  }
  Status MemsetAsync(void* d, int v, size_t n, Stream st) override {
    return host().MemsetAsync(d, v, n, st);
  }
  Status SynchronizeStream(Stream st) override {
    return host().SynchronizeStream(st);
  }
  Status AllocPinned(size_t n, void** h) override {
    return host().AllocPinned(n, h);
  }
  Status FreePinned(void* h) override { return host().FreePinned(h); }
  Status AllocMapped(size_t n, void** h, void** d) override {
    return host().AllocMapped(n, h, d);
  }
  Status FreeMapped(void* h) override { return host().FreeMapped(h); }
  Status AllocDevice(size_t n, void** d) override {
    return host().AllocDevice(n, d);
  }
  Status FreeDevice(void* d) override { return host().FreeDevice(d); }
  Status CreateEvent(Event* e) override { return host().CreateEvent(e); }
  Status DestroyEvent(Event e) override { return host().DestroyEvent(e); }
  Status WaitFlagAsync(const WaitFlag* f, uint32_t t, uint64_t ns,
                       Stream st) override {
    return host().WaitFlagAsync(f, t, ns, st);
  }
  Status SignalFlagAsync(WaitFlag* h, WaitFlag* d, uint32_t v,
                         Stream st) override {
    return host().SignalFlagAsync(h, d, v, st);
  }
  Status CopyDeviceAsync(void* d, const void* s, size_t n, Stream st) override {
    return host().CopyDeviceAsync(d, s, n, st);
  }
  Status RegisterHost(void* h, size_t n, void** d) override {
    return host().RegisterHost(h, n, d);
  }
  Status UnregisterHost(void* h) override { return host().UnregisterHost(h); }
  Status ExportIpc(void* d, IpcHandle* out) override {
    return host().ExportIpc(d, out);
  }
  Status OpenIpc(const IpcHandle& h, void** d) override {
    return host().OpenIpc(h, d);
  }
  Status CloseIpc(void* d) override { return host().CloseIpc(d); }

  Status RecordEvent(Event event, Stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    recorded_.push_back(event);
    if (!sticky_) pending_.insert(event);
    return Status::Ok();
  }
  Status QueryEvent(Event event, bool* done) override {
    std::lock_guard<std::mutex> lock(mu_);
    *done = pending_.count(event) == 0;
    return Status::Ok();
  }
  Status SynchronizeEvent(Event event) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++synchronize_calls_;
    cv_.wait(lock, [&] { return pending_.count(event) == 0; });
    return Status::Ok();
  }

 private:
  static Device& host() { return HostDevice(); }
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<Event> pending_;
  std::vector<Event> recorded_;
  bool sticky_ = false;
  uint64_t synchronize_calls_ = 0;
};

}  // namespace hetjax::device::testing
