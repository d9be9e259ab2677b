// The only place that knows whether this build talks CUDA or HIP. The GPU
// device layer (gpu_device.cu) is written once against these names; the HIP
// build compiles the same file with HETJAX_ROCM defined.
#pragma once

#include <cstdint>
#include <string>

#if defined(HETJAX_ROCM)
#include <hip/hip_runtime.h>
#else
#include <cuda.h>  // driver types only; no libcuda link (see ExportDmabufFd)
#include <cuda_runtime.h>
#endif

namespace hetjax::device::vendor {

#if defined(HETJAX_ROCM)

inline constexpr const char* kName = "rocm";
using Error = hipError_t;
using StreamT = hipStream_t;
using EventT = hipEvent_t;
inline constexpr Error kSuccess = hipSuccess;
inline constexpr Error kNotReady = hipErrorNotReady;
inline constexpr auto kHostToDevice = hipMemcpyHostToDevice;
inline constexpr auto kDeviceToHost = hipMemcpyDeviceToHost;
inline constexpr unsigned kPinnedFlags = hipHostMallocPortable;
inline constexpr unsigned kMappedFlags =
    hipHostMallocPortable | hipHostMallocMapped;
inline constexpr unsigned kEventFlags = hipEventDisableTiming;

inline const char* ErrorString(Error e) { return hipGetErrorString(e); }
inline Error GetLastError() { return hipGetLastError(); }
inline Error MemcpyAsync(void* d, const void* s, size_t n, hipMemcpyKind kind,
                         StreamT st) {
  return hipMemcpyAsync(d, s, n, kind, st);
}
inline Error MemsetAsync(void* d, int v, size_t n, StreamT st) {
  return hipMemsetAsync(d, v, n, st);
}
inline Error StreamSynchronize(StreamT st) { return hipStreamSynchronize(st); }
inline Error HostAlloc(void** p, size_t n, unsigned flags) {
  return hipHostMalloc(p, n, flags);
}
inline Error HostFree(void* p) { return hipHostFree(p); }
inline Error HostDevicePointer(void** d, void* h) {
  return hipHostGetDevicePointer(d, h, 0);
}
inline Error Malloc(void** p, size_t n) { return hipMalloc(p, n); }
inline constexpr auto kDeviceToDevice = hipMemcpyDefault;
inline constexpr unsigned kRegisterFlags =
    hipHostRegisterPortable | hipHostRegisterMapped;
inline Error HostRegister(void* p, size_t n) {
  return hipHostRegister(p, n, kRegisterFlags);
}
inline Error HostUnregister(void* p) { return hipHostUnregister(p); }
#if defined(HETJAX_HIP_STREAM_CALLBACK)
// This HIP runtime declares hipLaunchHostFunc but does not export it
// (Debian's 5.2, cc/device/CMakeLists.txt): the host function runs as a
// stream callback, which also runs in stream order on a runtime thread.
struct HostFuncCall {
  void (*fn)(void*);
  void* arg;
};
inline void RunHostFuncCall(hipStream_t, hipError_t, void* call) {
  auto* host_func = static_cast<HostFuncCall*>(call);
  host_func->fn(host_func->arg);
  delete host_func;
}
inline Error LaunchHostFunc(StreamT st, void (*fn)(void*), void* arg) {
  auto* call = new HostFuncCall{fn, arg};
  Error error = hipStreamAddCallback(st, RunHostFuncCall, call, 0);
  if (error != hipSuccess) delete call;
  return error;
}
#else
inline Error LaunchHostFunc(StreamT st, void (*fn)(void*), void* arg) {
  return hipLaunchHostFunc(st, fn, arg);
}
#endif
using IpcHandleT = hipIpcMemHandle_t;
inline Error IpcGetMemHandle(IpcHandleT* h, void* p) {
  return hipIpcGetMemHandle(h, p);
}
inline Error IpcOpenMemHandle(void** p, IpcHandleT h) {
  return hipIpcOpenMemHandle(p, h, hipIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return hipIpcCloseMemHandle(p); }
// dma-buf export needs hsa_amd_portable_export_dmabuf (ROCm 5.5+); the ROCm
// 5.2 headers Debian ships lack it, so this flavour reports unsupported.
inline bool ExportDmabufFd(void*, size_t, int* fd, std::string* error) {
  *fd = -1;
  *error =
      "unsupported: this ROCm has no hsa_amd_portable_export_dmabuf "
      "(needs ROCm 5.5 or later)";
  return false;
}
inline Error Free(void* p) { return hipFree(p); }
inline Error GetDevice(int* d) { return hipGetDevice(d); }
inline Error SetDevice(int d) { return hipSetDevice(d); }
inline Error StreamGetDevice(StreamT st, int* d) {
#if HIP_VERSION_MAJOR >= 6
  return hipStreamGetDevice(st, d);
#else
  // ROCm 5.x has no way to ask; one GPU per process is what we run there.
  (void)st;
  return hipGetDevice(d);
#endif
}
inline Error EventCreate(EventT* e) {
  return hipEventCreateWithFlags(e, kEventFlags);
}
inline Error EventRecord(EventT e, StreamT st) { return hipEventRecord(e, st); }
inline Error EventQuery(EventT e) { return hipEventQuery(e); }
inline Error EventSynchronize(EventT e) { return hipEventSynchronize(e); }
inline Error EventDestroy(EventT e) { return hipEventDestroy(e); }
// Streams of our own never wait for the legacy default stream.
inline Error StreamCreate(StreamT* st) {
  return hipStreamCreateWithFlags(st, hipStreamNonBlocking);
}
inline Error StreamWaitEvent(StreamT st, EventT e) {
  return hipStreamWaitEvent(st, e, 0);
}
// How many blocks of `threads` of `kernel` one multiprocessor holds at once.
template <typename Kernel>
inline Error OccupancyBlocksPerSm(int* blocks, Kernel kernel, int threads) {
  return hipOccupancyMaxActiveBlocksPerMultiprocessor(
      blocks, reinterpret_cast<const void*>(kernel), threads, 0);
}
inline Error MultiprocessorCount(int* count, int device) {
  return hipDeviceGetAttribute(count, hipDeviceAttributeMultiprocessorCount,
                               device);
}

// s_memrealtime counts at a constant 100 MHz on the MI200/MI300 series
// (ROCm 5.2 has no attribute to ask for the rate).
inline constexpr uint64_t kTicksPerSecond = 100000000;
__device__ inline uint64_t NowTicks() {
#if defined(__HIP_DEVICE_COMPILE__)
  return __builtin_amdgcn_s_memrealtime();
#else
  return 0;  // host pass of a kernel body: never executed
#endif
}
// A short back-off between polls (s_sleep 127 ~ 8k cycles, a few us), so the
// waiting wave does not hammer the host memory link.
__device__ inline void Backoff() {
#if defined(__HIP_DEVICE_COMPILE__)
  __builtin_amdgcn_s_sleep(127);
#endif
}
__device__ inline void ShortBackoff() {
#if defined(__HIP_DEVICE_COMPILE__)
  __builtin_amdgcn_s_sleep(8);
#endif
}
// Host memory a kernel reads here is fine-grained (uncached), so a plain
// load sees what another agent wrote.
template <class T>
__device__ inline T LoadFresh(const T* p) {
  return *p;
}

#else  // CUDA

inline constexpr const char* kName = "cuda";
using Error = cudaError_t;
using StreamT = cudaStream_t;
using EventT = cudaEvent_t;
inline constexpr Error kSuccess = cudaSuccess;
inline constexpr Error kNotReady = cudaErrorNotReady;
inline constexpr auto kHostToDevice = cudaMemcpyHostToDevice;
inline constexpr auto kDeviceToHost = cudaMemcpyDeviceToHost;
inline constexpr unsigned kPinnedFlags = cudaHostAllocPortable;
inline constexpr unsigned kMappedFlags =
    cudaHostAllocPortable | cudaHostAllocMapped;
inline constexpr unsigned kEventFlags = cudaEventDisableTiming;

inline const char* ErrorString(Error e) { return cudaGetErrorString(e); }
inline Error GetLastError() { return cudaGetLastError(); }
inline Error MemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind kind,
                         StreamT st) {
  return cudaMemcpyAsync(d, s, n, kind, st);
}
inline Error MemsetAsync(void* d, int v, size_t n, StreamT st) {
  return cudaMemsetAsync(d, v, n, st);
}
inline Error StreamSynchronize(StreamT st) { return cudaStreamSynchronize(st); }
inline Error HostAlloc(void** p, size_t n, unsigned flags) {
  return cudaHostAlloc(p, n, flags);
}
inline Error HostFree(void* p) { return cudaFreeHost(p); }
inline Error HostDevicePointer(void** d, void* h) {
  return cudaHostGetDevicePointer(d, h, 0);
}
inline Error Malloc(void** p, size_t n) { return cudaMalloc(p, n); }
// Default: unified addressing finds the owner of each side, peers included.
inline constexpr auto kDeviceToDevice = cudaMemcpyDefault;
inline constexpr unsigned kRegisterFlags =
    cudaHostRegisterPortable | cudaHostRegisterMapped;
inline Error HostRegister(void* p, size_t n) {
  return cudaHostRegister(p, n, kRegisterFlags);
}
inline Error HostUnregister(void* p) { return cudaHostUnregister(p); }
inline Error LaunchHostFunc(StreamT st, void (*fn)(void*), void* arg) {
  return cudaLaunchHostFunc(st, fn, arg);
}
using IpcHandleT = cudaIpcMemHandle_t;
inline Error IpcGetMemHandle(IpcHandleT* h, void* p) {
  return cudaIpcGetMemHandle(h, p);
}
inline Error IpcOpenMemHandle(void** p, IpcHandleT h) {
  return cudaIpcOpenMemHandle(p, h, cudaIpcMemLazyEnablePeerAccess);
}
inline Error IpcCloseMemHandle(void* p) { return cudaIpcCloseMemHandle(p); }
// cuMemGetHandleForAddressRange is a driver API call. We fetch it through
// the runtime rather than linking libcuda, so the library still loads on a
// machine without a driver. Needs a driver of CUDA 11.7+ and a kernel with
// dma-buf support (open kernel modules).
inline bool ExportDmabufFd(void* p, size_t n, int* fd, std::string* error) {
  using ExportFn = CUresult (*)(void*, CUdeviceptr, size_t,
                                CUmemRangeHandleType, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(
      "cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &found);
#else
  cudaError_t e = cudaGetDriverEntryPoint("cuMemGetHandleForAddressRange", &fn,
                                          cudaEnableDefault, &found);
#endif
  *fd = -1;
  if (e != cudaSuccess || found != cudaDriverEntryPointSuccess ||
      fn == nullptr) {
    *error = std::string("driver has no cuMemGetHandleForAddressRange (") +
             (e != cudaSuccess ? cudaGetErrorString(e)
                               : "symbol not found or driver too old") +
             ")";
    return false;
  }
  CUresult r =
      reinterpret_cast<ExportFn>(fn)(fd, reinterpret_cast<CUdeviceptr>(p), n,
                                     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (r != CUDA_SUCCESS) {
    *fd = -1;
    *error = "cuMemGetHandleForAddressRange(DMA_BUF_FD) returned CUresult " +
             std::to_string(static_cast<int>(r)) +
             (r == CUDA_ERROR_NOT_SUPPORTED
                  ? " (not supported: needs the open kernel modules)"
                  : "");
    return false;
  }
  return true;
}
inline Error Free(void* p) { return cudaFree(p); }
inline Error GetDevice(int* d) { return cudaGetDevice(d); }
inline Error SetDevice(int d) { return cudaSetDevice(d); }
inline Error StreamGetDevice(StreamT st, int* d) {
#if CUDART_VERSION >= 12080
  return cudaStreamGetDevice(st, d);
#else
  (void)st;
  return cudaGetDevice(d);
#endif
}
inline Error EventCreate(EventT* e) {
  return cudaEventCreateWithFlags(e, kEventFlags);
}
inline Error EventRecord(EventT e, StreamT st) {
  return cudaEventRecord(e, st);
}
inline Error EventQuery(EventT e) { return cudaEventQuery(e); }
inline Error EventSynchronize(EventT e) { return cudaEventSynchronize(e); }
inline Error EventDestroy(EventT e) { return cudaEventDestroy(e); }
inline Error StreamCreate(StreamT* st) {
  return cudaStreamCreateWithFlags(st, cudaStreamNonBlocking);
}
inline Error StreamWaitEvent(StreamT st, EventT e) {
  return cudaStreamWaitEvent(st, e, 0);
}
template <typename Kernel>
inline Error OccupancyBlocksPerSm(int* blocks, Kernel kernel, int threads) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, kernel, threads,
                                                       0);
}
inline Error MultiprocessorCount(int* count, int device) {
  return cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device);
}

// %globaltimer counts nanoseconds.
inline constexpr uint64_t kTicksPerSecond = 1000000000;
__device__ inline uint64_t NowTicks() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// FACTS.md: a 1 us nanosleep between polls releases within ~0.13 ms.
__device__ inline void Backoff() { __nanosleep(1000); }
// For polls of device memory another GPU writes: a release is seen within
// a microsecond, so the poll must not sleep through it.
__device__ inline void ShortBackoff() { __nanosleep(100); }
// ld.global.cv: treat cached lines as stale and fetch again, for bytes
// another agent (a copy engine, another GPU) wrote into host or peer memory.
template <class T>
__device__ inline T LoadFresh(const T* p) {
  return __ldcv(p);
}

#endif

// A wait's deadline in device clock ticks; ceil, so a tiny timeout never
// rounds down to "no limit" (0).
inline uint64_t TimeoutTicks(uint64_t timeout_ns) {
  return timeout_ns == 0
             ? 0
             : (timeout_ns * (kTicksPerSecond / 1000000) + 999) / 1000;
}

}  // namespace hetjax::device::vendor
