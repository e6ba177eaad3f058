// Transforms: exact outputs of Normalize / RandomCrop / RandomHorizontalFlip, and that their
// randomness depends only on (seed, epoch, index).
#include <catch2/catch.hpp>
#include <set>

#include "core/ops.h"
#include "data/transforms.h"

using namespace mg;
using namespace mg::data;
using Catch::Contains;

namespace {
// A [C, H, W] sample whose value at (c, y, x) is 100c + 10y + x + 1 (never 0, so padding shows).
Tensor coded_sample(int64_t c, int64_t h, int64_t w) {
  std::vector<float> v;
  for (int64_t k = 0; k < c; ++k)
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < w; ++x) v.push_back(float(100 * k + 10 * y + x + 1));
  return tensor<float>(v, {c, h, w});
}
}  // namespace

TEST_CASE("Normalize subtracts the mean and divides by the std per channel", "[data][transforms]") {
  Tensor x = coded_sample(2, 2, 2);
  Tensor y = Normalize({1.0, 101.0}, {2.0, 4.0})(x);
  CHECK(y.to_vector<float>() == std::vector<float>{0, 0.5, 5, 5.5, 0, 0.25, 2.5, 2.75});
  Tensor z = Normalize({1.0}, {1.0})(x);  // one value for every channel
  CHECK(z.to_vector<float>()[4] == 100.0f);
  CHECK_THROWS_WITH(Normalize({1, 2, 3}, {1, 1, 1})(x),
                    Contains("3 channel means/stds for a sample with 2 channels"));
  CHECK_THROWS_WITH(Normalize({0}, {0}), Contains("std[0] must be > 0"));
  CHECK_THROWS_WITH(Normalize({0, 1}, {1}), Contains("same, non-zero length"));
  CHECK_THROWS_WITH(Normalize({0}, {1})(arange(4).to(DType::f32)), Contains("[C, H, W] or [H, W]"));
}

TEST_CASE("RandomCrop cuts a window of the zero-padded sample", "[data][transforms]") {
  Tensor x = coded_sample(2, 5, 6);
  // No padding and full size: the identity.
  CHECK(RandomCrop(5, 6, 0)(x, {1, 2, 3}).to_vector<float>() == x.to_vector<float>());

  RandomCrop crop(4, 3, 2);  // 4 x 3 window of the 9 x 10 padded sample
  std::set<std::pair<int64_t, int64_t>> corners;
  for (int64_t index = 0; index < 300; ++index) {
    const std::vector<float> out = crop(x, {7, 0, index}).to_vector<float>();
    REQUIRE(out.size() == 2 * 4 * 3);
    // Find the (top, left) the output came from: exactly one offset must reproduce it.
    int matches = 0;
    for (int64_t top = 0; top <= 9 - 4; ++top) {
      for (int64_t left = 0; left <= 10 - 3; ++left) {
        bool same = true;
        for (int64_t c = 0; c < 2 && same; ++c)
          for (int64_t y = 0; y < 4 && same; ++y)
            for (int64_t xx = 0; xx < 3 && same; ++xx) {
              const int64_t sy = top + y - 2, sx = left + xx - 2;
              const float expect =
                  (sy >= 0 && sy < 5 && sx >= 0 && sx < 6) ? float(100 * c + 10 * sy + sx + 1) : 0.f;
              same = out[size_t((c * 4 + y) * 3 + xx)] == expect;
            }
        if (same) {
          ++matches;
          corners.insert({top, left});
        }
      }
    }
    CHECK(matches >= 1);
  }
  CHECK(corners.size() == 6 * 8);  // over 300 samples every position occurs
  CHECK(crop.output_shape({2, 5, 6}) == Shape{2, 4, 3});
  CHECK(RandomCrop(3, 1).output_shape({5, 5}) == Shape{3, 3});
  CHECK_THROWS_WITH(RandomCrop(8, 0)(x), Contains("does not fit"));
}

TEST_CASE("RandomHorizontalFlip mirrors rows with probability p", "[data][transforms]") {
  Tensor x = coded_sample(1, 2, 3);
  const std::vector<float> mirrored{3, 2, 1, 13, 12, 11};
  CHECK(RandomHorizontalFlip(1.0)(x).to_vector<float>() == mirrored);
  CHECK(RandomHorizontalFlip(0.0)(x).to_vector<float>() == x.to_vector<float>());
  RandomHorizontalFlip half(0.5);
  int flipped = 0;
  for (int64_t index = 0; index < 4000; ++index) {
    const bool f = half.flips({1, 0, index});
    flipped += f;
    if (index < 20) CHECK(half(x, {1, 0, index}).to_vector<float>() == (f ? mirrored : x.to_vector<float>()));
  }
  CHECK(flipped > 1800);  // expected 2000, sd ~32
  CHECK(flipped < 2200);
  CHECK_THROWS_WITH(RandomHorizontalFlip(1.5), Contains("p must be in [0, 1]"));
}

TEST_CASE("Random decisions depend only on (seed, epoch, index)", "[data][transforms][determinism]") {
  Tensor x = coded_sample(1, 8, 8);
  Compose t(RandomCrop(8, 2), RandomHorizontalFlip());
  CHECK(t(x, {5, 1, 9}).to_vector<float>() == t(x, {5, 1, 9}).to_vector<float>());
  int differ_epoch = 0, differ_seed = 0;
  for (int64_t index = 0; index < 50; ++index) {
    const auto base = t(x, {5, 1, index}).to_vector<float>();
    differ_epoch += base != t(x, {5, 2, index}).to_vector<float>();
    differ_seed += base != t(x, {6, 1, index}).to_vector<float>();
  }
  CHECK(differ_epoch > 35);  // new augmentation each epoch (a repeat has probability ~1/50)
  CHECK(differ_seed > 35);

  // apply_batch uses row b's dataset index: the same as transforming each sample alone.
  Tensor batch = stack({x, mul(x, 2.0), mul(x, 3.0)});
  const std::vector<int64_t> indices{40, 2, 40};
  const std::vector<float> out = t.apply_batch(batch, indices, 3, 5).to_vector<float>();
  for (size_t b = 0; b < 3; ++b) {
    const auto alone = t(batch.select(0, int64_t(b)), {5, 3, indices[b]}).to_vector<float>();
    CHECK(std::vector<float>(out.begin() + b * 64, out.begin() + (b + 1) * 64) == alone);
  }
  CHECK_THROWS_WITH(t.apply_batch(batch, {1, 2}, 0, 0), Contains("has 3 rows but 2 indices"));
}

TEST_CASE("Compose chains shapes; identical stages decide independently", "[data][transforms]") {
  Compose t(RandomCrop(6, 0), Normalize({1.0}, {2.0}));
  CHECK(t.output_shape({3, 8, 8}) == Shape{3, 6, 6});
  CHECK(Compose()(coded_sample(1, 2, 2)).to_vector<float>() == std::vector<float>{1, 2, 11, 12});
  // Two flips in a row: if they shared their coin the result would always be the identity.
  Compose twice(RandomHorizontalFlip(0.5), RandomHorizontalFlip(0.5));
  Tensor x = coded_sample(1, 1, 4);
  int changed = 0;
  for (int64_t index = 0; index < 100; ++index)
    changed += twice(x, {0, 0, index}).to_vector<float>() != x.to_vector<float>();
  CHECK(changed > 30);  // expected 50
  CHECK_THROWS_WITH(Compose(std::vector<std::shared_ptr<const Transform>>{nullptr}),
                    Contains("stage 0 is null"));
}
