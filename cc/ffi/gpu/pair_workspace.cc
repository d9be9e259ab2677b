#include "cc/ffi/gpu/pair_workspace.h"

#include <map>
#include <string>

#include "cc/ffi/gpu/staged_recv.h"
#include "cc/transport/env_number.h"

namespace hetjax::gpu {
namespace {

constexpr uint64_t kDefaultChunkBytes = uint64_t{8} << 20;
constexpr uint32_t kHandshakeMagic = 0x48504157;  // "HPAW"

// What each end tells the other once.
struct Handshake {
  uint32_t magic = 0;
  uint32_t depth = 0;
  uint32_t shares = 0;
  uint32_t reserved = 0;
  uint64_t chunk_bytes = 0;
  device::Device::IpcHandle handle = {};
};

TensorSpec HandshakeSpec() {
  TensorSpec spec;
  spec.dtype = DType::kBytes;
  spec.rank = 1;
  spec.dims[0] = sizeof(Handshake);
  return spec;
}

std::string Geometry(const Handshake& h) {
  return std::to_string(h.chunk_bytes) + "-byte chunks, depth " +
         std::to_string(h.depth) + ", " + std::to_string(h.shares) + " shares";
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
  static const uint64_t bytes = [] {
    const uint64_t value =
        EnvNumber("HETJAX_GPU_PAIR_CHUNK_BYTES", kDefaultChunkBytes);
    return value >= 16 ? value / 16 * 16 : kDefaultChunkBytes;
  }();
  return bytes;
}

bool PairExchangeEnabled() {
  static const bool enabled = EnvNumber("HETJAX_GPU_PAIR", 1) != 0;
  return enabled;
}

PairWorkspace::~PairWorkspace() {
  if (device_ == nullptr) return;
  if (order_ != nullptr) (void)device_->DestroyEvent(order_);
  if (remote_ != nullptr) (void)device_->CloseIpc(remote_);
  if (local_ != nullptr) (void)device_->FreeDevice(local_);
  if (control_.host != nullptr) flags_->Release(control_);
}

void PairWorkspace::Break(const Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_.ok()) {
    broken_ = Status(why.code(), "gpu pair exchange with peer " +
                                     std::to_string(peer_) +
                                     " is broken: " + why.message());
  }
  if (control_.host != nullptr) device::AbortFlag(control_.host);
}

Status PairWorkspace::SetUp(StagingContext& context, device::Stream stream) {
  const std::string what =
      "setting up the pair exchange with peer " + std::to_string(peer_);
  device::Device& device = context.device;
  device_ = &device;
  Handshake mine;
  mine.magic = kHandshakeMagic;
  mine.depth = kPairDepth;
  mine.shares = device::kPairShares;
  mine.chunk_bytes = PairChunkBytes();
  const uint64_t bytes =
      sizeof(device::PairCounters) + uint64_t{kPairDepth} * mine.chunk_bytes;
  Status s = device.AllocDevice(bytes, &local_);
  if (!s.ok()) local_ = nullptr;
  // Zero before the peer learns where it is: its first signals land here.
  if (s.ok()) {
    s = device.MemsetAsync(local_, 0, sizeof(device::PairCounters), stream);
  }
  if (s.ok()) s = device.SynchronizeStream(stream);
  if (s.ok()) s = device.ExportIpc(local_, &mine.handle);
  if (s.ok()) s = context.flags.Acquire(&control_);
  if (s.ok()) flags_ = &context.flags;
  if (s.ok()) s = device.CreateEvent(&order_);
  if (!s.ok()) order_ = nullptr;
  if (s.ok())
    s = bridge_.Send(peer_, kPairHandshakeTag, HandshakeSpec(), &mine);
  Handshake theirs;
  if (s.ok()) {
    s = bridge_.Recv(peer_, kPairHandshakeTag, HandshakeSpec(), &theirs);
  }
  if (!s.ok()) return WithContext(s, what);
  if (theirs.magic != kHandshakeMagic || theirs.depth != mine.depth ||
      theirs.shares != mine.shares || theirs.chunk_bytes != mine.chunk_bytes) {
    return Status(StatusCode::kMismatch,
                  what + ": this end has " + Geometry(mine) +
                      ", the peer's has " + Geometry(theirs) +
                      " (HETJAX_GPU_PAIR_CHUNK_BYTES must be the same on "
                      "every island)");
  }
  s = device.OpenIpc(theirs.handle, &remote_);
  if (!s.ok()) {
    remote_ = nullptr;
    return WithContext(s, what + " (opening its workspace over CUDA IPC)");
  }
  deadline_ns_ = WaitDeadlineNs(bridge_.options());
  return Status::Ok();
}

Status PairWorkspace::Enqueue(StagingContext& context, device::Stream stream,
                              device::PairExchange x) {
  std::unique_lock<std::mutex> lock(mu_);
  // A wait of an earlier exchange that gave up means the peer stopped (or
  // ran another op): this one would wait in vain too.
  if (broken_.ok() && device::FlagTimedOut(control_.host)) {
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
  if (s.ok()) s = context.device.PairExchangeAsync(x, stream);
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

Status FindPairWorkspace(StagingContext& context, Bridge& bridge, int peer,
                         device::Stream stream,
                         std::shared_ptr<PairWorkspace>* out) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(peer);
  if (it != Registry().end()) {
    *out = it->second;
    return Status::Ok();
  }
  std::shared_ptr<PairWorkspace> workspace(new PairWorkspace(peer, bridge));
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
