// The collective FFI targets on the CPU platform: operands already live in
// host memory, so the host views are XLA's own buffers and each handler is
// the shared body (host_collectives.h) straight on them. Blocking, hence
// never command-buffer compatible (no traits); a started collective runs
// the same body on the device's host worker instead (pending_ops.h).
#include "cc/ffi/collectives/cpu_collectives.h"
#include "cc/ffi/collectives/host_collectives.h"
#include "cc/ffi/collectives/pending_ops.h"
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

ffi::Error AllReduceImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path,
                         int64_t op, double divisor, int64_t algorithm) {
  ForwardToken(token, token_out);
  InPlace staging;
  return RunCollective(
      kAllReduceName, staging, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [&](const CollectiveCall& call, const HostBuffers& io) {
        return AllReduceOnHost(call, io, op, divisor, algorithm);
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
  InPlace staging;
  return RunCollective(
      kReduceScatterName, staging, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [&](const CollectiveCall& call, const HostBuffers& io) {
        return ReduceScatterOnHost(call, io, op, divisor);
      });
}

ffi::Error AllGatherImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t gpu_path) {
  ForwardToken(token, token_out);
  InPlace staging;
  return RunCollective(
      kAllGatherName, staging, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [](const CollectiveCall& call, const HostBuffers& io) {
        return AllGatherOnHost(call, io);
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
  InPlace staging;
  return RunCollective(
      kBroadcastName, staging, device, x, token_out, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [&](const CollectiveCall& call, const HostBuffers& io) {
        return BroadcastOnHost(call, io, root);
      });
}

int32_t DeviceIndex(const AnyBuffer& device) {
  return *static_cast<const int32_t*>(device.untyped_data());
}

// A started op: the checks and the decoding here, the algorithm (`body`,
// by value) on the device's host worker; the done waits for it.
template <typename Body>
ffi::Error StartOnCpu(const char* name, const AnyBuffer& device,
                      const AnyBuffer& x, Result<AnyBuffer>& kept,
                      Result<AnyBuffer>& y, const CallAttrs& attrs, Body body) {
  InPlace staging;
  CollectiveCall call;
  HostBuffers io;
  Status s = CheckAliased(name, x, kept, "the kept result with the operand");
  if (s.ok()) {
    s = PrepareCollective(name, staging, device, x, y, attrs, &call, &io);
  }
  if (s.ok()) {
    s = StartOnHostWorker(static_cast<uint64_t>(attrs.base_tag),
                          DeviceIndex(device), y->untyped_data(),
                          [call, io, body] { return body(call, io); });
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
      kAllReduceStartName, device, x, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [op, divisor, algorithm](const CollectiveCall& call,
                               const HostBuffers& io) {
        return AllReduceOnHost(call, io, op, divisor, algorithm);
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
      kReduceScatterStartName, device, x, kept, y,
      {base_tag, island, device_ranks, island_sizes, shape, gpu_path},
      [op, divisor](const CollectiveCall& call, const HostBuffers& io) {
        return ReduceScatterOnHost(call, io, op, divisor);
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
