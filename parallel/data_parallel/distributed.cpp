// Distributed training helpers: agreed GradScaler skips (distributed.h).
#include "parallel/data_parallel/distributed.h"

#include "parallel/comm/object_collectives.h"

namespace mg::parallel {

void synchronize_grad_scaler(optim::GradScaler& scaler, const ProcessGroup& group) {
  ProcessGroup pg = group;  // a handle: copies share the communicator
  scaler.set_found_inf_reducer([pg](bool local_found_inf) mutable { return any_rank(pg, local_found_inf); });
}

}  // namespace mg::parallel
