#include "cc/ffi/gpu/staged_send.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

namespace hetjax::gpu {
namespace {

// One send in flight. Its staging and events go back to the pools once both
// holders let go: the bridge (done: no more reads of staging) and the stream
// (last chunk's event: no more copies into it).
struct SendOp {
  SendOp(StagingContext& context, int ordinal, std::string what)
      : context(context), ordinal(ordinal), what(std::move(what)) {}

  void Drop() {
    if (holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    context.pinned.Release(staging);
    for (device::Event event : events) context.events.Release(ordinal, event);
  }

  // The bridge is about to read [offset, offset + length): wait for the
  // copies of every chunk in that range.
  void WaitForChunks(uint64_t offset, uint64_t length) {
    if (length == 0 || events.empty()) return;
    const uint64_t first = offset / chunk_bytes;
    const uint64_t last = std::min<uint64_t>(
        (offset + length - 1) / chunk_bytes, events.size() - 1);
    for (uint64_t c = first; c <= last; ++c) {
      Status status = context.device.SynchronizeEvent(events[c]);
      if (!status.ok()) {
        context.errors.Record(WithContext(
            status, "send to " + what + ": device->host copy of chunk " +
                        std::to_string(c)));
      }
    }
  }

  StagingContext& context;
  const int ordinal;
  const std::string what;
  device::PinnedPool::Buffer staging;
  std::vector<device::Event> events;  // one per chunk, recorded after it
  uint64_t chunk_bytes = 1;
  std::atomic<int> holds{2};
};

}  // namespace

Status StagedSend(StagingContext& context, Bridge& bridge,
                  device::Stream stream, int peer, uint64_t tag,
                  const TensorSpec& spec, const void* device_src) {
  context.retired.Poll();
  if (Status earlier = context.errors.Take(); !earlier.ok()) return earlier;

  StreamDeviceScope scope(context.device, stream);
  if (!scope.status().ok()) return scope.status();

  const std::string what = DescribeMessage(peer, tag, spec);
  auto op = std::make_shared<SendOp>(context, scope.ordinal(), what);
  const uint64_t bytes = spec.num_bytes();
  op->chunk_bytes = std::max<uint64_t>(bridge.options().chunk_bytes, 1);
  const uint64_t chunks = (bytes + op->chunk_bytes - 1) / op->chunk_bytes;

  Status status;
  if (bytes > 0) status = context.pinned.Acquire(bytes, &op->staging);
  auto* staging = static_cast<uint8_t*>(op->staging.data);
  const auto* src = static_cast<const uint8_t*>(device_src);
  size_t recorded = 0;
  for (uint64_t c = 0; status.ok() && c < chunks; ++c) {
    const uint64_t offset = c * op->chunk_bytes;
    const uint64_t length = std::min(op->chunk_bytes, bytes - offset);
    device::Event event = nullptr;
    status = context.events.Acquire(op->ordinal, &event);
    if (!status.ok()) break;
    op->events.push_back(event);
    status = context.device.CopyToHostAsync(staging + offset, src + offset,
                                            length, stream);
    if (status.ok()) status = context.device.RecordEvent(event, stream);
    if (status.ok()) ++recorded;
  }
  if (!status.ok()) {
    // The bridge never saw this message. Copies already enqueued may still
    // write into staging, so it waits for the last event that was recorded;
    // if none was, nothing can touch it.
    op->holds.store(1);
    if (recorded > 0) {
      context.retired.Retire(op->events[recorded - 1], [op] { op->Drop(); });
    } else {
      op->Drop();
    }
    return WithContext(status, "send to " + what);
  }

  // Copies first, then the send: the gate must only ever wait on events
  // that were recorded already.
  bridge.SendAsync(
      peer, tag, spec, staging,
      [op](uint64_t offset, uint64_t length) {
        op->WaitForChunks(offset, length);
      },
      [op](const Status& done) {
        op->context.errors.Record(
            WithContext(done, "earlier send to " + op->what + " failed"));
        op->Drop();
      });
  if (op->events.empty()) {
    op->Drop();  // nothing was copied: the stream holds nothing
  } else {
    context.retired.Retire(op->events.back(), [op] { op->Drop(); });
  }
  return Status::Ok();
}

}  // namespace hetjax::gpu
