// Cross-island collectives over host buffers: one slot's exchange among its
// group (one member per island). Platform-free: the CPU handlers pass XLA's
// buffers, a GPU variant passes its staging buffers.
//
// Every algorithm posts all of its receives first, starts sends as soon as
// their data is final, and works through the payload in pieces of the
// bridge's chunk size, so the reduction of piece k overlaps the wire
// carrying piece k+1 (and, in the ring, the next member reducing piece k).
// No algorithm reduces in arrival order: the order of every addition is
// fixed by the algorithm, so runs repeat bitwise.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "cc/ffi/collectives/group.h"
#include "cc/ffi/collectives/op_descriptor.h"
#include "cc/ffi/collectives/reduce_kernels.h"
#include "cc/transport/bridge.h"

namespace hetjax::collectives {

struct SlotOp {
  Bridge* bridge;
  Group group;
  uint64_t base;  // the op's base tag
  int slot;
};

struct Reduction {
  DType in_dtype;   // what members contribute (and the ring's wire dtype
                    // once widened to AccumulatorDType)
  DType out_dtype;  // in_dtype, or float16/bfloat16 when in_dtype is float32
  ReduceOp op;
  double divisor;  // 1 = none; mean divides once, before the final rounding
};

// out[count] = reduce over members of in[count].
//  kRing: reduce-scatter then all-gather around the ring; each member sends
//    2 (n-1)/n of the payload, to its successor only. Partial sums travel in
//    the accumulator dtype (float32 for halves).
//  kOrdered: member c owns segment c, receives every member's raw segment c
//    and reduces it in island order x_0, x_1, ..., then sends the result to
//    all. Same bytes per member as the ring, over n-1 links at once; the
//    result equals the sequential island-order reduction bitwise.
Status AllReduce(const SlotOp& op, Algorithm algorithm, const Reduction& r,
                 const void* in, void* out, size_t count);

// in[n * count]: block c for member c. out[count] = reduce over members of
// their block `me`, in island order.
Status ReduceScatter(const SlotOp& op, const Reduction& r, const void* in,
                     void* out, size_t count);

// out = concatenation over members of their in (counts[q] elements each).
Status AllGather(const SlotOp& op, DType dtype, const void* in,
                 const std::vector<size_t>& counts, void* out);

// out[count] = the root member's in[count]; the root sends to every member.
Status Broadcast(const SlotOp& op, int root, DType dtype, const void* in,
                 void* out, size_t count);

// The four collectives on one slot, over some kind of memory. The shared
// handler body (host_collectives.h) decides shapes, slots and the op
// descriptor once and hands each slot to one of these: HostAlgorithms() (the
// functions above, host buffers) or the GPU channel collectives
// (channel_collective.h, device buffers).
class SlotAlgorithms {
 public:
  virtual ~SlotAlgorithms() = default;
  // Where the bytes move; part of the op descriptor the members agree on.
  virtual DataPath path() const = 0;
  // The pipelining unit in bytes when it is not the bridge's chunk size
  // (0); also agreed on.
  virtual uint64_t piece_bytes() const { return 0; }
  // Empty: the members agree on the op descriptor before anything moves
  // (AgreeOnOp). Otherwise they agree while `op` runs (PostAgreement), and
  // this takes the result: a disagreement found after the data path was
  // enqueued must stop it and be reported by a later call.
  virtual std::function<void(const Status&)> LateAgreement(const SlotOp& op) {
    (void)op;
    return {};
  }
  virtual Status AllReduce(const SlotOp& op, Algorithm algorithm,
                           const Reduction& r, const void* in, void* out,
                           size_t count) = 0;
  virtual Status ReduceScatter(const SlotOp& op, const Reduction& r,
                               const void* in, void* out, size_t count) = 0;
  virtual Status AllGather(const SlotOp& op, DType dtype, const void* in,
                           const std::vector<size_t>& counts, void* out) = 0;
  virtual Status Broadcast(const SlotOp& op, int root, DType dtype,
                           const void* in, void* out, size_t count) = 0;
};

SlotAlgorithms& HostAlgorithms();

}  // namespace hetjax::collectives
