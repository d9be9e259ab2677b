#include "cc/ffi/collectives/channel_members.h"

#include <map>
#include <mutex>

namespace hetjax::collectives {
namespace {

std::mutex& MembersMutex() {
  static auto* mu = new std::mutex();
  return *mu;
}

std::map<int, MemberPlatform>& Members() {
  static auto* members = new std::map<int, MemberPlatform>();
  return *members;
}

}  // namespace

void SetChannelMembers(const std::vector<int>& gpu_ranks,
                       const std::vector<int>& cpu_ranks) {
  std::lock_guard<std::mutex> lock(MembersMutex());
  Members().clear();
  for (int rank : gpu_ranks) Members()[rank] = MemberPlatform::kGpu;
  for (int rank : cpu_ranks) Members()[rank] = MemberPlatform::kCpu;
}

MemberPlatform PlatformOf(int rank) {
  std::lock_guard<std::mutex> lock(MembersMutex());
  auto it = Members().find(rank);
  return it == Members().end() ? MemberPlatform::kUnknown : it->second;
}

void ClearChannelMembers() {
  std::lock_guard<std::mutex> lock(MembersMutex());
  Members().clear();
}

}  // namespace hetjax::collectives
