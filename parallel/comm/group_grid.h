// A 2-D grid of process groups for hybrid parallelism (PyTorch's 2-D DeviceMesh, Megatron's
// data x tensor layout): a group of D x T ranks, rank = d * T + t, cut into
//
//   tensor groups  {d T, ..., d T + T - 1}     consecutive ranks: on one node, its fast links
//   data groups    {t, T + t, 2T + t, ...}     one rank of every tensor group
//
//   ranks 0..7, T = 2:   tensor groups {0,1} {2,3} {4,5} {6,7}   data groups {0,2,4,6} {1,3,5,7}
//
// Each rank gets its own tensor group (tensor parallelism inside it) and data group (DDP over
// it); both are ordinary subgroups (new_group), NCCL ones where the parent has NCCL.
#pragma once

#include "parallel/comm/process_group.h"

namespace mg::parallel {

struct GroupGrid {
  ProcessGroup data, tensor;  // this rank's
  int data_rank = 0, tensor_rank = 0;
  int data_size = 1, tensor_size = 1;
};

// A collective over `group` (every rank calls it): tensor_size must divide the group's size.
GroupGrid new_group_grid(const ProcessGroup& group, int tensor_size);

}  // namespace mg::parallel
