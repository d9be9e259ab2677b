// hetjax_recv on CUDA / ROCm: pre-post the receive into pinned staging and
// enqueue per-chunk flag waits and host->device copies (staged_recv.h); the
// stream, not the host thread, waits for the data. Never command-buffer
// compatible (no traits).
#include "cc/ffi/gpu/gpu_handler.h"
#include "cc/ffi/gpu/slot_channel.h"
#include "cc/ffi/gpu/staged_recv.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::gpu {
namespace {

namespace ffi = ::xla::ffi;
constexpr char kOp[] = "hetjax_recv";

ffi::Error GpuRecvImpl(void* stream, ffi::AnyBuffer token_in,
                       ffi::Result<ffi::AnyBuffer> token_out,
                       ffi::Result<ffi::AnyBuffer> y, int64_t peer,
                       int64_t tag) {
  (void)token_in;
  Bridge* bridge = nullptr;
  StagingContext* context = nullptr;
  TensorSpec spec;
  Status status = ffi_core::RequireBridge(&bridge);
  if (status.ok()) status = RequireStagingContext(&context);
  if (status.ok()) status = ffi_core::SpecOf(y, kOp, &spec);
  if (status.ok()) {
    if (auto channel = ChannelForHandler(static_cast<int>(peer), false)) {
      status =
          channel->Recv(*context, *bridge, stream, static_cast<uint64_t>(tag),
                        spec, y->untyped_data());
    } else {
      status = StagedRecv(*context, *bridge, stream, static_cast<int>(peer),
                          static_cast<uint64_t>(tag), spec, y->untyped_data());
    }
  }
  if (status.ok()) status = WriteToken(*context, stream, token_out);
  return ffi_core::ToFfiError(status, kOp);
}

// hetjax_recv_into: the result aliases a buffer the caller passes (and
// donates); the receive itself is GpuRecvImpl's.
ffi::Error GpuRecvIntoImpl(void* stream, ffi::AnyBuffer token_in,
                           ffi::AnyBuffer /*aliased*/,
                           ffi::Result<ffi::AnyBuffer> token_out,
                           ffi::Result<ffi::AnyBuffer> y, int64_t peer,
                           int64_t tag) {
  return GpuRecvImpl(stream, token_in, token_out, y, peer, tag);
}

}  // namespace
}  // namespace hetjax::gpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxRecvGpu, hetjax::gpu::GpuRecvImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<void*>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // y
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxRecvIntoGpu, hetjax::gpu::GpuRecvIntoImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Ctx<::xla::ffi::PlatformStream<void*>>()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Arg<::xla::ffi::AnyBuffer>()  // into (= y)
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // y
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));
