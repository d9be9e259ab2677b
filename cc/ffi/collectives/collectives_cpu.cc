// The collective FFI targets on the CPU platform: operands already live in
// host memory, so each handler is the shared decode (collective_call.h) plus
// one algorithm call per owned slot, straight on XLA's buffers. Blocking,
// hence never command-buffer compatible (no traits).
#include "cc/ffi/collectives/cpu_collectives.h"

#include <algorithm>
#include <string>
#include <vector>

#include "cc/ffi/collectives/collective_call.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {
namespace {

using ffi::AnyBuffer;
using ffi::Result;
using ffi::Span;

constexpr char kAllReduce[] = "hetjax_all_reduce";
constexpr char kReduceScatter[] = "hetjax_reduce_scatter";
constexpr char kAllGather[] = "hetjax_all_gather";
constexpr char kBroadcast[] = "hetjax_broadcast";

void ForwardToken(const AnyBuffer& in, Result<AnyBuffer>& out) {
  *static_cast<uint8_t*>(out->untyped_data()) =
      *static_cast<const uint8_t*>(in.untyped_data());
}

const char* At(const AnyBuffer& b, uint64_t elements, DType dtype) {
  return static_cast<const char*>(b.untyped_data()) + elements * DTypeSize(dtype);
}
char* At(Result<AnyBuffer>& b, uint64_t elements, DType dtype) {
  return static_cast<char*>(b->untyped_data()) + elements * DTypeSize(dtype);
}

// Decodes both buffers and the common attributes.
Status Prepare(const char* name, const AnyBuffer& device, const AnyBuffer& x,
               const Result<AnyBuffer>& y, int64_t base_tag, int64_t island,
               Span<const int64_t> device_ranks, Span<const int64_t> island_sizes,
               Span<const int64_t> shape, TensorSpec* x_spec, TensorSpec* y_spec,
               CollectiveCall* call) {
  Status s = ffi_core::SpecOf(x, name, x_spec);
  if (s.ok()) s = ffi_core::SpecOf(y, name, y_spec);
  if (!s.ok()) return s;
  const int32_t index = *static_cast<const int32_t*>(device.untyped_data());
  return DecodeCall(base_tag, island, index, device_ranks, island_sizes, shape,
                    y_spec->dtype, call);
}

// The dtype pairs a reduction accepts: out == in, or a float32 island
// partial rounded once into the caller's half dtype.
Status CheckReductionDtypes(const char* name, const TensorSpec& x,
                            const TensorSpec& y) {
  if (x.dtype == y.dtype) return Status::Ok();
  if (x.dtype == DType::kF32 && (y.dtype == DType::kBF16 || y.dtype == DType::kF16)) {
    return Status::Ok();
  }
  return Status(StatusCode::kInvalidArgument,
                std::string(name) + ": operand " + x.ToString() +
                    " cannot produce result " + y.ToString());
}

ffi::Error AllReduceImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t op, double divisor,
                         int64_t algorithm) {
  ForwardToken(token, token_out);
  TensorSpec xs, ys;
  CollectiveCall call;
  Status s = Prepare(kAllReduce, device, x, y, base_tag, island, device_ranks,
                     island_sizes, shape, &xs, &ys, &call);
  if (s.ok()) s = CheckReductionDtypes(kAllReduce, xs, ys);
  if (s.ok()) s = CheckReducible(xs.dtype, static_cast<ReduceOp>(op), kAllReduce);
  const uint64_t slots = call.layout.slots_per_device(call.layout.my_island());
  const uint64_t per_slot = s.ok() ? ys.num_elements() / slots : 0;
  if (s.ok()) s = CheckSlotElements(call, "all_reduce operand", xs, per_slot);
  if (s.ok()) s = CheckSlotElements(call, "all_reduce result", ys, per_slot);
  if (s.ok()) {
    OpDescriptor d;
    d.kind = CollectiveKind::kAllReduce;
    d.reduce_op = op;
    d.wire_dtype = xs.dtype;
    d.algorithm = static_cast<Algorithm>(algorithm);
    d.slots = call.layout.slots();
    d.logical = call.logical;
    const Reduction r{xs.dtype, ys.dtype, static_cast<ReduceOp>(op), divisor};
    s = ForEachMySlot(call, d, [&](const SlotOp& slot_op, int i) {
      return AllReduce(slot_op, d.algorithm, r, At(x, i * per_slot, xs.dtype),
                       At(y, i * per_slot, ys.dtype), per_slot);
    });
  }
  return ffi_core::ToFfiError(s, kAllReduce);
}

ffi::Error ReduceScatterImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                             Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                             int64_t base_tag, int64_t island,
                             Span<const int64_t> device_ranks,
                             Span<const int64_t> island_sizes,
                             Span<const int64_t> shape, int64_t op,
                             double divisor) {
  ForwardToken(token, token_out);
  TensorSpec xs, ys;
  CollectiveCall call;
  Status s = Prepare(kReduceScatter, device, x, y, base_tag, island,
                     device_ranks, island_sizes, shape, &xs, &ys, &call);
  if (s.ok()) s = CheckReductionDtypes(kReduceScatter, xs, ys);
  if (s.ok()) s = CheckReducible(xs.dtype, static_cast<ReduceOp>(op), kReduceScatter);
  const uint64_t slots = call.layout.slots_per_device(call.layout.my_island());
  const uint64_t per_slot = s.ok() ? ys.num_elements() / slots : 0;
  const uint64_t n = call.layout.num_islands();
  if (s.ok()) s = CheckSlotElements(call, "reduce_scatter operand", xs, n * per_slot);
  if (s.ok()) s = CheckSlotElements(call, "reduce_scatter result", ys, per_slot);
  if (s.ok()) {
    OpDescriptor d;
    d.kind = CollectiveKind::kReduceScatter;
    d.reduce_op = op;
    d.wire_dtype = xs.dtype;
    d.algorithm = Algorithm::kOrdered;
    d.slots = call.layout.slots();
    d.logical = call.logical;
    const Reduction r{xs.dtype, ys.dtype, static_cast<ReduceOp>(op), divisor};
    s = ForEachMySlot(call, d, [&](const SlotOp& slot_op, int i) {
      return ReduceScatter(slot_op, r, At(x, i * n * per_slot, xs.dtype),
                           At(y, i * per_slot, ys.dtype), per_slot);
    });
  }
  return ffi_core::ToFfiError(s, kReduceScatter);
}

ffi::Error AllGatherImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape) {
  ForwardToken(token, token_out);
  TensorSpec xs, ys;
  CollectiveCall call;
  Status s = Prepare(kAllGather, device, x, y, base_tag, island, device_ranks,
                     island_sizes, shape, &xs, &ys, &call);
  if (s.ok() && xs.dtype != ys.dtype) {
    s = Status(StatusCode::kInvalidArgument,
               std::string(kAllGather) + ": operand " + xs.ToString() +
                   " and result " + ys.ToString() + " differ in dtype");
  }
  // Island k's block (d_k devices' values) is padded to whole slots of
  // counts[k] elements each.
  const IslandLayout& layout = call.layout;
  std::vector<size_t> counts(layout.num_islands());
  size_t total = 0;
  if (s.ok()) {
    const uint64_t m = call.logical.num_elements();
    for (int k = 0; k < layout.num_islands(); ++k) {
      // At least one element per slot: the Python side never passes empty
      // buffers (XLA may drop such custom calls on some islands).
      counts[k] = std::max<uint64_t>(
          1, (layout.devices(k) * m + layout.slots() - 1) / layout.slots());
      total += counts[k];
    }
    s = CheckSlotElements(call, "all_gather operand", xs, counts[layout.my_island()]);
  }
  if (s.ok()) s = CheckSlotElements(call, "all_gather result", ys, total);
  if (s.ok()) {
    OpDescriptor d;
    d.kind = CollectiveKind::kAllGather;
    d.wire_dtype = xs.dtype;
    d.slots = layout.slots();
    d.logical = call.logical;
    const size_t mine = counts[layout.my_island()];
    s = ForEachMySlot(call, d, [&](const SlotOp& slot_op, int i) {
      return AllGather(slot_op, xs.dtype, At(x, i * mine, xs.dtype), counts,
                       At(y, i * total, ys.dtype));
    });
  }
  return ffi_core::ToFfiError(s, kAllGather);
}

ffi::Error BroadcastImpl(AnyBuffer token, AnyBuffer device, AnyBuffer x,
                         Result<AnyBuffer> token_out, Result<AnyBuffer> y,
                         int64_t base_tag, int64_t island,
                         Span<const int64_t> device_ranks,
                         Span<const int64_t> island_sizes,
                         Span<const int64_t> shape, int64_t root) {
  ForwardToken(token, token_out);
  TensorSpec xs, ys;
  CollectiveCall call;
  Status s = Prepare(kBroadcast, device, x, y, base_tag, island, device_ranks,
                     island_sizes, shape, &xs, &ys, &call);
  if (s.ok() && (xs != ys)) {
    s = Status(StatusCode::kInvalidArgument,
               std::string(kBroadcast) + ": operand " + xs.ToString() +
                   " and result " + ys.ToString() + " differ");
  }
  if (s.ok() && (root < 0 || root >= call.layout.num_islands())) {
    s = Status(StatusCode::kInvalidArgument,
               "broadcast root island " + std::to_string(root) + " outside " +
                   std::to_string(call.layout.num_islands()) + " islands");
  }
  const uint64_t slots = call.layout.slots_per_device(call.layout.my_island());
  const uint64_t per_slot = s.ok() ? ys.num_elements() / slots : 0;
  if (s.ok()) s = CheckSlotElements(call, "broadcast operand", xs, per_slot);
  if (s.ok()) {
    OpDescriptor d;
    d.kind = CollectiveKind::kBroadcast;
    d.wire_dtype = xs.dtype;
    d.root = root;
    d.slots = call.layout.slots();
    d.logical = call.logical;
    s = ForEachMySlot(call, d, [&](const SlotOp& slot_op, int i) {
      return Broadcast(slot_op, static_cast<int>(root), xs.dtype,
                       At(x, i * per_slot, xs.dtype),
                       At(y, i * per_slot, ys.dtype), per_slot);
    });
  }
  return ffi_core::ToFfiError(s, kBroadcast);
}

auto BindOperands() {
  return ffi::Ffi::Bind()
      .Arg<AnyBuffer>()   // token
      .Arg<AnyBuffer>()   // device index (int32 scalar)
      .Arg<AnyBuffer>()   // x
      .Ret<AnyBuffer>()   // token
      .Ret<AnyBuffer>();  // y
}

}  // namespace
}  // namespace hetjax::collectives

namespace hc = ::hetjax::collectives;

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxAllReduceCpu, hc::AllReduceImpl,
    hc::BindCollectiveAttrs(hc::BindOperands())
        .Attr<int64_t>("op")
        .Attr<double>("divisor")
        .Attr<int64_t>("algorithm"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxReduceScatterCpu, hc::ReduceScatterImpl,
    hc::BindCollectiveAttrs(hc::BindOperands())
        .Attr<int64_t>("op")
        .Attr<double>("divisor"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(HetjaxAllGatherCpu, hc::AllGatherImpl,
                              hc::BindCollectiveAttrs(hc::BindOperands()));

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    HetjaxBroadcastCpu, hc::BroadcastImpl,
    hc::BindCollectiveAttrs(hc::BindOperands()).Attr<int64_t>("root"));
