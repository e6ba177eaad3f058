// Uses multigrad through its installed headers and library only, the way a user's program would:
// a small MLP trained for a few SGD steps on a TensorDataset through a DataLoader. Built at C++17,
// C++20 and C++23 (CMakeLists.txt); the same code must compile, without warnings, at each.
// Prints "multigrad consumer (C++NN): loss <first> -> <last>" and exits 0 when the loss fell.
#include <cstdio>

#include "multigrad.h"  // the umbrella header must be self-contained once installed

int main() {
  using namespace mg;
  manual_seed(7);
  Tensor inputs = randn({64, 8});
  Tensor targets = gt(inputs.sum({1}), 0.0).to(DType::i64);  // two classes: is the sum positive?
  data::TensorDataset dataset(inputs, targets);
  data::DataLoaderOptions loader_options;  // options are aggregates: set the fields by name
  loader_options.batch_size = 16;
  loader_options.shuffle = true;
  data::DataLoader loader(dataset, loader_options);

  nn::MLP model(8, {16}, 2);
  optim::SGDOptions sgd;
  sgd.lr = 0.1;
  sgd.momentum = 0.9;
  optim::SGD opt(model.parameters(), sgd);

  const Device device = model.parameters().front().device();
  double first = -1, last = -1;
  for (int epoch = 0; epoch < 5; ++epoch) {
    for (auto it = loader.begin(); it != loader.end(); ++it) {  // the iterator's == and !=
      Tensor loss = cross_entropy(model(it->data.to(device)), it->target.to(device));
      opt.zero_grad();
      loss.backward();
      opt.step();
      last = loss.item<double>();
      if (first < 0) first = last;
    }
  }
  const bool on_cpu = device == Device::cpu();  // Device's operator== (C++20 rewrites it)
  std::printf("multigrad consumer (C++%d): loss %.4f -> %.4f on %s%s\n", MG_CONSUMER_STANDARD, first, last,
              device.str().c_str(), on_cpu ? "" : " (not the CPU?)");
  std::printf("multigrad consumer (C++%d): %s\n", MG_CONSUMER_STANDARD, cuda::describe_devices().c_str());
  return last < first && on_cpu ? 0 : 1;
}
