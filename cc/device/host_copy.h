// Large copies between host buffers, on several threads: the CPU island's end
// of a slot channel (cc/ffi/gpu/slot_channel.h) runs its "device" copies
// here, between XLA's buffer and the shared slots the GPU peer copies into
// and out of at pinned speed.
//
// Why threads: measured on a 16-core host with one H100 (bench/results/
// gpu_bridge_h100x1_cuda_cpu.json), one thread moves 256 MiB at 10 GB/s
// between buffers already in use and 3.3 GB/s into fresh ones (every page is
// faulted in and zeroed on first touch, and XLA:CPU maps each large output
// anew), against 55 GB/s for a pinned GPU copy; 8 threads reach 30 and 18.
#pragma once

#include <cstddef>
#include <functional>

namespace hetjax::device {

// memcpy(dst, src, bytes), split into pieces that a process-wide pool of
// HostCopyThreads() threads (the caller among them) copies at once. Small
// copies stay on the caller. Safe to call from several threads at a time.
void ParallelCopy(void* dst, const void* src, size_t bytes);

// body(begin, end) over pieces of [0, count), at least `min_piece` each,
// on the same pool: the host device's reductions (a collective's combine of
// a 64 MiB piece is memory-bound as a copy is). Returns when every piece
// has run.
void ParallelFor(size_t count, size_t min_piece,
                 const std::function<void(size_t, size_t)>& body);

// DeviceTuning::host_copy_threads, within [1, 256]; the pool takes it when
// it is built.
int HostCopyThreads();

// Pieces of 256 KiB and more are copied with non-temporal (streaming)
// stores, which write the destination without reading it into the cache
// first, unless DeviceTuning::host_copy_streaming is off. Measured on that
// host, alternating 3 + 3 runs: GPU -> CPU into a donated buffer at 256 MiB
// 46-50 GB/s with them, 36-37 without (docs/performance.md).
bool HostCopyStreaming();

// memcpy with non-temporal stores (x86-64; plain memcpy elsewhere): the
// destination's lines are written whole, without the read-for-ownership a
// plain store costs, and without evicting the source from the cache. A large
// copy on the CPU end is bounded by memory traffic while the GPU's DMA
// writes into the same memory, and this takes a quarter of that traffic
// away. Every byte is visible to other threads once it returns (sfence).
void StreamCopy(void* dst, const void* src, size_t bytes);

// Pages of a buffer about to be written for the first time fault in one by
// one, 4 KiB each, on whichever thread touches them first: most of the cost
// of a fresh destination, and with 2 MiB pieces of a copy split into
// smaller ones, threads wait on each other's faults. If the start of
// [dst, dst + bytes) is not backed yet, this asks for transparent huge
// pages behind the 2 MiB-aligned middle of it (madvise MADV_HUGEPAGE, which
// the common "madvise" THP mode honours: 512x fewer faults) and faults
// the whole buffer in on the pool's threads, one huge page per piece, before
// anything is copied. Its contents are garbage until then written. Memory
// already in use is left alone.
void PrepareFreshDestination(void* dst, size_t bytes);

}  // namespace hetjax::device
