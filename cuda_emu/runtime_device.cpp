// The emulated runtime's devices, errors and versions.
//
// MG_EMU_GPUS=N (default 2) devices, each presenting an H200's properties (132 SMs, 227 KiB of
// opt-in shared memory per block, ~141 GB of memory, compute capability 9.0), so code that sizes
// grids or checks limits from the properties takes the same decisions as on the real card.
// Errors are the real runtime's codes with its names and strings; the last error is per thread.
// One string says more than the real one: after a kernel fault, cudaErrorLaunchFailure's names the
// kernel, block and thread that faulted, and why (what mg::Error then reports).
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

#include "cuda_emu/emulator.h"
#include "cuda_emu/runtime_internal.h"

namespace mg_emu {
namespace {

thread_local cudaError_t t_last_error = cudaSuccess;
thread_local int t_current_device = 0;

std::atomic<uint64_t> g_launches{0}, g_syncs{0}, g_mallocs{0}, g_h2d{0}, g_d2h{0};
std::mutex g_fault_mutex;
std::string g_last_fault;
// cudaGetErrorString(cudaErrorLaunchFailure) after a fault: "unspecified launch failure; cuda_emu:
// <the fault>". Every such text is kept (faults are few), so a pointer handed out stays valid.
std::deque<std::string> g_fault_texts;

constexpr size_t kTotalMemory = 150754820096ull;  // what an H200 reports (140.4 GiB)

}  // namespace

int device_count() {
  static const int n = [] {
    const char* v = std::getenv("MG_EMU_GPUS");
    const int k = v ? std::atoi(v) : 2;
    return k < 0 ? 0 : (k > 64 ? 64 : k);
  }();
  return n;
}

int current_device() { return t_current_device; }

cudaError_t fail(cudaError_t err, const char* api, const std::string& why) {
  t_last_error = err;
  if (!why.empty()) std::fprintf(stderr, "cuda_emu: %s: %s\n", api, why.c_str());
  return err;
}

void count_launch() { g_launches.fetch_add(1, std::memory_order_relaxed); }
void count_host_sync() { g_syncs.fetch_add(1, std::memory_order_relaxed); }
void count_malloc() { g_mallocs.fetch_add(1, std::memory_order_relaxed); }
void count_copy(cudaMemcpyKind direction, size_t bytes) {
  if (direction == cudaMemcpyHostToDevice) g_h2d.fetch_add(bytes, std::memory_order_relaxed);
  if (direction == cudaMemcpyDeviceToHost) g_d2h.fetch_add(bytes, std::memory_order_relaxed);
}
void record_fault(const std::string& message) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_last_fault = message;
  g_fault_texts.push_back("unspecified launch failure; cuda_emu: " + message);
  std::fprintf(stderr, "cuda_emu: kernel fault: %s\n", message.c_str());
}

Counters counters() {
  Counters c;
  c.kernel_launches = g_launches.load();
  c.host_syncs = g_syncs.load();
  c.device_mallocs = g_mallocs.load();
  c.bytes_host_to_device = g_h2d.load();
  c.bytes_device_to_host = g_d2h.load();
  return c;
}

const char* launch_failure_text() {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  return g_fault_texts.empty() ? "unspecified launch failure" : g_fault_texts.back().c_str();
}

std::string last_fault() {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  return g_last_fault;
}

size_t total_memory() { return kTotalMemory; }

}  // namespace mg_emu

using mg_emu::fail;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount");
  *count = mg_emu::device_count();
  if (*count == 0) return fail(cudaErrorNoDevice, "cudaGetDeviceCount");
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= mg_emu::device_count()) return fail(cudaErrorInvalidDevice, "cudaSetDevice");
  mg_emu::t_current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDevice");
  *device = mg_emu::t_current_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties");
  if (device < 0 || device >= mg_emu::device_count())
    return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties");
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "NVIDIA H200 (cuda_emu)");
  prop->totalGlobalMem = mg_emu::total_memory();
  prop->sharedMemPerBlock = 48 * 1024;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->sharedMemPerMultiprocessor = 228 * 1024;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 65536;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 132;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->l2CacheSize = 50 * 1024 * 1024;
  prop->memoryBusWidth = 6144;
  prop->concurrentKernels = 1;
  prop->asyncEngineCount = 3;
  prop->unifiedAddressing = 1;
  prop->pciBusID = device + 1;
  prop->pciDeviceID = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr) return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute");
  if (device < 0 || device >= mg_emu::device_count())
    return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute");
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = 9; return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; return cudaSuccess;
    case cudaDevAttrMultiProcessorCount: *value = 132; return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; return cudaSuccess;
    case cudaDevAttrWarpSize: *value = 32; return cudaSuccess;
    case cudaDevAttrMemoryClockRate: *value = 2619000; return cudaSuccess;  // kHz
    case cudaDevAttrGlobalMemoryBusWidth: *value = 6144; return cudaSuccess;
    case cudaDevAttrClockRate: *value = 1980000; return cudaSuccess;
    default: return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute", "attribute not emulated");
  }
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue, "cudaDriverGetVersion");
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion");
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = mg_emu::t_last_error;
  mg_emu::t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return mg_emu::t_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorLaunchFailure: return mg_emu::launch_failure_text();
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    default: return "unknown error";
  }
}

}  // extern "C"
