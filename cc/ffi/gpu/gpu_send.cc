// hetjax_send on CUDA / ROCm: stage device->host in chunks and start the
// bridge send; returns without blocking the stream (staged_send.h). Never
// command-buffer compatible (no traits): it must run on every execution.
#include "cc/ffi/gpu/gpu_handler.h"
#include "cc/ffi/gpu/slot_channel.h"
#include "cc/ffi/gpu/staged_send.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::gpu {
namespace {

namespace ffi = ::xla::ffi;
constexpr char kOp[] = "hetjax_send";

ffi::Error GpuSendImpl(void* stream, ffi::AnyBuffer token_in, ffi::AnyBuffer x,
                       ffi::Result<ffi::AnyBuffer> token_out, int64_t peer,
                       int64_t tag) {
  (void)token_in;  // ordering only: XLA already ran what produced it
  Bridge* bridge = nullptr;
  StagingContext* context = nullptr;
  TensorSpec spec;
  Status status = ffi_core::RequireBridge(&bridge);
  if (status.ok()) status = RequireStagingContext(&context);
  if (status.ok()) status = ffi_core::SpecOf(x, kOp, &spec);
  if (status.ok()) {
    // A GPU or CPU island on this host has a slot channel (slot_channel.h);
    // any other peer (another host) gets host staging over the wire.
    if (auto channel = ChannelForHandler(static_cast<int>(peer), false)) {
      status =
          channel->Send(*context, *bridge, stream, static_cast<uint64_t>(tag),
                        spec, x.untyped_data());
    } else {
      status = StagedSend(*context, *bridge, stream, static_cast<int>(peer),
                          static_cast<uint64_t>(tag), spec, x.untyped_data());
    }
  }
  if (status.ok()) status = WriteToken(*context, stream, token_out);
  return ffi_core::ToFfiError(status, kOp);
}

}  // namespace
}  // namespace hetjax::gpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxSendGpu, hetjax::gpu::GpuSendImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<void*>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Arg<::xla::ffi::AnyBuffer>()  // x
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));
