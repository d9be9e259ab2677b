// The collective FFI targets on CUDA and ROCm. Two ways to run the shared
// handler body (host_collectives.h), chosen by ChooseChannels
// (channel_choice.h), the same on every member:
//   channels: device to device over the slot channels (or staged bridge
//     messages where none joins two members), reductions in a device
//     kernel, only enqueued on XLA's stream (channel_collective.h). A CPU
//     island's member runs the same algorithms on its host device
//     (collectives_cpu.cc).
//   staged: pinned host copies of XLA's buffers, the host algorithms on them
//     with the host thread blocked, the result copied back on XLA's stream
//     (staged_collective.h). Everything else: processes with several
//     devices, members of unknown platform, complex dtypes,
//     HETJAX_GPU_COLLECTIVES=staged.
// Streams arrive as void* and the device layer does the vendor calls, so
// this one object file serves both flavours. Never command-buffer
// compatible (no traits): a collective must run on every execution.
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "cc/ffi/collectives/channel_choice.h"
#include "cc/ffi/collectives/channel_collective.h"
#include "cc/ffi/collectives/gpu_collectives.h"
#include "cc/ffi/collectives/host_collectives.h"
#include "cc/ffi/collectives/on_channels.h"
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

// What an op asks of the channel path.
struct ChannelNeeds {
  bool reduces = false;  // needs the device kernel for its dtype
};

// Every handler: pick the path, then the shared body on it.
// `body(call, io, algorithms)` is one of the *OnHost functions.
template <typename Body>
ffi::Error RunOnGpu(const char* name, void* stream, const AnyBuffer& device,
                    const AnyBuffer& x, Result<AnyBuffer>& token_out,
                    Result<AnyBuffer>& y, const CallAttrs& attrs,
                    const ChannelNeeds& needs, const Body& body) {
  gpu::StagingContext* context = gpu::GpuStagingContext();
  int32_t index = 0;
  if (context != nullptr &&
      ChooseChannels(attrs, needs.reduces, x, /*on_gpu=*/true, &index)) {
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

// ---- started collectives (pending_ops.h) ----------------------------------

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

// The communication stream starts after what XLA enqueued ahead of the start
// (the operand's producers). A wait takes the event's state when it is
// enqueued, so the event can go back to the pool at once.
Status ForkOff(gpu::StagingContext& context, int ordinal, void* xla_stream,
               device::Stream comm) {
  device::Event fork = nullptr;
  Status s = context.events.Acquire(ordinal, &fork);
  if (s.ok()) s = context.device.RecordEvent(fork, xla_stream);
  if (s.ok()) s = context.device.StreamWaitEvent(comm, fork);
  if (fork != nullptr) context.events.Release(ordinal, fork);
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
    Status s = ForkOff(context_, ordinal_, xla_stream_, comm_);
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

// The done of a started op whose end is `*done` on the communication stream
// once `ran` (the start's own part, or its host worker's) has succeeded.
FinishPending JoinAt(gpu::StagingContext* context, int ordinal,
                     std::shared_future<Status> ran,
                     std::shared_ptr<device::Event> done) {
  return [context, ordinal, ran, done](void* xla_stream) {
    Status s = ran.get();
    if (s.ok()) s = context->device.StreamWaitEvent(xla_stream, *done);
    if (*done != nullptr) context->events.Release(ordinal, *done);
    return s;
  };
}

std::shared_future<Status> Ready() {
  std::promise<Status> ok;
  ok.set_value(Status::Ok());
  return ok.get_future().share();
}

// Staged, started: the operand's copy to pinned memory is enqueued on the
// communication stream at once; the device's host worker waits for it, runs
// the host algorithm (blocking only itself) and enqueues the result's copy
// back there, with an event after it that `done` makes XLA's stream wait
// for. So a CUDA island beside a ROCm or CPU island computes while its
// gradients cross the host ring.
template <typename Body>
Status StartStaged(const char* name, gpu::StagingContext* context, void* stream,
                   int ordinal, device::Stream comm, const AnyBuffer& device,
                   const AnyBuffer& x, Result<AnyBuffer>& token_out,
                   Result<AnyBuffer>& y, const CallAttrs& attrs,
                   const Body& body) {
  HostBuffers io;
  Status s = SpecsOf(name, x, y, &io);
  if (s.ok()) s = ForkOff(*context, ordinal, stream, comm);
  auto staged = std::make_shared<StagedCollective>(*context, comm);
  if (s.ok()) {
    s = staged->EnqueueCopyIn(device.untyped_data(), x.untyped_data(),
                              x.size_bytes(), y->size_bytes());
  }
  if (s.ok()) {
    s = context->device.MemsetAsync(token_out->untyped_data(), 0,
                                    token_out->size_bytes(), stream);
  }
  if (!s.ok()) return s;
  auto owned = std::make_shared<OwnedCallAttrs>(attrs);
  auto done = std::make_shared<device::Event>(nullptr);
  void* y_device = y->untyped_data();
  std::shared_future<Status> ran = RunOnHostWorker(ordinal, [=]() -> Status {
    gpu::StreamDeviceScope scope(context->device, comm);
    Status st = scope.status();
    if (st.ok()) st = staged->WaitCopyIn();
    HostBuffers host = io;
    host.x = staged->x();
    host.y = staged->y();
    CollectiveCall call;
    if (st.ok()) {
      st = DecodeCall(owned->view(), staged->device_index(), host.y_spec.dtype,
                      &call);
    }
    if (st.ok()) st = body(call, host, HostAlgorithms());
    if (st.ok()) st = staged->CopyOut(y_device, y_device, 0);
    if (st.ok()) st = context->events.Acquire(ordinal, done.get());
    if (st.ok()) st = context->device.RecordEvent(*done, comm);
    return st;
  });
  return AddPending(static_cast<uint64_t>(attrs.base_tag), ordinal, y_device,
                    JoinAt(context, ordinal, ran, done));
}

// Over the channels the op is only enqueued on the communication stream and
// `done` joins it; anywhere else it is staged on the host worker
// (StartStaged).
template <typename Body>
ffi::Error StartOnGpu(const char* name, void* stream, const AnyBuffer& device,
                      const AnyBuffer& x, Result<AnyBuffer>& token_out,
                      Result<AnyBuffer>& kept, Result<AnyBuffer>& y,
                      const CallAttrs& attrs, const ChannelNeeds& needs,
                      const Body& body) {
  gpu::StagingContext* context = gpu::GpuStagingContext();
  Status s = CheckAliased(name, x, kept, "the kept result with the operand");
  if (!s.ok() || context == nullptr) {
    if (s.ok()) s = Status(StatusCode::kInternal, "no GPU device layer");
    return ffi_core::ToFfiError(s, name);
  }
  gpu::StreamDeviceScope scope(context->device, stream);
  const int ordinal = scope.ordinal();
  device::Stream comm = nullptr;
  s = scope.status();
  if (s.ok()) s = CommStreamOf(context->device, ordinal, &comm);
  if (!s.ok()) return ffi_core::ToFfiError(s, name);
  int32_t index = 0;
  if (!ChooseChannels(attrs, needs.reduces, x, /*on_gpu=*/true, &index)) {
    return ffi_core::ToFfiError(
        StartStaged(name, context, stream, ordinal, comm, device, x, token_out,
                    y, attrs, body),
        name);
  }
  StartedOnChannels channels(*context, stream, comm, ordinal, index);
  ffi::Error started =
      RunCollective(name, channels, device, x, token_out, y, attrs,
                    [&](const CollectiveCall& call, const HostBuffers& io) {
                      return body(call, io, channels.algorithms());
                    });
  if (started.failure()) return started;
  return ffi_core::ToFfiError(
      AddPending(static_cast<uint64_t>(attrs.base_tag), ordinal,
                 y->untyped_data(),
                 JoinAt(context, ordinal, Ready(),
                        std::make_shared<device::Event>(channels.done()))),
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
      // By value: a staged start runs it later, on the host worker.
      [op, divisor, algorithm](const CollectiveCall& call,
                               const HostBuffers& io,
                               SlotAlgorithms& algorithms) {
        return AllReduceOnHost(call, io, op, divisor, algorithm, algorithms);
      });
}

ffi::Error ReduceScatterStartImpl(
    void* stream, AnyBuffer token, AnyBuffer device, AnyBuffer x,
    Result<AnyBuffer> token_out, Result<AnyBuffer> kept, Result<AnyBuffer> y,
    int64_t base_tag, int64_t island, Span<const int64_t> device_ranks,
    Span<const int64_t> island_sizes, Span<const int64_t> shape,
    int64_t gpu_path, int64_t op, double divisor) {
  (void)token;
  return StartOnGpu(
      kReduceScatterStartName, stream, device, x, token_out, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, {true},
      [op, divisor](const CollectiveCall& call, const HostBuffers& io,
                    SlotAlgorithms& algorithms) {
        return ReduceScatterOnHost(call, io, op, divisor, algorithms);
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
                        y.untyped_data(), stream);
  }
  if (s.ok()) {
    s = CheckAliased(kCollectiveDoneName, y, y_out,
                     "the result with the start's result");
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
    HetjaxReduceScatterStartGpu, hc::ReduceScatterStartImpl,
    hc::BindCollectiveAttrs(
        hc::BindStartOperands(
            ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<void*>>()))
        .Attr<int64_t>("op")
        .Attr<double>("divisor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxCollectiveDoneGpu, hc::DoneImpl,
    hc::BindDoneOperands(
        ::xla::ffi::Ffi::Bind().Ctx<::xla::ffi::PlatformStream<void*>>())
        .Attr<int64_t>("base_tag"));
