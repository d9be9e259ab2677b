// The collective FFI targets on CUDA and ROCm. Two ways to run the shared
// handler body (host_collectives.h):
//   channels: device to device over the GPU slot channels, reductions in a
//     device kernel, only enqueued on XLA's stream (channel_collective.h).
//     Taken when the caller allows it (attribute gpu_path, from
//     HETJAX_GPU_COLLECTIVES) and every other process of the layout is a
//     one-device GPU process of this host reached by a slot channel.
//   staged: pinned host copies of XLA's buffers, the host algorithms on them
//     with the host thread blocked, the result copied back on XLA's stream
//     (staged_collective.h). Everything else: CPU peers, other hosts,
//     processes with several devices, complex dtypes.
// Every input of that choice is the same on every member, and the members
// agree on it through the op descriptor, so a mismatch fails, never hangs.
// Streams arrive as void* and the device layer does the vendor calls, so
// this one object file serves both flavours. Never command-buffer
// compatible (no traits): a collective must run on every execution.
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include "cc/ffi/collectives/channel_collective.h"
#include "cc/ffi/collectives/device_combine.h"
#include "cc/ffi/collectives/gpu_collectives.h"
#include "cc/ffi/collectives/host_collectives.h"
#include "cc/ffi/collectives/pending_ops.h"
#include "cc/ffi/collectives/staged_collective.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {
namespace {

using ffi::AnyBuffer;
using ffi::Result;
using ffi::Span;

// Adapts StagedCollective to RunCollective's staging interface.
class OnStream {
 public:
  explicit OnStream(void* stream) : stream_(stream) {}

  Status CopyIn(const AnyBuffer& device, const AnyBuffer& x,
                Result<AnyBuffer>& y, int32_t* device_index, HostBuffers* io) {
    gpu::StagingContext* context = gpu::GpuStagingContext();
    if (context == nullptr) {
      return Status(StatusCode::kInternal,
                    "this hetjax build has no GPU device layer (flavour none), "
                    "yet a GPU collective handler ran");
    }
    staged_.emplace(*context, stream_);
    Status s = staged_->CopyIn(device.untyped_data(), x.untyped_data(),
                               x.size_bytes(), y->size_bytes());
    *device_index = staged_->device_index();
    io->x = staged_->x();
    io->y = staged_->y();
    return s;
  }

  Status CopyOut(Result<AnyBuffer>& y, Result<AnyBuffer>& token_out) {
    return staged_->CopyOut(y->untyped_data(), token_out->untyped_data(),
                            token_out->size_bytes());
  }

 private:
  void* stream_;
  std::optional<StagedCollective> staged_;
};

// Adapts ChannelCollective to the same interface: XLA's device buffers are
// the buffers; nothing is copied in or out.
class OnChannels {
 public:
  OnChannels(gpu::StagingContext& context, void* stream, int32_t device_index)
      : collective_(context, stream), device_index_(device_index) {}

  Status CopyIn(const AnyBuffer&, const AnyBuffer& x, Result<AnyBuffer>& y,
                int32_t* device_index, HostBuffers* io) {
    *device_index = device_index_;
    io->x = x.untyped_data();
    io->y = y->untyped_data();
    return collective_.Begin();
  }
  Status CopyOut(Result<AnyBuffer>&, Result<AnyBuffer>& token_out) {
    return collective_.Finish(token_out->untyped_data(),
                              token_out->size_bytes());
  }
  SlotAlgorithms& algorithms() { return collective_; }

 private:
  ChannelCollective collective_;
  const int32_t device_index_;
};

// What an op asks of the channel path.
struct ChannelNeeds {
  bool reduces = false;  // needs the device kernel for its dtype
};

// Whether the op runs over the slot channels; then `device_index` is this
// process's position in its island (it holds one device there, so the
// index operand, which lives in device memory, need not be read back).
bool ChannelsFit(const CallAttrs& attrs, const ChannelNeeds& needs,
                 const AnyBuffer& x, int32_t* device_index) {
  if (attrs.gpu_path != static_cast<int64_t>(GpuPathChoice::kChannels)) {
    return false;
  }
  Bridge* bridge = nullptr;
  if (!ffi_core::RequireBridge(&bridge).ok()) return false;
  if (needs.reduces &&
      !DeviceReducible(ffi_core::ToWireDType(x.element_type()))) {
    return false;
  }
  // A process holding several devices would run one handler per device at
  // once, interleaving their messages on the channels it shares.
  std::set<int64_t> seen;
  for (int64_t rank : attrs.device_ranks) {
    if (!seen.insert(rank).second) return false;
  }
  const int64_t me = bridge->options().rank;
  for (int64_t rank : attrs.device_ranks) {
    if (rank != me && !HasSlotChannel(static_cast<int>(rank))) return false;
  }
  if (attrs.island < 0 ||
      attrs.island >= static_cast<int64_t>(attrs.island_sizes.size())) {
    return false;  // the staged path reports the bad layout
  }
  size_t at = 0;
  for (int64_t k = 0; k < attrs.island; ++k) at += attrs.island_sizes[k];
  for (int64_t j = 0; j < attrs.island_sizes[attrs.island]; ++j) {
    if (at + j < attrs.device_ranks.size() &&
        attrs.device_ranks[at + j] == me) {
      *device_index = static_cast<int32_t>(j);
      return true;
    }
  }
  return false;
}

// Every handler: pick the path, then the shared body on it.
// `body(call, io, algorithms)` is one of the *OnHost functions.
template <typename Body>
ffi::Error RunOnGpu(const char* name, void* stream, const AnyBuffer& device,
                    const AnyBuffer& x, Result<AnyBuffer>& token_out,
                    Result<AnyBuffer>& y, const CallAttrs& attrs,
                    const ChannelNeeds& needs, const Body& body) {
  gpu::StagingContext* context = gpu::GpuStagingContext();
  int32_t index = 0;
  if (context != nullptr && ChannelsFit(attrs, needs, x, &index)) {
    OnChannels channels(*context, stream, index);
    return RunCollective(
        name, channels, device, x, token_out, y, attrs,
        [&](const CollectiveCall& call, const HostBuffers& io) {
          return body(call, io, channels.algorithms());
        });
  }
  OnStream staging(stream);
  return RunCollective(name, staging, device, x, token_out, y, attrs,
                       [&](const CollectiveCall& call, const HostBuffers& io) {
                         return body(call, io, HostAlgorithms());
                       });
}

ffi::Error AllReduceImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path,
                         int64_t op, double divisor, int64_t algorithm) {
  (void)token;  // ordering only: XLA already ran what produced it
  return RunOnGpu(
      kAllReduceName, stream, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {true},
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return AllReduceOnHost(call, io, op, divisor, algorithm, algorithms);
      });
}

ffi::Error ReduceScatterImpl(void* stream, AnyBuffer token, AnyBuffer device,
                             AnyBuffer x, Result<AnyBuffer> token_out,
                             Result<AnyBuffer> y, int64_t base_tag,
                             int64_t island, Span<const int64_t> device_ranks,
                             Span<const int64_t> island_sizes,
                             Span<const int64_t> shape, int64_t gpu_path,
                             int64_t op, double divisor) {
  (void)token;
  return RunOnGpu(
      kReduceScatterName, stream, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {true},
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return ReduceScatterOnHost(call, io, op, divisor, algorithms);
      });
}

ffi::Error AllGatherImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path) {
  (void)token;
  return RunOnGpu(
      kAllGatherName, stream, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {},
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return AllGatherOnHost(call, io, algorithms);
      });
}

ffi::Error BroadcastImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path,
                         int64_t root) {
  (void)token;
  return RunOnGpu(
      kBroadcastName, stream, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {},
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return BroadcastOnHost(call, io, root, algorithms);
      });
}

// ---- started all-reduce (pending_ops.h) ----------------------------------

// Where a started op's sends and reductions run: a stream of the device's
// own (created once, never destroyed, like the receive stream), so XLA's
// stream goes on with the program while the bytes move.
Status CommStreamOf(device::Device& dev, int ordinal, device::Stream* out) {
  static std::mutex* mu = new std::mutex();
  static auto* streams = new std::map<int, device::Stream>();
  std::lock_guard<std::mutex> lock(*mu);
  auto it = streams->find(ordinal);
  if (it != streams->end()) {
    *out = it->second;
    return Status::Ok();
  }
  Status s = dev.CreateStream(out);  // the caller made `ordinal` current
  if (s.ok()) (*streams)[ordinal] = *out;
  return s;
}

// ChannelCollective on the communication stream, forked off XLA's stream at
// the start; its end is an event `done` will make XLA's stream wait for.
class StartedOnChannels {
 public:
  StartedOnChannels(gpu::StagingContext& context, void* xla_stream,
                    device::Stream comm, int ordinal, int32_t device_index)
      : context_(context),
        xla_stream_(xla_stream),
        comm_(comm),
        ordinal_(ordinal),
        collective_(context, comm),
        device_index_(device_index) {}

  Status CopyIn(const AnyBuffer&, const AnyBuffer& x, Result<AnyBuffer>& y,
                int32_t* device_index, HostBuffers* io) {
    *device_index = device_index_;
    io->x = x.untyped_data();
    io->y = y->untyped_data();
    // Not before what XLA enqueued ahead of the start: the operand's
    // producers. A wait takes the event's state when it is enqueued, so the
    // event can go back to the pool at once.
    device::Event fork = nullptr;
    Status s = context_.events.Acquire(ordinal_, &fork);
    if (s.ok()) s = context_.device.RecordEvent(fork, xla_stream_);
    if (s.ok()) s = context_.device.StreamWaitEvent(comm_, fork);
    if (fork != nullptr) context_.events.Release(ordinal_, fork);
    if (s.ok()) s = collective_.Begin();
    return gpu::WithContext(s, "gpu collective start");
  }

  Status CopyOut(Result<AnyBuffer>&, Result<AnyBuffer>& token_out) {
    Status s = collective_.Finish(nullptr, 0);
    if (s.ok()) s = context_.events.Acquire(ordinal_, &done_);
    if (s.ok()) s = context_.device.RecordEvent(done_, comm_);
    if (s.ok()) {
      s = context_.device.MemsetAsync(token_out->untyped_data(), 0,
                                      token_out->size_bytes(), xla_stream_);
    }
    return gpu::WithContext(s, "gpu collective start");
  }

  SlotAlgorithms& algorithms() { return collective_; }
  device::Event done() const { return done_; }

 private:
  gpu::StagingContext& context_;
  void* const xla_stream_;
  const device::Stream comm_;
  const int ordinal_;
  ChannelCollective collective_;
  const int32_t device_index_;
  device::Event done_ = nullptr;
};

// Over the channels the op is only enqueued on the communication stream and
// `done` joins it; anywhere else the start runs the whole op as the one-call
// handler does and `done` has nothing left to wait for.
template <typename Body>
ffi::Error StartOnGpu(const char* name, void* stream, const AnyBuffer& device,
                      const AnyBuffer& x, Result<AnyBuffer>& token_out,
                      Result<AnyBuffer>& kept, Result<AnyBuffer>& y,
                      const CallAttrs& attrs, const ChannelNeeds& needs,
                      const Body& body) {
  gpu::StagingContext* context = gpu::GpuStagingContext();
  Status s = CheckKeptInPlace(name, x, kept);
  if (!s.ok() || context == nullptr) {
    if (s.ok()) s = Status(StatusCode::kInternal, "no GPU device layer");
    return ffi_core::ToFfiError(s, name);
  }
  gpu::StreamDeviceScope scope(context->device, stream);
  if (!scope.status().ok()) return ffi_core::ToFfiError(scope.status(), name);
  const auto tag = static_cast<uint64_t>(attrs.base_tag);
  int32_t index = 0;
  device::Stream comm = nullptr;
  if (ChannelsFit(attrs, needs, x, &index) &&
      CommStreamOf(context->device, scope.ordinal(), &comm).ok()) {
    StartedOnChannels channels(*context, stream, comm, scope.ordinal(), index);
    ffi::Error started =
        RunCollective(name, channels, device, x, token_out, y, attrs,
                      [&](const CollectiveCall& call, const HostBuffers& io) {
                        return body(call, io, channels.algorithms());
                      });
    if (started.failure()) return started;
    const int ordinal = scope.ordinal();
    const device::Event done = channels.done();
    return ffi_core::ToFfiError(
        AddPending(tag, ordinal,
                   [context, ordinal, done](void* xla_stream) {
                     Status waited =
                         context->device.StreamWaitEvent(xla_stream, done);
                     context->events.Release(ordinal, done);
                     return waited;
                   }),
        name);
  }
  ffi::Error finished =
      RunOnGpu(name, stream, device, x, token_out, y, attrs, needs, body);
  if (finished.failure()) return finished;
  return ffi_core::ToFfiError(
      AddPending(tag, scope.ordinal(), [](void*) { return Status::Ok(); }),
      name);
}

ffi::Error AllReduceStartImpl(void* stream, AnyBuffer token, AnyBuffer device,
                              AnyBuffer x, Result<AnyBuffer> token_out,
                              Result<AnyBuffer> kept, Result<AnyBuffer> y,
                              int64_t base_tag, int64_t island,
                              Span<const int64_t> device_ranks,
                              Span<const int64_t> island_sizes,
                              Span<const int64_t> shape, int64_t gpu_path,
                              int64_t op, double divisor, int64_t algorithm) {
  (void)token;
  return StartOnGpu(
      kAllReduceStartName, stream, device, x, token_out, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {true},
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return AllReduceOnHost(call, io, op, divisor, algorithm, algorithms);
      });
}

ffi::Error DoneImpl(void* stream, AnyBuffer token, AnyBuffer device,
                    AnyBuffer kept, AnyBuffer y, Result<AnyBuffer> token_out,
                    Result<AnyBuffer> y_out, int64_t base_tag) {
  (void)token, (void)device, (void)kept;  // held alive until here
  gpu::StagingContext* context = gpu::GpuStagingContext();
  if (context == nullptr) {
    return ffi_core::ToFfiError(
        Status(StatusCode::kInternal, "no GPU device layer"),
        kCollectiveDoneName);
  }
  gpu::StreamDeviceScope scope(context->device, stream);
  Status s = scope.status();
  if (s.ok()) {
    s = FinishPendingOp(static_cast<uint64_t>(base_tag), scope.ordinal(),
                        stream);
  }
  if (s.ok() && y_out->untyped_data() != y.untyped_data()) {
    s = context->device.CopyDeviceAsync(y_out->untyped_data(), y.untyped_data(),
                                        y.size_bytes(), stream);
  }
  if (s.ok()) {
    s = context->device.MemsetAsync(token_out->untyped_data(), 0,
                                    token_out->size_bytes(), stream);
  }
  return ffi_core::ToFfiError(s, kCollectiveDoneName);
}

auto BindOnStream() {
  return BindCollectiveOperands(
      ffi::Ffi::Bind().Ctx<ffi::PlatformStream<void*>>());
}

}  // namespace
}  // namespace hetjax::collectives

namespace hc = ::hetjax::collectives;

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxAllReduceGpu, hc::AllReduceImpl,
                              hc::BindCollectiveAttrs(hc::BindOnStream())
                                  .Attr<int64_t>("op")
                                  .Attr<double>("divisor")
                                  .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxReduceScatterGpu, hc::ReduceScatterImpl,
                              hc::BindCollectiveAttrs(hc::BindOnStream())
                                  .Attr<int64_t>("op")
                                  .Attr<double>("divisor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxAllGatherGpu, hc::AllGatherImpl,
                              hc::BindCollectiveAttrs(hc::BindOnStream()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxBroadcastGpu, hc::BroadcastImpl,
    hc::BindCollectiveAttrs(hc::BindOnStream()).Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxAllReduceStartGpu, hc::AllReduceStartImpl,
    hc::BindCollectiveAttrs(
        hc::BindStartOperands(
            ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<void*>>()))
        .Attr<int64_t>("op")
        .Attr<double>("divisor")
        .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxCollectiveDoneGpu, hc::DoneImpl,
    hc::BindDoneOperands(
        ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<void*>>())
        .Attr<int64_t>("base_tag"));
