// Normalize, RandomCrop, RandomHorizontalFlip and Compose as loops over raw floats.
#include "data/transforms.h"

#include <algorithm>
#include <cstring>

#include "base/error.h"
#include "core/grad_mode.h"
#include "data/seeding.h"

namespace mg::data {

namespace {
struct CHW {
  int64_t c, h, w;
};
// [C, H, W] or [H, W] (one channel).
CHW chw(const Shape& shape, const char* who) {
  MG_CHECK(shape.size() == 2 || shape.size() == 3, who,
           ": expected a sample of shape [C, H, W] or [H, W], got ", shape_str(shape));
  if (shape.size() == 2) return CHW{1, shape[0], shape[1]};
  return CHW{shape[0], shape[1], shape[2]};
}

Tensor as_cpu_f32(const Tensor& t, const char* who) {
  MG_CHECK(t.defined(), who, ": undefined tensor");
  MG_CHECK(t.device().is_cpu(), who, ": transforms run on the CPU, got a tensor on ", t.device());
  MG_CHECK(is_floating(t.dtype()), who, ": expected a floating-point sample, got ", t.dtype());
  return t.detach().to(DType::f32).contiguous();
}
}  // namespace

// ---- Transform: the Tensor-level entry points -------------------------------------------------

Tensor Transform::operator()(const Tensor& sample, const SampleKey& key) const {
  Tensor in = as_cpu_f32(sample, "Transform");
  Tensor out = empty(output_shape(in.shape()));
  apply(in.data<float>(), in.shape(), out.data<float>(), key);
  return out;
}

Tensor Transform::apply_batch(const Tensor& batch, const std::vector<int64_t>& indices, int64_t epoch,
                              uint64_t seed) const {
  Tensor in = as_cpu_f32(batch, "Transform::apply_batch");
  MG_CHECK(in.dim() >= 1 && in.size(0) == static_cast<int64_t>(indices.size()),
           "Transform::apply_batch: batch ", shape_str(in.shape()), " has ", in.dim() ? in.size(0) : 0,
           " rows but ", indices.size(), " indices were given");
  const Shape sample_shape(in.shape().begin() + 1, in.shape().end());
  const Shape out_sample = output_shape(sample_shape);
  Shape out_shape{in.size(0)};
  out_shape.insert(out_shape.end(), out_sample.begin(), out_sample.end());
  Tensor out = empty(out_shape);
  const int64_t in_numel = shape_numel(sample_shape), out_numel = shape_numel(out_sample);
  const float* src = in.data<float>();
  float* dst = out.data<float>();
  for (size_t b = 0; b < indices.size(); ++b) {
    apply(src + b * in_numel, sample_shape, dst + b * out_numel, SampleKey{seed, epoch, indices[b]});
  }
  return out;
}

// ---- Normalize --------------------------------------------------------------------------------

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) {
  MG_CHECK(!mean.empty() && mean.size() == std.size(),
           "Normalize: mean and std need the same, non-zero length, got ", mean.size(), " and ", std.size());
  for (size_t c = 0; c < mean.size(); ++c) {
    MG_CHECK(std[c] > 0, "Normalize: std[", c, "] must be > 0, got ", std[c]);
    mean_.push_back(static_cast<float>(mean[c]));
    inv_std_.push_back(static_cast<float>(1.0 / std[c]));
  }
}

Shape Normalize::output_shape(const Shape& in) const {
  const CHW s = chw(in, "Normalize");
  MG_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == s.c, "Normalize: ", mean_.size(),
           " channel means/stds for a sample with ", s.c, " channels (shape ", shape_str(in), ")");
  return in;
}

void Normalize::apply(const float* in, const Shape& in_shape, float* out, const SampleKey&) const {
  const CHW s = chw(in_shape, "Normalize");
  const int64_t plane = s.h * s.w;
  for (int64_t c = 0; c < s.c; ++c) {
    const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    const float m = mean_[k], inv = inv_std_[k];
    for (int64_t i = 0; i < plane; ++i) out[c * plane + i] = (in[c * plane + i] - m) * inv;
  }
}

// ---- RandomCrop -------------------------------------------------------------------------------

RandomCrop::RandomCrop(int64_t size_h, int64_t size_w, int64_t padding)
    : size_h_(size_h), size_w_(size_w), padding_(padding) {
  MG_CHECK(size_h > 0 && size_w > 0, "RandomCrop: size must be positive, got ", size_h, " x ", size_w);
  MG_CHECK(padding >= 0, "RandomCrop: padding must be >= 0, got ", padding);
}

Shape RandomCrop::output_shape(const Shape& in) const {
  const CHW s = chw(in, "RandomCrop");
  MG_CHECK(size_h_ <= s.h + 2 * padding_ && size_w_ <= s.w + 2 * padding_, "RandomCrop: a ", size_h_, " x ",
           size_w_, " crop does not fit a ", s.h, " x ", s.w, " sample padded by ", padding_);
  return in.size() == 2 ? Shape{size_h_, size_w_} : Shape{s.c, size_h_, size_w_};
}

void RandomCrop::apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const {
  const CHW s = chw(in_shape, "RandomCrop");
  // Top-left corner of the window in padded coordinates, uniform over every position that fits.
  const Random128 r = philox128(stream_key(key.seed, Stream::Crop), static_cast<uint64_t>(key.index),
                                static_cast<uint64_t>(key.epoch));
  const int64_t top =
      static_cast<int64_t>(below(r.lo, static_cast<uint64_t>(s.h + 2 * padding_ - size_h_ + 1)));
  const int64_t left =
      static_cast<int64_t>(below(r.hi, static_cast<uint64_t>(s.w + 2 * padding_ - size_w_ + 1)));
  for (int64_t c = 0; c < s.c; ++c) {
    for (int64_t y = 0; y < size_h_; ++y) {
      const int64_t src_y = top + y - padding_;  // row in the unpadded sample
      float* dst = out + (c * size_h_ + y) * size_w_;
      for (int64_t x = 0; x < size_w_; ++x) {
        const int64_t src_x = left + x - padding_;
        const bool inside = src_y >= 0 && src_y < s.h && src_x >= 0 && src_x < s.w;
        dst[x] = inside ? in[(c * s.h + src_y) * s.w + src_x] : 0.0f;
      }
    }
  }
}

// ---- RandomHorizontalFlip ---------------------------------------------------------------------

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  MG_CHECK(p >= 0.0 && p <= 1.0, "RandomHorizontalFlip: p must be in [0, 1], got ", p);
}

Shape RandomHorizontalFlip::output_shape(const Shape& in) const {
  chw(in, "RandomHorizontalFlip");
  return in;
}

bool RandomHorizontalFlip::flips(const SampleKey& key) const {
  const Random128 r = philox128(stream_key(key.seed, Stream::Flip), static_cast<uint64_t>(key.index),
                                static_cast<uint64_t>(key.epoch));
  return unit_double(r.lo) < p_;
}

void RandomHorizontalFlip::apply(const float* in, const Shape& in_shape, float* out,
                                 const SampleKey& key) const {
  const CHW s = chw(in_shape, "RandomHorizontalFlip");
  const bool flip = flips(key);
  for (int64_t row = 0; row < s.c * s.h; ++row) {
    const float* src = in + row * s.w;
    float* dst = out + row * s.w;
    if (flip) {
      std::reverse_copy(src, src + s.w, dst);
    } else {
      std::memcpy(dst, src, static_cast<size_t>(s.w) * sizeof(float));
    }
  }
}

// ---- Compose ----------------------------------------------------------------------------------

Compose::Compose(std::vector<std::shared_ptr<const Transform>> stages) : stages_(std::move(stages)) {
  for (size_t s = 0; s < stages_.size(); ++s)
    MG_CHECK(stages_[s] != nullptr, "Compose: stage ", s, " is null");
}

Shape Compose::output_shape(const Shape& in) const {
  Shape shape = in;
  for (const auto& stage : stages_) shape = stage->output_shape(shape);
  return shape;
}

void Compose::apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const {
  if (stages_.empty()) {
    std::memcpy(out, in, static_cast<size_t>(shape_numel(in_shape)) * sizeof(float));
    return;
  }
  // Ping-pong between two scratch buffers; the last stage writes straight into `out`.
  std::vector<float> scratch[2];
  const float* src = in;
  Shape shape = in_shape;
  for (size_t s = 0; s < stages_.size(); ++s) {
    const Shape next = stages_[s]->output_shape(shape);
    float* dst = out;
    if (s + 1 < stages_.size()) {
      scratch[s % 2].resize(static_cast<size_t>(shape_numel(next)));
      dst = scratch[s % 2].data();
    }
    SampleKey stage_key = key;
    stage_key.seed = derive_key(key.seed, 0x100 + s);
    stages_[s]->apply(src, shape, dst, stage_key);
    src = dst;
    shape = next;
  }
}

}  // namespace mg::data
