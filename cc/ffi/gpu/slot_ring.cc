#include "cc/ffi/gpu/slot_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace hetjax::gpu {
namespace {

constexpr uint32_t kMagic = 0x534c4f54;  // "SLOT"
constexpr size_t kFlagStride = 128;  // a GPU L2 line each: no flag shares one
constexpr size_t kPage = 4096;

struct Header {
  uint32_t magic;
  uint32_t slots;
  uint64_t slot_bytes;
  uint32_t host_data;
  uint32_t reserved[11];
};
static_assert(sizeof(Header) == 64);

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

size_t DataOffset(uint32_t slots) {
  return RoundUp(sizeof(Header) + 2 * size_t{slots} * kFlagStride, kPage);
}

Status Errno(const std::string& what, const std::string& name) {
  return Status(StatusCode::kInternal,
                what + " of slot ring " + name + ": " + std::strerror(errno));
}

}  // namespace

Status SlotRing::Create(const std::string& name, const Shape& shape,
                        std::unique_ptr<SlotRing>* out) {
  if (shape.slots == 0 || shape.slot_bytes == 0) {
    return Status(StatusCode::kInvalidArgument,
                  "slot ring " + name +
                      ": needs at least one slot of at "
                      "least one byte, got " +
                      std::to_string(shape.slots) + " x " +
                      std::to_string(shape.slot_bytes));
  }
  std::unique_ptr<SlotRing> ring(new SlotRing());
  ring->name_ = name;
  ring->creator_ = true;
  ring->shape_ = shape;
  ring->data_offset_ = DataOffset(shape.slots);
  ring->bytes_ = ring->data_offset_ +
                 (shape.host_data ? shape.slots * shape.slot_bytes : 0);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open(create)", name);
  if (ftruncate(fd, static_cast<off_t>(ring->bytes_)) != 0) {
    Status status = Errno("ftruncate to " + std::to_string(ring->bytes_) +
                              " bytes (is /dev/shm large enough?)",
                          name);
    close(fd);
    shm_unlink(name.c_str());
    return status;
  }
  void* base =
      mmap(nullptr, ring->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    Status status = Errno("mmap", name);
    shm_unlink(name.c_str());
    return status;
  }
  ring->base_ = static_cast<uint8_t*>(base);
  // ftruncate zeroed every flag; the header goes last, magic after the rest.
  auto* header = reinterpret_cast<Header*>(ring->base_);
  header->slots = shape.slots;
  header->slot_bytes = shape.slot_bytes;
  header->host_data = shape.host_data ? 1 : 0;
  __atomic_store_n(&header->magic, kMagic, __ATOMIC_RELEASE);
  *out = std::move(ring);
  return Status::Ok();
}

Status SlotRing::Open(const std::string& name, std::unique_ptr<SlotRing>* out) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return Errno("shm_open(open)", name);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    Status status = Errno("fstat", name);
    close(fd);
    return status;
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(Header)) {
    close(fd);
    return Status(StatusCode::kInternal, "slot ring " + name + " is " +
                                             std::to_string(bytes) +
                                             " bytes, smaller than its header");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return Errno("mmap", name);
  shm_unlink(name.c_str());  // both ends have it now

  std::unique_ptr<SlotRing> ring(new SlotRing());
  ring->name_ = name;
  ring->base_ = static_cast<uint8_t*>(base);
  ring->bytes_ = bytes;
  const auto* header = reinterpret_cast<const Header*>(ring->base_);
  const uint32_t magic = __atomic_load_n(&header->magic, __ATOMIC_ACQUIRE);
  ring->shape_ = {header->slots, header->slot_bytes, header->host_data != 0};
  ring->data_offset_ = DataOffset(header->slots);
  const size_t want =
      ring->data_offset_ + (ring->shape_.host_data
                                ? ring->shape_.slots * ring->shape_.slot_bytes
                                : 0);
  if (magic != kMagic || ring->shape_.slots == 0 || want != bytes) {
    return Status(StatusCode::kInternal,
                  "slot ring " + name + ": expected magic " +
                      std::to_string(kMagic) + " and " + std::to_string(want) +
                      " bytes, found magic " + std::to_string(magic) + " and " +
                      std::to_string(bytes) + " bytes");
  }
  *out = std::move(ring);
  return Status::Ok();
}

SlotRing::~SlotRing() {
  if (registered_with_ != nullptr)
    (void)registered_with_->UnregisterHost(base_);
  if (base_ != nullptr) munmap(base_, bytes_);
  if (creator_) shm_unlink(name_.c_str());  // ENOENT once the peer opened it
}

Status SlotRing::Register(device::Device& device) {
  if (registered_with_ == &device) return Status::Ok();
  void* device_base = nullptr;
  Status status = device.RegisterHost(base_, bytes_, &device_base);
  if (!status.ok()) return status;
  registered_with_ = &device;
  device_base_ = static_cast<uint8_t*>(device_base);
  return Status::Ok();
}

size_t SlotRing::FlagOffset(bool freed, uint32_t slot) const {
  return sizeof(Header) +
         ((freed ? shape_.slots : 0) + size_t{slot}) * kFlagStride;
}

device::WaitFlag* SlotRing::filled_host(uint32_t slot) const {
  return reinterpret_cast<device::WaitFlag*>(base_ + FlagOffset(false, slot));
}
device::WaitFlag* SlotRing::freed_host(uint32_t slot) const {
  return reinterpret_cast<device::WaitFlag*>(base_ + FlagOffset(true, slot));
}
uint8_t* SlotRing::data_host(uint32_t slot) const {
  return base_ + data_offset_ + size_t{slot} * shape_.slot_bytes;
}
device::WaitFlag* SlotRing::filled_device(uint32_t slot) const {
  return reinterpret_cast<device::WaitFlag*>(device_base_ +
                                             FlagOffset(false, slot));
}
device::WaitFlag* SlotRing::freed_device(uint32_t slot) const {
  return reinterpret_cast<device::WaitFlag*>(device_base_ +
                                             FlagOffset(true, slot));
}
uint8_t* SlotRing::data_device(uint32_t slot) const {
  return device_base_ + data_offset_ + size_t{slot} * shape_.slot_bytes;
}

void SlotRing::AbortAll() {
  for (uint32_t s = 0; s < shape_.slots; ++s) {
    device::AbortFlag(filled_host(s));
    device::AbortFlag(freed_host(s));
  }
}

}  // namespace hetjax::gpu
