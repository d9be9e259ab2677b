#include "cc/ffi/collectives/collective_tuning.h"

namespace hetjax::collectives {
namespace {

CollectiveTuning& Current() {
  static CollectiveTuning* tuning = new CollectiveTuning();
  return *tuning;
}

}  // namespace

void SetCollectiveTuning(const CollectiveTuning& tuning) { Current() = tuning; }

const CollectiveTuning& GetCollectiveTuning() { return Current(); }

}  // namespace hetjax::collectives
