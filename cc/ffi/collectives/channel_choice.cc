#include "cc/ffi/collectives/channel_choice.h"

#include <atomic>
#include <set>

#include "cc/ffi/collectives/channel_members.h"
#include "cc/ffi/collectives/device_combine.h"
#include "cc/ffi/handler_core.h"

namespace hetjax::collectives {
namespace {

std::atomic<uint64_t> ops_on_channels{0};
std::atomic<uint64_t> ops_staged{0};
std::atomic<uint64_t> ops_on_host{0};

bool ChannelsReach(const CallAttrs& attrs, bool reduces, DType dtype,
                   int32_t* device_index) {
  if (attrs.gpu_path != static_cast<int64_t>(GpuPathChoice::kChannels)) {
    return false;
  }
  Bridge* bridge = nullptr;
  if (!ffi_core::RequireBridge(&bridge).ok()) return false;
  if (reduces && !DeviceReducible(dtype)) return false;
  // A process holding several devices would run one handler per device at
  // once, interleaving their messages on the channels it shares.
  std::set<int64_t> seen;
  bool any_gpu = false;
  for (int64_t rank : attrs.device_ranks) {
    if (!seen.insert(rank).second) return false;
    const MemberPlatform platform = PlatformOf(static_cast<int>(rank));
    if (platform == MemberPlatform::kUnknown) return false;
    any_gpu = any_gpu || platform == MemberPlatform::kGpu;
  }
  // Between CPU islands alone the host ring is the channel path's equal
  // without its device-shaped detours.
  if (!any_gpu) return false;
  if (attrs.island < 0 ||
      attrs.island >= static_cast<int64_t>(attrs.island_sizes.size())) {
    return false;  // the other path reports the bad layout
  }
  const int64_t me = bridge->options().rank;
  size_t at = 0;
  for (int64_t k = 0; k < attrs.island; ++k) at += attrs.island_sizes[k];
  for (int64_t j = 0; j < attrs.island_sizes[attrs.island]; ++j) {
    if (at + j < attrs.device_ranks.size() &&
        attrs.device_ranks[at + j] == me) {
      *device_index = static_cast<int32_t>(j);
      return true;
    }
  }
  return false;
}

}  // namespace

bool ChooseChannels(const CallAttrs& attrs, bool reduces,
                    const ffi::AnyBuffer& x, bool on_gpu,
                    int32_t* device_index) {
  const bool fits = ChannelsReach(
      attrs, reduces, ffi_core::ToWireDType(x.element_type()), device_index);
  std::atomic<uint64_t>& count =
      fits ? ops_on_channels : (on_gpu ? ops_staged : ops_on_host);
  count.fetch_add(1, std::memory_order_relaxed);
  return fits;
}

CollectivePathCounts CollectivePaths() {
  return {ops_on_channels.load(std::memory_order_relaxed),
          ops_staged.load(std::memory_order_relaxed),
          ops_on_host.load(std::memory_order_relaxed)};
}

}  // namespace hetjax::collectives
