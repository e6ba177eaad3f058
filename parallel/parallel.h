// The parallel module's public headers in one include.
//
//   DataParallel (one process, several devices): replicate → scatter → parallel_apply → gather
//   ProcessGroup (one process per device): the collectives DistributedDataParallel is built on
#pragma once

#include "parallel/broadcast.h"
#include "parallel/data_parallel.h"
#include "parallel/parallel_apply.h"
#include "parallel/process_group.h"
#include "parallel/replicate.h"
#include "parallel/scatter_gather.h"
