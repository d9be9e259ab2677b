// The CPU platform's collective FFI handlers, listed by cc/ffi/cpu_targets.cc.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HetjaxAllReduceCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxReduceScatterCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxAllGatherCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxBroadcastCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxAllReduceStartCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxReduceScatterStartCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxCollectiveDoneCpu(XLA_FFI_CallFrame* call_frame);
}

namespace hetjax::collectives {

inline std::vector<std::pair<const char*, void*>> CpuCollectiveTargets() {
  return {
      {"hetjax_all_reduce", reinterpret_cast<void*>(&HetjaxAllReduceCpu)},
      {"hetjax_reduce_scatter",
       reinterpret_cast<void*>(&HetjaxReduceScatterCpu)},
      {"hetjax_all_gather", reinterpret_cast<void*>(&HetjaxAllGatherCpu)},
      {"hetjax_broadcast", reinterpret_cast<void*>(&HetjaxBroadcastCpu)},
      {"hetjax_all_reduce_start",
       reinterpret_cast<void*>(&HetjaxAllReduceStartCpu)},
      {"hetjax_reduce_scatter_start",
       reinterpret_cast<void*>(&HetjaxReduceScatterStartCpu)},
      {"hetjax_collective_done",
       reinterpret_cast<void*>(&HetjaxCollectiveDoneCpu)},
  };
}

}  // namespace hetjax::collectives
