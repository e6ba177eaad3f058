// A warp's own clocks through a block of PTX (cuda_emu/ptx_count.h: block_cycles), on hand-written
// PTX whose chains a reader can follow instruction by instruction, and the limit the GPU model
// makes of them (cuda_emu/gpu_model.h: KernelWork::warp_cycles).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "cuda_emu/gpu_model.h"
#include "cuda_emu/gpu_spec.h"
#include "cuda_emu/ptx_count.h"

namespace ptx = mg_emu::ptx;

namespace {

std::vector<mg_emu::profile::InstructionKind> kinds_of(const ptx::Block& b) {
  std::vector<mg_emu::profile::InstructionKind> kinds;
  for (const ptx::Instruction& in : b.instructions) kinds.push_back(in.kind);
  return kinds;
}

double cycles_of(const ptx::Block& b) { return ptx::block_cycles(b, kinds_of(b)); }

// Block 1: a dot product's loop over shared memory, one FFMA a trip.
//   ld.shared x2      ready at 30 (both issue at once: neither waits)
//   fma               reads both: starts at 30, ready at 34
//   add x3, setp      the pointers and the counter: 4, the compare 8
//   bra               issues at 8
// 8 instructions, a chain of 34 clocks: latency, not issue, sets a lone warp's pace.
// Block 2: a store, the barrier that waits for it, a load of what another warp stored, an FFMA,
//   a compare and a branch: st.shared done at 30; bar.sync: nothing after it starts before 30;
//   ld.shared ready at 60; fma at 64; setp at 68, where the branch issues. 6 instructions, 68 clocks.
// Block 3: an IEEE division (a MUFU.RCP, 8 FP32 instructions and a branch, each waiting for the
//   one before): 20 + 8 x 4 = 52 clocks for 10 instructions.
// Block 4: an unrolled chain of 8 independent FFMAs (4 clocks deep, 8 instructions): issue binds.
const char* kChains = R"(
.visible .entry _Z6chainsPf(
	.param .u64 _Z6chainsPf_param_0
)
{
	.loc	1 5 0
	mov.f32 	%f1, 0f00000000;
	mov.u32 	%r5, 0;
$L__BB0_1:
	.loc	1 7 5
	ld.shared.f32 	%f2, [%r3];
	ld.shared.f32 	%f3, [%r4];
	fma.rn.f32 	%f1, %f2, %f3, %f1;
	add.s32 	%r3, %r3, 4;
	add.s32 	%r4, %r4, 128;
	add.s32 	%r5, %r5, 1;
	setp.lt.s32 	%p1, %r5, 32;
	@%p1 bra 	$L__BB0_1;
	.loc	1 9 3
	st.shared.f32 	[%r3], %f1;
	bar.sync 	0;
	ld.shared.f32 	%f4, [%r4];
	fma.rn.f32 	%f5, %f4, %f4, %f1;
	setp.gt.f32 	%p2, %f5, 0f00000000;
	@%p2 bra 	$L__BB0_4;
	div.rn.f32 	%f6, %f5, %f4;
$L__BB0_4:
	fma.rn.f32 	%f10, %f2, %f2, %f2;
	fma.rn.f32 	%f11, %f3, %f3, %f3;
	fma.rn.f32 	%f12, %f4, %f4, %f4;
	fma.rn.f32 	%f13, %f5, %f5, %f5;
	fma.rn.f32 	%f14, %f2, %f3, %f3;
	fma.rn.f32 	%f15, %f3, %f4, %f4;
	fma.rn.f32 	%f16, %f4, %f5, %f5;
	fma.rn.f32 	%f17, %f5, %f2, %f2;
	ret;
}
	.file	1 "/src/chains.cu"
)";

// Round trips (ptx::load_levels), block by block:
// Block 0: an unrolled loop's four loads, none reading another's value: one round trip.
// Block 1: a pointer chase: the second load's address is the first's value: two.
// Block 2: a tile loop's body: a load stored to shared memory, the barrier, then the next load
//   (which reads nothing the first wrote, but cannot go out before the barrier the store waited
//   at): two. A prefetch into a register, used only after the barrier, sets no floor.
// Block 3: a prefetch (its value used after the barrier), the barrier, another load: one.
const char* kRoundTrips = R"(
.visible .entry _Z6tripsPf(
	.param .u64 _Z6tripsPf_param_0
)
{
	.loc	1 5 0
	ld.global.f32 	%f1, [%rd1];
	ld.global.f32 	%f2, [%rd1+512];
	ld.global.f32 	%f3, [%rd1+1024];
	ld.global.f32 	%f4, [%rd1+1536];
	add.f32 	%f5, %f1, %f2;
	add.f32 	%f6, %f3, %f4;
	setp.gt.f32 	%p1, %f5, %f6;
	@%p1 bra 	$L__BB1_2;
$L__BB1_1:
	ld.global.u64 	%rd2, [%rd1];
	ld.global.f32 	%f7, [%rd2];
	setp.gt.f32 	%p2, %f7, 0f00000000;
	@%p2 bra 	$L__BB1_3;
$L__BB1_2:
	ld.global.f32 	%f8, [%rd1];
	st.shared.f32 	[%r1], %f8;
	bar.sync 	0;
	ld.global.f32 	%f9, [%rd1+4];
	setp.gt.f32 	%p3, %f9, 0f00000000;
	@%p3 bra 	$L__BB1_4;
$L__BB1_3:
	ld.global.f32 	%f10, [%rd1];
	bar.sync 	0;
	ld.global.f32 	%f11, [%rd1+4];
	add.f32 	%f12, %f10, %f11;
$L__BB1_4:
	ret;
}
	.file	1 "/src/trips.cu"
)";

// Round trips of a kernel (ptx::load_round_trips), carried from block to block. nvcc puts each
// guarded load of an unrolled loop (`if (i < n) v[k] = x[i + k * 32]`) in a block of its own that a
// branch skips:
//   b0  no load; branches over b1
//   b1  a guarded load (level 1)
//   b2  branches over b3
//   b3  another guarded load, independent of the first: the same level, it goes out with it
//   b4  uses both values (the warp waits here); branches over b5
//   b5  a load after that use: level 2 (ptxas does not hoist it above the branch)
//   b6  a loop of one block: each trip starts again, one load a trip (level 1)
//   b7  after the loop: a new stretch, level 1
const char* kGuardedLoads = R"(
.visible .entry _Z6guardsPf(
	.param .u64 _Z6guardsPf_param_0
)
{
	.loc	1 5 0
	setp.lt.s32 	%p1, %r1, %r2;
	@!%p1 bra 	$L__BB2_2;
	ld.global.f32 	%f1, [%rd1];
$L__BB2_2:
	@!%p2 bra 	$L__BB2_4;
	ld.global.f32 	%f2, [%rd1+128];
$L__BB2_4:
	add.f32 	%f3, %f1, %f2;
	@!%p3 bra 	$L__BB2_6;
	ld.global.f32 	%f4, [%rd2];
$L__BB2_6:
	ld.global.f32 	%f5, [%rd3];
	add.f32 	%f6, %f6, %f5;
	setp.lt.s32 	%p4, %r3, %r4;
	@%p4 bra 	$L__BB2_6;
	ld.global.f32 	%f7, [%rd4];
	ret;
}
	.file	1 "/src/guards.cu"
)";

std::vector<std::vector<mg_emu::profile::InstructionKind>> kinds_of(const std::vector<ptx::Block>& blocks) {
  std::vector<std::vector<mg_emu::profile::InstructionKind>> kinds;
  for (const ptx::Block& b : blocks) kinds.push_back(kinds_of(b));
  return kinds;
}

// The blocks of a PTX text's one function, which has `n` of them.
std::vector<ptx::Block> blocks_of(const char* text, size_t n) {
  const std::vector<ptx::Function> fs = ptx::parse(text);
  REQUIRE(fs.size() == 1);
  REQUIRE(fs[0].blocks.size() == n);
  return fs[0].blocks;
}

}  // namespace

TEST_CASE("warp path: a block's clocks are its issue or its chain of dependent latencies, worked by hand",
          "[profiler][ptx]") {
  const std::vector<ptx::Block> blocks = blocks_of(kChains, 5);

  CHECK(cycles_of(blocks[1]) == Approx(ptx::kSharedLatency + 4));      // 34: the loads, then the FFMA
  CHECK(cycles_of(blocks[2]) == Approx(2 * ptx::kSharedLatency + 8));  // 68
  CHECK(cycles_of(blocks[3]) == Approx(ptx::kQuarterRateLatency + 8 * ptx::kArithmeticLatency));  // 52
  CHECK(cycles_of(blocks[4]) == Approx(9));  // 8 independent FFMAs and the return: issue, not latency

  // The loop issues 8 instructions in those 34 clocks: with 4 or more warps on its scheduler the
  // others fill the gaps, and the issue limit binds instead.
  double issued = 0;
  for (const ptx::Instruction& in : blocks[1].instructions) issued += in.weight;
  CHECK(issued == Approx(8));
}

TEST_CASE("round trips: a block's dependent levels of global loads, worked by hand", "[profiler][ptx]") {
  const std::vector<ptx::Block> blocks = blocks_of(kRoundTrips, 5);
  CHECK(ptx::load_levels(blocks[0], kinds_of(blocks[0])) == 1);  // four loads together
  CHECK(ptx::load_levels(blocks[1], kinds_of(blocks[1])) == 2);  // a pointer chase
  CHECK(ptx::load_levels(blocks[2], kinds_of(blocks[2])) == 2);  // load, store, barrier, load
  CHECK(ptx::load_levels(blocks[3], kinds_of(blocks[3])) == 1);  // a prefetch across the barrier
  CHECK(ptx::load_levels(blocks[4], kinds_of(blocks[4])) == 0);  // no load
}

TEST_CASE("warp path: the GPU model prices a warp's own clocks wave after wave", "[gpu_model]") {
  const mg_emu::GpuSpec& gpu = mg_emu::h200_sxm();
  // One 32-thread block per SM, each warp 1e6 clocks of dependent work and nothing else.
  mg_emu::KernelWork w;
  w.blocks = 132;
  w.threads_per_block = 32;
  w.warp_cycles = 132 * 1e6;
  w.issued_instructions = 132 * 1e5;  // a tenth of the clocks: the warp waits, it does not issue
  mg_emu::Prediction p = mg_emu::predict(w, gpu);
  CHECK(p.binding == "latency (dependent instructions)");
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 1e6 / gpu.clock_hz));

  // Twice the blocks at one wave (two per SM): each warp still needs its own clocks, and the
  // second warp on an SM runs beside the first, not after it.
  w.blocks = 264;
  w.warp_cycles = 264 * 1e6;
  w.issued_instructions = 264 * 1e5;
  p = mg_emu::predict(w, gpu);
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 1e6 / gpu.clock_hz));

  // Blocks beyond one wave wait for a slot: 32 blocks per SM fit (32-thread blocks), so
  // 33 x 132 blocks run in two waves and take twice as long.
  w.blocks = 33 * 132;
  w.warp_cycles = 33 * 132 * 1e6;
  w.issued_instructions = 33 * 132 * 1e5;
  p = mg_emu::predict(w, gpu);
  CHECK(p.seconds == Approx(gpu.launch_latency_s + 2e6 / gpu.clock_hz));
}

TEST_CASE("round trips: guarded loads in blocks of their own go out together, worked by hand",
          "[profiler][ptx]") {
  const std::vector<ptx::Block> blocks = blocks_of(kGuardedLoads, 8);
  CHECK(blocks[6].loops_back_to == 6);
  const auto kinds = kinds_of(blocks);

  // Warp runs of each block: 10 warps; the second guard holds for half of them, the third for 4;
  // the loop makes 3 trips.
  const std::vector<double> runs = {10, 10, 10, 5, 10, 4, 30, 10};
  // Level 1: the 10 warps that ran b1 (b3's 5 go out with theirs); level 2: b5's 4; the loop's 30;
  // after it, 10. Block by block (ptx::load_levels of each run) it would be 10 + 5 + 4 + 30 + 10.
  CHECK(ptx::load_round_trips(blocks, kinds, runs) == Approx(10 + 4 + 30 + 10));

  // A block that never ran sets no level: without b1, b3's 5 warps make level 1, and b5 still
  // waits for b3's value, used in b4.
  const std::vector<double> without_b1 = {10, 0, 10, 5, 10, 4, 30, 10};
  CHECK(ptx::load_round_trips(blocks, kinds, without_b1) == Approx(5 + 4 + 30 + 10));

  // Every block its own stretch (what the count did before the fourteenth session) would add
  // b3's 5: the guarded copies of one unrolled load, one round trip each.
  double block_by_block = 0;
  for (size_t k = 0; k < blocks.size(); ++k)
    block_by_block += runs[k] * ptx::load_levels(blocks[k], kinds[k]);
  CHECK(block_by_block == Approx(10 + 5 + 4 + 30 + 10));
}
