#include "cc/ffi/collectives/host_collectives.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {
namespace {

const char* At(const void* b, uint64_t elements, DType dtype) {
  return static_cast<const char*>(b) + elements * DTypeSize(dtype);
}
char* At(void* b, uint64_t elements, DType dtype) {
  return static_cast<char*>(b) + elements * DTypeSize(dtype);
}

// The dtype pairs a reduction accepts: out == in, or a float32 island
// partial rounded once into the caller's half dtype.
Status CheckReductionDtypes(const char* name, const TensorSpec& x,
                            const TensorSpec& y) {
  if (x.dtype == y.dtype) return Status::Ok();
  if (x.dtype == DType::kF32 &&
      (y.dtype == DType::kBF16 || y.dtype == DType::kF16)) {
    return Status::Ok();
  }
  return Status(StatusCode::kInvalidArgument,
                std::string(name) + ": operand " + x.ToString() +
                    " cannot produce result " + y.ToString());
}

uint64_t MySlots(const CollectiveCall& call) {
  return call.layout.slots_per_device(call.layout.my_island());
}

OpDescriptor Describe(const CollectiveCall& call, CollectiveKind kind,
                      DType wire_dtype, const SlotAlgorithms& algorithms) {
  OpDescriptor d;
  d.kind = kind;
  d.path = algorithms.path();
  d.piece_bytes = algorithms.piece_bytes();
  d.wire_dtype = wire_dtype;
  d.slots = call.layout.slots();
  d.logical = call.logical;
  return d;
}

}  // namespace

Status SpecsOf(const char* name, const ffi::AnyBuffer& x,
               const ffi::Result<ffi::AnyBuffer>& y, HostBuffers* buffers) {
  Status s = ffi_core::SpecOf(x, name, &buffers->x_spec);
  if (s.ok()) s = ffi_core::SpecOf(y, name, &buffers->y_spec);
  return s;
}

Status AllReduceOnHost(const CollectiveCall& call, const HostBuffers& io,
                       int64_t op, double divisor, int64_t algorithm,
                       SlotAlgorithms& algorithms) {
  const TensorSpec& xs = io.x_spec;
  const TensorSpec& ys = io.y_spec;
  Status s = CheckReductionDtypes(kAllReduceName, xs, ys);
  if (s.ok())
    s = CheckReducible(xs.dtype, static_cast<ReduceOp>(op), kAllReduceName);
  const uint64_t per_slot = s.ok() ? ys.num_elements() / MySlots(call) : 0;
  if (s.ok()) s = CheckSlotElements(call, "all_reduce operand", xs, per_slot);
  if (s.ok()) s = CheckSlotElements(call, "all_reduce result", ys, per_slot);
  if (!s.ok()) return s;
  OpDescriptor d =
      Describe(call, CollectiveKind::kAllReduce, xs.dtype, algorithms);
  d.reduce_op = op;
  d.algorithm = static_cast<Algorithm>(algorithm);
  const Reduction r{xs.dtype, ys.dtype, static_cast<ReduceOp>(op), divisor};
  return ForEachMySlot(call, d, algorithms, [&](const SlotOp& slot_op, int i) {
    return algorithms.AllReduce(slot_op, d.algorithm, r,
                                At(io.x, i * per_slot, xs.dtype),
                                At(io.y, i * per_slot, ys.dtype), per_slot);
  });
}

Status ReduceScatterOnHost(const CollectiveCall& call, const HostBuffers& io,
                           int64_t op, double divisor,
                           SlotAlgorithms& algorithms) {
  const TensorSpec& xs = io.x_spec;
  const TensorSpec& ys = io.y_spec;
  Status s = CheckReductionDtypes(kReduceScatterName, xs, ys);
  if (s.ok())
    s = CheckReducible(xs.dtype, static_cast<ReduceOp>(op), kReduceScatterName);
  const uint64_t per_slot = s.ok() ? ys.num_elements() / MySlots(call) : 0;
  const uint64_t n = call.layout.num_islands();
  if (s.ok())
    s = CheckSlotElements(call, "reduce_scatter operand", xs, n * per_slot);
  if (s.ok())
    s = CheckSlotElements(call, "reduce_scatter result", ys, per_slot);
  if (!s.ok()) return s;
  OpDescriptor d =
      Describe(call, CollectiveKind::kReduceScatter, xs.dtype, algorithms);
  d.reduce_op = op;
  d.algorithm = Algorithm::kOrdered;
  const Reduction r{xs.dtype, ys.dtype, static_cast<ReduceOp>(op), divisor};
  return ForEachMySlot(call, d, algorithms, [&](const SlotOp& slot_op, int i) {
    return algorithms.ReduceScatter(slot_op, r,
                                    At(io.x, i * n * per_slot, xs.dtype),
                                    At(io.y, i * per_slot, ys.dtype), per_slot);
  });
}

Status AllGatherOnHost(const CollectiveCall& call, const HostBuffers& io,
                       SlotAlgorithms& algorithms) {
  const TensorSpec& xs = io.x_spec;
  const TensorSpec& ys = io.y_spec;
  if (xs.dtype != ys.dtype) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(kAllGatherName) + ": operand " + xs.ToString() +
                      " and result " + ys.ToString() + " differ in dtype");
  }
  // Island k's block (d_k devices' values) is padded to whole slots of
  // counts[k] elements each.
  const IslandLayout& layout = call.layout;
  std::vector<size_t> counts(layout.num_islands());
  size_t total = 0;
  const uint64_t m = call.logical.num_elements();
  for (int k = 0; k < layout.num_islands(); ++k) {
    // At least one element per slot: the Python side never passes empty
    // buffers (XLA may drop such custom calls on some islands).
    counts[k] = std::max<uint64_t>(
        1, (layout.devices(k) * m + layout.slots() - 1) / layout.slots());
    total += counts[k];
  }
  const size_t mine = counts[layout.my_island()];
  Status s = CheckSlotElements(call, "all_gather operand", xs, mine);
  if (s.ok()) s = CheckSlotElements(call, "all_gather result", ys, total);
  if (!s.ok()) return s;
  const OpDescriptor d =
      Describe(call, CollectiveKind::kAllGather, xs.dtype, algorithms);
  return ForEachMySlot(call, d, algorithms, [&](const SlotOp& slot_op, int i) {
    return algorithms.AllGather(slot_op, xs.dtype, At(io.x, i * mine, xs.dtype),
                                counts, At(io.y, i * total, ys.dtype));
  });
}

Status BroadcastOnHost(const CollectiveCall& call, const HostBuffers& io,
                       int64_t root, SlotAlgorithms& algorithms) {
  const TensorSpec& xs = io.x_spec;
  const TensorSpec& ys = io.y_spec;
  if (xs != ys) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(kBroadcastName) + ": operand " + xs.ToString() +
                      " and result " + ys.ToString() + " differ");
  }
  if (root < 0 || root >= call.layout.num_islands()) {
    return Status(StatusCode::kInvalidArgument,
                  "broadcast root island " + std::to_string(root) +
                      " outside " + std::to_string(call.layout.num_islands()) +
                      " islands");
  }
  const uint64_t per_slot = ys.num_elements() / MySlots(call);
  Status s = CheckSlotElements(call, "broadcast operand", xs, per_slot);
  if (!s.ok()) return s;
  OpDescriptor d =
      Describe(call, CollectiveKind::kBroadcast, xs.dtype, algorithms);
  d.root = root;
  return ForEachMySlot(call, d, algorithms, [&](const SlotOp& slot_op, int i) {
    return algorithms.Broadcast(slot_op, static_cast<int>(root), xs.dtype,
                                At(io.x, i * per_slot, xs.dtype),
                                At(io.y, i * per_slot, ys.dtype), per_slot);
  });
}

Status CheckAliased(const char* name, const ffi::AnyBuffer& operand,
                    ffi::Result<ffi::AnyBuffer>& result, const char* what) {
  if (result->untyped_data() == operand.untyped_data()) return Status::Ok();
  return Status(StatusCode::kInternal,
                std::string(name) + ": expected XLA to alias " + what +
                    " (input_output_aliases), got another buffer");
}

}  // namespace hetjax::collectives
