// The collective FFI targets on the CPU platform: operands already live in
// host memory, so XLA's own buffers are the buffers. Two ways to run the
// shared body (host_collectives.h), chosen by ChooseChannels
// (channel_choice.h) as the GPU members choose theirs:
//   channels: in a group with GPU members, the GPU members' own algorithms
//     (channel_collective.h) on the host device, over the slot channel to a
//     GPU island of this host (host_channel.h's) or bridge messages straight
//     from and into XLA's buffers; the GPU members then only enqueue their
//     part.
//   host: the host algorithms over the transport; between CPU islands alone.
// Blocking, hence never command-buffer compatible (no traits). A started
// op runs the host algorithms on the device's host worker (pending_ops.h);
// on the channels it runs at the start itself, because a channel carries
// one ordered stream of messages and a worker thread's would interleave
// with this thread's sends and receives on it.
#include "cc/ffi/collectives/channel_choice.h"
#include "cc/ffi/collectives/cpu_collectives.h"
#include "cc/ffi/collectives/host_collectives.h"
#include "cc/ffi/collectives/on_channels.h"
#include "cc/ffi/collectives/pending_ops.h"
#include "cc/ffi/gpu/staging_context.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {
namespace {

using ffi::AnyBuffer;
using ffi::Result;
using ffi::Span;

struct InPlace {
  Status CopyIn(const AnyBuffer& device, const AnyBuffer& x,
                Result<AnyBuffer>& y, int32_t* device_index, HostBuffers* io) {
    *device_index = *static_cast<const int32_t*>(device.untyped_data());
    io->x = x.untyped_data();
    io->y = y->untyped_data();
    return Status::Ok();
  }
  Status CopyOut(Result<AnyBuffer>&, Result<AnyBuffer>&) {
    return Status::Ok();
  }
};

void ForwardToken(const AnyBuffer& in, Result<AnyBuffer>& out) {
  *static_cast<uint8_t*>(out->untyped_data()) =
      *static_cast<const uint8_t*>(in.untyped_data());
}

// Every handler: pick the path, then the shared body on it.
// `body(call, io, algorithms)` is one of the *OnHost functions.
template <typename Body>
ffi::Error RunOnCpu(const char* name, const AnyBuffer& device,
                    const AnyBuffer& x, Result<AnyBuffer>& token_out,
                    Result<AnyBuffer>& y, const CallAttrs& attrs, bool reduces,
                    const Body& body) {
  int32_t index = 0;
  if (ChooseChannels(attrs, reduces, x, /*on_gpu=*/false, &index)) {
    OnChannels channels(*gpu::HostStagingContext(), nullptr, index);
    return RunCollective(
        name, channels, device, x, token_out, y, attrs,
        [&](const CollectiveCall& call, const HostBuffers& io) {
          return body(call, io, channels.algorithms());
        });
  }
  InPlace staging;
  return RunCollective(name, staging, device, x, token_out, y, attrs,
                       [&](const CollectiveCall& call, const HostBuffers& io) {
                         return body(call, io, HostAlgorithms());
                       });
}

ffi::Error AllReduceImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path,
                         int64_t op, double divisor, int64_t algorithm) {
  ForwardToken(token, token_out);
  return RunOnCpu(
      kAllReduceName, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, true,
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return AllReduceOnHost(call, io, op, divisor, algorithm, algorithms);
      });
}

ffi::Error ReduceScatterImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                             Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                             int64_t base_tag, int64_t island,
                             Span<const int64_t> device_ranks,
                             Span<const int64_t> island_sizes,
                             Span<const int64_t> shape, int64_t gpu_path,
                             int64_t op, double divisor) {
  ForwardToken(token, token_out);
  return RunOnCpu(
      kReduceScatterName, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, true,
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return ReduceScatterOnHost(call, io, op, divisor, algorithms);
      });
}

ffi::Error AllGatherImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path) {
  ForwardToken(token, token_out);
  return RunOnCpu(
      kAllGatherName, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, false,
      [](const CollectiveCall& call, const HostBuffers& io,
         SlotAlgorithms& algorithms) {
        return AllGatherOnHost(call, io, algorithms);
      });
}

ffi::Error BroadcastImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path,
                         int64_t root) {
  ForwardToken(token, token_out);
  return RunOnCpu(
      kBroadcastName, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, false,
      [&](const CollectiveCall& call, const HostBuffers& io,
          SlotAlgorithms& algorithms) {
        return BroadcastOnHost(call, io, root, algorithms);
      });
}

int32_t DeviceIndex(const AnyBuffer& device) {
  return *static_cast<const int32_t*>(device.untyped_data());
}

// A started op. Over the channels it runs here, whole (see the top), and
// the done only forgets it; otherwise the checks and the decoding here, the
// host algorithm (`body`, by value) on the device's host worker, and the
// done waits for it.
template <typename Body>
ffi::Error StartOnCpu(const char* name, const AnyBuffer& device,
                      const AnyBuffer& x, Result<AnyBuffer>& token_out,
                      Result<AnyBuffer>& kept, Result<AnyBuffer>& y,
                      const CallAttrs& attrs, bool reduces, Body body) {
  const uint64_t base_tag = static_cast<uint64_t>(attrs.base_tag);
  Status s = CheckAliased(name, x, kept, "the kept result with the operand");
  int32_t index = 0;
  if (s.ok() && ChooseChannels(attrs, reduces, x, /*on_gpu=*/false, &index)) {
    OnChannels channels(*gpu::HostStagingContext(), nullptr, index);
    ffi::Error ran =
        RunCollective(name, channels, device, x, token_out, y, attrs,
                      [&](const CollectiveCall& call, const HostBuffers& io) {
                        return body(call, io, channels.algorithms());
                      });
    if (ran.failure()) return ran;
    return ffi_core::ToFfiError(
        AddPending(base_tag, DeviceIndex(device), y->untyped_data(),
                   [](void*) { return Status::Ok(); }),
        name);
  }
  InPlace staging;
  CollectiveCall call;
  HostBuffers io;
  if (s.ok()) {
    s = PrepareCollective(name, staging, device, x, y, attrs, &call, &io);
  }
  if (s.ok()) {
    s = StartOnHostWorker(
        base_tag, DeviceIndex(device), y->untyped_data(),
        [call, io, body] { return body(call, io, HostAlgorithms()); });
  }
  return ffi_core::ToFfiError(s, name);
}

ffi::Error AllReduceStartImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                              Result<AnyBuffer> token_out,
                              Result<AnyBuffer> kept, Result<AnyBuffer> y,
                              int64_t base_tag, int64_t island,
                              Span<const int64_t> device_ranks,
                              Span<const int64_t> island_sizes,
                              Span<const int64_t> shape, int64_t gpu_path,
                              int64_t op, double divisor, int64_t algorithm) {
  ForwardToken(token, token_out);
  return StartOnCpu(
      kAllReduceStartName, device, x, token_out, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, true,
      [op, divisor, algorithm](const CollectiveCall& call,
                               const HostBuffers& io,
                               SlotAlgorithms& algorithms) {
        return AllReduceOnHost(call, io, op, divisor, algorithm, algorithms);
      });
}

ffi::Error ReduceScatterStartImpl(AnyBuffer token, AnyBuffer device,
                                  AnyBuffer x, Result<AnyBuffer> token_out,
                                  Result<AnyBuffer> kept, Result<AnyBuffer> y,
                                  int64_t base_tag, int64_t island,
                                  Span<const int64_t> device_ranks,
                                  Span<const int64_t> island_sizes,
                                  Span<const int64_t> shape, int64_t gpu_path,
                                  int64_t op, double divisor) {
  ForwardToken(token, token_out);
  return StartOnCpu(
      kReduceScatterStartName, device, x, token_out, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path}, true,
      [op, divisor](const CollectiveCall& call, const HostBuffers& io,
                    SlotAlgorithms& algorithms) {
        return ReduceScatterOnHost(call, io, op, divisor, algorithms);
      });
}

ffi::Error DoneImpl(AnyBuffer token, AnyBuffer device, AnyBuffer kept,
                    AnyBuffer y, Result<AnyBuffer> token_out,
                    Result<AnyBuffer> y_out, int64_t base_tag) {
  (void)kept;  // held alive until here; nothing reads it
  ForwardToken(token, token_out);
  Status s = FinishPendingOp(static_cast<uint64_t>(base_tag),
                             DeviceIndex(device), y.untyped_data(), nullptr);
  if (s.ok()) {
    s = CheckAliased(kCollectiveDoneName, y, y_out,
                     "the result with the start's result");
  }
  return ffi_core::ToFfiError(s, kCollectiveDoneName);
}

}  // namespace
}  // namespace hetjax::collectives

namespace hc = ::hetjax::collectives;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxAllReduceCpu, hc::AllReduceImpl,
    hc::BindCollectiveAttrs(hc::BindCollectiveOperands())
        .Attr<int64_t>("op")
        .Attr<double>("divisor")
        .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxReduceScatterCpu, hc::ReduceScatterImpl,
    hc::BindCollectiveAttrs(hc::BindCollectiveOperands())
        .Attr<int64_t>("op")
        .Attr<double>("divisor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxAllGatherCpu, hc::AllGatherImpl,
    hc::BindCollectiveAttrs(hc::BindCollectiveOperands()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxBroadcastCpu, hc::BroadcastImpl,
    hc::BindCollectiveAttrs(hc::BindCollectiveOperands())
        .Attr<int64_t>("root"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxAllReduceStartCpu, hc::AllReduceStartImpl,
    hc::BindCollectiveAttrs(hc::BindStartOperands(::xla::ffi::Ffi::Bind()))
        .Attr<int64_t>("op")
        .Attr<double>("divisor")
        .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxReduceScatterStartCpu, hc::ReduceScatterStartImpl,
    hc::BindCollectiveAttrs(hc::BindStartOperands(::xla::ffi::Ffi::Bind()))
        .Attr<int64_t>("op")
        .Attr<double>("divisor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxCollectiveDoneCpu, hc::DoneImpl,
    hc::BindDoneOperands(::xla::ffi::Ffi::Bind()).Attr<int64_t>("base_tag"));
