// The profiler's counts as a reader sees them: the GPU model's input for one traced launch, the
// per-instruction listing, and the report a program prints at exit when run with MG_EMU_PROFILE
// set (the emulation build's answer to running it under Nsight Compute). Every time in it is a
// PREDICTION of cuda_emu/gpu_model.h, never a measurement.
//
//   MG_EMU_PROFILE=1 ./prog        each launch: its requests, sectors, wavefronts, DRAM bytes and
//                                  the predicted time, printed to stderr at exit
//   MG_EMU_PROFILE=sites ./prog    the same, and every instruction's counts under its launch
//   MG_EMU_PROFILE_BLOCKS=N        trace the first N blocks of each launch (default: every block)
//   MG_EMU_GPU=a100                the GPU predicted for (gpu_spec.h: h200, the default, h100,
//                                  a100, a6000); an unknown name stops the program with exit 2
//
// The program's kernels must be compiled with the access instrumentation: `mg-nvcc --profile`
// (docs/tutorial-kernels.md), or by linking libmultigrad_traced.
#pragma once

#include <cstdio>
#include <vector>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/profiler.h"

namespace mg_emu::profile {

// The model's input for one launch; `fp32_flops` is what the caller declares (the tracer does not
// count arithmetic). A cuBLAS/cuDNN call is priced at its FLOPs and ideal bytes over the whole GPU.
KernelWork work_of(const LaunchProfile& launch, double fp32_flops);

// Each launch on one line, then each of its instructions with its counts (`indent` spaces first).
// One line: the launch's counted instructions by kind, or why they were not counted.
void print_instructions(std::FILE* out, const InstructionMix& mix);
void print_sites(std::FILE* out, const std::vector<LaunchProfile>& launches, int indent = 4);

// Every limit of one prediction, largest first, and the inputs of its latency limit: which limit
// binds and how far the next is behind it (`indent` spaces before each line).
void print_limits(std::FILE* out, const Prediction& p, const KernelWork& w, int indent = 4);

// The MG_EMU_PROFILE report of these launches.
void print_report(std::FILE* out, const std::vector<LaunchProfile>& launches, bool sites);

// Called by every launch: the first one starts the profile if MG_EMU_PROFILE asks for it, and
// registers the report for the program's exit.
void start_from_environment();

}  // namespace mg_emu::profile
