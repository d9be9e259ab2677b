// Runs the shared handler body (host_collectives.h) on the channel
// collectives (channel_collective.h), as RunCollective's staging: XLA's
// buffers are the buffers, nothing is copied in or out. A GPU handler's
// context is the GPU's and its stream XLA's; a CPU handler's is the host
// device's, with no stream (collectives_cpu.cc).
#pragma once

#include <cstdint>

#include "cc/device/device.h"
#include "cc/device/host_copy.h"
#include "cc/ffi/collectives/channel_collective.h"
#include "cc/ffi/collectives/host_collectives.h"

namespace hetjax::collectives {

class OnChannels {
 public:
  OnChannels(gpu::StagingContext& context, void* stream, int32_t device_index)
      : context_(context),
        collective_(context, stream, gpu::FindSlotChannel,
                    OnHost() ? ChannelCollective::Buffers::kHost
                             : ChannelCollective::Buffers::kDevice),
        device_index_(device_index) {}

  Status CopyIn(const ffi::AnyBuffer&, const ffi::AnyBuffer& x,
                ffi::Result<ffi::AnyBuffer>& y, int32_t* device_index,
                HostBuffers* io) {
    *device_index = device_index_;
    io->x = x.untyped_data();
    io->y = y->untyped_data();
    // XLA:CPU maps a large result anew: fault it in at once, in huge pages
    // where it can, rather than 4 KiB at a time under the copies.
    if (OnHost()) device::PrepareFreshDestination(io->y, y->size_bytes());
    return collective_.Begin();
  }

  Status CopyOut(ffi::Result<ffi::AnyBuffer>&,
                 ffi::Result<ffi::AnyBuffer>& token_out) {
    Status s =
        collective_.Finish(token_out->untyped_data(), token_out->size_bytes());
    if (!s.ok() || !OnHost()) return s;
    // The host device ran every step before Finish returned, so a failure
    // recorded for the next op (a timeout, a broken channel) is this op's.
    context_.retired.Poll();
    return context_.errors.Take();
  }

  SlotAlgorithms& algorithms() { return collective_; }

 private:
  bool OnHost() const { return &context_.device == &device::HostDevice(); }

  gpu::StagingContext& context_;
  ChannelCollective collective_;
  const int32_t device_index_;
};

}  // namespace hetjax::collectives
