// The parallel module's public headers in one include.
//
//   DataParallel (one process, several devices): replicate → scatter → parallel_apply → gather
//   ProcessGroup (one process per device): the collectives DistributedDataParallel is built on
//   DistributedDataParallel: bucketed gradient all-reduce overlapped with backward (Reducer)
//   ring_allreduce: multigrad's own all-reduce over the group's send/recv
//   distributed.h: seed_for_rank, synchronize_grad_scaler, rank-0 checkpoints
//   beyond data parallelism: ZeroRedundancyOptimizer (ZeRO-1), tensor_parallel.h (column / row
//   parallel layers), tensor_parallel_gpt.h (TensorParallelGPT), pipeline.h (GPipe, 1F1B)
#pragma once

#include "parallel/broadcast.h"
#include "parallel/data_parallel.h"
#include "parallel/distributed.h"
#include "parallel/distributed_data_parallel.h"
#include "parallel/group_grid.h"
#include "parallel/object_collectives.h"
#include "parallel/parallel_apply.h"
#include "parallel/pipeline.h"
#include "parallel/process_group.h"
#include "parallel/reducer.h"
#include "parallel/replicate.h"
#include "parallel/ring_allreduce.h"
#include "parallel/scatter_gather.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tensor_parallel_gpt.h"
#include "parallel/work.h"
#include "parallel/zero_redundancy_optimizer.h"
