// hetjax_recv on the CPU platform: Bridge::Recv straight into XLA's result
// buffer, or, from a GPU island of this host, a copy out of the slots its
// GPU writes (gpu/host_channel.h); the expected dtype/shape are the
// result's, so either header check names both sides on a mismatch.
// Blocking, hence never command-buffer compatible (no traits).
#include "cc/ffi/cpu_targets.h"
#include "cc/ffi/gpu/host_channel.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::cpu {
namespace {

namespace ffi = ::xla::ffi;
constexpr char kOp[] = "hetjax_recv";

ffi::Error RecvImpl(ffi::AnyBuffer token_in,
                    ffi::Result<ffi::AnyBuffer> token_out,
                    ffi::Result<ffi::AnyBuffer> y, int64_t peer, int64_t tag) {
  Bridge* bridge = nullptr;
  TensorSpec expected;
  Status status = ffi_core::RequireBridge(&bridge);
  if (status.ok()) status = ffi_core::SpecOf(y, kOp, &expected);
  if (status.ok()) {
    if (auto channel = gpu::ChannelForHandler(static_cast<int>(peer), true)) {
      status =
          gpu::HostChannelRecv(*channel, *bridge, static_cast<uint64_t>(tag),
                               expected, y->untyped_data());
    } else {
      status = bridge->Recv(static_cast<int>(peer), static_cast<uint64_t>(tag),
                            expected, y->untyped_data());
    }
  }
  *static_cast<uint8_t*>(token_out->untyped_data()) =
      *static_cast<const uint8_t*>(token_in.untyped_data());
  return ffi_core::ToFfiError(status, kOp);
}

// hetjax_recv_into: the result aliases a buffer the caller passes (and
// donates), so a receive in a loop lands in pages already faulted in
// instead of a fresh XLA result; the receive itself is RecvImpl's.
ffi::Error RecvIntoImpl(ffi::AnyBuffer token_in, ffi::AnyBuffer /*aliased*/,
                        ffi::Result<ffi::AnyBuffer> token_out,
                        ffi::Result<ffi::AnyBuffer> y, int64_t peer,
                        int64_t tag) {
  return RecvImpl(token_in, token_out, y, peer, tag);
}

}  // namespace
}  // namespace hetjax::cpu

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxRecvCpu, hetjax::cpu::RecvImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // y
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxRecvIntoCpu, hetjax::cpu::RecvIntoImpl,
                              ::xla::ffi::Ffi::Bind()
                                  .Arg<::xla::ffi::AnyBuffer>()  // token
                                  .Arg<::xla::ffi::AnyBuffer>()  // into (= y)
                                  .Ret<::xla::ffi::AnyBuffer>()  // token
                                  .Ret<::xla::ffi::AnyBuffer>()  // y
                                  .Attr<int64_t>("peer")
                                  .Attr<int64_t>("tag"));
