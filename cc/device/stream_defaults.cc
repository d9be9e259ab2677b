// What a device without a second stream or device kernels answers (test
// doubles, and the host device for Combine): a clear "unsupported", so a
// caller falls back instead of running half an operation.
#include <string>

#include "cc/device/device.h"

namespace hetjax::device {
namespace {

Status Unsupported(const Device& device, const char* what) {
  return Status(StatusCode::kInvalidArgument,
                std::string("unsupported: the ") + device.name() +
                    " device layer has no " + what);
}

}  // namespace

Status Device::CreateStream(Stream* stream) {
  *stream = nullptr;
  return Unsupported(*this, "CreateStream");
}

Status Device::StreamWaitEvent(Stream, Event) {
  return Unsupported(*this, "StreamWaitEvent");
}

Status Device::CombineAsync(const Combine&, Stream) {
  return Unsupported(*this, "combine kernel");
}

Status Device::PairExchangeAsync(const PairExchange&, Stream) {
  return Unsupported(*this, "pair exchange kernel");
}

Status Device::ConcurrentPairMoves(int* count) {
  *count = 1;
  return Status::Ok();
}

}  // namespace hetjax::device
