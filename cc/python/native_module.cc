// hetjax._native: the process-wide bridge as Python sees it
// (docs/INTERFACES.md). Every call that can block releases the GIL, so the
// control plane's threads and other Python work keep running while bytes move.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "cc/ffi/collectives/channel_choice.h"
#include "cc/ffi/collectives/channel_members.h"
#include "cc/ffi/cpu_targets.h"
#include "cc/ffi/gpu/pair_workspace.h"
#include "cc/ffi/gpu/slot_channel.h"
#include "cc/python/host_array.h"
#include "cc/python/native_tuning.h"
#include "cc/python/raise_status.h"
#include "cc/transport/bridge.h"
#include "cc/transport/verbs_gpu_registration.h"

#ifdef HETJAX_FFI_GPU_TARGETS
#include "cc/device/device.h"
#include "cc/ffi/gpu/gpu_targets.h"
#endif

namespace nb = nanobind;

namespace hetjax::python {
namespace {

Bridge* RunningBridge() {
  Bridge* bridge = Bridge::Get();
  if (bridge == nullptr) {
    RaiseIfError(Status(StatusCode::kAborted,
                        "the bridge is not running: call _native.start() "
                        "(or hetjax.init()) first"));
  }
  return bridge;
}

void Start(int rank, int world_size, double timeout_s,
           uint64_t unexpected_limit_bytes, uint64_t max_message_bytes,
           uint64_t chunk_bytes, uint64_t eager_limit_bytes,
           double heartbeat_timeout_s, const nb::dict& tuning) {
  // The layers read their tuning without a lock: set it only while nothing
  // of a bridge runs.
  if (Bridge::Get() != nullptr) {
    RaiseIfError(Status(StatusCode::kInvalidArgument,
                        "the bridge is already running in this process"));
  }
  ApplyTuning(tuning);
  BridgeOptions options;
  options.rank = rank;
  options.world_size = world_size;
  options.timeout_seconds = timeout_s;
  options.unexpected_limit_bytes = unexpected_limit_bytes;
  options.max_message_bytes = max_message_bytes;
  options.chunk_bytes = chunk_bytes;
  options.eager_limit_bytes = eager_limit_bytes;
  options.heartbeat_timeout_seconds = heartbeat_timeout_s;
  Status status;
  {
    nb::gil_scoped_release release;
    status = Bridge::Start(options);
  }
  RaiseIfError(status);
}

void Stop() {
  nb::gil_scoped_release release;
  gpu::ClearSlotChannels();
  collectives::ClearChannelMembers();
  gpu::ClearPairWorkspaces();
  Bridge::Stop();
}

// The fast path to a GPU or CPU island on this host
// (cc/ffi/gpu/slot_channel.h). local_cpu / peer_cpu: that end is a CPU island
// (host path only). A module without a GPU flavour can only be a CPU end.
void AddGpuChannel(int peer, const std::string& path,
                   const std::string& outbound_name,
                   const std::string& inbound_name, uint32_t slots,
                   uint64_t slot_bytes, bool local_cpu, bool peer_cpu) {
  gpu::SlotChannelConfig config;
  config.peer = peer;
  if (path != "host" && path != "ipc") {
    RaiseIfError(Status(StatusCode::kInvalidArgument,
                        "gpu channel path: expected host or ipc, got " + path));
  }
#ifndef HETJAX_FFI_GPU_TARGETS
  if (!local_cpu) {
    RaiseIfError(Status(StatusCode::kInvalidArgument,
                        "add_gpu_channel: this module has no GPU flavour, so "
                        "its end of a channel can only be a CPU island's"));
  }
#endif
  config.path = path == "ipc" ? gpu::SlotPath::kIpc : gpu::SlotPath::kHost;
  config.outbound_name = outbound_name;
  config.inbound_name = inbound_name;
  config.slots = slots;
  config.slot_bytes = slot_bytes;
  config.local_cpu = local_cpu;
  config.peer_cpu = peer_cpu;
  RaiseIfError(gpu::AddSlotChannel(config));
}

void AddTcpPeer(int peer, const std::vector<int>& fds) {
  Bridge* bridge = RunningBridge();
  Status status;
  {
    nb::gil_scoped_release release;
    status = bridge->AddTcpPeer(peer, fds);
  }
  RaiseIfError(status);
}

void AddShmPeer(int peer, const std::string& outbound_name,
                const std::string& inbound_name, uint64_t ring_bytes) {
  Bridge* bridge = RunningBridge();
  Status status;
  {
    nb::gil_scoped_release release;
    status = bridge->AddShmPeer(peer, outbound_name, inbound_name, ring_bytes);
  }
  RaiseIfError(status);
}

// This process's GPU memory for the verbs transport (verbs_gpu_registration.h);
// empty hooks without a GPU.
GpuMemoryHooks GpuHooks() {
  GpuMemoryHooks hooks;
#ifdef HETJAX_FFI_GPU_TARGETS
  if (device::Device* gpu = device::GpuDevice()) {
    hooks.alloc = [gpu](size_t bytes, void** ptr) {
      return gpu->AllocDevice(bytes, ptr);
    };
    hooks.free = [gpu](void* ptr) { (void)gpu->FreeDevice(ptr); };
    hooks.export_dmabuf = [gpu](void* ptr, size_t bytes, int* fd) {
      return gpu->ExportDmabuf(ptr, bytes, fd);
    };
    hooks.copy_to_host = [gpu](void* dst, const void* src, size_t bytes) {
      Status copied = gpu->CopyToHostAsync(dst, src, bytes, nullptr);
      return copied.ok() ? gpu->SynchronizeStream(nullptr) : copied;
    };
  }
#endif
  return hooks;
}

// verbs (cc/transport/verbs_link.h): queue pairs in two steps, since each
// side needs the other's endpoint, which the control plane carries.
// gpu_ring: inbound rings in this process's GPU memory, registered by the
// preferred path (docs/rdma.md); host memory where there is no GPU.
std::string PrepareVerbsPeer(int peer, const std::vector<std::string>& devices,
                             int gid_index, uint64_t ring_bytes,
                             bool gpu_ring) {
  Bridge* bridge = RunningBridge();
  VerbsLinkOptions options;
  options.devices = devices;
  options.gid_index = gid_index;
  options.ring_bytes = ring_bytes;
  if (gpu_ring) {
    options.inbound_memory = GpuHooks();
    // Opt-in, and the path depends on the NIC and driver: say which it took.
    options.on_ring_registered = [peer](const std::string& qp,
                                        const GpuRegistrationReport& report) {
      std::string line = "hetjax: " + qp + " to rank " + std::to_string(peer) +
                         ": inbound ring registered by " + report.path;
      for (const auto& [path, why] : report.rejected) {
        line += "; not " + path + ": " + why;
      }
      std::fprintf(stderr, "%s\n", line.c_str());
    };
  }
  std::string local;
  Status status;
  {
    nb::gil_scoped_release release;
    status = bridge->PrepareVerbsPeer(peer, options, &local);
  }
  RaiseIfError(status);
  return local;
}

void ConnectVerbsPeer(int peer, const std::string& remote) {
  Bridge* bridge = RunningBridge();
  Status status;
  {
    nb::gil_scoped_release release;
    status = bridge->ConnectVerbsPeer(peer, remote);
  }
  RaiseIfError(status);
}

// Which way this process's GPU memory reaches `device_name` (docs/rdma.md):
// {"path": "dmabuf" | "peer_memory" | "host_staging", "rejected": {path: why}}.
nb::dict RdmaGpuRegistration(const std::string& device_name) {
  GpuMemoryHooks hooks = GpuHooks();
  GpuRegistrationReport report;
  {
    nb::gil_scoped_release release;
    report = GpuRegistrationPath(device_name, hooks);
  }
  nb::dict rejected;
  for (const auto& [path, why] : report.rejected) rejected[path.c_str()] = why;
  nb::dict out;
  out["path"] = report.path;
  out["rejected"] = rejected;
  return out;
}

nb::list VerbsPorts() {
  nb::list out;
  for (const VerbsPort& p : ListVerbsPorts()) {
    nb::dict port;
    port["device"] = p.device;
    port["port"] = p.port;
    port["active"] = p.active;
    port["state"] = p.state;
    port["link_layer"] = p.link_layer;
    port["active_mtu"] = p.active_mtu;
    port["lid"] = p.lid;
    nb::list gids;
    for (const VerbsGid& g : p.gids) {
      nb::dict gid;
      gid["index"] = g.index;
      gid["gid"] = g.gid;
      gid["type"] = g.type;
      gids.append(gid);
    }
    port["gids"] = gids;
    out.append(port);
  }
  return out;
}

void SendArray(int peer, uint64_t tag, nb::handle array) {
  HostArray view = ViewHostArray(array, /*writable=*/false, "send_array");
  Bridge* bridge = RunningBridge();
  Status status;
  {
    // `array` stays referenced by the caller's frame while we block.
    nb::gil_scoped_release release;
    status = bridge->Send(peer, tag, view.spec, view.data);
  }
  RaiseIfError(status);
}

void RecvArray(int peer, uint64_t tag, nb::handle out) {
  HostArray view = ViewHostArray(out, /*writable=*/true, "recv_array");
  Bridge* bridge = RunningBridge();
  Status status;
  {
    nb::gil_scoped_release release;
    status = bridge->Recv(peer, tag, view.spec, view.data);
  }
  RaiseIfError(status);
}

nb::dict GetStats() {
  Stats stats = RunningBridge()->GetStats();
  nb::dict out;
  out["messages_sent"] = stats.messages_sent;
  out["messages_received"] = stats.messages_received;
  out["bytes_sent"] = stats.bytes_sent;
  out["bytes_received"] = stats.bytes_received;
  out["unexpected_bytes_buffered"] = stats.unexpected_bytes_buffered;
  return out;
}

nb::dict Capsules(const std::vector<std::pair<const char*, void*>>& targets) {
  nb::dict out;
  for (const auto& [name, handler] : targets) out[name] = nb::capsule(handler);
  return out;
}

nb::dict FfiTargets() {
  nb::dict platforms;
  platforms["cpu"] = Capsules(cpu::CpuFfiTargets());
#ifdef HETJAX_FFI_GPU_TARGETS
  // XLA's platform names for the GPU plugins.
  const char* gpu_platform =
      std::string(HETJAX_GPU_FLAVOUR_NAME) == "rocm" ? "ROCM" : "CUDA";
  platforms[gpu_platform] = Capsules(gpu::GpuFfiTargets());
#endif
  return platforms;
}

nb::dict CollectivePaths() {
  const collectives::CollectivePathCounts counts =
      collectives::CollectivePaths();
  nb::dict out;
  out["channels"] = counts.channels;
  out["staged"] = counts.staged;
  out["host"] = counts.host;
  return out;
}

}  // namespace
}  // namespace hetjax::python

NB_MODULE(_native, m) {
  using namespace hetjax::python;
  const hetjax::BridgeOptions defaults;
  m.doc() = "hetjax's native bridge: transports, FFI handler capsules.";
  m.def(
      "flavour", [] { return std::string(HETJAX_GPU_FLAVOUR_NAME); },
      "GPU flavour this module was built for: none, cuda or rocm.");
  m.def(
      "requested_flavour",
      [] { return std::string(HETJAX_GPU_REQUESTED_NAME); },
      "What the build asked for (auto, none, cuda, rocm); auto picks cuda "
      "where nvcc exists, else rocm where hipcc exists, else none.");
  m.def("start", &Start, nb::arg("rank"), nb::arg("world_size"),
        nb::arg("timeout_s") = defaults.timeout_seconds,
        nb::arg("unexpected_limit_bytes") = defaults.unexpected_limit_bytes,
        nb::arg("max_message_bytes") = defaults.max_message_bytes,
        nb::arg("chunk_bytes") = defaults.chunk_bytes,
        nb::arg("eager_limit_bytes") = defaults.eager_limit_bytes,
        nb::arg("heartbeat_timeout_s") = defaults.heartbeat_timeout_seconds,
        nb::arg("tuning") = nb::dict(),
        "Starts the process-wide bridge and its progress engine. tuning: "
        "{knob: value} (hetjax.bridge.BridgeTuning.native()); knobs not "
        "given take their defaults.");
  m.def("tuning", &TuningInForce,
        "{knob: value} of the tuning in force: what the last start set, "
        "the defaults before any.");
  m.def("default_tuning", &DefaultTuning,
        "{knob: value} that hold where a start does not set them.");
  m.def("stop", &Stop,
        "Stops the bridge, closing every transport. Idempotent.");
  m.def("is_running", [] { return hetjax::Bridge::Get() != nullptr; });
  m.def("add_tcp_peer", &AddTcpPeer, nb::arg("peer"), nb::arg("fds"),
        "Attaches connected, authenticated sockets (takes ownership).");
  m.def("add_shm_peer", &AddShmPeer, nb::arg("peer"), nb::arg("outbound_name"),
        nb::arg("inbound_name"), nb::arg("ring_bytes"));
  m.def("add_gpu_channel", &AddGpuChannel, nb::arg("peer"), nb::arg("path"),
        nb::arg("outbound_name"), nb::arg("inbound_name"), nb::arg("slots"),
        nb::arg("slot_bytes"), nb::arg("local_cpu") = false,
        nb::arg("peer_cpu") = false,
        "Slot channel to a GPU or CPU island on this host: path host or ipc; "
        "local_cpu / peer_cpu: that end is a CPU island (host path only).");
  m.def("set_channel_members", &hetjax::collectives::SetChannelMembers,
        nb::arg("gpu_ranks"), nb::arg("cpu_ranks"),
        "The bridge ranks (this one included) that are CUDA/ROCm islands' "
        "processes and CPU islands' processes: a collective with at least "
        "one GPU member and every member in these lists runs the channel "
        "collectives.");
  m.def("verbs_compiled_in", &hetjax::VerbsCompiledIn,
        "Whether this build carries the verbs (RDMA) transport.");
  m.def("verbs_ports", &VerbsPorts,
        "RDMA ports this process can open: device, port, state, GIDs.");
  m.def("rdma_gpu_registration", &RdmaGpuRegistration,
        nb::arg("device_name") = "",
        "How GPU memory reaches the RDMA device: dmabuf, peer_memory or "
        "host_staging, with why each better path was rejected.");
  m.def(
      "prepare_verbs_peer", &PrepareVerbsPeer, nb::arg("peer"),
      nb::arg("devices"), nb::arg("gid_index") = -1,
      nb::arg("ring_bytes") = hetjax::VerbsLinkOptions().ring_bytes,
      nb::arg("gpu_ring") = false,
      "Creates queue pairs to `peer` (one per device); returns our endpoints.");
  m.def("connect_verbs_peer", &ConnectVerbsPeer, nb::arg("peer"),
        nb::arg("remote"),
        "Connects the prepared queue pairs to the peer's endpoints.");
  m.def("send_array", &SendArray, nb::arg("peer"), nb::arg("tag"),
        nb::arg("array"), "Blocking send of a C-contiguous numpy array.");
  m.def("recv_array", &RecvArray, nb::arg("peer"), nb::arg("tag"),
        nb::arg("out"),
        "Blocking receive into `out`, whose dtype and shape are expected.");
  m.def("stats", &GetStats);
  m.def("collective_paths", &CollectivePaths,
        "How many collective ops this process ran over the channels (on a "
        "GPU only enqueued), staged through host memory by a GPU handler "
        "(host thread blocked), and on the host algorithms by a CPU "
        "handler: {'channels': n, 'staged': n, 'host': n}.");
  m.def("ffi_targets", &FfiTargets,
        "{platform: {target name: capsule}} for jax.ffi.register_ffi_target.");
}
