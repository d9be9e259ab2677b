#include "cc/ffi/gpu/gpu_handler.h"

namespace hetjax::gpu {

Status RequireStagingContext(StagingContext** context) {
  *context = GpuStagingContext();
  if (*context != nullptr) return Status::Ok();
  return Status(StatusCode::kInternal,
                "this hetjax build has no GPU device layer (flavour none), "
                "yet a GPU handler ran");
}

Status WriteToken(StagingContext& context, device::Stream stream,
                  ::xla::ffi::Result<::xla::ffi::AnyBuffer>& token_out) {
  return context.device.MemsetAsync(token_out->untyped_data(), 0,
                                    token_out->size_bytes(), stream);
}

}  // namespace hetjax::gpu
