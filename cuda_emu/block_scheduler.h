// Runs one block of a kernel: its threads as fibers on the calling OS thread (block_scheduler.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "cuda_emu/emulator.h"

namespace mg_emu {

// Thread order between barriers: forward, reverse, a permutation drawn from `seed` anew for every
// phase (the stretch between two barrier openings), or -- vary -- one of the three per phase, drawn
// from `seed` and the phase number.
enum class ThreadOrder : int { forward = 0, reverse = 1, shuffled = 2, vary = 3 };

// Runs every thread of block `block_index` of `launch` to completion. Returns "" on success, or
// the fault ("block (1,0,0), thread (37,0,0): __syncthreads() at softmax.cu:120 ...").
// `trace` (nullptr: not profiling) decides whether the block, `linear_block` of the grid, is traced.
struct LaunchTrace;
// `static_shared_bytes` (may be null) receives the bytes of the __shared__ arrays the block claimed.
std::string run_block(const Launch& launch, uint3 block_index, ThreadOrder order, uint64_t seed,
                      LaunchTrace* trace = nullptr, uint64_t linear_block = 0,
                      size_t* static_shared_bytes = nullptr);

// A kernel's static __shared__ bytes as its blocks found them (a GPU knows them from the compiled
// kernel; the emulator learns them as the arrays are first used): each grid reports the most any
// of its blocks claimed, and launch() checks the next launches of that kernel against the limit.
void note_static_shared(const void* kernel, size_t bytes);
size_t known_static_shared(const void* kernel);  // 0 until a block of it has run

}  // namespace mg_emu
