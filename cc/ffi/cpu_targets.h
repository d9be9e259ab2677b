// The CPU platform's FFI handlers, as (target name, handler symbol) pairs for
// the nanobind module to wrap in capsules. Same shape as the GPU flavours'
// list (cc/ffi/gpu/gpu_targets.h), so the module treats them alike.
#pragma once

#include <utility>
#include <vector>

#include "xla/ffi/api/c_api.h"

extern "C" {
XLA_FFI_Error* HetjaxSendCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxRecvCpu(XLA_FFI_CallFrame* call_frame);
XLA_FFI_Error* HetjaxRecvIntoCpu(XLA_FFI_CallFrame* call_frame);
}

namespace hetjax::cpu {

std::vector<std::pair<const char*, void*>> CpuFfiTargets();

}  // namespace hetjax::cpu
