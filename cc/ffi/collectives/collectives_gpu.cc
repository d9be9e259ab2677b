// The collective FFI targets on CUDA and ROCm: the CPU handlers' body
// (host_collectives.h) on pinned host copies of XLA's buffers, staged on
// XLA's stream (staged_collective.h). Streams arrive as void* and the device
// layer does the vendor calls, so this one object file serves both flavours.
// Blocking, hence never command-buffer compatible (no traits).
#include <optional>

#include "cc/ffi/collectives/gpu_collectives.h"
#include "cc/ffi/collectives/host_collectives.h"
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

ffi::Error AllReduceImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t op, double divisor,
                         int64_t algorithm) {
  (void)token;  // ordering only: XLA already ran what produced it
  OnStream staging(stream);
  return RunCollective(kAllReduceName, staging, device, x, token_out, y,
                       {base_tag, island, device_ranks, island_sizes, shape},
                       [&](const CollectiveCall& call, const HostBuffers& io) {
                         return AllReduceOnHost(call, io, op, divisor,
                                                algorithm);
                       });
}

ffi::Error ReduceScatterImpl(void* stream, AnyBuffer token, AnyBuffer device,
                             AnyBuffer x, Result<AnyBuffer> token_out,
                             Result<AnyBuffer> y, int64_t base_tag,
                             int64_t island, Span<const int64_t> device_ranks,
                             Span<const int64_t> island_sizes,
                             Span<const int64_t> shape, int64_t op,
                             double divisor) {
  (void)token;
  OnStream staging(stream);
  return RunCollective(kReduceScatterName, staging, device, x, token_out, y,
                       {base_tag, island, device_ranks, island_sizes, shape},
                       [&](const CollectiveCall& call, const HostBuffers& io) {
                         return ReduceScatterOnHost(call, io, op, divisor);
                       });
}

ffi::Error AllGatherImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape) {
  (void)token;
  OnStream staging(stream);
  return RunCollective(kAllGatherName, staging, device, x, token_out, y,
                       {base_tag, island, device_ranks, island_sizes, shape},
                       AllGatherOnHost);
}

ffi::Error BroadcastImpl(void* stream, AnyBuffer token, AnyBuffer device,
                         AnyBuffer x, Result<AnyBuffer> token_out,
                         Result<AnyBuffer> y, int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t root) {
  (void)token;
  OnStream staging(stream);
  return RunCollective(kBroadcastName, staging, device, x, token_out, y,
                       {base_tag, island, device_ranks, island_sizes, shape},
                       [&](const CollectiveCall& call, const HostBuffers& io) {
                         return BroadcastOnHost(call, io, root);
                       });
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
