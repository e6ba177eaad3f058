// Instruction counts from PTX (cuda_emu/ptx_count.h), on hand-written PTX whose counts a reader can
// work out line by line, and on a traced kernel compiled by nvcc when this machine has one.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/gpu_spec.h"
#include "cuda_emu/profile_report.h"
#include "cuda_emu/profiler.h"
#include "cuda_emu/ptx_count.h"

namespace profile = mg_emu::profile;
namespace ptx = mg_emu::ptx;
using K = profile::InstructionKind;

namespace {

// A sum of squares over 8 strided elements, then a conversion, an exp2 and a store. Per warp:
//   entry      S2R (1 integer); the parameter load, cvta and the moves are operands in SASS
//   loop x 8   LDG (global), FMUL+FADD contracted to one FFMA (fp32), a 64-bit add (2 integer),
//              a 32-bit add and a compare (2 integer), the branch
//   exit       I2F (conversion), MUFU.EX2 (special), STG (global), EXIT (branch)
const char* kSumOfSquares = R"(
.version 8.0
.target sm_90
.address_size 64

.visible .entry _Z14sum_of_squaresPf(
	.param .u64 _Z14sum_of_squaresPf_param_0
)
{
	.reg .pred 	%p<2>;
	.reg .f32 	%f<6>;
	.reg .b32 	%r<3>;
	.reg .b64 	%rd<3>;
	.loc	1 10 0
	ld.param.u64 	%rd1, [_Z14sum_of_squaresPf_param_0];
	cvta.to.global.u64 	%rd2, %rd1;
	mov.u32 	%r1, %tid.x;
	mov.u32 	%r2, 0;
	mov.f32 	%f1, 0f00000000;
$L__BB0_1:
	.loc	1 12 5
	ld.global.f32 	%f2, [%rd2];
	mul.f32 	%f3, %f2, %f2;
	add.f32 	%f1, %f1, %f3;
	add.s64 	%rd2, %rd2, 128;
	add.s32 	%r2, %r2, 1;
	setp.lt.s32 	%p1, %r2, 8;
	@%p1 bra 	$L__BB0_1;
	.loc	1 14 3
	cvt.rn.f32.s32 	%f4, %r1;
	ex2.approx.f32 	%f5, %f4;
	st.global.f32 	[%rd2], %f5;
	ret;
}
	.file	1 "/src/sum_of_squares.cu"
)";

// An unrolled loop (four copies of line 20's load) and its remainder loop (one copy), both with a
// trip count known only at run time.
const char* kUnrolled = R"(
.visible .entry _Z8unrolledPfi(
	.param .u64 _Z8unrolledPfi_param_0,
	.param .u32 _Z8unrolledPfi_param_1
)
{
	.loc	1 18 0
	ld.param.u64 	%rd1, [_Z8unrolledPfi_param_0];
	ld.param.u32 	%r1, [_Z8unrolledPfi_param_1];
	and.b32 	%r2, %r1, 3;
$L__BB0_1:
	.loc	1 20 5
	ld.global.v2.f32 	{%f1, %f2}, [%rd1];
	ld.global.v2.f32 	{%f3, %f4}, [%rd1+8];
	add.s32 	%r1, %r1, -4;
	setp.ne.s32 	%p1, %r1, %r2;
	@%p1 bra 	$L__BB0_1;
$L__BB0_2:
	.loc	1 20 5
	ld.global.f32 	%f5, [%rd1];
	add.s32 	%r2, %r2, -1;
	setp.ne.s32 	%p2, %r2, 0;
	@%p2 bra 	$L__BB0_2;
	ret;
}
	.file	1 "/src/unrolled.cu"
)";

ptx::LineAccesses seen(const std::string& where, ptx::Access access, double requests, double bytes_per_lane) {
  ptx::LineAccesses l;
  l.where = where;
  l.access = access;
  l.requests = requests;
  l.lanes = requests * 32;
  l.lane_bytes = l.lanes * bytes_per_lane;
  return l;
}

}  // namespace

TEST_CASE("ptx count: blocks, weights and the contraction, worked by hand", "[profiler][ptx]") {
  const std::vector<ptx::Function> fs = ptx::parse(kSumOfSquares);
  REQUIRE(fs.size() == 1);
  const ptx::Function& f = fs[0];
  CHECK(f.demangled == "sum_of_squares(float*)");
  REQUIRE(f.blocks.size() == 3);
  CHECK(f.blocks[1].label == "$L__BB0_1");
  CHECK(f.blocks[1].loops_back_to == 1);  // a loop of one block
  CHECK(f.files.at(1) == "/src/sum_of_squares.cu");

  // The tracer saw 8 load requests per warp at line 12 and one store at line 14, for 10 warps.
  const double warps = 10;
  const profile::InstructionMix m = ptx::count(f,
                                               {seen("sum_of_squares.cu:12", ptx::Access::load, 8 * warps, 4),
                                                seen("sum_of_squares.cu:14", ptx::Access::store, warps, 4)},
                                               warps);
  REQUIRE(m.counted);
  CHECK(m.of(K::integer) == Approx(warps * (1 + 8 * 4)));
  CHECK(m.of(K::fp32) == Approx(warps * 8));  // one FFMA an iteration, not an FMUL and an FADD
  CHECK(m.of(K::global_memory) == Approx(warps * 9));
  CHECK(m.of(K::branch) == Approx(warps * 9));
  CHECK(m.of(K::conversion) == Approx(warps));
  CHECK(m.of(K::special) == Approx(warps));
  CHECK(m.total() == Approx(warps * 61));
  CHECK(m.inherited == Approx(warps * 1));  // only the entry block had nothing to anchor it

  // Without the tracer's counts the loop's trip count comes from its counter: 0, +1, while < 8.
  const profile::InstructionMix blind = ptx::count(f, {}, warps);
  CHECK(blind.total() == Approx(warps * 61));
  CHECK(blind.inherited == Approx(warps * 5));  // the entry and the exit block
}

TEST_CASE("ptx count: an unrolled loop and its remainder share what the tracer saw of their line",
          "[profiler][ptx]") {
  const std::vector<ptx::Function> fs = ptx::parse(kUnrolled);
  REQUIRE(fs.size() == 1);
  const ptx::Function& f = fs[0];
  REQUIRE(f.blocks.size() == 4);  // entry, main loop, remainder loop, ret
  // 18 four-byte loads a warp at line 20 (the CPU build does not unroll): 72 bytes a lane. The main
  // block moves 16 bytes a lane a trip, the remainder 4: the remainder is taken to run
  // (4 - 1) / 2 = 1.5 times per entry (each warp enters once), the main loop the rest:
  // (72 - 1.5 x 4) / 16 = 4.125 trips (the truth: 4 and 2).
  const double warps = 1;
  const profile::InstructionMix m = ptx::count(f, {seen("unrolled.cu:20", ptx::Access::load, 18, 4)}, warps);
  const double main_trips = 4.125, remainder_trips = 1.5;
  CHECK(m.of(K::global_memory) == Approx(2 * main_trips + remainder_trips));
  CHECK(m.of(K::integer) == Approx(1 + 2 * main_trips + 2 * remainder_trips));  // the and.b32 first
  CHECK(m.of(K::branch) == Approx(main_trips + remainder_trips + 1));           // ret: once, as the entry
}

TEST_CASE("ptx count: without anchors, a conditional branch sends half its count each way",
          "[profiler][ptx]") {
  // A two-way switch on a kernel argument, then a join: the compare block runs once per warp,
  // each case is taken as half the warps (nothing says which), the join as all of them.
  const std::string body = R"(
.visible .entry _Z6switchi(
	.param .u32 _Z6switchi_param_0
)
{
	ld.param.u32 	%r1, [_Z6switchi_param_0];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	ex2.approx.f32 	%f1, %f2;
	ex2.approx.f32 	%f3, %f1;
	bra.uni 	$L__BB0_3;
$L__BB0_2:
	sqrt.approx.f32 	%f1, %f2;
$L__BB0_3:
	ret;
}
)";
  const std::vector<ptx::Function> fs = ptx::parse(body);
  REQUIRE(fs.size() == 1);
  REQUIRE(fs[0].blocks.size() == 4);
  const double warps = 8;
  const profile::InstructionMix m = ptx::count(fs[0], {}, warps);
  CHECK(m.of(K::integer) == Approx(warps));                        // the compare
  CHECK(m.of(K::special) == Approx(warps * (0.5 * 2 + 0.5 * 1)));  // the cases
  CHECK(m.of(K::branch) == Approx(warps * (1 + 0.5 + 1)));         // @p bra, bra.uni, ret
}

TEST_CASE("ptx count: the lines the CPU build ran decide which way a branch went", "[profiler][ptx]") {
  // The same switch with line numbers: the compare on line 5, case A (two exp2) on line 6, case B
  // (a square root) on line 8, the join on line 9. The CPU build began a basic block at lines 5,
  // 8 and 9 and never at line 6: every warp took case B.
  const std::string body = R"(
.visible .entry _Z6switchi(
	.param .u32 _Z6switchi_param_0
)
{
	.loc	1 5 0
	ld.param.u32 	%r1, [_Z6switchi_param_0];
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	.loc	1 6 0
	ex2.approx.f32 	%f1, %f2;
	ex2.approx.f32 	%f3, %f1;
	bra.uni 	$L__BB0_3;
$L__BB0_2:
	.loc	1 8 0
	sqrt.approx.f32 	%f1, %f2;
$L__BB0_3:
	.loc	1 9 0
	ret;
}
	.file	1 "/src/switch.cu"
)";
  const std::vector<ptx::Function> fs = ptx::parse(body);
  REQUIRE(fs.size() == 1);
  const double warps = 8;
  const std::map<std::string, double> ran = {
      {"switch.cu:5", warps}, {"switch.cu:8", warps}, {"switch.cu:9", warps}};
  const profile::InstructionMix m = ptx::count(fs[0], {}, warps, ran);
  CHECK(m.of(K::special) == Approx(warps * 1));  // the square root only
  CHECK(m.of(K::branch) == Approx(warps * 2));   // @p bra and ret; case A's bra.uni never ran
  // Both cases seen, one warp in case A for every three in case B: split 1 : 3.
  const std::map<std::string, double> both = {
      {"switch.cu:5", warps}, {"switch.cu:6", 2}, {"switch.cu:8", 6}, {"switch.cu:9", warps}};
  const profile::InstructionMix b = ptx::count(fs[0], {}, warps, both);
  CHECK(b.of(K::special) == Approx(2 * 2 + 1 * 6));
}

TEST_CASE("ptx count: a way whose own stores were never made is not taken", "[profiler][ptx]") {
  // A store every warp makes (line 5), then a tail for the elements a size leaves over: its address
  // arithmetic (line 7) and its store (line 8), which no warp reached -- the tracer saw the line-5
  // store and none on line 8. The arithmetic has no memory instruction of its own and nothing says
  // how often the CPU build ran it; the store after it in the same way says the way was not taken.
  // (Before this rule it was counted as taken by half the warps: fill's per-element path, which a
  // size that is a multiple of the pack never runs, counted so came to 73 of 137 instructions.)
  const std::string body = R"(
.visible .entry _Z4tailPfl(
	.param .u64 _Z4tailPfl_param_0,
	.param .u64 _Z4tailPfl_param_1
)
{
	.loc	1 5 0
	ld.param.u64 	%rd1, [_Z4tailPfl_param_0];
	ld.param.u64 	%rd2, [_Z4tailPfl_param_1];
	st.global.f32 	[%rd1], %f1;
	setp.lt.s64 	%p1, %rd2, 1;
	@%p1 bra 	$L__BB0_2;
	.loc	1 7 0
	mul.lo.s64 	%rd3, %rd2, 4;
	add.s64 	%rd4, %rd1, %rd3;
	.loc	1 8 0
	st.global.f32 	[%rd4], %f1;
$L__BB0_2:
	.loc	1 9 0
	ret;
}
	.file	1 "/src/tail.cu"
)";
  const std::vector<ptx::Function> fs = ptx::parse(body);
  REQUIRE(fs.size() == 1);
  REQUIRE(fs[0].blocks.size() == 3);
  const double warps = 8;
  const profile::InstructionMix m =
      ptx::count(fs[0], {seen("tail.cu:5", ptx::Access::store, warps, 4)}, warps);
  CHECK(m.of(K::global_memory) == Approx(warps));  // the line-5 store only
  CHECK(m.of(K::integer) == Approx(warps * 2));    // the 64-bit compare; not the tail's 3 + 2
  CHECK(m.of(K::branch) == Approx(warps * 2));     // @p bra and ret
  // With the tail's store seen too (4 of the 8 warps made it), the tail is counted by its store.
  const profile::InstructionMix both = ptx::count(
      fs[0], {seen("tail.cu:5", ptx::Access::store, warps, 4), seen("tail.cu:8", ptx::Access::store, 4, 4)},
      warps);
  CHECK(both.of(K::integer) == Approx(warps * 2 + 0.5 * warps * 5));
}

TEST_CASE("ptx count: what is free, what is several instructions, and names both compilers share",
          "[profiler][ptx]") {
  const std::string body = R"(
.visible .entry _Z1kv()
{
	.loc	1 1 0
	cvt.u64.u32 	%rd1, %r1;
	cvt.s64.s32 	%rd2, %r1;
	neg.f32 	%f2, %f1;
	mul.rn.f32 	%f3, %f1, %f1;
	add.f32 	%f4, %f3, %f1;
	div.rn.f32 	%f5, %f4, %f1;
	rem.u32 	%r2, %r1, %r3;
	shfl.sync.bfly.b32 	%r4, %r1, 16, 31, -1;
	bar.sync 	0;
	bar.warp.sync 	-1;
	setp.lt.s64 	%p1, %rd1, %rd2;
	ret;
}
)";
  const std::vector<ptx::Function> fs = ptx::parse(body);
  REQUIRE(fs.size() == 1);
  const profile::InstructionMix m = ptx::count(fs[0], {}, 1);
  // Zero extension and neg are free; sign extension is one SHF; mul.rn is not contracted (the
  // rounding is explicit): FMUL + FADD; the IEEE division is MUFU.RCP, 8 FP32 and a branch; an
  // unsigned remainder 18 integer, 2 conversions and a MUFU; a 64-bit compare two ISETPs.
  CHECK(m.of(K::fp32) == Approx(1 + 1 + 8));
  CHECK(m.of(K::special) == Approx(1 + 1));
  CHECK(m.of(K::integer) == Approx(1 + 18 + 2));
  CHECK(m.of(K::conversion) == Approx(2));
  CHECK(m.of(K::warp) == Approx(1));
  CHECK(m.of(K::barrier) == Approx(1));  // __syncwarp is not a barrier instruction on sm_90
  CHECK(m.of(K::branch) == Approx(1 + 1));

  CHECK(ptx::normalise_name("void (anonymous namespace)::k<1>(float const*, int)") ==
        ptx::normalise_name("void {anonymous}::k<1>(float const *, int)"));
  CHECK_THROWS(ptx::parse(".visible .entry _Z1kv()\n{\n ret;\n"));  // no closing brace
}

namespace {
__global__ void squares_kernel(const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const float x = in[i];
  out[i] = x * x;
}

// The mistake the first H200 run found in unary_kernel, reduced: a by-value copy of an argument
// written at a run-time index cannot live in registers, so ptxas gives every thread a stack frame
// in local memory (elementwise.cu's OffsetCalc, 200 bytes, made relu 4x slower).
struct Offsets {
  int64_t v[24];  // 192 bytes
};
__global__ void offsets_copied_kernel(Offsets offsets, int dims, const float* in, float* out, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  Offsets mine = offsets;
  mine.v[i % dims] += i;
  out[i] = in[i] * static_cast<float>(mine.v[(i + 1) % dims]);
}

// Each thread sums 4 consecutive floats of a shared tile, at 16-byte steps. From a tile declared
// __align__(16) nvcc can prove the 4 loads aligned and emits one ld.shared.v4.f32; from a tile
// declared without it, it emits four ld.shared.f32 -- however the tile happens to be aligned.
constexpr int kQuadThreads = 256;
__device__ __forceinline__ void sum_quads(float* tile, const float* in, float* out) {
  const int t = static_cast<int>(threadIdx.x);
  for (int k = 0; k < 4; ++k)
    tile[k * kQuadThreads + t] = in[blockIdx.x * 4 * kQuadThreads + k * kQuadThreads + t];
  __syncthreads();
  const float* mine = tile + 4 * t;
  float sum = 0;
  for (int i = 0; i < 4; ++i) sum += mine[i];
  out[blockIdx.x * kQuadThreads + t] = sum;
}
__global__ void shared_quads_aligned_kernel(const float* in, float* out) {
  __shared__ __align__(16) float tile[4 * kQuadThreads];
  sum_quads(tile, in, out);
}
__global__ void shared_quads_plain_kernel(const float* in, float* out) {
  __shared__ float tile[4 * kQuadThreads];
  sum_quads(tile, in, out);
}

// Runs `launch(in, out)` on two device buffers of `n` floats (in zeroed) under a profile that
// counts instructions. Empty, with a warning, where the count is switched off (MG_EMU_NVCC empty)
// or this machine has no nvcc.
std::vector<profile::LaunchProfile> counted_launches(int n,
                                                     const std::function<void(float*, float*)>& launch) {
  const char* nvcc = std::getenv("MG_EMU_NVCC");
  if (nvcc != nullptr && *nvcc == '\0') {
    WARN("MG_EMU_NVCC is empty: the PTX count is switched off, nothing to check");
    return {};
  }
  float *in = nullptr, *out = nullptr;
  REQUIRE(cudaMalloc(&in, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMalloc(&out, n * sizeof(float)) == cudaSuccess);
  REQUIRE(cudaMemset(in, 0, n * sizeof(float)) == cudaSuccess);
  profile::Options options;
  options.count_instructions = true;
  profile::begin(options);
  launch(in, out);
  cudaDeviceSynchronize();
  std::vector<profile::LaunchProfile> launches = profile::end();
  cudaFree(in);
  cudaFree(out);
  REQUIRE(!launches.empty());
  const profile::InstructionMix& m = launches[0].instructions;
  profile::print_instructions(stdout, m);
  if (!m.counted && m.why.find("no nvcc") != std::string::npos) {
    WARN("no nvcc on this machine: " << m.why);
    return {};
  }
  return launches;
}
}  // namespace

namespace {

// One helper line (helpers.cuh:3, a generic ld: the pointer may be global or shared) inlined at two
// calls of the kernel's file, the first with a global pointer, the second with one into a tile
// staged in shared memory; a global load of inner.cuh:7 inlined into a helper of helpers.cuh (line
// 20) that the kernel calls at its line 13; then a global store. The tracer names a header's
// access by its line and the first .cu line of its chain; it sees the helper's line in both spaces,
// or (nvcc and the CPU compiler attribute a load folded into a copy differently) on another line
// of the helper: the call lines match either way.
const char* kStagedHelper = R"(
.visible .entry _Z5stagePf(
	.param .u64 _Z5stagePf_param_0
)
{
	.loc	2 3 5, function_name $L__info_string0, inlined_at 1 10 3
	ld.f32 	%f1, [%rd1];
	.loc	2 3 5, function_name $L__info_string0, inlined_at 1 11 3
	ld.f32 	%f2, [%rd2];
	.loc	2 20 5, function_name $L__info_string1, inlined_at 1 13 3
	add.f32 	%f4, %f1, %f2;
	.loc	3 7 5, function_name $L__info_string2, inlined_at 2 20 5
	ld.global.f32 	%f5, [%rd4];
	.loc	1 12 3
	add.f32 	%f3, %f4, %f5;
	st.global.f32 	[%rd3], %f3;
	ret;
}
	.file	1 "/src/stage.cu"
	.file	2 "/src/helpers.cuh"
	.file	3 "/src/inner.cuh"
)";

}  // namespace

TEST_CASE("ptx count: a helper's accesses are matched call by call", "[profiler][ptx]") {
  const std::vector<ptx::Function> fs = ptx::parse(kStagedHelper);
  REQUIRE(fs.size() == 1);
  const ptx::Function& f = fs[0];
  REQUIRE(f.blocks.size() == 1);
  const std::vector<ptx::Instruction>& ins = f.blocks[0].instructions;
  REQUIRE(ins.size() >= 6);
  CHECK(ins[0].generic);
  CHECK(ins[0].call_line == 10);
  CHECK(ins[1].call_line == 11);
  CHECK(ins[3].call_line == 13);  // inner.cuh:7 < helpers.cuh:20 < stage.cu:13
  CHECK(ins[4].call_line == 0);   // a line of the .cu file itself

  const double warps = 10;
  auto at = [&](const char* where, const char* outer, profile::Space space) {
    ptx::LineAccesses l = seen(where, ptx::Access::load, warps, 4);
    l.outer = outer;
    l.space = space;
    return l;
  };
  for (const char* helper_line : {"helpers.cuh:3", "helpers.cuh:4"}) {
    INFO(helper_line);
    const profile::InstructionMix m = ptx::count(f,
                                                 {at(helper_line, "stage.cu:10", profile::Space::global),
                                                  at(helper_line, "stage.cu:11", profile::Space::shared),
                                                  at("inner.cuh:7", "stage.cu:13", profile::Space::global),
                                                  seen("stage.cu:12", ptx::Access::store, warps, 4)},
                                                 warps);
    REQUIRE(m.counted);
    CHECK(m.of(K::shared_memory) == Approx(warps));      // the staged load
    CHECK(m.of(K::global_memory) == Approx(3 * warps));  // two global loads and the store
    CHECK(m.load_round_trips == Approx(warps));          // the global loads go out together
  }

  // A header line inlined at two places (helpers.cuh:20 at stage.cu:13 and 14) leaves the lines
  // inlined into it without a call: which of the two they came through is not in the PTX.
  std::string twice = kStagedHelper;
  const std::string marker = "\t.loc\t1 12 3\n";
  twice.insert(twice.find(marker),
               "\t.loc\t2 20 5, function_name $L__info_string1, inlined_at 1 14 3\n"
               "\tadd.f32 \t%f6, %f1, %f2;\n");
  const std::vector<ptx::Function> ambiguous = ptx::parse(twice);
  REQUIRE(ambiguous.size() == 1);
  REQUIRE(ambiguous[0].blocks[0].instructions.size() > 3);
  CHECK(ambiguous[0].blocks[0].instructions[3].call_line == 0);   // inner.cuh:7 < helpers.cuh:20 < ?
  CHECK(ambiguous[0].blocks[0].instructions[4].call_line == 14);  // the second helpers.cuh:20

  // Without the call lines the helper's line was not seen at all: both its loads stay global.
  const profile::InstructionMix unknown = ptx::count(
      f,
      {seen("helpers.cuh:4", ptx::Access::load, 2 * warps, 4),
       seen("inner.cuh:7", ptx::Access::load, warps, 4), seen("stage.cu:12", ptx::Access::store, warps, 4)},
      warps);
  CHECK(unknown.of(K::shared_memory) == 0);
  CHECK(unknown.of(K::global_memory) == Approx(4 * warps));
}

TEST_CASE("ptx count: a traced launch is counted from nvcc's PTX of its own source file", "[profiler][ptx]") {
  const int n = 4096;
  const std::vector<profile::LaunchProfile> launches =
      counted_launches(n, [&](float* in, float* out) { squares_kernel<<<n / 256, 256>>>(in, out, n); });
  if (launches.empty()) return;
  REQUIRE(launches.size() == 1);
  const profile::InstructionMix& m = launches[0].instructions;
  REQUIRE(m.counted);
  CHECK(launches[0].kernel_symbol.find("squares_kernel") != std::string::npos);
  // 128 warps, one block each of straight-line code: every warp issues its one load and one store
  // (the tracer's anchors) and one FP32 multiply.
  const double warps = n / 32;
  CHECK(m.of(K::global_memory) == Approx(2 * warps));
  CHECK(m.of(K::fp32) == Approx(warps));
  CHECK(m.of(K::integer) >= 3 * warps);  // S2Rs, the index arithmetic and the bound check at least
  CHECK(m.registers_per_thread > 0);
  CHECK(m.stack_bytes == 0);  // registers only
}

TEST_CASE("ptx count: a stack frame in local memory is read off ptxas and priced as DRAM traffic",
          "[profiler][ptx]") {
  const int n = 4096;
  const std::vector<profile::LaunchProfile> launches = counted_launches(
      n, [&](float* in, float* out) { offsets_copied_kernel<<<n / 256, 256>>>(Offsets{}, 24, in, out, n); });
  if (launches.empty()) return;
  REQUIRE(launches.size() == 1);
  const profile::InstructionMix& copied = launches[0].instructions;
  REQUIRE(copied.counted);
  CHECK(copied.stack_bytes >= static_cast<int>(sizeof(Offsets)));
  // Every thread's frame is priced: a DRAM limit of (traced bytes + frames) / bandwidth.
  const mg_emu::KernelWork w = profile::work_of(launches[0], 0);
  CHECK(w.local_bytes == Approx(static_cast<double>(copied.stack_bytes) * n));
  mg_emu::KernelWork without = w;
  without.local_bytes = 0;
  const mg_emu::GpuSpec& gpu = mg_emu::h200_sxm();
  const auto dram_of = [&](const mg_emu::KernelWork& work) {
    for (const mg_emu::Limit& l : mg_emu::predict(work, gpu).limits)
      if (std::string(l.name) == "DRAM") return l.seconds;
    return -1.0;
  };
  CHECK(dram_of(w) - dram_of(without) ==
        Approx(w.local_bytes / (gpu.hbm_bytes_per_s * gpu.hbm_sustained_fraction)));
}

TEST_CASE(
    "ptx count: a thread's 4 shared loads are one request where nvcc emits ld.shared.v4, four where it "
    "cannot prove the alignment",
    "[profiler][ptx][tracer]") {
  const int n = 4096;  // 4 blocks of 256 threads, 4 floats each
  for (const bool aligned : {true, false}) {
    const std::vector<profile::LaunchProfile> launches = counted_launches(n, [&](float* in, float* out) {
      if (aligned)
        shared_quads_aligned_kernel<<<n / 1024, kQuadThreads>>>(in, out);
      else
        shared_quads_plain_kernel<<<n / 1024, kQuadThreads>>>(in, out);
    });
    if (launches.empty()) return;
    REQUIRE(launches.size() == 1);
    const profile::AccessCounts& loads = launches[0].shared_load;
    const double warps = n / 4 / 32.0;
    INFO((aligned ? "__align__(16) tile" : "tile without __align__"));
    if (aligned) {
      // One 16-byte load a lane: lane t's words 4t..4t+3 put 4 words in every bank, 4 wavefronts.
      CHECK(loads.requests == Approx(warps));
      CHECK(loads.lane_bytes == Approx(warps * 32 * 16));
      CHECK(loads.wavefronts == Approx(4 * warps));
    } else {
      // Four 4-byte loads a lane, 16 bytes apart across the lanes: 8 banks, 4 words each, 4
      // wavefronts every one of them.
      CHECK(loads.requests == Approx(4 * warps));
      CHECK(loads.lane_bytes == Approx(warps * 32 * 16));
      CHECK(loads.wavefronts == Approx(16 * warps));
    }
    CHECK(loads.ideal_wavefronts == Approx(4 * warps));
    // The instruction count sees the same loads: one per warp, or four.
    CHECK(launches[0].instructions.of(K::shared_memory) >= (aligned ? 1 : 4) * warps);
  }
}
