// Embedding: a lookup table. Row i of `weight` is the vector of token i.
//
//   weight [num_embeddings, embedding_dim];  indices [...] (i64) -> [..., embedding_dim]
//
// Initialised N(0, 1) like PyTorch's nn.Embedding; the row `padding_idx` (when
// given) starts at zero and never receives a gradient.
#pragma once

#include "nn/module.h"

namespace mg::nn {

class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, int64_t padding_idx = -1);
  Tensor forward(const Tensor& indices) override;
  std::shared_ptr<Module> clone_empty() const override;
  std::string extra_repr() const override;

  const int64_t num_embeddings, embedding_dim, padding_idx;  // padding_idx -1: none
  Tensor weight;
};

}  // namespace mg::nn
