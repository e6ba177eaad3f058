// new_group_grid: the D + T new_group calls of a data x tensor grid, in the same order on every
// rank (group_grid.h).
#include "parallel/comm/group_grid.h"

#include <vector>

#include "base/error.h"

namespace mg::parallel {

GroupGrid new_group_grid(const ProcessGroup& group, int tensor_size) {
  const int world = group.size();
  MG_CHECK(tensor_size >= 1 && world % tensor_size == 0, "new_group_grid: tensor_size ", tensor_size,
           " does not divide the group's ", world, " ranks");
  GroupGrid grid;
  grid.tensor_size = tensor_size;
  grid.data_size = world / tensor_size;
  grid.tensor_rank = group.rank() % tensor_size;
  grid.data_rank = group.rank() / tensor_size;
  for (int d = 0; d < grid.data_size; ++d) {
    std::vector<int> ranks;
    for (int t = 0; t < tensor_size; ++t) ranks.push_back(d * tensor_size + t);
    ProcessGroup g = group.new_group(ranks);
    if (g.defined()) grid.tensor = g;
  }
  for (int t = 0; t < tensor_size; ++t) {
    std::vector<int> ranks;
    for (int d = 0; d < grid.data_size; ++d) ranks.push_back(d * tensor_size + t);
    ProcessGroup g = group.new_group(ranks);
    if (g.defined()) grid.data = g;
  }
  return grid;
}

}  // namespace mg::parallel
