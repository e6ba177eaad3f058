// A host read of a device-to-host copy's destination before cudaStreamSynchronize: on a GPU it
// reads whatever was there (a race with the DMA engine); under the emulation the copy runs on
// the stream's own thread, so it is a data race between two threads that ThreadSanitizer names.
//
//   tsan_host_read race           reads before synchronising: TSan reports the race. The host
//                                 sleeps first, so the copy has landed and the value read is even
//                                 right: the point is that TSan names the bug anyway. (Reading at
//                                 once would see the poison, and the stream thread would often
//                                 start the copy only after the host's cudaStreamSynchronize had
//                                 handed it the stream's lock: ordered, so no report.)
//   tsan_host_read synchronised   reads after: no report (the emulator's stream synchronisation
//                                 is a real happens-before edge, so TSan sees the order)
//
// Built with -fsanitize=thread against the emulated runtime compiled the same way
// (tests/CMakeLists.txt); the two ctest cases match its output. The race case passes only on
// exactly one report, naming this file's read_before_synchronising() as the reader and the
// emulator's copy (copy_async, cuda_emu/runtime_memory.cpp) as the writer: any other race, or a
// second one, fails it.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

// The racing read, in a function of its own so that TSan's report names it (never inlined into main).
__attribute__((noinline)) float read_before_synchronising(const float* pinned, int i) { return pinned[i]; }

int main(int argc, char** argv) {
  const bool synchronised = argc > 1 && std::strcmp(argv[1], "synchronised") == 0;
  const int n = 1 << 16;  // a copy long enough to still be running when the host reads
  float* device = nullptr;
  float* pinned = nullptr;
  cudaStream_t stream = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&device), n * sizeof(float)) != cudaSuccess ||
      cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)) != cudaSuccess ||
      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    std::printf("setup failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  cudaMemsetAsync(device, 0, n * sizeof(float), stream);
  cudaMemcpyAsync(pinned, device, n * sizeof(float), cudaMemcpyDeviceToHost, stream);
  float first = 0;
  if (synchronised) {
    cudaStreamSynchronize(stream);
    first = pinned[n - 1];
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // timing is no synchronisation
    first = read_before_synchronising(pinned, n - 1);  // the bug: nothing orders this read after the copy
    cudaStreamSynchronize(stream);
  }
  std::printf("%s read: %g\n", synchronised ? "synchronised" : "racing", first);
  cudaFreeHost(pinned);
  cudaFree(device);
  return 0;
}
