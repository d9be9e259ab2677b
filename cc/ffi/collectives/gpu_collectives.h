// The CUDA / ROCm collective FFI handlers, listed by cc/ffi/gpu/gpu_targets.cc
// under the same target names as on the CPU (the platform picks the handler).
// Built only in a GPU flavour.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HetjaxAllReduceGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxReduceScatterGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxAllGatherGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxBroadcastGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxAllReduceStartGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxReduceScatterStartGpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxCollectiveDoneGpu(XLA_FFI_CallFrame* call_frame);
}

namespace hetjax::collectives {

inline std::vector<std::pair<const char*, void*>> GpuCollectiveTargets() {
  return {
      {"hetjax_all_reduce", reinterpret_cast<void*>(&HetjaxAllReduceGpu)},
      {"hetjax_reduce_scatter",
       reinterpret_cast<void*>(&HetjaxReduceScatterGpu)},
      {"hetjax_all_gather", reinterpret_cast<void*>(&HetjaxAllGatherGpu)},
      {"hetjax_broadcast", reinterpret_cast<void*>(&HetjaxBroadcastGpu)},
      {"hetjax_all_reduce_start",
       reinterpret_cast<void*>(&HetjaxAllReduceStartGpu)},
      {"hetjax_reduce_scatter_start",
       reinterpret_cast<void*>(&HetjaxReduceScatterStartGpu)},
      {"hetjax_collective_done",
       reinterpret_cast<void*>(&HetjaxCollectiveDoneGpu)},
  };
}

}  // namespace hetjax::collectives
