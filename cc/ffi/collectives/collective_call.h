// What every collective handler does before and around its algorithm,
// whatever the platform: decode the layout attributes and this device's
// index, then for each slot the device owns agree on the op with that slot's
// group and run the algorithm on the slot's part of the buffers.
//
// Attributes shared by every collective target (docs/collectives.md):
//   base_tag: int64      op's tag base (bit 62, group id, sequence number)
//   island: int64        this process's island index in the group
//   device_ranks: int64[] bridge rank holding each device, island by island
//   island_sizes: int64[] devices per island
//   shape: int64[]       the caller's per-device shape (for the agreement)
//   gpu_path: int64      0: the channel collectives where the group
//                        takes them (channel_choice.h), 1: never (GPU
//                        handlers stage through host memory, CPU handlers
//                        run the host algorithms); HETJAX_GPU_COLLECTIVES
// Operands (token: uint8[], device: int32[], x) and results (token, y).
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "cc/ffi/collectives/algorithms.h"
#include "cc/ffi/collectives/group.h"
#include "cc/ffi/collectives/op_descriptor.h"
#include "xla/ffi/api/ffi.h"

namespace hetjax::collectives {

namespace ffi = ::xla::ffi;

// The shared attributes as a handler receives them.
struct CallAttrs {
  int64_t base_tag;
  int64_t island;
  ffi::Span<const int64_t> device_ranks;
  ffi::Span<const int64_t> island_sizes;
  ffi::Span<const int64_t> shape;
  int64_t gpu_path;
};

// CallAttrs that outlive the handler call (its spans point into XLA's
// attribute storage): for a started op that a host worker decodes later.
struct OwnedCallAttrs {
  explicit OwnedCallAttrs(const CallAttrs& a)
      : base_tag(a.base_tag),
        island(a.island),
        device_ranks(a.device_ranks.begin(), a.device_ranks.end()),
        island_sizes(a.island_sizes.begin(), a.island_sizes.end()),
        shape(a.shape.begin(), a.shape.end()),
        gpu_path(a.gpu_path) {}
  CallAttrs view() const {
    return {base_tag, island, device_ranks, island_sizes, shape, gpu_path};
  }
  int64_t base_tag, island;
  std::vector<int64_t> device_ranks, island_sizes, shape;
  int64_t gpu_path;
};

// Values of the gpu_path attribute.
enum class GpuPathChoice : int64_t { kChannels = 0, kStaged = 1 };

struct CollectiveCall {
  Bridge* bridge = nullptr;
  IslandLayout layout;
  uint64_t base = 0;
  TensorSpec logical;  // dtype of the result, the caller's per-device shape
};

// `device`: this device's index in its island (the index operand);
// `dtype`: the result's.
Status DecodeCall(const CallAttrs& attrs, int32_t device, DType dtype,
                  CollectiveCall* call);

// Runs `body(op, i)` for the i-th slot this device owns, in slot order, each
// after AgreeOnOp with the slot's group, or while the agreement is under way
// where `algorithms` takes it late (SlotAlgorithms::LateAgreement).
Status ForEachMySlot(const CollectiveCall& call, const OpDescriptor& descriptor,
                     SlotAlgorithms& algorithms,
                     const std::function<Status(const SlotOp&, int)>& body);

// `x` must hold `per_slot` elements for each slot this device owns.
Status CheckSlotElements(const CollectiveCall& call, const char* what,
                         const TensorSpec& buffer, uint64_t per_slot);

// The operands (token, device index: int32 scalar, x) and results (token,
// y), after whatever context a platform binds first.
template <typename Binding>
auto BindCollectiveOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}
inline auto BindCollectiveOperands() {
  return BindCollectiveOperands(ffi::Ffi::Bind());
}

// A start's operands are the collective's; its results (token, kept, y):
// `kept` is the operand's buffer, aliased, so that it outlives the call.
template <typename Binding>
auto BindStartOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

// A done's operands (token, device index, kept, y) and results (token, y
// aliased): holding kept and y until here keeps XLA from reusing them.
template <typename Binding>
auto BindDoneOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Arg<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<ffi::AnyBuffer>();
}

// The shared attribute list, appended to a binding.
template <typename Binding>
auto BindCollectiveAttrs(Binding binding) {
  return std::move(binding)
      .template Attr<int64_t>("base_tag")
      .template Attr<int64_t>("island")
      .template Attr<ffi::Span<const int64_t>>("device_ranks")
      .template Attr<ffi::Span<const int64_t>>("island_sizes")
      .template Attr<ffi::Span<const int64_t>>("shape")
      .template Attr<int64_t>("gpu_path");
}

}  // namespace hetjax::collectives
