// The pair exchange kernel (pair_exchange.h), one source for CUDA and HIP.
// Blocks [0, kPairShares) publish, share s each; blocks [kPairShares,
// 2 kPairShares) consume; with publish_copy, kCopyBlocks more store our own
// part locally. Publishers run up to `depth` chunks ahead of the peer's
// consumers, so pushing chunk k+1 overlaps reducing chunk k, and neither
// side ever waits on a host thread.
#include <algorithm>
#include <string>
#include <type_traits>

#include "cc/device/device.h"
#include "cc/device/gpu_elements.cuh"
#include "cc/device/gpu_pair_exchange.h"
#include "cc/device/gpu_vendor.h"
#include "cc/device/pair_shares.h"

#if defined(HETJAX_ROCM)
#include <hip/hip_fp16.h>
#else
#include <cuda_fp16.h>
#endif

namespace hetjax::device {
namespace {

namespace v = vendor;
using elements::Apply;
using elements::Elements;
using elements::Scale;

constexpr int kThreads = 512;
constexpr int kUnroll = 4;
// Blocks that store an all-gather's or broadcast root's own part. Apart
// from the publishers: a publisher that also stored locally issued half as
// many stores to the link, and all-gather ran at 0.75-0.81 of XLA where
// all-reduce, moving as many bytes over NVLink, ran at 0.9-1.05.
constexpr uint32_t kCopyBlocks = 32;
// How often (in polls) a waiting thread looks at the host-side abort word:
// each look crosses PCIe.
constexpr uint32_t kPollsPerAbortCheck = 256;

__device__ uint8_t* BuffersOf(void* workspace) {
  return static_cast<uint8_t*>(workspace) + sizeof(PairCounters);
}
__device__ PairCounters* CountersOf(void* workspace) {
  return static_cast<PairCounters*>(workspace);
}

// Every 16-byte vector i < vectors of a block's range, kUnroll loads in
// flight per thread before the first store: load(i) reads what vector i
// needs, store(i, loaded) finishes it. The one loop every path shares.
template <typename Load, typename Store>
__device__ void ForEachVector(uint64_t vectors, Load load, Store store) {
  uint64_t i = threadIdx.x;
  for (; i + (kUnroll - 1) * kThreads < vectors; i += kThreads * kUnroll) {
    decltype(load(i)) held[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) held[u] = load(i + u * kThreads);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store(i + u * kThreads, held[u]);
  }
  for (; i < vectors; i += kThreads) store(i, load(i));
}

// Thread 0 waits until *counter >= target; every thread of the block then
// learns whether the wait succeeded (false: aborted or out of time, and
// control->timed_out is set for the host to find).
__device__ bool BlockWait(const uint64_t* counter, uint64_t target,
                          WaitFlag* control, uint64_t start,
                          uint64_t timeout_ticks) {
  __shared__ int ok;
  if (threadIdx.x == 0) {
    volatile const uint64_t* word = counter;
    volatile WaitFlag* flags = control;
    int result = 1;
    for (uint32_t polls = 1; *word < target; ++polls) {
      if (polls % kPollsPerAbortCheck == 0 &&
          (flags->abort != 0 ||
           (timeout_ticks != 0 && v::NowTicks() - start > timeout_ticks))) {
        flags->timed_out = 1;
        __threadfence_system();
        result = 0;
        break;
      }
      v::ShortBackoff();
    }
    __threadfence();  // acquire: the data behind the count
    ok = result;
  }
  __syncthreads();
  return ok != 0;
}

// After every thread's loads and stores of the share: raise the peer's
// counter (a release at system scope, so our bytes are visible first).
__device__ void BlockSignal(uint64_t* peer_counter, uint64_t value) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
#if defined(HETJAX_ROCM)
    __atomic_store_n(peer_counter, value, __ATOMIC_RELEASE);
#else
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(peer_counter),
                 "l"(value)
                 : "memory");
#endif
  }
}

// `bytes` from src to dst by one block: 16-byte vectors when both ends
// allow. Into the peer's buffer these are posted stores over NVLink, so a
// push keeps the link busy where remote loads would wait out its latency.
__device__ void BlockCopy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  uint64_t done = 0;
  if (((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) &
       15) == 0) {
    const auto* from = reinterpret_cast<const int4*>(src);
    auto* to = reinterpret_cast<int4*>(dst);
    done = bytes / 16;
    ForEachVector(
        done, [&](uint64_t i) { return from[i]; },
        [&](uint64_t i, const int4& v) { to[i] = v; });
    done *= 16;
  }
  for (uint64_t i = done + threadIdx.x; i < bytes; i += kThreads) {
    dst[i] = src[i];
  }
}

// The bit patterns the fast path moves: a bfloat16's, a float16's, or the
// arithmetic type's own.
struct BF16Bits {
  uint16_t bits;
};
template <typename W, typename Bits>
struct Typed {
  __device__ static W Widen(Bits x) { return x; }
  __device__ static Bits Narrow(W x) { return x; }
};
template <>
struct Typed<float, BF16Bits> {
  __device__ static float Widen(BF16Bits x) {
    return elements::FromBF16(x.bits);
  }
  __device__ static BF16Bits Narrow(float x) { return {elements::ToBF16(x)}; }
};
template <>
struct Typed<float, __half> {
  __device__ static float Widen(__half x) { return __half2float(x); }
  __device__ static __half Narrow(float x) { return __float2half_rn(x); }
};

// 16 bytes of the peer's elements combined with 16 bytes of ours (or only
// converted, without ours), exactly as the element-wise path computes.
template <typename W, typename Bits>
__device__ int4 CombineVector(const int4& theirs, const int4* ours,
                              const Combine& c, bool peer_first) {
  constexpr int kElements = 16 / sizeof(Bits);
  const auto* a = reinterpret_cast<const Bits*>(&theirs);
  const auto* b = reinterpret_cast<const Bits*>(ours);
  int4 result;
  auto* out = reinterpret_cast<Bits*>(&result);
#pragma unroll
  for (int j = 0; j < kElements; ++j) {
    W value = Typed<W, Bits>::Widen(a[j]);
    if (ours != nullptr) {
      const W mine = Typed<W, Bits>::Widen(b[j]);
      value = peer_first ? Apply(c.op, value, mine) : Apply(c.op, mine, value);
    }
    out[j] =
        Typed<W, Bits>::Narrow(Scale(value, c.divisor, std::is_integral<W>()));
  }
  return result;
}

// The whole 16-byte vectors of a share where every operand has one type
// and 16-byte alignment: vector loads and stores, no per-element type
// dispatch.
template <typename W, typename Bits>
__device__ void ConsumeVectors(const Combine& c, bool peer_first,
                               const int4* theirs, uint64_t vectors,
                               uint64_t first_byte) {
  const int4* ours = c.b == nullptr
                         ? nullptr
                         : reinterpret_cast<const int4*>(
                               static_cast<const uint8_t*>(c.b) + first_byte);
  auto* out =
      reinterpret_cast<int4*>(static_cast<uint8_t*>(c.out) + first_byte);
  struct Operands {
    int4 theirs, ours;
  };
  ForEachVector(
      vectors,
      [&](uint64_t i) {
        return Operands{v::LoadFresh(theirs + i),
                        ours != nullptr ? ours[i] : int4{}};
      },
      [&](uint64_t i, const Operands& held) {
        out[i] = CombineVector<W, Bits>(
            held.theirs, ours != nullptr ? &held.ours : nullptr, c, peer_first);
      });
}

// Takes the fast path for the share's whole vectors if it fits; false:
// the element-wise path must do them.
template <typename W>
__device__ bool ConsumeFast(const Combine& c, bool peer_first,
                            const int4* theirs, uint64_t vectors,
                            uint64_t first_byte) {
  const bool one_type =
      c.a_type == c.out_type && (c.b == nullptr || c.b_type == c.a_type);
  const auto out_at = reinterpret_cast<uintptr_t>(c.out) + first_byte;
  const auto b_at = reinterpret_cast<uintptr_t>(c.b) + first_byte;
  if (!one_type || ((out_at | (c.b == nullptr ? 0 : b_at)) & 15) != 0) {
    return false;
  }
  if constexpr (std::is_same_v<W, float>) {
    switch (c.a_type) {
      case ElementType::kF32:
        ConsumeVectors<float, float>(c, peer_first, theirs, vectors,
                                     first_byte);
        return true;
      case ElementType::kBF16:
        ConsumeVectors<float, BF16Bits>(c, peer_first, theirs, vectors,
                                        first_byte);
        return true;
      case ElementType::kF16:
        ConsumeVectors<float, __half>(c, peer_first, theirs, vectors,
                                      first_byte);
        return true;
      default:
        return false;
    }
  } else {
    ConsumeVectors<W, W>(c, peer_first, theirs, vectors, first_byte);
    return true;
  }
}

// The peer's `bytes` (elements of x.combine.a_type, starting at element
// `first` of the message) from its buffer, combined or converted into
// combine.out. Loads from the peer bypass the caches (ld.cv): the buffer is
// reused every `depth` chunks.
template <typename W>
__device__ void ConsumeShare(const PairExchange& x, const uint8_t* from,
                             uint64_t bytes, uint64_t first) {
  const Combine& c = x.combine;
  const int size = static_cast<int>(x.element_bytes);
  const int per_vector = 16 / size;
  const uint64_t vectors = bytes / 16;
  const auto* peer = reinterpret_cast<const int4*>(from);
  auto load = [&](uint64_t vec) { return v::LoadFresh(peer + vec); };
  auto finish = [&](const int4& raw, int elements, uint64_t at) {
    for (int j = 0; j < elements; ++j) {
      const uint64_t i = at + j;
      W value = Elements<W>::Load(&raw, c.a_type, j);
      if (c.b != nullptr) {
        const W mine = Elements<W>::Load(c.b, c.b_type, i);
        value =
            x.peer_first ? Apply(c.op, value, mine) : Apply(c.op, mine, value);
      }
      Elements<W>::Store(c.out, c.out_type, i,
                         Scale(value, c.divisor, std::is_integral<W>()));
    }
  };
  // A plain move (all-gather, broadcast): the bytes as they are, whatever
  // the element type, NaN payloads included.
  const bool copy =
      c.b == nullptr && c.a_type == c.out_type && c.divisor == 1.0;
  auto* out_bytes = static_cast<uint8_t*>(c.out) + first * size;
  const bool vector_out = (reinterpret_cast<uintptr_t>(out_bytes) & 15) == 0;
  if (copy) {
    auto finish_copy = [&](uint64_t vec, const int4& raw) {
      if (vector_out) {
        reinterpret_cast<int4*>(out_bytes)[vec] = raw;
        return;
      }
      const auto* raw_bytes = reinterpret_cast<const uint8_t*>(&raw);
      for (int b = 0; b < 16; ++b) out_bytes[vec * 16 + b] = raw_bytes[b];
    };
    ForEachVector(vectors, load, finish_copy);
    for (uint64_t b = vectors * 16 + threadIdx.x; b < bytes; b += kThreads) {
      out_bytes[b] = v::LoadFresh(from + b);
    }
    return;
  }
  if (!ConsumeFast<W>(c, x.peer_first, peer, vectors, first * size)) {
    ForEachVector(vectors, load, [&](uint64_t vec, const int4& raw) {
      finish(raw, per_vector, first + vec * per_vector);
    });
  }
  // The tail of the message's last share: fewer than 16 bytes.
  const uint64_t tail = bytes - vectors * 16;
  if (tail > 0 && threadIdx.x == 0) {
    int4 raw;
    auto* raw_bytes = reinterpret_cast<uint8_t*>(&raw);
    for (uint64_t b = 0; b < tail; ++b) {
      raw_bytes[b] = v::LoadFresh(from + vectors * 16 + b);
    }
    finish(raw, static_cast<int>(tail / size), first + vectors * per_vector);
  }
}

// A copier block's part of our own bytes into publish_copy. Nothing waits
// on it: the kernel, and so the op, ends when every block has.
__device__ void CopyOwnPart(const PairExchange& x, uint32_t block) {
  const ByteRange range = PartOf(x.publish_bytes, block, kCopyBlocks);
  BlockCopy(static_cast<uint8_t*>(x.publish_copy) + range.begin,
            static_cast<const uint8_t*>(x.publish) + range.begin, range.bytes);
}

template <typename W>
__global__ void __launch_bounds__(kThreads)
    PairExchangeKernel(PairExchange x, uint64_t timeout_ticks) {
  if (blockIdx.x >= 2 * kPairShares) {
    CopyOwnPart(x, blockIdx.x - 2 * kPairShares);
    return;
  }
  const uint64_t start = v::NowTicks();
  const bool publisher = blockIdx.x < kPairShares;
  const uint32_t share = publisher ? blockIdx.x : blockIdx.x - kPairShares;
  PairCounters* mine = CountersOf(x.local_workspace);
  PairCounters* theirs = CountersOf(x.peer_workspace);
  const uint64_t total = publisher ? x.publish_bytes : x.consume_bytes;
  const uint64_t chunks = (total + x.chunk_bytes - 1) / x.chunk_bytes;
  for (uint64_t k = 0; k < chunks; ++k) {
    const uint64_t offset = k * x.chunk_bytes;
    const uint64_t left = total - offset;
    const ByteRange range = ShareOf(
        x.chunk_bytes, left < x.chunk_bytes ? left : x.chunk_bytes, share);
    if (publisher) {
      const uint64_t n = x.first_out + k;
      if (n + 1 > x.depth &&
          !BlockWait(&mine->freed[share], n + 1 - x.depth, x.control_device,
                     start, timeout_ticks)) {
        return;
      }
      uint8_t* slot =
          BuffersOf(x.peer_workspace) + (n % x.depth) * x.chunk_bytes;
      BlockCopy(slot + range.begin,
                static_cast<const uint8_t*>(x.publish) + offset + range.begin,
                range.bytes);
      BlockSignal(&theirs->filled[share], n + 1);
    } else {
      const uint64_t n = x.first_in + k;
      if (!BlockWait(&mine->filled[share], n + 1, x.control_device, start,
                     timeout_ticks)) {
        return;
      }
      const uint8_t* slot =
          BuffersOf(x.local_workspace) + (n % x.depth) * x.chunk_bytes;
      ConsumeShare<W>(x, slot + range.begin, range.bytes,
                      (offset + range.begin) / x.element_bytes);
      BlockSignal(&theirs->freed[share], n + 1);
    }
  }
}

}  // namespace

Status LaunchPairExchange(const PairExchange& x, Stream stream) {
  using elements::Storable;
  const Combine& c = x.combine;
  if (!Storable(c.wide, c.a_type) || !Storable(c.wide, c.out_type) ||
      (c.b != nullptr && !Storable(c.wide, c.b_type))) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(v::kName) +
                      " pair exchange: element types do not fit arithmetic "
                      "type " +
                      std::to_string(int(c.wide)));
  }
  const bool element_fits = x.element_bytes == 1 || x.element_bytes == 2 ||
                            x.element_bytes == 4 || x.element_bytes == 8;
  if (!element_fits || x.consume_bytes % x.element_bytes != 0) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(v::kName) +
                      " pair exchange: " + std::to_string(x.consume_bytes) +
                      " bytes of elements of " +
                      std::to_string(x.element_bytes) + " bytes");
  }
  if (x.depth == 0 || x.chunk_bytes == 0 || x.chunk_bytes % 16 != 0 ||
      x.local_workspace == nullptr || x.peer_workspace == nullptr) {
    return Status(StatusCode::kInvalidArgument,
                  std::string(v::kName) +
                      " pair exchange: no workspace, or chunks of " +
                      std::to_string(x.chunk_bytes) +
                      " bytes (expected a positive multiple of 16)");
  }
  if (x.publish_bytes == 0 && x.consume_bytes == 0) return Status::Ok();
  return elements::WithWideType(
      c.wide,
      Status(StatusCode::kInvalidArgument,
             std::string(v::kName) +
                 " pair exchange: a half type is never an arithmetic type"),
      [&](auto wide) {
        const uint32_t blocks =
            2 * kPairShares + (x.publish_copy != nullptr ? kCopyBlocks : 0);
        PairExchangeKernel<decltype(wide)>
            <<<blocks, kThreads, 0, static_cast<v::StreamT>(stream)>>>(
                x, v::TimeoutTicks(x.timeout_ns));
        const v::Error error = v::GetLastError();
        if (error == v::kSuccess) return Status::Ok();
        return Status(StatusCode::kInternal,
                      std::string(v::kName) + " launch PairExchangeKernel(" +
                          std::to_string(x.publish_bytes) + " out, " +
                          std::to_string(x.consume_bytes) +
                          " in): " + v::ErrorString(error));
      });
}

Status PairMovesResident(int* count) {
  *count = 1;
  int ordinal = 0, multiprocessors = 0, per_multiprocessor = 0;
  v::Error error = v::GetDevice(&ordinal);
  if (error == v::kSuccess) {
    error = v::MultiprocessorCount(&multiprocessors, ordinal);
  }
  // A move is the byte-wide instantiation, without the own-part copiers.
  if (error == v::kSuccess) {
    error = v::OccupancyBlocksPerSm(&per_multiprocessor,
                                    PairExchangeKernel<uint8_t>, kThreads);
  }
  if (error != v::kSuccess) {
    return Status(StatusCode::kInternal,
                  std::string(v::kName) + " occupancy of PairExchangeKernel: " +
                      v::ErrorString(error));
  }
  *count = std::max(1, per_multiprocessor * multiprocessors /
                           static_cast<int>(2 * kPairShares));
  return Status::Ok();
}

}  // namespace hetjax::device
