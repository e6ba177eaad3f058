// The parallel module's public headers in one include, by folder (one folder per strategy):
//
//   comm/           ProcessGroup over MPI (CPU) and NCCL (GPU), Work, the object collectives
//                   (broadcast_object, any_rank), new_group_grid, and ring_allreduce: multigrad's
//                   own all-reduce over the group's send/recv
//   data_parallel/  DataParallel (one process, several devices: replicate -> scatter ->
//                   parallel_apply -> gather) and DistributedDataParallel (one process per
//                   device: the Reducer's bucketed all-reduce overlapped with backward);
//                   seed_for_rank, synchronize_grad_scaler
//   zero/           ZeroRedundancyOptimizer (ZeRO-1: optimizer state sharded over the ranks)
//   tensor_parallel/ Megatron-style column / row parallel layers and TensorParallelGPT
//   context_parallel/ ring_attention: the sequence split over the ranks, K and V passed around
//                   a ring (contiguous or zigzag layout); ulysses_attention: the sequence split
//                   exchanged for a heads split by all-to-all; ContextParallelGPT: a TinyGPT
//                   on each rank's positions, either attention, DDP over its copies
//   pipeline/       pipeline stages with the GPipe, 1F1B and interleaved 1F1B schedules
//   resilience/     CheckpointManager (step checkpoints, exact resume), ShardedMetric, and the
//                   heartbeat that turns a dead or hung rank into an error on every survivor
#pragma once

#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/group_grid.h"
#include "parallel/comm/object_collectives.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/ring_allreduce.h"
#include "parallel/comm/work.h"
#include "parallel/context_parallel/context_parallel_gpt.h"
#include "parallel/context_parallel/ring_attention.h"
#include "parallel/context_parallel/ulysses_attention.h"
#include "parallel/data_parallel/broadcast.h"
#include "parallel/data_parallel/data_parallel.h"
#include "parallel/data_parallel/distributed.h"
#include "parallel/data_parallel/distributed_data_parallel.h"
#include "parallel/data_parallel/join.h"
#include "parallel/data_parallel/parallel_apply.h"
#include "parallel/data_parallel/reducer.h"
#include "parallel/data_parallel/replicate.h"
#include "parallel/data_parallel/scatter_gather.h"
#include "parallel/data_parallel/sync_batch_norm.h"
#include "parallel/fsdp/fsdp_state_dict.h"
#include "parallel/fsdp/fully_sharded_data_parallel.h"
#include "parallel/pipeline/pipeline.h"
#include "parallel/resilience/checkpoint_manager.h"
#include "parallel/resilience/sharded_metric.h"
#include "parallel/tensor_parallel/tensor_parallel.h"
#include "parallel/tensor_parallel/tensor_parallel_gpt.h"
#include "parallel/zero/zero_redundancy_optimizer.h"
