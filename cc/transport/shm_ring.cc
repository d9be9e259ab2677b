#include "cc/transport/shm_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "cc/transport/format.h"
#include "cc/transport/spin_policy.h"

namespace hetjax {
namespace {

constexpr uint32_t kRingMagic = 0x474e5248;  // "HRNG"
constexpr uint64_t kMinRingBytes = 64 << 10;

// Producer and consumer fields on separate cache lines: each side writes only
// its own line, so they do not bounce while both stream.
struct alignas(64) RingControl {
  uint32_t magic;
  std::atomic<uint32_t> ready;  // set last by the creator
  uint64_t capacity;
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever written
  std::atomic<uint32_t> data_seq;          // futex: bumped per publish
  std::atomic<uint32_t> reader_sleeping;
  alignas(64) std::atomic<uint64_t> head;  // bytes ever read
  std::atomic<uint32_t> space_seq;         // futex: bumped per consume
  std::atomic<uint32_t> writer_sleeping;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shm rings need address-free atomics");
constexpr size_t kDataOffset = sizeof(RingControl);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int wait_ms) {
  timespec ts{wait_ms / 1000, (wait_ms % 1000) * 1000000L};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          &ts, nullptr, 0);
}
void FutexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX,
          nullptr, nullptr, 0);
}

// Waits until ready() holds: spin, then futex sleeps on `seq` with `sleeping`
// raised so the other side knows to wake us. Gives up after wait_ms.
template <typename Ready>
bool AwaitRing(Ready ready, std::atomic<uint32_t>* seq,
               std::atomic<uint32_t>* sleeping, const std::atomic<bool>& stop,
               int wait_ms) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    for (int i = 0; i < 16; ++i) {
      if (ready()) return true;
      SpinPause();
    }
    if (std::chrono::steady_clock::now() - start > SpinBudget()) break;
  }
  auto deadline = start + std::chrono::milliseconds(wait_ms);
  while (!stop.load(std::memory_order_relaxed)) {
    uint32_t observed = seq->load();
    sleeping->store(1);
    if (ready()) {
      sleeping->store(0);
      return true;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) break;
    FutexWait(seq, observed, static_cast<int>(std::min<int64_t>(left, 10)));
    sleeping->store(0);
    if (ready()) return true;
  }
  sleeping->store(0);
  return ready();
}

// One mapped segment.
struct Segment {
  std::string name;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  bool owner = false;

  RingControl* control() const { return static_cast<RingControl*>(base); }
  uint8_t* data() const { return static_cast<uint8_t*>(base) + kDataOffset; }
  ~Segment() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
    // ENOENT once the peer has opened it; this covers a peer that never did.
    if (owner) ::shm_unlink(name.c_str());
  }
};

Status Errno(const std::string& what, const std::string& name) {
  return Status(StatusCode::kInvalidArgument,
                what + " shm segment " + name + ": " + std::strerror(errno));
}

Status CreateSegment(const std::string& name, uint64_t ring_bytes,
                     Segment* seg) {
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return Errno("cannot create", name);
  seg->name = name;
  seg->owner = true;
  seg->bytes = kDataOffset + ring_bytes;
  if (::ftruncate(fd, static_cast<off_t>(seg->bytes)) != 0) {
    ::close(fd);
    return Errno("cannot size", name);
  }
  seg->base =
      ::mmap(nullptr, seg->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (seg->base == MAP_FAILED) return Errno("cannot map", name);
  // A fresh segment is zero-filled, so the atomics start at 0.
  RingControl* c = seg->control();
  c->magic = kRingMagic;
  c->capacity = ring_bytes;
  c->ready.store(1, std::memory_order_release);
  return Status::Ok();
}

// Status::Ok with seg->base mapped, or kTimeout/kInvalidArgument.
Status OpenSegment(const std::string& name, double timeout_seconds,
                   Segment* seg) {
  auto start = std::chrono::steady_clock::now();
  seg->name = name;
  std::string last_problem = "it does not exist";
  while (true) {
    int fd = ::shm_open(name.c_str(), O_RDWR, 0600);
    if (fd >= 0) {
      struct stat st{};
      if (::fstat(fd, &st) == 0 &&
          static_cast<size_t>(st.st_size) >= kDataOffset + kMinRingBytes) {
        size_t bytes = static_cast<size_t>(st.st_size);
        void* base =
            ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        ::close(fd);
        if (base == MAP_FAILED) return Errno("cannot map", name);
        auto* c = static_cast<RingControl*>(base);
        if (c->ready.load(std::memory_order_acquire) == 1) {
          if (c->magic != kRingMagic || c->capacity + kDataOffset != bytes) {
            ::munmap(base, bytes);
            return Status(StatusCode::kInvalidArgument,
                          "shm segment " + name + " is not a hetjax ring");
          }
          seg->base = base;
          seg->bytes = bytes;
          // Both ends have it mapped now: the name is no longer needed, and
          // without it a process killed later leaves nothing in /dev/shm.
          ::shm_unlink(name.c_str());
          return Status::Ok();
        }
        ::munmap(base, bytes);
        last_problem = "it is not initialised yet";
      } else {
        ::close(fd);
        last_problem = "it is not sized yet";
      }
    } else if (errno != ENOENT) {
      return Errno("cannot open", name);
    }
    double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count();
    if (timeout_seconds > 0 && waited > timeout_seconds) {
      return Status(StatusCode::kTimeout, "peer's shm segment " + name +
                                              " did not appear within " +
                                              FormatSeconds(timeout_seconds) +
                                              " (" + last_problem + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

class ShmStream final : public ByteStream {
 public:
  ShmStream(std::unique_ptr<Segment> out, std::unique_ptr<Segment> in)
      : out_(std::move(out)), in_(std::move(in)) {
    // Publishing in slices lets the reader start on the first bytes of a
    // chunk while the writer is still copying the rest.
    slice_ = std::max<uint64_t>(16 << 10, out_->control()->capacity / 8);
  }

  Status ReadSome(void* dst, size_t max, int wait_ms, size_t* got) override {
    *got = 0;
    RingControl* c = in_->control();
    const uint64_t cap = c->capacity;
    uint64_t head = c->head.load(std::memory_order_relaxed);
    auto available = [&] {
      return c->tail.load(std::memory_order_acquire) - head;
    };
    if (available() == 0 &&
        !AwaitRing([&] { return available() > 0; }, &c->data_seq,
                   &c->reader_sleeping, stop_, wait_ms)) {
      return StopOr();
    }
    uint64_t pos = head % cap;
    size_t n =
        static_cast<size_t>(std::min<uint64_t>({available(), max, cap - pos}));
    std::memcpy(dst, in_->data() + pos, n);
    c->head.store(head + n, std::memory_order_release);
    c->space_seq.fetch_add(1);
    if (c->writer_sleeping.load()) FutexWakeAll(&c->space_seq);
    *got = n;
    return Status::Ok();
  }

  Status WriteSome(const void* src, size_t len, int wait_ms,
                   size_t* put) override {
    *put = 0;
    RingControl* c = out_->control();
    const uint64_t cap = c->capacity;
    uint64_t tail = c->tail.load(std::memory_order_relaxed);
    auto room = [&] {
      return cap - (tail - c->head.load(std::memory_order_acquire));
    };
    if (room() == 0 && !AwaitRing([&] { return room() > 0; }, &c->space_seq,
                                  &c->writer_sleeping, stop_, wait_ms)) {
      return StopOr();
    }
    uint64_t pos = tail % cap;
    size_t n = static_cast<size_t>(
        std::min<uint64_t>({room(), len, cap - pos, slice_}));
    std::memcpy(out_->data() + pos, src, n);
    c->tail.store(tail + n, std::memory_order_release);
    c->data_seq.fetch_add(1);
    if (c->reader_sleeping.load()) FutexWakeAll(&c->data_seq);
    *put = n;
    return Status::Ok();
  }

  void Shutdown() override {
    stop_.store(true);
    // Wake our own sleepers; the peer learns we left from the tcp socket.
    FutexWakeAll(&in_->control()->data_seq);
    FutexWakeAll(&out_->control()->space_seq);
  }

  std::string Describe() const override {
    return "shm " + out_->name + " / " + in_->name;
  }

 private:
  Status StopOr() {
    if (stop_.load()) {
      return Status(StatusCode::kAborted, Describe() + " was shut down");
    }
    return Status::Ok();
  }

  std::unique_ptr<Segment> out_, in_;
  uint64_t slice_;
  std::atomic<bool> stop_{false};
};

}  // namespace

Status MakeShmStream(const std::string& outbound_name,
                     const std::string& inbound_name, uint64_t ring_bytes,
                     double timeout_seconds,
                     std::unique_ptr<ByteStream>* stream) {
  if (ring_bytes < kMinRingBytes) {
    return Status(StatusCode::kInvalidArgument,
                  "shm ring of " + std::to_string(ring_bytes) +
                      " bytes is too small (minimum " +
                      std::to_string(kMinRingBytes) + ")");
  }
  if (outbound_name == inbound_name) {
    return Status(StatusCode::kInvalidArgument,
                  "shm outbound and inbound names are both " + outbound_name);
  }
  auto out = std::make_unique<Segment>();
  Status status = CreateSegment(outbound_name, ring_bytes, out.get());
  if (!status.ok()) return status;
  auto in = std::make_unique<Segment>();
  status = OpenSegment(inbound_name, timeout_seconds, in.get());
  if (!status.ok()) return status;
  *stream = std::make_unique<ShmStream>(std::move(out), std::move(in));
  return Status::Ok();
}

}  // namespace hetjax
