// Instruction issue from nvcc's PTX: which warp instructions a traced launch issued, by kind
// (ptx_parse.cpp reads the PTX, ptx_count.cpp counts).
//
// The tracer sees memory, not registers: it cannot count the FMAs, address arithmetic,
// conversions, shuffles and branches that bind a tuned kernel's issue slots. nvcc can: compiled
// to PTX with -lineinfo, every instruction of a kernel carries the source line it came from. This
// file reads that PTX (ptx_compile.cpp produces it) and counts a launch's instructions as
//
//   sum over the kernel's basic blocks of  (instructions in the block) x (times a warp ran it),
//
// where a block's count comes, in this order, from
//   * its memory instructions (anchored): the tracer counted how many warp requests each source
//     line's loads, stores, atomics, cp.async, ldmatrix and mma made; spread evenly over the PTX
//     instructions of that line (an unrolled loop has several copies of one line), weighted by
//     bytes per lane (nvcc may merge two 4-byte loads into one 8-byte one), that is how often each
//     of those instructions ran, and the block runs as often as the median of its memory
//     instructions. A helper's line inlined at several calls is matched per call where the PTX's
//     inlined_at and the tracer's chain name the same .cu line (ptx_count.cpp: SeenLines);
//   * a constant trip count: a loop of one block with no memory instruction (an unrolled FMA
//     chain) whose counter starts, steps and stops at constants runs trips x its entry's count;
//   * otherwise it is reached: the sum over the edges into it from the blocks before it, each
//     carrying its source's count, the way out of a loop carrying the count the loop was entered
//     with. A conditional branch splits its count between its two ways by what the tracer saw: a
//     way whose own memory accesses were never made gets none, else the ways get it as the CPU
//     build ran their lines, else evenly. InstructionMix::inherited says how many instructions
//     were counted so.
//
// PTX is not SASS: ptxas still folds, fuses and expands. The counting rules below stand in for it
// (docs/performance-model.md lists them): parameter loads, cvta and register moves are free (ptxas
// makes them operands), a mul.f32 whose only use is an add.f32 is one FFMA (contraction), 64-bit
// integer adds and compares are two instructions, an IEEE division or square root is a reciprocal
// and a Newton sequence. Internal to cuda_emu/.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "cuda_emu/profiler.h"

namespace mg_emu::ptx {

using profile::InstructionKind;
constexpr size_t kKinds = profile::kInstructionKinds;

// What a memory-like instruction is, for matching it with the tracer's sites.
enum class Access : uint8_t { none, load, store, atomic, cp_async, ldmatrix, mma };

struct Instruction {
  std::string opcode;  // "ld.global.nc.v4.f32"
  InstructionKind kind = InstructionKind::other;
  double weight = 1;  // SASS instructions it stands for (0: free, see the rules above)
  int file = 0;       // the innermost .loc: index into Function::files, 0 = none
  int line = 0;
  int call_file = 0;  // a header's line: the first .cu line of the chain it was inlined into
  int call_line = 0;  // (the .locs' inlined_at, walked up), as the tracer names it; else 0
  Access access = Access::none;
  bool generic = false;               // a load or store without a state space (.global or .shared unknown)
  int bytes_per_lane = 0;             // memory instructions: vector width x element size
  std::vector<std::string> dests;     // every register the instruction writes ("{%f1, %f2}": both)
  bool continues = false;             // a later piece of one PTX instruction (a division's Newton
                                      // steps): it waits for the piece before it
  std::vector<std::string> sources;   // registers the instruction reads
  std::string guard;                  // "@%p1", "@!%p1" or empty
  std::vector<std::string> operands;  // as written: branches, setp, add and mov (the loop analysis)

  // The register it writes when it writes exactly one ("%f12"), else empty.
  std::string dest() const { return dests.size() == 1 ? dests[0] : std::string(); }
};

struct Block {
  std::string label;  // "$L__BB0_3"; empty for the entry block
  std::vector<Instruction> instructions;
  int loops_back_to = -1;  // index of the block its last branch jumps back to (a loop's latch)
};

struct Function {
  std::string mangled;    // "_Z6kernelPf"
  std::string demangled;  // "kernel(float*)"
  std::vector<Block> blocks;
  std::vector<std::string> files;  // .file table: files[i] is file index i ("" where unused)
  int registers_per_thread = 0;    // from ptxas -v, 0 = unknown
  int stack_bytes = 0;             // ptxas -v's "N bytes stack frame": per thread, in local memory
};

// Every .entry of a PTX module, with its basic blocks. Throws std::runtime_error on text that is
// not PTX as nvcc writes it (an unterminated function).
std::vector<Function> parse(const std::string& ptx);

// The memory counts of one source line the tracer saw, over the traced blocks.
struct LineAccesses {
  std::string where;  // innermost "file.cu:line"
  std::string outer;  // a header's line: the first .cu line of its inlining chain, else empty
  Access access = Access::load;
  profile::Space space = profile::Space::global;
  double requests = 0;    // warp requests
  double lane_bytes = 0;  // bytes per lane access times lane accesses
  double lanes = 0;
};
std::vector<LineAccesses> line_accesses(const std::vector<profile::SiteCounts>& sites);

// The instructions `warps` warps issued running `f`, given what the tracer saw of them: the
// memory accesses by line and `lines_run`, the source lines (innermost "file.cu:line") that
// began a basic block of the CPU build, with how often (warp executions; absent: not seen).
profile::InstructionMix count(const Function& f, const std::vector<LineAccesses>& seen, double warps,
                              const std::map<std::string, double>& lines_run = {});

// Dependent-issue latencies, in clocks, of Ampere and Hopper alike (docs/performance-model.md,
// "A warp's own path"): when an instruction's result can be read by the next.
constexpr double kArithmeticLatency = 4;    // FFMA, FADD, IADD3, IMAD, LOP3, ... (measured: 4 on
                                            // Volta to Hopper)
constexpr double kSharedLatency = 30;       // LDS, LDSM, SHFL; mma ASSUMED the same
constexpr double kQuarterRateLatency = 20;  // MUFU and conversions: ASSUMED (not measured here)
constexpr double kFp64Latency = 8;          // DFMA: ASSUMED
double latency_of(InstructionKind kind);    // 0 for global and local loads (the round-trip limit's),
                                            // branches and barriers

// The clocks one warp needs to run block `b` once, alone on its scheduler (ptx_chain.cpp): the
// longer of its issue (one warp instruction a clock) and its longest chain of dependent
// instructions, each waiting for the results it reads. `kinds[i]` is instruction i's kind as the
// count resolved it (a generic load the tracer saw in shared memory is a shared load).
double block_cycles(const Block& b, const std::vector<InstructionKind>& kinds);

// The memory round trips one warp makes running block `b` once (ptx_chain.cpp): the levels of
// dependent global loads in it. A load waits for the loads its address reads (through any
// arithmetic) and, after a barrier, for every load whose value was used before the barrier (a
// tile stored to shared memory; a prefetch into registers does not wait); loads that wait for none
// of each other are issued together, as ptxas hoists them (the copies of an unrolled loop's load
// are one level, not one each). cp.async is not counted here (the tracer counts its waits).
double load_levels(const Block& b, const std::vector<InstructionKind>& kinds);

// The memory round trips of a kernel whose block k ran `runs[k]` times (warp executions), its
// instructions of kinds `kinds[k]` (ptx_chain.cpp). The levels of load_levels, carried from block
// to block through each stretch of blocks between loop edges (a loop's first block and the block
// after its last start a new one): a block's loads also wait for every load whose value a block
// before it used (in-order issue: ptxas does not hoist a load above a branch), not for the loads
// still in flight. Each level counts the most runs of any block that reached it in the stretch (a
// guarded load's block runs no more often than the unguarded ones before it); a block that did
// not run sets nothing.
double load_round_trips(const std::vector<Block>& blocks,
                        const std::vector<std::vector<InstructionKind>>& kinds,
                        const std::vector<double>& runs);

// Small text helpers of ptx_parse.cpp that the count uses too.
std::vector<std::string> split(const std::string& s, char by);
std::string basename_of(const std::string& path);  // "/src/a.cu" -> "a.cu"
bool parse_integer(const std::string& s, long long* v);

// "(anonymous namespace)::k<1>(float*)" -> the form both compilers' demangled names share.
std::string normalise_name(std::string demangled);

}  // namespace mg_emu::ptx
