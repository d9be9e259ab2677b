#include "cc/transport/verbs_link.h"

#include "cc/transport/verbs_device.h"
#include "cc/transport/verbs_endpoint.h"
#include "cc/transport/verbs_stream.h"

namespace hetjax {
namespace {

class VerbsLinkSetupImpl final : public VerbsLinkSetup {
 public:
  Status Init(const VerbsLinkOptions& options) {
    if (options.devices.empty()) {
      return Status(StatusCode::kInvalidArgument,
                    "verbs: no RDMA device given");
    }
    verbs::ChannelOptions channel_options;
    channel_options.ring_bytes = options.ring_bytes;
    channel_options.max_write_bytes = options.max_write_bytes;
    channel_options.max_writes_in_flight = options.max_writes_in_flight;
    channel_options.inbound_memory = options.inbound_memory;
    std::vector<verbs::Endpoint> endpoints;
    for (const std::string& name : options.devices) {
      std::shared_ptr<verbs::Device> device;
      Status status = verbs::Device::Open(name, options.gid_index, &device);
      if (!status.ok()) return status;
      std::unique_ptr<verbs::Channel> channel;
      status = verbs::Channel::Create(device, channel_options, &channel);
      if (!status.ok()) return status;
      if (options.on_ring_registered) {
        options.on_ring_registered(channel->Describe(),
                                   channel->ring_registration());
      }
      endpoints.push_back(channel->local());
      channels_.push_back(std::move(channel));
    }
    local_ = verbs::EncodeEndpoints(endpoints);
    return Status::Ok();
  }

  const std::string& local_endpoints() const override { return local_; }

  Status Connect(const std::string& remote_endpoints,
                 std::vector<std::unique_ptr<ByteStream>>* streams) override {
    std::vector<verbs::Endpoint> remote;
    Status status = verbs::DecodeEndpoints(remote_endpoints, &remote);
    if (!status.ok()) return status;
    if (remote.size() != channels_.size()) {
      return Status(StatusCode::kInvalidArgument,
                    "verbs: we have " + std::to_string(channels_.size()) +
                        " queue pair(s) for this peer, it has " +
                        std::to_string(remote.size()) +
                        " (HETJAX_RDMA_DEVICES must give both the same count)");
    }
    for (size_t i = 0; i < channels_.size(); ++i) {
      status = channels_[i]->Connect(remote[i]);
      if (!status.ok()) return status;
    }
    for (auto& channel : channels_) streams->push_back(std::move(channel));
    channels_.clear();
    return Status::Ok();
  }

 private:
  std::vector<std::unique_ptr<verbs::Channel>> channels_;
  std::string local_;
};

}  // namespace

bool VerbsCompiledIn() { return true; }

std::vector<VerbsPort> ListVerbsPorts() {
  std::vector<VerbsPort> out;
  for (const verbs::PortInfo& p : verbs::ListPorts()) {
    VerbsPort port{p.device,     p.port,       p.active, p.state,
                   p.link_layer, p.active_mtu, p.lid,    {}};
    for (const verbs::GidEntry& g : p.gids) {
      port.gids.push_back({g.index, g.gid, g.type});
    }
    out.push_back(std::move(port));
  }
  return out;
}

Status VerbsLinkSetup::Create(const VerbsLinkOptions& options,
                              std::unique_ptr<VerbsLinkSetup>* setup) {
  auto made = std::make_unique<VerbsLinkSetupImpl>();
  Status status = made->Init(options);
  if (!status.ok()) return status;
  *setup = std::move(made);
  return Status::Ok();
}

}  // namespace hetjax
