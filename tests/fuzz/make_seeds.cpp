// Writes the seed corpus of every fuzz target into <out>/<target>/ (tests/fuzz/corpus/): small
// valid inputs made by the repo's own writers (encode_safetensors, CheckpointManager::save, zlib's
// gzip), plus hand-made edge cases -- each one a refusal the reader must give with a reason, most
// of them defects that crashed a loader once (issue 26). scripts/fuzz --seeds runs it; the seeds are
// committed, so this is needed only to change them.
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/safetensors.h"
#include "multigrad.h"
#include "nn/zoo.h"
#include "optim/adam.h"
#include "optim/lr_scheduler.h"
#include "parallel/resilience/checkpoint_manager.h"

using namespace mg;

namespace {

std::string out_dir;

void put(const std::string& target, const std::string& name, const std::string& bytes) {
  std::system(("mkdir -p '" + out_dir + "/" + target + "'").c_str());
  std::ofstream(out_dir + "/" + target + "/seed-" + name, std::ios::binary) << bytes;
}

std::string le64(uint64_t v) {
  std::string s;
  for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  return s;
}

// A safetensors file from a header text and a data buffer, with no checksums (as PyTorch writes).
std::string raw_safetensors(const std::string& header, const std::string& buffer) {
  return le64(header.size()) + header + buffer;
}

std::string gzip(const std::string& data) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY);  // +16: a gzip wrapper
  std::string out(deflateBound(&zs, data.size()) + 32, '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

std::string idx(uint8_t type, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) s += be32(d);
  return s + payload;
}

void safetensors_seeds() {
  StateDict dict;
  dict["f32"] = arange(0, 6).to(DType::f32).reshape({2, 3});
  dict["f64"] = full({}, 2.5, TensorOptions{DType::f64});
  dict["f16"] = ones({2}, TensorOptions{DType::f16});
  dict["bf16"] = ones({1, 1}, TensorOptions{DType::bf16});
  dict["i32"] = zeros({0}, TensorOptions{DType::i32});
  dict["i64"] = arange(0, 3).to(DType::i64);
  dict["bool"] = ones({2}, TensorOptions{DType::boolean});
  put("safetensors", "all-dtypes", encode_safetensors(dict, {{"format", "pt"}}));
  put("safetensors", "empty", encode_safetensors({}));
  {
    std::ifstream in(std::string(MG_FUZZ_FIXTURES_DIR) + "/fixture.safetensors", std::ios::binary);
    put("safetensors", "fixture",
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  }
  const std::string eight(8, '\x01');
  put("safetensors", "no-checksums",
      raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", eight));
  // issue 26: a shape whose byte count wraps to 0 ([2^62] F32), and one through signed overflow.
  put("safetensors", "overflow-2pow62",
      raw_safetensors(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""));
  put("safetensors", "overflow-2pow32-squared",
      raw_safetensors(R"({"a":{"dtype":"I64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""));
  put("safetensors", "negative-dim",
      raw_safetensors(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", eight));
  put("safetensors", "fractional-dim",
      raw_safetensors(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", eight));
  put("safetensors", "offsets-past-end",
      raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", eight));
  put("safetensors", "overlapping",
      raw_safetensors(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
          eight));
  put("safetensors", "header-past-end", le64(1000) + "{}");
  put("safetensors", "nested-dtype",
      raw_safetensors(R"({"a":{"dtype":)" + std::string(64, '[') + std::string(64, ']') +
                          R"(,"shape":[],"data_offsets":[0,0]}})",
                      ""));
  std::string bad_crc = encode_safetensors(dict);
  bad_crc.back() ^= 1;
  put("safetensors", "bad-checksum", bad_crc);
}

void safetensors_writer_seeds() {
  auto text = [](const std::string& s) { return std::string(1, static_cast<char>(s.size())) + s; };
  const std::string meta(1, '\0');
  // An entry: 1 = tensor (name, dtype, ndims, dims, data), 0 = metadata (key, value).
  const std::string f32_2x3 = std::string("\x00\x02\x02\x03", 4) + std::string(24, '\x11');
  put("safetensors_writer", "tensor-and-metadata",
      "\x01" + text("w") + f32_2x3 + meta + text("format") + text("pt"));
  put("safetensors_writer", "every-dtype",
      "\x01" + text("a") + std::string("\x01\x01\x02", 3) + std::string(16, 'x') + "\x01" + text("b") +
          std::string("\x06\x01\x03", 3) + std::string("\x01\x00\x01", 3) + "\x01" + text("c") +
          std::string("\x03\x00", 2) + "ab");
  put("safetensors_writer", "reserved-tensor-name", "\x01" + text("__metadata__") + f32_2x3);
  put("safetensors_writer", "reserved-header-name", "\x01" + text("__header__") + f32_2x3);
  put("safetensors_writer", "reserved-key",
      "\x01" + text("w") + f32_2x3 + meta + text("crc32c:w") + text("0"));
  put("safetensors_writer", "empty-names", "\x01" + text("") + f32_2x3 + meta + text("") + text(""));
  put("safetensors_writer", "escapes", meta + text("q\"\\\n\x01") + text("\xc3\xa9\xe2\x82\xac"));
}

void idx_seeds() {
  const std::string u8 = idx(0x08, {2, 2, 2}, "\x01\x02\x03\x04\x05\x06\x07\x08");
  put("idx", "u8-3d", u8);
  put("idx", "labels", idx(0x08, {3}, std::string("\x00\x01\x09", 3)));
  put("idx", "i16", idx(0x0B, {2}, std::string("\x01\x00\xff\xff", 4)));
  put("idx", "f32", idx(0x0D, {1, 1}, std::string("\x3f\x80\x00\x00", 4)));
  put("idx", "f64", idx(0x0E, {1}, std::string("\x3f\xf0\x00\x00\x00\x00\x00\x00", 8)));
  put("idx", "i32-empty", idx(0x0C, {0, 5}, ""));
  // issue 26: dims 2^31 x 256 x 2^25 with an empty payload (the product wraps past 2^64).
  put("idx", "overflow-dims", idx(0x08, {2147483648u, 256, 33554432u}, ""));
  put("idx", "zero-dim-after-large",
      idx(0x08, {0xa0000000u, 0x1a0, 0}, ""));  // 0 bytes, however large the rest
  put("idx", "truncated", u8.substr(0, u8.size() - 3));
  put("idx", "trailing", u8 + "xyz");
  put("idx", "bad-type", idx(0x07, {1}, "a"));
}

void gzip_seeds() {
  const std::string image = idx(0x08, {2, 2, 2}, "\x01\x02\x03\x04\x05\x06\x07\x08");
  const std::string gz = gzip(image);
  put("gzip", "idx", gz);
  put("gzip", "two-members", gzip(image.substr(0, 5)) + gzip(image.substr(5)));
  put("gzip", "empty-member", gzip(""));
  put("gzip", "truncated", gz.substr(0, gz.size() - 5));
  put("gzip", "trailing-garbage", gz + "zz");
  std::string bad_crc = gz;
  bad_crc[bad_crc.size() - 6] ^= 0x40;
  put("gzip", "bad-crc", bad_crc);
  // 2 MiB of zeros (as a u8 IDX) in ~2 KiB: more than the harness's cap lets out.
  put("gzip", "bomb", gzip(idx(0x08, {2u << 20}, std::string(2u << 20, '\0'))));
  put("gzip", "not-gzip", image);
}

void object_collectives_seeds() {
  StateDict dict;
  dict["w"] = arange(0, 4).to(DType::f32);
  const std::string object = encode_safetensors(dict);
  auto padded = [](std::string s) {
    s.resize((s.size() + 7) / 8 * 8, '\0');
    return s;
  };
  // byte 0: path (bits 0-1) and ranks - 1 (bits 2-4); then the lengths; then the payload.
  put("object_collectives", "broadcast-state-dict", std::string(1, 0) + le64(object.size()) + padded(object));
  put("object_collectives", "gather-3",
      std::string(1, static_cast<char>(1 | (2 << 2))) + le64(3) + le64(0) + le64(5) + "abc" + "hello");
  const std::string slot = padded(object);
  put("object_collectives", "all-gather-2",
      std::string(1, static_cast<char>(2 | (1 << 2))) + le64(object.size()) + le64(2) + slot + padded("hi"));
  put("object_collectives", "all-paths", std::string(1, 3) + le64(4) + "abcdefgh");
  // A corrupt announced length: negative (once a read before the buffer), huge (a wrapped size).
  put("object_collectives", "negative-length", std::string(1, 3) + le64(uint64_t(-1)) + "abcdefgh");
  put("object_collectives", "huge-length", std::string(1, 3) + le64(uint64_t(1) << 62) + "abcdefgh");
  put("object_collectives", "max-length",
      std::string(1, 2 | (1 << 2)) + le64(INT64_MAX) + le64(1) + "abcdefgh");
}

void checkpoint_seeds() {
  const std::string dir = "/tmp/mg_fuzz_seed_checkpoint";
  std::system(("rm -rf " + dir).c_str());
  nn::MLP model{2, {3}, 2};
  optim::AdamW opt{model.parameters(), optim::AdamWOptions{}};
  optim::CosineAnnealingLROptions so;
  so.t_max = 10;
  optim::CosineAnnealingLR schedule{opt, so};
  Tensor loss = cross_entropy(model.forward(randn({4, 2})), randint(0, 2, {4}));
  loss.backward();
  opt.step();
  schedule.step();
  parallel::TrainingState state;
  state.module = &model;
  state.optimizer = &opt;
  state.scheduler = &schedule;
  parallel::CheckpointManagerOptions options;
  options.background = false;
  options.save_on_sigterm = false;
  parallel::TrainingPosition position;
  position.step = 7;
  {
    parallel::CheckpointManager writer(parallel::ProcessGroup(parallel::make_single_process_backend(),
                                                              Device::cpu(), parallel::LaunchInfo{}),
                                       dir, options);
    writer.save(state, position);
    writer.wait();
  }
  auto read = [&](const char* name) {
    std::ifstream in(dir + "/" + parallel::CheckpointManager::step_dir_name(7) + "/" + name,
                     std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  const std::string sep = "\n#MGFILE#\n";
  const std::string all = read("model.safetensors") + sep + read("optimizer.safetensors") + sep +
                          read("lr_scheduler.safetensors");
  // byte 0: bit 0 structured, bit 1 the pieces instead of load_latest.
  put("checkpoint_dir", "raw-valid", std::string(1, 0) + all);
  put("checkpoint_dir", "raw-valid-pieces", std::string(1, 2) + all);
  put("checkpoint_dir", "raw-model-only", std::string(1, 0) + read("model.safetensors"));
  auto text = [](const std::string& s) { return std::string(1, static_cast<char>(s.size())) + s; };
  // Structured edits: op code (bits 0-2 % 6: the op, bits 3-4 % 3: the file), then the op's arguments.
  const std::string set_model = std::string(1, 0) + std::string(1, static_cast<char>(200));
  put("checkpoint_dir", "structured-unchanged", std::string(1, 1));
  // Both files: load_checkpoint refuses a model and an optimizer file whose metadata differ.
  const std::string set_optimizer = std::string(1, 8) + std::string(1, static_cast<char>(200));
  put("checkpoint_dir", "structured-world-0",
      std::string(1, 1) + set_model + text("world_size") + text("0") + set_model + text("rank_rng") +
          text("") + set_optimizer + text("world_size") + text("0") + set_optimizer + text("rank_rng") +
          text(""));
  put("checkpoint_dir", "structured-world-0-pieces",
      std::string(1, 3) + set_model + text("world_size") + text("0") + set_optimizer + text("world_size") +
          text("0"));
  put("checkpoint_dir", "structured-bad-rng",
      std::string(1, 1) + set_model + text("rank_rng") + text("1:2,x") + set_optimizer + text("rank_rng") +
          text("1:2,x"));
  put("checkpoint_dir", "structured-negative-step",
      std::string(1, 1) + set_model + text("step") + text("-5") + set_optimizer + text("step") + text("-5"));
  put("checkpoint_dir", "structured-tensor-edits",
      std::string(1, 3) + "\x03\x01\x02\x02\x04\x04" + "\x02\x00" + "\x0b\x01" + "\x04\x00" +
          text("renamed") + "\x05");
  std::system(("rm -rf " + dir).c_str());
}

// fuzz_optimizer_state.cpp. Byte 0: bits 0-1 the reader (plain, ZeRO by parameter, ZeRO flat,
// GradScaler), bits 2-3 the optimizer (SGD, Adam, AdamW), bit 4 structured.
void optimizer_state_seeds() {
  for (int reader = 0; reader < 4; ++reader)
    for (int kind = 0; kind < 3; ++kind)
      put("optimizer_state", "structured-unchanged-" + std::to_string(reader) + "-" + std::to_string(kind),
          std::string(1, static_cast<char>(16 | reader | kind << 2)));
  // Issue 37, finding 9: ZeRO given "state.x.exp_avg" (op 2 renames; the name is 4 words:
  // "state.", "x", ".", "exp_avg") used to throw std::invalid_argument from stoll.
  put("optimizer_state", "structured-zero-state-x", std::string("\x19\x02\x00\x04\x00\x08\x07\x09", 8));
  // ... and a 20-digit index ("state.", "99999999999999999999", ".", "step").
  put("optimizer_state", "structured-zero-20-digits", std::string("\x19\x02\x00\x04\x00\x18\x07\x0c", 8));
  // A step count of 2^63 (op 3 sets a 0-d value; value 9 of the awkward numbers).
  put("optimizer_state", "structured-step-2-63", std::string("\x18\x03\x05\x09\x03\x00\x09", 7));
  // Raw: an AdamW's and an SGD's real state dicts, as a checkpoint file holds them.
  Tensor w = randn({3, 2}), b = randn({3});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  optim::AdamW adamw{{w, b}, optim::AdamWOptions{}};
  w.set_grad(randn({3, 2}));
  b.set_grad(randn({3}));
  adamw.step();
  put("optimizer_state", "raw-adamw", std::string(1, 8) + encode_safetensors(adamw.state_dict(), {}));
  put("optimizer_state", "raw-adamw-zero", std::string(1, 9) + encode_safetensors(adamw.state_dict(), {}));
  put("optimizer_state", "raw-scaler",
      std::string(1, 3) + encode_safetensors({{"scale", scalar_tensor(8.0)}}, {}));
}

// fuzz_fsdp_checkpoint.cpp. Byte 0: bits 0-1 the old world size - 1, bit 2 structured, bit 3
// the in-memory reader, bit 4 without the optimizer.
void fsdp_checkpoint_seeds() {
  for (int flags = 0; flags < 32; ++flags)
    if (flags & 4)
      put("fsdp_checkpoint", "structured-unchanged-" + std::to_string(flags),
          std::string(1, static_cast<char>(flags)));
  // Issue 37, finding 3: a layout whose shard size is 0 (op 4 on file 0's first layout, the root's,
  // set to [2, 0, 2, 0]: world 2, rank 0, its 2 elements, s = 0) was a SIGFPE.
  put("fsdp_checkpoint", "structured-shard-size-0", std::string("\x05\x04\x00\x00\x02\x00\x02\x00", 8));
  put("fsdp_checkpoint", "structured-shard-size-0-memory",
      std::string("\x0d\x04\x00\x00\x02\x00\x02\x00", 8));
  // A stray fsdp-rank0-of99999999999.safetensors (op 6; the words "0", "-of", "99999999999").
  put("fsdp_checkpoint", "structured-stray-huge-world", std::string("\x05\x06\x00\x03\x12\x11\x16", 7));
  // rank 1 of 2 dropped (op 5 on file 1), and the files of a second world size (op 7: -of3).
  put("fsdp_checkpoint", "structured-rank-1-missing", std::string("\x05\x05\x01", 3));
  put("fsdp_checkpoint", "structured-two-worlds", std::string("\x05\x07\x00\x02\x00", 5));
  // rank 1's file truncated to 64 bytes (op 8).
  put("fsdp_checkpoint", "structured-rank-1-truncated", std::string("\x05\x08\x01\x08", 4));
  // Raw: one rank's file of a one-unit model, and two ranks' files of it.
  const std::string sep = "\n#MGFILE#\n";
  auto rank_file = [](int64_t world, int64_t rank) {
    return encode_safetensors(
        {{"fsdp//layout", tensor(std::vector<int64_t>{world, rank, 3, (3 + world - 1) / world})},
         {"fsdp//flat_shard", zeros({(3 + world - 1) / world})}},
        {});
  };
  put("fsdp_checkpoint", "raw-one-rank", std::string(1, 0) + rank_file(1, 0));
  put("fsdp_checkpoint", "raw-two-ranks", std::string(1, 1) + rank_file(2, 0) + sep + rank_file(2, 1));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_make_seeds <corpus dir>\n");
    return 2;
  }
  out_dir = argv[1];
  safetensors_seeds();
  safetensors_writer_seeds();
  idx_seeds();
  gzip_seeds();
  object_collectives_seeds();
  checkpoint_seeds();
  optimizer_state_seeds();
  fsdp_checkpoint_seeds();
  return 0;
}
