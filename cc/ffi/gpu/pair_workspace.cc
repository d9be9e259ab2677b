#include "cc/ffi/gpu/pair_workspace.h"

#include <map>
#include <string>

#include "cc/ffi/gpu/gpu_tuning.h"
#include "cc/ffi/gpu/staged_recv.h"

namespace hetjax::gpu {
namespace {

constexpr uint32_t kHandshakeMagic = 0x48504157;  // "HPAW"

// The peer opens our host segment by this name; its own is named after its
// outbound ring, as ours after ours.
std::string SegmentName(const std::string& ring_name) {
  return ring_name + "-pair";
}

}  // namespace

// What each end tells the other once.
struct PairWorkspace::Handshake {
  uint32_t magic = 0;
  uint32_t depth = 0;
  uint32_t shares = 0;
  uint32_t path = 0;       // SlotPath: where the workspaces live
  uint32_t by_copies = 0;  // host path: copy engines move the bytes
  uint32_t reserved = 0;
  uint64_t chunk_bytes = 0;
  device::Device::IpcHandle handle = {};  // ipc only
};

namespace {

using Handshake = PairWorkspace::Handshake;

TensorSpec HandshakeSpec() {
  TensorSpec spec;
  spec.dtype = DType::kBytes;
  spec.rank = 1;
  spec.dims[0] = sizeof(Handshake);
  return spec;
}

std::string Geometry(const Handshake& h) {
  return std::to_string(h.chunk_bytes) + "-byte chunks, depth " +
         std::to_string(h.depth) + ", " + std::to_string(h.shares) +
         " shares, workspaces on the " +
         SlotPathName(static_cast<SlotPath>(h.path)) + " path, moved by " +
         (h.by_copies != 0 ? "copy engines" : "the kernel");
}

uint64_t ChunksOf(uint64_t bytes, uint64_t chunk) {
  return (bytes + chunk - 1) / chunk;
}

std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}
// Never destroyed: workspaces are GPU memory, freed only while the GPU
// runtime is still up (ClearPairWorkspaces at stop).
std::map<int, std::shared_ptr<PairWorkspace>>& Registry() {
  static auto* workspaces = new std::map<int, std::shared_ptr<PairWorkspace>>();
  return *workspaces;
}

}  // namespace

uint64_t PairChunkBytes() {
  const uint64_t bytes = GetGpuTuning().pair_chunk_bytes;
  return bytes >= 16 ? bytes / 16 * 16 : GpuTuning().pair_chunk_bytes;
}

bool PairExchangeEnabled(SlotPath path) {
  const GpuTuning& tuning = GetGpuTuning();
  return tuning.pair_exchange &&
         (path == SlotPath::kIpc || tuning.pair_exchange_over_host);
}

bool PairCopiesOverHost() { return GetGpuTuning().pair_copies_over_host; }

PairWorkspace::~PairWorkspace() {
  if (device_ == nullptr) return;
  for (device::Event* event : copies_.Events()) {
    if (*event != nullptr) (void)device_->DestroyEvent(*event);
  }
  if (copies_.scratch != nullptr) (void)device_->FreeDevice(copies_.scratch);
  if (order_ != nullptr) (void)device_->DestroyEvent(order_);
  if (remote_segment_ == nullptr && remote_ != nullptr) {
    (void)device_->CloseIpc(remote_);
  }
  if (local_segment_ == nullptr && local_ != nullptr) {
    (void)device_->FreeDevice(local_);
  }
  if (control_.host != nullptr) flags_->Release(control_);
}

void PairWorkspace::Break(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) {
    broken_ = Status(why.code(), "gpu pair exchange with peer " +
                                     std::to_string(channel_.peer) +
                                     " is broken: " + why.message());
  }
  if (control_.host != nullptr) device::AbortFlag(control_.host);
  // Exchanges by copies wait on our segment's flags.
  if (local_segment_ != nullptr) local_segment_->AbortAll();
}

bool PairWorkspace::AnyWaitTimedOut() const {
  if (control_.host != nullptr && device::FlagTimedOut(control_.host)) {
    return true;
  }
  return local_segment_ != nullptr &&
         (device::FlagTimedOut(local_segment_->filled_host(0)) ||
          device::FlagTimedOut(local_segment_->freed_host(0)));
}

Status PairWorkspace::SetUpCopies(device::Device& device,
                                  uint64_t scratch_bytes) {
  copies_.local = local_segment_.get();
  copies_.remote = remote_segment_.get();
  Status s = PairCopyLanes(device, channel_.peer, &copies_.publish_lane,
                           &copies_.consume_lane);
  copies_.SetDepth(kPairDepth);
  for (device::Event* event : copies_.Events()) {
    if (s.ok()) s = device.CreateEvent(event);
    if (!s.ok()) *event = nullptr;
  }
  if (s.ok()) s = device.AllocDevice(scratch_bytes, &copies_.scratch);
  if (!s.ok()) copies_.scratch = nullptr;
  return WithContext(s, "setting up its copy-engine lanes");
}

Status PairWorkspace::CreateLocal(StagingContext& context,
                                  device::Stream stream, uint64_t bytes,
                                  Handshake* mine) {
  device::Device& device = context.device;
  if (channel_.path == SlotPath::kHost) {
    // A fresh segment reads as zeros: the counters start at 0.
    Status s = SlotRing::Create(SegmentName(channel_.outbound_name),
                                {1, bytes, true}, &local_segment_);
    if (s.ok()) s = local_segment_->Register(device);
    if (s.ok()) local_ = local_segment_->data_device(0);
    return s;
  }
  Status s = device.AllocDevice(bytes, &local_);
  if (!s.ok()) local_ = nullptr;
  // Zero before the peer learns where it is: its first signals land here.
  if (s.ok()) {
    s = device.MemsetAsync(local_, 0, sizeof(device::PairCounters), stream);
  }
  if (s.ok()) s = device.SynchronizeStream(stream);
  if (s.ok()) s = device.ExportIpc(local_, &mine->handle);
  return s;
}

Status PairWorkspace::OpenRemote(const Handshake& theirs) {
  if (channel_.path == SlotPath::kHost) {
    Status s =
        SlotRing::Open(SegmentName(channel_.inbound_name), &remote_segment_);
    if (s.ok()) s = remote_segment_->Register(*device_);
    if (s.ok()) remote_ = remote_segment_->data_device(0);
    return WithContext(s, "opening its workspace segment");
  }
  Status s = device_->OpenIpc(theirs.handle, &remote_);
  if (!s.ok()) remote_ = nullptr;
  return WithContext(s, "opening its workspace over CUDA IPC");
}

Status PairWorkspace::SetUp(StagingContext& context, device::Stream stream) {
  const std::string what =
      "setting up the pair exchange with peer " + std::to_string(channel_.peer);
  device::Device& device = context.device;
  device_ = &device;
  Handshake mine;
  mine.magic = kHandshakeMagic;
  mine.depth = kPairDepth;
  mine.shares = device::kPairShares;
  mine.path = static_cast<uint32_t>(channel_.path);
  mine.chunk_bytes = PairChunkBytes();
  mine.by_copies =
      channel_.path == SlotPath::kHost && PairCopiesOverHost() ? 1 : 0;
  const uint64_t bytes =
      sizeof(device::PairCounters) + uint64_t{kPairDepth} * mine.chunk_bytes;
  Status s = CreateLocal(context, stream, bytes, &mine);
  if (s.ok()) s = context.flags.Acquire(&control_);
  if (s.ok()) flags_ = &context.flags;
  if (s.ok()) s = device.CreateEvent(&order_);
  if (!s.ok()) order_ = nullptr;
  if (s.ok())
    s = bridge_.Send(channel_.peer, kPairHandshakeTag, HandshakeSpec(), &mine);
  Handshake theirs;
  if (s.ok()) {
    s = bridge_.Recv(channel_.peer, kPairHandshakeTag, HandshakeSpec(),
                     &theirs);
  }
  if (!s.ok()) return WithContext(s, what);
  if (theirs.magic != kHandshakeMagic || theirs.depth != mine.depth ||
      theirs.shares != mine.shares || theirs.path != mine.path ||
      theirs.chunk_bytes != mine.chunk_bytes ||
      theirs.by_copies != mine.by_copies) {
    return Status(StatusCode::kMismatch,
                  what + ": this end has " + Geometry(mine) +
                      ", the peer's has " + Geometry(theirs) +
                      " (HETJAX_GPU_PAIR_CHUNK_BYTES, HETJAX_GPU_PAIR_COPIES "
                      "and HETJAX_GPU_PATH must be the same on every island)");
  }
  s = OpenRemote(theirs);
  by_copies_ = mine.by_copies != 0;
  if (s.ok() && by_copies_) {
    s = SetUpCopies(device, uint64_t{kPairDepth} * mine.chunk_bytes);
  }
  if (!s.ok()) return WithContext(s, what);
  deadline_ns_ = WaitDeadlineNs(bridge_.options());
  return Status::Ok();
}

Status PairWorkspace::Enqueue(StagingContext& context, device::Stream stream,
                              device::PairExchange x) {
  std::unique_lock<std::mutex> lock(mu_);
  // A wait of an earlier exchange that gave up means the peer stopped (or
  // ran another op): this one would wait in vain too.
  if (broken_.ok() && AnyWaitTimedOut()) {
    lock.unlock();
    Break(Status(StatusCode::kTimeout,
                 "an earlier exchange gave up waiting for the peer (it "
                 "stopped, or ran a different collective)"));
    lock.lock();
  }
  if (!broken_.ok()) return broken_;
  const uint64_t chunk = PairChunkBytes();
  x.local_workspace = local_;
  x.peer_workspace = remote_;
  x.depth = kPairDepth;
  x.chunk_bytes = chunk;
  x.first_out = next_out_;
  x.first_in = next_in_;
  x.control_device = const_cast<device::WaitFlag*>(control_.device);
  x.timeout_ns = deadline_ns_;
  Status s = context.device.StreamWaitEvent(stream, order_);
  if (s.ok()) {
    s = by_copies_ ? EnqueuePairCopies(context.device, stream, x, copies_)
                   : context.device.PairExchangeAsync(x, stream);
  }
  if (s.ok()) s = context.device.RecordEvent(order_, stream);
  if (!s.ok()) {
    lock.unlock();
    Break(s);  // the peer would wait for chunks that never come
    return s;
  }
  next_out_ += ChunksOf(x.publish_bytes, chunk);
  next_in_ += ChunksOf(x.consume_bytes, chunk);
  return Status::Ok();
}

Status FindPairWorkspace(StagingContext& context, Bridge& bridge,
                         const SlotChannelConfig& channel,
                         device::Stream stream,
                         std::shared_ptr<PairWorkspace>* out) {
  const int peer = channel.peer;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(peer);
  if (it != Registry().end()) {
    *out = it->second;
    return Status::Ok();
  }
  std::shared_ptr<PairWorkspace> workspace(new PairWorkspace(channel, bridge));
  Status s = workspace->SetUp(context, stream);
  if (!s.ok()) return s;
  std::weak_ptr<PairWorkspace> weak = workspace;
  bridge.WatchPeer(peer, [weak](const Status& why) {
    if (auto w = weak.lock()) w->Break(why);
  });
  Registry()[peer] = workspace;
  *out = std::move(workspace);
  return Status::Ok();
}

std::shared_ptr<PairWorkspace> ExistingPairWorkspace(int peer) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(peer);
  return it == Registry().end() ? nullptr : it->second;
}

void ClearPairWorkspaces() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().clear();
}

}  // namespace hetjax::gpu
