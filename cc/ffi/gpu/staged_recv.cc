#include "cc/ffi/gpu/staged_recv.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

namespace hetjax::gpu {
namespace {

// One receive in flight. Staging and flag go back to the pools once both
// holders let go: the bridge (progress done: no more writes into staging,
// no more flag updates) and the stream (fence after the last copy: no more
// flag polls, no more reads of staging).
struct RecvOp {
  RecvOp(StagingContext& context, int ordinal, std::string what)
      : context(context), ordinal(ordinal), what(std::move(what)) {}

  void Drop() {
    if (holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    context.pinned.Release(staging);
    context.flags.Release(flag);
    context.events.Release(ordinal, fence);
  }

  // Bridge progress: raise the flag to the number of whole chunks that are
  // in staging, so each chunk's copy starts as soon as its bytes are there.
  void OnProgress(uint64_t contiguous, bool done, const Status& status) {
    if (!done) {
      device::SignalFlag(flag.host, ChunksIn(contiguous));
      return;
    }
    if (status.ok()) {
      device::SignalFlag(flag.host, static_cast<uint32_t>(chunks));
    } else {
      Status failed = WithContext(status, "receive from " + what);
      bool handler_reports = false;
      {
        std::lock_guard<std::mutex> lock(mu);
        handler_reports = !enqueued;
        if (handler_reports) early_error = failed;
      }
      if (!handler_reports) context.errors.Record(failed);
      device::AbortFlag(flag.host);  // waits exit; the stream goes on
    }
    Drop();
  }

  uint32_t ChunksIn(uint64_t contiguous) const {
    return static_cast<uint32_t>(
        contiguous >= bytes ? chunks : contiguous / chunk_bytes);
  }

  // Decides, against a racing failure, whether the handler reports the
  // error now (returned) or the op goes ahead and later errors are deferred.
  Status CommitToEnqueue() {
    std::lock_guard<std::mutex> lock(mu);
    if (!early_error.ok()) return early_error;
    enqueued = true;
    return Status::Ok();
  }

  StagingContext& context;
  const int ordinal;
  const std::string what;
  device::PinnedPool::Buffer staging;
  device::FlagPool::Flag flag;
  device::Event fence = nullptr;
  uint64_t bytes = 0;
  uint64_t chunk_bytes = 1;
  uint64_t chunks = 0;
  uint64_t deadline_ns = 0;
  std::atomic<int> holds{2};

  std::mutex mu;
  bool enqueued = false;
  Status early_error;
};

}  // namespace

uint64_t WaitDeadlineNs(const BridgeOptions& options) {
  if (options.timeout_seconds <= 0) return 0;
  // Well past the bridge's own timeout: the bridge should always fail first
  // and abort the flag with its clearer error.
  const double t = options.timeout_seconds;
  const double seconds = 2 * t + (t < 10 ? t : 10);
  return static_cast<uint64_t>(seconds * 1e9);
}

Status StagedRecv(StagingContext& context, Bridge& bridge,
                  device::Stream stream, int peer, uint64_t tag,
                  const TensorSpec& spec, void* device_dst) {
  context.retired.Poll();
  if (Status earlier = context.errors.Take(); !earlier.ok()) return earlier;

  StreamDeviceScope scope(context.device, stream);
  if (!scope.status().ok()) return scope.status();

  const std::string what = DescribeMessage(peer, tag, spec);
  auto op = std::make_shared<RecvOp>(context, scope.ordinal(), what);
  op->bytes = spec.num_bytes();
  op->chunk_bytes = std::max<uint64_t>(bridge.options().chunk_bytes, 1);
  op->chunks = (op->bytes + op->chunk_bytes - 1) / op->chunk_bytes;
  op->deadline_ns = WaitDeadlineNs(bridge.options());
  if (op->chunks > UINT32_MAX) {
    return Status(StatusCode::kInvalidArgument,
                  "receive from " + what + ": " + std::to_string(op->chunks) +
                      " chunks exceed the flag's 32-bit count; raise "
                      "chunk_bytes");
  }

  Status status;
  if (op->bytes > 0) status = context.pinned.Acquire(op->bytes, &op->staging);
  if (status.ok()) status = context.flags.Acquire(&op->flag);
  if (status.ok()) status = context.events.Acquire(op->ordinal, &op->fence);
  if (!status.ok()) {
    op->holds.store(1);
    op->Drop();
    return WithContext(status, "receive from " + what);
  }

  bridge.PostRecv(peer, tag, spec, op->staging.data,
                  [op](uint64_t contiguous, bool done, const Status& s) {
                    op->OnProgress(contiguous, done, s);
                  });
  if (Status early = op->CommitToEnqueue(); !early.ok()) {
    op->Drop();  // the stream never saw this op
    return early;
  }

  auto* dst = static_cast<uint8_t*>(device_dst);
  const auto* staging = static_cast<const uint8_t*>(op->staging.data);
  for (uint64_t c = 0; status.ok() && c < op->chunks; ++c) {
    const uint64_t offset = c * op->chunk_bytes;
    const uint64_t length = std::min(op->chunk_bytes, op->bytes - offset);
    status = context.device.WaitFlagAsync(
        op->flag.device, static_cast<uint32_t>(c + 1), op->deadline_ns, stream);
    if (status.ok()) {
      status = context.device.CopyToDeviceAsync(dst + offset, staging + offset,
                                                length, stream);
    }
  }
  if (!status.ok()) device::AbortFlag(op->flag.host);  // release what waits
  Status fenced = context.device.RecordEvent(op->fence, stream);
  if (fenced.ok()) {
    context.retired.Retire(op->fence, [op] {
      if (device::FlagTimedOut(op->flag.host)) {
        op->context.errors.Record(Status(
            StatusCode::kTimeout,
            "receive from " + op->what + ": the device gave up waiting " +
                "for data after " + std::to_string(op->deadline_ns / 1e9) +
                " s (the bridge never completed or aborted it)"));
      }
      op->Drop();
    });
  }
  // Without a fence we cannot know when the stream is done with staging and
  // flag: they stay out of the pools for good (a leak, never a corruption).
  if (!status.ok()) return WithContext(status, "receive from " + what);
  return WithContext(fenced, "receive from " + what);
}

}  // namespace hetjax::gpu
