#include "cc/ffi/gpu/slot_channel.h"

#include <algorithm>
#include <atomic>
#include <map>

#include "cc/ffi/gpu/gpu_tuning.h"
#include "cc/ffi/gpu/staged_recv.h"

namespace hetjax::gpu {
namespace {

TensorSpec DescriptorSpec() {
  TensorSpec spec;
  spec.dtype = DType::kBytes;
  spec.rank = 1;
  spec.dims[0] = sizeof(SlotDescriptor);
  return spec;
}

// Chunk n of a direction: its slot and the generation the slot is in.
uint32_t SlotOf(uint64_t n, uint32_t slots) {
  return static_cast<uint32_t>(n % slots);
}
uint32_t GenerationOf(uint64_t n, uint32_t slots) {
  return static_cast<uint32_t>(n / slots + 1);
}

uint64_t TargetChunks(SlotPath path) {
  return path == SlotPath::kIpc ? kIpcTargetChunks : kTargetChunks;
}

// Chunk c of a message whose first chunk is `first`: its slot, the slot's
// generation, and a hand-off with the size, deadline and fusing filled in
// (the waits, addresses and signal are the direction's to add).
struct Chunk {
  uint32_t slot = 0;
  uint32_t generation = 0;
  uint64_t offset = 0;
  device::Device::Handoff move;
};
Chunk PlanChunk(const ChunkPlan& plan, uint64_t message_bytes, uint64_t first,
                uint64_t c, uint32_t slots, uint64_t deadline, bool fuse) {
  Chunk chunk;
  chunk.slot = SlotOf(first + c, slots);
  chunk.generation = GenerationOf(first + c, slots);
  chunk.offset = c * plan.chunk_bytes;
  chunk.move.bytes = std::min(plan.chunk_bytes, message_bytes - chunk.offset);
  chunk.move.timeout_ns = deadline;
  chunk.move.fuse = fuse;
  return chunk;
}

bool AnyTimedOut(const SlotRing& ring) {
  for (uint32_t s = 0; s < ring.shape().slots; ++s) {
    if (device::FlagTimedOut(ring.filled_host(s)) ||
        device::FlagTimedOut(ring.freed_host(s))) {
      return true;
    }
  }
  return false;
}

// What a stream-side op holds until its fence passes (and, for a receive,
// until the descriptor arrived): the channel itself, an event, a flag.
struct SlotOp {
  SlotOp(StagingContext& context, std::shared_ptr<SlotChannel> channel,
         int ordinal, std::string what)
      : context(context),
        channel(std::move(channel)),
        ordinal(ordinal),
        what(std::move(what)) {}

  void Drop() {
    if (holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (flag.host != nullptr) context.flags.Release(flag);
    if (fence != nullptr) context.events.Release(ordinal, fence);
  }

  StagingContext& context;
  std::shared_ptr<SlotChannel> channel;
  const int ordinal;
  const std::string what;
  device::FlagPool::Flag flag;  // receive: "descriptor checked"
  device::Event fence = nullptr;
  std::atomic<int> holds{1};
  SlotDescriptor descriptor;

  std::mutex mu;
  bool enqueued = false;
  Status early_error;
};

}  // namespace

const char* SlotPathName(SlotPath path) {
  return path == SlotPath::kIpc ? "ipc" : "host";
}

ChunkPlan PlanChunks(uint64_t bytes, uint64_t slot_bytes,
                     uint64_t target_chunks) {
  if (bytes == 0) return {};
  const uint64_t target = (bytes + target_chunks - 1) / target_chunks;
  const uint64_t chunk = std::min(
      slot_bytes, std::max(kMinChunkBytes, (target + 4095) / 4096 * 4096));
  return {chunk, (bytes + chunk - 1) / chunk};
}

uint64_t FusedMaxBytes() { return GetGpuTuning().fused_max_bytes; }

Status CheckDescriptor(int peer, uint64_t tag, const TensorSpec& expected,
                       uint64_t first_chunk, SlotPath path,
                       const SlotDescriptor& got) {
  const std::string mine = DescribeMessage(peer, tag, expected);
  if (got.magic != kSlotDescriptorMagic) {
    return Status(StatusCode::kMismatch,
                  "receive from " + mine +
                      ": the fast-path descriptor is corrupt (magic " +
                      std::to_string(got.magic) + ")");
  }
  if (got.tag != tag || got.spec != expected) {
    return Status(StatusCode::kMismatch,
                  "receive from " + mine + ": expected tag " +
                      std::to_string(tag) + ", " + expected.ToString() +
                      " but the sender's next message is tag " +
                      std::to_string(got.tag) + ", " + got.spec.ToString() +
                      " (gpu fast path: receives must follow the send order)");
  }
  if (got.first_chunk != first_chunk ||
      got.path != static_cast<uint8_t>(path)) {
    return Status(
        StatusCode::kMismatch,
        "receive from " + mine +
            ": the sender's message starts at "
            "chunk " +
            std::to_string(got.first_chunk) + " on path " +
            std::to_string(got.path) + ", this receiver is at chunk " +
            std::to_string(first_chunk) + " on path " + SlotPathName(path) +
            " (an earlier message went wrong on this channel)");
  }
  return Status::Ok();
}

Status SlotChannel::Create(const SlotChannelConfig& config,
                           std::shared_ptr<SlotChannel>* out) {
  if ((config.local_cpu || config.peer_cpu) && config.path != SlotPath::kHost) {
    return Status(StatusCode::kInvalidArgument,
                  "gpu channel to peer " + std::to_string(config.peer) +
                      ": a CPU island's end needs the host path, not " +
                      SlotPathName(config.path));
  }
  std::shared_ptr<SlotChannel> channel(new SlotChannel(config));
  SlotRing::Shape shape{config.slots, config.slot_bytes,
                        config.path == SlotPath::kHost};
  Status status = SlotRing::Create(config.outbound_name, shape, &channel->out_);
  if (!status.ok()) return status;
  channel->out_view_ = channel->out_.get();
  *out = std::move(channel);
  return Status::Ok();
}

SlotChannel::~SlotChannel() {
  if (send_slots_ != nullptr) (void)send_device_->FreeDevice(send_slots_);
  if (recv_slots_ != nullptr) (void)recv_device_->CloseIpc(recv_slots_);
}

SlotChannel::SlotBytes SlotChannel::SlotAt(const SlotRing& ring,
                                           void* gpu_slots,
                                           uint32_t slot) const {
  if (config_.path == SlotPath::kIpc) {
    auto* bytes =
        static_cast<uint8_t*>(gpu_slots) + size_t{slot} * config_.slot_bytes;
    return {bytes, bytes};
  }
  return {ring.data_host(slot), ring.data_device(slot)};
}

Status SlotChannel::BrokenStatus() {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_;
}

void SlotChannel::Break(const Status& why) {
  std::lock_guard<std::mutex> lock(broken_mu_);
  if (broken_.ok()) {
    broken_ = Status(why.code(), "gpu channel to peer " +
                                     std::to_string(config_.peer) +
                                     " is broken: " + why.message());
  }
  if (out_view_ != nullptr) out_view_->AbortAll();
  if (in_view_ != nullptr) in_view_->AbortAll();
}

void SlotChannel::WatchPeerOnce(Bridge& bridge) {
  std::call_once(watching_peer_, [&] {
    std::weak_ptr<SlotChannel> weak = weak_from_this();
    bridge.WatchPeer(config_.peer, [weak](const Status& why) {
      if (auto channel = weak.lock()) channel->Break(why);
    });
  });
}

Status SlotChannel::PrepareSend(StagingContext& context) {
  Status status = out_->Register(context.device);
  if (!status.ok() || config_.path != SlotPath::kIpc || send_slots_) {
    return status;
  }
  status = context.device.AllocDevice(
      size_t{config_.slots} * config_.slot_bytes, &send_slots_);
  if (!status.ok()) return status;
  send_device_ = &context.device;
  return context.device.ExportIpc(send_slots_, &send_handle_);
}

Status SlotChannel::PrepareRecv(StagingContext& context) {
  if (in_ == nullptr) {
    Status status = SlotRing::Open(config_.inbound_name, &in_);
    if (!status.ok()) return status;
    const bool want_host = config_.path == SlotPath::kHost;
    if (in_->shape().host_data != want_host) {
      in_.reset();
      return Status(StatusCode::kInvalidArgument,
                    "slot ring " + config_.inbound_name +
                        ": the peer set it up for another path than " +
                        SlotPathName(config_.path));
    }
    std::lock_guard<std::mutex> lock(broken_mu_);
    in_view_ = in_.get();
  }
  return in_->Register(context.device);
}

Status SlotChannel::OpenPeerSlots(device::Device& device,
                                  const device::Device::IpcHandle& handle) {
  Status status = device.OpenIpc(handle, &recv_slots_);
  if (!status.ok()) {
    recv_slots_ = nullptr;
    return WithContext(status,
                       "opening the GPU slots of peer " +
                           std::to_string(config_.peer) +
                           " (CUDA IPC between these GPUs failed; "
                           "HETJAX_GPU_PATH=host stages through host memory "
                           "instead)");
  }
  recv_device_ = &device;
  return Status::Ok();
}

Status SlotChannel::BeginOp(StagingContext& context, Bridge& bridge) {
  context.retired.Poll();
  if (Status earlier = context.errors.Take(); !earlier.ok()) return earlier;
  WatchPeerOnce(bridge);
  return BrokenStatus();
}

Status SlotChannel::Send(StagingContext& context, Bridge& bridge,
                         device::Stream stream, uint64_t tag,
                         const TensorSpec& spec, const void* device_src) {
  if (Status begin = BeginOp(context, bridge); !begin.ok()) return begin;
  StreamDeviceScope scope(context.device, stream);
  if (!scope.status().ok()) return scope.status();
  const int peer = config_.peer;
  const std::string what = DescribeMessage(peer, tag, spec);

  std::lock_guard<std::mutex> lock(send_mu_);
  Status status = PrepareSend(context);
  if (!status.ok()) return WithContext(status, "send to " + what);
  const uint32_t slots = out_->shape().slots;
  const ChunkPlan plan = PlanChunks(spec.num_bytes(), out_->shape().slot_bytes,
                                    TargetChunks(config_.path));

  SlotDescriptor descriptor;
  descriptor.magic = kSlotDescriptorMagic;
  descriptor.path = static_cast<uint8_t>(config_.path);
  descriptor.tag = tag;
  descriptor.spec = spec;
  descriptor.first_chunk = next_send_chunk_;
  descriptor.chunks = plan.chunks;
  descriptor.chunk_bytes = plan.chunk_bytes;
  descriptor.slots_handle = send_handle_;
  // Small and eager: returns once copied, whatever the peer is doing.
  status = bridge.Send(peer, kSlotDescriptorTag, DescriptorSpec(), &descriptor);
  if (!status.ok()) return WithContext(status, "send to " + what);
  const uint64_t first = next_send_chunk_;
  next_send_chunk_ += plan.chunks;
  if (plan.chunks == 0) return Status::Ok();

  const uint64_t deadline = WaitDeadlineNs(bridge.options());
  const bool fuse = spec.num_bytes() <= FusedMaxBytes();
  const auto* src = static_cast<const uint8_t*>(device_src);
  for (uint64_t c = 0; status.ok() && c < plan.chunks; ++c) {
    Chunk chunk =
        PlanChunk(plan, spec.num_bytes(), first, c, slots, deadline, fuse);
    device::Device::Handoff& move = chunk.move;
    // A slot the receiver already gave back needs no wait.
    if (chunk.generation > 1 &&
        __atomic_load_n(&out_->freed_host(chunk.slot)->ready,
                        __ATOMIC_ACQUIRE) < chunk.generation - 1) {
      move.waits[0] = {out_->freed_device(chunk.slot), chunk.generation - 1};
    }
    const SlotBytes to = SlotAt(*out_, send_slots_, chunk.slot);
    move.kind = config_.path == SlotPath::kIpc
                    ? device::Device::CopyKind::kDeviceToDevice
                    : device::Device::CopyKind::kDeviceToHost;
    move.src = move.src_device = src + chunk.offset;
    move.dst = to.host;
    move.dst_device = to.device;
    move.signal_host = out_->filled_host(chunk.slot);
    move.signal_device = out_->filled_device(chunk.slot);
    move.signal_value = chunk.generation;
    status = context.device.HandoffAsync(move, stream);
  }
  if (!status.ok()) {
    Break(status);  // the receiver would wait for chunks that never come
    return WithContext(status, "send to " + what);
  }

  // A wait that ran out its deadline means the receiver stopped freeing
  // slots: learn it once the stream passed, report it on the next op.
  auto op = std::make_shared<SlotOp>(context, shared_from_this(),
                                     scope.ordinal(), what);
  if (Status s = context.events.Acquire(op->ordinal, &op->fence); s.ok()) {
    if (context.device.RecordEvent(op->fence, stream).ok()) {
      SlotRing* ring = out_.get();
      SlotChannel* self = this;  // op->channel keeps it alive
      context.retired.Retire(op->fence, [op, ring, self] {
        if (AnyTimedOut(*ring)) {
          Status timeout(StatusCode::kTimeout,
                         "send to " + op->what +
                             ": the device gave up waiting for the receiver "
                             "to free a slot");
          self->Break(timeout);
          op->context.errors.Record(timeout);
        }
        op->Drop();
      });
    } else {
      op->Drop();
    }
  }
  return Status::Ok();
}

Status SlotChannel::Recv(StagingContext& context, Bridge& bridge,
                         device::Stream stream, uint64_t tag,
                         const TensorSpec& spec, void* device_dst) {
  if (Status begin = BeginOp(context, bridge); !begin.ok()) return begin;
  StreamDeviceScope scope(context.device, stream);
  if (!scope.status().ok()) return scope.status();
  const int peer = config_.peer;
  const std::string what = DescribeMessage(peer, tag, spec);

  std::lock_guard<std::mutex> lock(recv_mu_);
  Status status = PrepareRecv(context);
  if (!status.ok()) return WithContext(status, "receive from " + what);
  const uint32_t slots = in_->shape().slots;
  const ChunkPlan plan = PlanChunks(spec.num_bytes(), in_->shape().slot_bytes,
                                    TargetChunks(config_.path));
  const uint64_t first = next_recv_chunk_;

  auto op = std::make_shared<SlotOp>(context, shared_from_this(),
                                     scope.ordinal(), what);
  status = context.flags.Acquire(&op->flag);
  if (status.ok()) status = context.events.Acquire(op->ordinal, &op->fence);
  if (!status.ok()) {
    op->Drop();
    return WithContext(status, "receive from " + what);
  }

  if (config_.path == SlotPath::kIpc && recv_slots_ == nullptr) {
    // Once per channel: where the peer's slots are is in its first
    // descriptor, and our copies need that address when enqueued.
    status = bridge.Recv(peer, kSlotDescriptorTag, DescriptorSpec(),
                         &op->descriptor);
    if (status.ok()) {
      status =
          CheckDescriptor(peer, tag, spec, first, config_.path, op->descriptor);
    }
    if (status.ok()) {
      status = OpenPeerSlots(context.device, op->descriptor.slots_handle);
    }
    if (!status.ok()) {
      Break(status);
      op->Drop();
      return status.code() == StatusCode::kMismatch
                 ? status
                 : WithContext(status, "receive from " + what);
    }
    device::SignalFlag(op->flag.host, 1);
  } else {
    // The descriptor is checked on arrival; the stream waits for that check
    // before it touches the data.
    op->holds.store(2);
    SlotChannel* self = this;  // op->channel keeps it alive
    bridge.PostRecv(
        peer, kSlotDescriptorTag, DescriptorSpec(), &op->descriptor,
        [op, self, peer, tag, spec, first](uint64_t, bool done,
                                           const Status& arrived) {
          if (!done) return;
          Status checked =
              arrived.ok() ? CheckDescriptor(peer, tag, spec, first,
                                             self->config_.path, op->descriptor)
                           : WithContext(arrived, "receive from " + op->what);
          if (checked.ok()) {
            device::SignalFlag(op->flag.host, 1);
          } else {
            self->Break(checked);
            bool handler_reports;
            {
              std::lock_guard<std::mutex> lock(op->mu);
              handler_reports = !op->enqueued;
              if (handler_reports) op->early_error = checked;
            }
            if (!handler_reports) op->context.errors.Record(checked);
            device::AbortFlag(op->flag.host);
          }
          op->Drop();
        });
    std::lock_guard<std::mutex> op_lock(op->mu);
    if (!op->early_error.ok()) {
      Status early = op->early_error;
      op->Drop();  // the stream never saw this op
      return early;
    }
    op->enqueued = true;
  }
  next_recv_chunk_ += plan.chunks;

  const uint64_t deadline = WaitDeadlineNs(bridge.options());
  const bool fuse = spec.num_bytes() <= FusedMaxBytes();
  auto* dst = static_cast<uint8_t*>(device_dst);
  // Nothing may touch the data before the descriptor checked out: the first
  // chunk's hand-off waits for that too (a message of no bytes only for it).
  device::Device::FlagTarget checked{op->flag.device, 1};
  if (plan.chunks == 0) {
    status =
        context.device.WaitFlagAsync(checked.flag_device, 1, deadline, stream);
  }
  for (uint64_t c = 0; status.ok() && c < plan.chunks; ++c) {
    Chunk chunk =
        PlanChunk(plan, spec.num_bytes(), first, c, slots, deadline, fuse);
    device::Device::Handoff& move = chunk.move;
    if (c == 0) move.waits[0] = checked;
    move.waits[1] = {in_->filled_device(chunk.slot), chunk.generation};
    const SlotBytes from = SlotAt(*in_, recv_slots_, chunk.slot);
    move.kind = config_.path == SlotPath::kIpc
                    ? device::Device::CopyKind::kDeviceToDevice
                    : device::Device::CopyKind::kHostToDevice;
    move.peer_source = config_.path == SlotPath::kIpc;
    move.src = from.host;
    move.src_device = from.device;
    move.dst = move.dst_device = dst + chunk.offset;
    move.signal_host = in_->freed_host(chunk.slot);
    move.signal_device = in_->freed_device(chunk.slot);
    move.signal_value = chunk.generation;
    status = context.device.HandoffAsync(move, stream);
  }
  if (!status.ok()) Break(status);
  Status fenced = context.device.RecordEvent(op->fence, stream);
  if (fenced.ok()) {
    SlotRing* ring = in_.get();
    SlotChannel* self = this;  // op->channel keeps it alive
    context.retired.Retire(op->fence, [op, ring, self] {
      if (device::FlagTimedOut(op->flag.host) || AnyTimedOut(*ring)) {
        Status timeout(StatusCode::kTimeout,
                       "receive from " + op->what +
                           ": the device gave up waiting for the sender's "
                           "data (the bridge never completed or aborted it)");
        self->Break(timeout);
        op->context.errors.Record(timeout);
      }
      op->Drop();
    });
  }
  if (!status.ok()) return WithContext(status, "receive from " + what);
  return WithContext(fenced, "receive from " + what);
}

namespace {

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
// Never destroyed: channels may be page-locked with a GPU runtime that is
// gone by the time static destructors run.
std::map<int, std::shared_ptr<SlotChannel>>& Registry() {
  static auto* channels = new std::map<int, std::shared_ptr<SlotChannel>>();
  return *channels;
}

}  // namespace

Status AddSlotChannel(const SlotChannelConfig& config) {
  std::shared_ptr<SlotChannel> channel;
  Status status = SlotChannel::Create(config, &channel);
  if (!status.ok()) return status;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry()[config.peer] = std::move(channel);
  return Status::Ok();
}

std::shared_ptr<SlotChannel> FindSlotChannel(int peer) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(peer);
  return it == Registry().end() ? nullptr : it->second;
}

std::shared_ptr<SlotChannel> ChannelForHandler(int peer, bool on_host) {
  std::shared_ptr<SlotChannel> channel = FindSlotChannel(peer);
  if (channel == nullptr || channel->config().local_cpu != on_host) {
    return nullptr;
  }
  return channel;
}

void ClearSlotChannels() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().clear();
}

}  // namespace hetjax::gpu
