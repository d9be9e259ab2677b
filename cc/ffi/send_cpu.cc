// hetjax_send on the CPU platform: the operand already lives in host memory,
// so this is Bridge::Send straight from XLA's buffer, or, to a GPU island of
// this host, a copy into the slots its GPU reads (gpu/host_channel.h).
// Blocking, hence never command-buffer compatible (no traits).
#include "cc/ffi/cpu_targets.h"
#include "cc/ffi/gpu/host_channel.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::cpu {
namespace {

namespace ffi = ::xla::ffi;
constexpr char kOp[] = "hetjax_send";

ffi::Error SendImpl(ffi::AnyBuffer token_in, ffi::AnyBuffer x,
                    ffi::Result<ffi::AnyBuffer> token_out, int64_t peer,
                    int64_t tag) {
  Bridge* bridge = nullptr;
  TensorSpec spec;
  Status status = ffi_core::RequireBridge(&bridge);
  if (status.ok()) status = ffi_core::SpecOf(x, kOp, &spec);
  if (status.ok()) {
    if (auto channel = gpu::ChannelForHandler(static_cast<int>(peer), true)) {
      status =
          gpu::HostChannelSend(*channel, *bridge, static_cast<uint64_t>(tag),
                               spec, x.untyped_data());
    } else {
      status = bridge->Send(static_cast<int>(peer), static_cast<uint64_t>(tag),
                            spec, x.untyped_data());
    }
  }
  // The token carries only ordering; forwarding its byte keeps the data
  // dependency XLA sees from input to output.
  *static_cast<uint8_t*>(token_out->untyped_data()) =
      *static_cast<const uint8_t*>(token_in.untyped_data());
  return ffi_core::ToFfiError(status, kOp);
}

}  // namespace
}  // namespace hetjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxSendCpu, hetjax::cpu::SendImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Arg<::xla::ffi::AnyBuffer>()  // x
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));
