#include "cc/device/host_copy.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "cc/device/device_tuning.h"
#include "cc/transport/spin_policy.h"

namespace hetjax::device {
namespace {

// Below this a piece is copied faster than another thread wakes up for it.
constexpr size_t kMinPieceBytes = size_t{512} << 10;
constexpr size_t kPieceAlign = 4096;
constexpr size_t kHugePage = size_t{2} << 20;
// Pieces at least this large go through StreamCopy when HostCopyStreaming().
constexpr size_t kMinStreamBytes = size_t{256} << 10;

struct Job {
  uint8_t* dst = nullptr;
  const uint8_t* src = nullptr;
  size_t bytes = 0;
  size_t piece = 0;
  // Pieces end on multiples of this in the destination's address space (1:
  // anywhere). 2 MiB for large copies: a fresh destination advised for huge
  // pages (AdviseFreshDestination) then has each huge page faulted in and
  // zeroed by one thread, not by two of them waiting on each other.
  size_t align = 1;
  size_t pieces = 0;
  // Set: a ParallelFor's body runs on each piece's [begin, end) instead of
  // a copy (dst is then null and align 1).
  const std::function<void(size_t, size_t)>* body = nullptr;
  std::atomic<size_t> next{0};  // pieces claimed
  std::atomic<size_t> done{0};  // pieces copied

  // Where piece i starts (i == pieces: the end).
  size_t Boundary(size_t i) const {
    if (i == 0) return 0;
    const auto base = reinterpret_cast<uintptr_t>(dst);
    const uintptr_t at = (base + i * piece + align - 1) / align * align;
    return std::min<size_t>(bytes, at - base);
  }
  bool Exhausted() const {
    return next.load(std::memory_order_relaxed) >= pieces;
  }
  // Claims and works through pieces until none is left.
  void Work() {
    for (size_t i = next.fetch_add(1, std::memory_order_relaxed); i < pieces;
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const size_t begin = Boundary(i), end = Boundary(i + 1);
      if (end > begin) Take(begin, end);
      done.fetch_add(1, std::memory_order_release);
    }
  }
  // Piece [begin, end): the ParallelFor's body on it, else its copy.
  void Take(size_t begin, size_t end) const {
    if (body != nullptr) {
      (*body)(begin, end);
    } else {
      Move(dst + begin, src ? src + begin : nullptr, end - begin);
    }
  }
  // A copy, or without a source one written byte per 4 KiB page: enough to
  // fault every page in (nothing reads the bytes before the copies).
  static void Move(uint8_t* to, const uint8_t* from, size_t n) {
    if (from != nullptr) {
      if (n >= kMinStreamBytes && HostCopyStreaming()) {
        StreamCopy(to, from, n);
      } else {
        std::memcpy(to, from, n);
      }
      return;
    }
    auto* bytes = reinterpret_cast<volatile uint8_t*>(to);
    for (size_t at = 0; at < n; at += kPieceAlign) bytes[at] = 0;
    bytes[n - 1] = 0;  // the last page, when `to` is not page-aligned
  }
};

// Workers sleep on a condition variable, but spin a little first after each
// job, so the chunks of one message (a few hundred us apart) do not pay a
// wake-up each.
class CopyPool {
 public:
  explicit CopyPool(int threads) : threads_(threads) {
    for (int i = 1; i < threads; ++i) {
      std::thread([this] { Serve(); }).detach();
    }
  }

  int threads() const { return threads_; }

  // [dst, dst + bytes) in pieces of at least `min_piece` bytes ending on
  // multiples of `align` (Job), which the pool's threads and the caller work
  // through: copied from `src`, or, without one, faulted in (Job::Move).
  void Run(uint8_t* dst, const uint8_t* src, size_t bytes, size_t min_piece,
           size_t align,
           const std::function<void(size_t, size_t)>* body = nullptr) {
    const size_t pieces =
        std::min<size_t>(2 * size_t(threads_), bytes / min_piece);
    if (pieces <= 1 || threads_ == 1) {
      Job whole;
      whole.dst = dst;
      whole.src = src;
      whole.body = body;
      if (bytes != 0) whole.Take(0, bytes);
      return;
    }
    auto job = std::make_shared<Job>();
    job->dst = dst;
    job->src = src;
    job->bytes = bytes;
    job->align = align;
    job->body = body;
    const size_t unit = std::max(kPieceAlign, job->align);
    job->piece = ((bytes + pieces - 1) / pieces + unit - 1) / unit * unit;
    job->pieces = (bytes + job->piece - 1) / job->piece;
    // An unaligned destination moves the boundaries up: one more piece may
    // be needed to reach the end.
    while (job->Boundary(job->pieces) < bytes) ++job->pieces;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
    job->Work();
    while (job->done.load(std::memory_order_acquire) < job->pieces) {
      SpinPause();
    }
  }

 private:
  // A job with pieces left, dropping exhausted ones; nullptr if none.
  std::shared_ptr<Job> Next() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!jobs_.empty() && jobs_.front()->Exhausted()) jobs_.pop_front();
    for (const auto& job : jobs_) {
      if (!job->Exhausted()) return job;
    }
    return nullptr;
  }

  // A worker's life: take pieces of any pending job, else spin, then sleep.
  void Serve() {
    while (true) {
      // Read before looking for work: a job pushed after this read changes
      // the generation, so the wait below cannot miss it.
      const uint64_t seen = generation_.load(std::memory_order_acquire);
      if (std::shared_ptr<Job> job = Next()) {
        job->Work();
        continue;
      }
      const auto start = std::chrono::steady_clock::now();
      while (generation_.load(std::memory_order_acquire) == seen &&
             std::chrono::steady_clock::now() - start < SpinBudget()) {
        SpinPause();
      }
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] {
        return generation_.load(std::memory_order_acquire) != seen;
      });
    }
  }

  const int threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> jobs_;
  std::atomic<uint64_t> generation_{0};
};

CopyPool& Pool() {
  // Never destroyed: its detached threads outlive static destruction.
  static CopyPool* pool = new CopyPool(HostCopyThreads());
  return *pool;
}

}  // namespace

void StreamCopy(void* dst, const void* src, size_t n) {
  auto* to = static_cast<uint8_t*>(dst);
  const auto* from = static_cast<const uint8_t*>(src);
#if defined(__x86_64__)
  // Stores need a 16-byte aligned destination: the head goes by memcpy.
  const size_t head =
      std::min(n, (16 - reinterpret_cast<uintptr_t>(to) % 16) % 16);
  std::memcpy(to, from, head);
  to += head;
  from += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(from + i);
    auto* d = reinterpret_cast<__m128i*>(to + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1),
                  c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  std::memcpy(to + i, from + i, n - i);
  // Streaming stores are weakly ordered: whoever learns that the copy is
  // done (Job::done, release) must see every byte.
  _mm_sfence();
#else
  std::memcpy(to, from, n);
#endif
}

int HostCopyThreads() {
  return std::clamp(GetDeviceTuning().host_copy_threads, 1, 256);
}

bool HostCopyStreaming() { return GetDeviceTuning().host_copy_streaming; }

void ParallelCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CopyPool& pool = Pool();
  // Whole huge pages per piece only where that still gives every thread
  // one: smaller copies keep finer pieces.
  const size_t align =
      bytes >= size_t(pool.threads()) * kHugePage ? kHugePage : 1;
  pool.Run(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes,
           kMinPieceBytes, align);
}

void PrepareFreshDestination(void* dst, size_t bytes) {
  const auto start = reinterpret_cast<uintptr_t>(dst);
  const uintptr_t begin = (start + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t end = (start + bytes) / kHugePage * kHugePage;
  if (end <= begin) return;
  unsigned char resident = 0;
  if (mincore(reinterpret_cast<void*>(begin), 1, &resident) != 0 ||
      (resident & 1) != 0) {
    return;  // not plain memory of ours, or already in use
  }
  (void)madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
  // One huge page per piece: each is faulted in (and zeroed by the kernel)
  // by one thread, all of the buffer's at once.
  Pool().Run(static_cast<uint8_t*>(dst), nullptr, bytes, kHugePage, kHugePage);
}

void ParallelFor(size_t count, size_t min_piece,
                 const std::function<void(size_t, size_t)>& body) {
  Pool().Run(nullptr, nullptr, count, std::max<size_t>(min_piece, 1), 1, &body);
}

}  // namespace hetjax::device
