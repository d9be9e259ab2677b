// The verbs transport in builds without libibverbs: nothing to list, and a
// request for it says why it cannot be had.
#include "cc/transport/verbs_link.h"

namespace hetjax {

bool VerbsCompiledIn() { return false; }

std::vector<VerbsPort> ListVerbsPorts() { return {}; }

Status VerbsLinkSetup::Create(const VerbsLinkOptions&,
                              std::unique_ptr<VerbsLinkSetup>*) {
  return Status(StatusCode::kInvalidArgument,
                "this hetjax build has no verbs transport: libibverbs was not "
                "found when it was built (install libibverbs-dev and rebuild, "
                "or configure with -DHETJAX_VERBS=ON to make it required)");
}

}  // namespace hetjax
