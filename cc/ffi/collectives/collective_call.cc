#include "cc/ffi/collectives/collective_call.h"

#include <string>

#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {

Status DecodeCall(const CallAttrs& attrs, int32_t device, DType dtype,
                  CollectiveCall* call) {
  const auto& [base_tag, island, device_ranks, island_sizes, shape, gpu_path] =
      attrs;
  (void)gpu_path;  // the GPU handlers' choice, made before decoding
  Status status = ffi_core::RequireBridge(&call->bridge);
  if (!status.ok()) return status;
  status = CheckBaseTag(static_cast<uint64_t>(base_tag));
  if (!status.ok()) return status;
  call->base = static_cast<uint64_t>(base_tag);
  status = IslandLayout::Parse(device_ranks.begin(), device_ranks.size(),
                               island_sizes.begin(), island_sizes.size(),
                               island, device, &call->layout);
  if (!status.ok()) return status;
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return Status(StatusCode::kInvalidArgument,
                  "rank " + std::to_string(shape.size()) + " exceeds " +
                      std::to_string(kMaxRank));
  }
  call->logical = TensorSpec{};
  call->logical.dtype = dtype;
  call->logical.rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) call->logical.dims[i] = shape[i];
  return Status::Ok();
}

Status ForEachMySlot(const CollectiveCall& call, const OpDescriptor& descriptor,
                     SlotAlgorithms& algorithms,
                     const std::function<Status(const SlotOp&, int)>& body) {
  const IslandLayout& layout = call.layout;
  for (int i = 0; i < layout.slots_per_device(layout.my_island()); ++i) {
    const int slot = layout.first_slot() + i;
    SlotOp op{call.bridge, layout.GroupOf(slot), call.base, slot};
    Status status;
    if (auto late = algorithms.LateAgreement(op)) {
      PostAgreement(call.bridge, op.group, call.base, slot, descriptor,
                    std::move(late));
    } else {
      status = AgreeOnOp(call.bridge, op.group, call.base, slot, descriptor);
    }
    if (status.ok()) status = body(op, i);
    if (!status.ok()) return status;
  }
  return Status::Ok();
}

Status CheckSlotElements(const CollectiveCall& call, const char* what,
                         const TensorSpec& buffer, uint64_t per_slot) {
  const uint64_t slots = call.layout.slots_per_device(call.layout.my_island());
  if (buffer.num_elements() == slots * per_slot) return Status::Ok();
  return Status(StatusCode::kInvalidArgument,
                std::string(what) + " is " + buffer.ToString() + ", expected " +
                    std::to_string(slots) + " slots of " +
                    std::to_string(per_slot) + " elements for " +
                    call.logical.ToString() + " on " + call.layout.ToString());
}

}  // namespace hetjax::collectives
