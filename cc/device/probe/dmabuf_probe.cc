// Can this machine's GPU export memory as dma-buf, and which way would GPU
// memory reach an RDMA NIC here? Prints one JSON object:
//   {"export_ok", "fd", "error", "registration_path", "rejected"}
// Usage: hetjax_dmabuf_probe [rdma_device]. Without a NIC the export step
// alone is informative (registration_path is then host_staging).
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cc/device/device.h"
#include "cc/transport/verbs_gpu_registration.h"

namespace {

std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += (c == '\n') ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  using hetjax::Status;
  hetjax::device::Device* gpu = hetjax::device::GpuDevice();
  if (gpu == nullptr) {
    std::printf(
        "{\"export_ok\": false, \"fd\": -1, \"error\": "
        "\"no GPU in this build\"}\n");
    return 1;
  }
  constexpr size_t kBytes = size_t{2} << 20;
  void* memory = nullptr;
  int fd = -1;
  Status status = gpu->AllocDevice(kBytes, &memory);
  if (status.ok()) {
    status = gpu->ExportDmabuf(memory, kBytes, &fd);
    (void)gpu->FreeDevice(memory);
  }
  const int exported_fd = fd;
  if (fd >= 0) close(fd);

  hetjax::GpuMemoryHooks hooks;
  hooks.alloc = [gpu](size_t bytes, void** ptr) {
    return gpu->AllocDevice(bytes, ptr);
  };
  hooks.free = [gpu](void* ptr) { (void)gpu->FreeDevice(ptr); };
  hooks.export_dmabuf = [gpu](void* ptr, size_t bytes, int* out) {
    return gpu->ExportDmabuf(ptr, bytes, out);
  };
  hetjax::GpuRegistrationReport report =
      hetjax::GpuRegistrationPath(argc > 1 ? argv[1] : "", hooks);

  std::string rejected = "{";
  for (const auto& [path, why] : report.rejected) {
    if (rejected.size() > 1) rejected += ", ";
    rejected += Quoted(path) + ": " + Quoted(why);
  }
  rejected += "}";
  std::printf(
      "{\"device\": %s, \"export_ok\": %s, \"fd\": %d, \"error\": %s, "
      "\"registration_path\": %s, \"rejected\": %s}\n",
      Quoted(gpu->name()).c_str(), status.ok() ? "true" : "false", exported_fd,
      Quoted(status.message()).c_str(), Quoted(report.path).c_str(),
      rejected.c_str());
  return status.ok() ? 0 : 2;
}
