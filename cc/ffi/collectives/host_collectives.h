// The four collectives once the operand and the result are in host memory:
// check the buffers against the layout, then run the algorithm on each slot
// this device owns. The CPU handlers pass XLA's own buffers; the GPU handlers
// pass their pinned staging copies (staged_collective.h). Everything a
// collective decides is here, so both platforms decide alike.
#pragma once

#include <cstdint>

#include "cc/ffi/collectives/collective_call.h"
#include "cc/ffi/handler_core.h"
#include "cc/transport/status.h"
#include "cc/transport/tensor_spec.h"

namespace hetjax::collectives {

inline constexpr char kAllReduceName[] = "hetjax_all_reduce";
inline constexpr char kReduceScatterName[] = "hetjax_reduce_scatter";
inline constexpr char kAllGatherName[] = "hetjax_all_gather";
inline constexpr char kBroadcastName[] = "hetjax_broadcast";
// The all-reduce and the reduce-scatter in two calls (pending_ops.h): the
// start launches one, the done (one target for every started collective)
// completes it.
inline constexpr char kAllReduceStartName[] = "hetjax_all_reduce_start";
inline constexpr char kReduceScatterStartName[] = "hetjax_reduce_scatter_start";
inline constexpr char kCollectiveDoneName[] = "hetjax_collective_done";

struct HostBuffers {
  TensorSpec x_spec;        // XLA's operand
  TensorSpec y_spec;        // XLA's result
  const void* x = nullptr;  // host bytes of the operand
  void* y = nullptr;        // host bytes the result is written to
};

// The specs of XLA's operand and result, named after the op on failure.
Status SpecsOf(const char* name, const ffi::AnyBuffer& x,
               const ffi::Result<ffi::AnyBuffer>& y, HostBuffers* buffers);

// `algorithms` runs each slot: the host algorithms on host buffers (the
// default), or the GPU channel collectives, whose `io` then holds XLA's
// device buffers (channel_collective.h). Either way the checks, the slot
// arithmetic and the op descriptor are these, so both paths decide alike.
Status AllReduceOnHost(const CollectiveCall& call, const HostBuffers& io,
                       int64_t op, double divisor, int64_t algorithm,
                       SlotAlgorithms& algorithms = HostAlgorithms());
Status ReduceScatterOnHost(const CollectiveCall& call, const HostBuffers& io,
                           int64_t op, double divisor,
                           SlotAlgorithms& algorithms = HostAlgorithms());
Status AllGatherOnHost(const CollectiveCall& call, const HostBuffers& io,
                       SlotAlgorithms& algorithms = HostAlgorithms());
Status BroadcastOnHost(const CollectiveCall& call, const HostBuffers& io,
                       int64_t root,
                       SlotAlgorithms& algorithms = HostAlgorithms());

// What a handler does on any platform. `staging` gives host views of XLA's
// buffers and publishes the result:
//   Status CopyIn(const ffi::AnyBuffer& device, const ffi::AnyBuffer& x,
//                 ffi::Result<ffi::AnyBuffer>& y,
//                 int32_t* device_index, HostBuffers* io);
//   Status CopyOut(ffi::Result<ffi::AnyBuffer>& y,
//                  ffi::Result<ffi::AnyBuffer>& token_out);
// `body(call, io)` is one of the *OnHost functions above.
// Everything before the algorithm: specs, host views, the decoded layout.
template <typename Staging>
Status PrepareCollective(const char* name, Staging& staging,
                         const ffi::AnyBuffer& device, const ffi::AnyBuffer& x,
                         ffi::Result<ffi::AnyBuffer>& y, const CallAttrs& attrs,
                         CollectiveCall* call, HostBuffers* io) {
  int32_t index = 0;
  Status s = SpecsOf(name, x, y, io);
  if (s.ok()) s = staging.CopyIn(device, x, y, &index, io);
  if (s.ok()) s = DecodeCall(attrs, index, io->y_spec.dtype, call);
  return s;
}

template <typename Staging, typename Body>
ffi::Error RunCollective(const char* name, Staging& staging,
                         const ffi::AnyBuffer& device, const ffi::AnyBuffer& x,
                         ffi::Result<ffi::AnyBuffer>& token_out,
                         ffi::Result<ffi::AnyBuffer>& y, const CallAttrs& attrs,
                         const Body& body) {
  HostBuffers io;
  CollectiveCall call;
  Status s = PrepareCollective(name, staging, device, x, y, attrs, &call, &io);
  if (s.ok()) s = body(call, io);
  if (s.ok()) s = staging.CopyOut(y, token_out);
  return ffi_core::ToFfiError(s, name);
}

// A started op's buffers must stay where it reads and writes them: XLA
// gives the start's `kept` result the operand's buffer, and the done's
// result the start's result (input_output_aliases). A copy in between would
// be taken while the op still runs, so a mismatch fails instead.
Status CheckAliased(const char* name, const ffi::AnyBuffer& operand,
                    ffi::Result<ffi::AnyBuffer>& result, const char* what);

}  // namespace hetjax::collectives
