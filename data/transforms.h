// Transforms: per-sample preprocessing and augmentation (torchvision.transforms, in C++).
//
// A transform maps one sample (f32, CPU, [C, H, W] or [H, W]) to another. Random transforms do
// not own a generator: every decision is drawn from Philox keyed by a SampleKey {seed, epoch,
// index} (see seeding.h). The DataLoader fills the key with its seed, the epoch it is running
// and the sample's dataset index, so a sample's augmentation is the same whichever worker thread
// (or how many) produced it, changes from epoch to epoch, and can be reproduced on its own.
//
// Each transform is a small kernel on raw floats — apply(in, shape, out, key) — with Tensor
// conveniences on top: t(sample, key) for one sample, t.apply_batch(batch, indices, epoch, seed)
// for the rows of a [B, ...] batch (what the DataLoader calls).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace mg::data {

struct SampleKey {
  uint64_t seed = 0;  // the DataLoader's seed (add the rank for per-rank augmentation)
  int64_t epoch = 0;
  int64_t index = 0;  // the sample's index in the dataset
};

class Transform {
 public:
  virtual ~Transform() = default;
  // The output shape for an input sample of shape `in` ([C, H, W] or [H, W]); throws if `in` is
  // not accepted.
  virtual Shape output_shape(const Shape& in) const { return in; }
  // Writes the transformed sample to `out` (output_shape(in_shape) floats). `in` and `out` never
  // alias.
  virtual void apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const = 0;

  // One sample (any float dtype is converted to f32; must be on the CPU).
  Tensor operator()(const Tensor& sample, const SampleKey& key = {}) const;
  // Row b of `batch` is the sample with dataset index indices[b].
  Tensor apply_batch(const Tensor& batch, const std::vector<int64_t>& indices, int64_t epoch,
                     uint64_t seed) const;
};

// (x - mean[c]) / std[c] per channel c; one value applies to every channel.
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const override;

 private:
  std::vector<float> mean_, inv_std_;
};

// Pads each side with `padding` zeros, then cuts a size_h x size_w window at a random position
// (torchvision's RandomCrop(size, padding)). The classic CIFAR/Fashion-MNIST augmentation.
class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t size, int64_t padding = 0) : RandomCrop(size, size, padding) {}
  RandomCrop(int64_t size_h, int64_t size_w, int64_t padding);
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const override;

 private:
  int64_t size_h_, size_w_, padding_;
};

// Mirrors the sample left-right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const override;
  // Whether the sample with this key is flipped (exposed for tests).
  bool flips(const SampleKey& key) const;

 private:
  double p_;
};

// Runs transforms in order. Stage s sees the key with its seed mixed with s, so two identical
// random transforms in one Compose make independent decisions.
class Compose : public Transform {
 public:
  explicit Compose(std::vector<std::shared_ptr<const Transform>> stages);
  // Compose(RandomCrop(28, 4), RandomHorizontalFlip(), Normalize({0.286}, {0.353}))
  template <class... Ts, class = std::enable_if_t<(std::is_base_of_v<Transform, Ts> && ...)>>
  explicit Compose(Ts... stages)
      : Compose(
            std::vector<std::shared_ptr<const Transform>>{std::make_shared<const Ts>(std::move(stages))...}) {
  }

  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, const SampleKey& key) const override;

 private:
  std::vector<std::shared_ptr<const Transform>> stages_;
};

}  // namespace mg::data
