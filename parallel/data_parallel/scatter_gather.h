// scatter and gather: how DataParallel splits a batch across devices and joins the
// replicas' outputs again.
//
//   scatter(x [10, ...], {d0, d1, d2, d3})       chunk = ceil(10 / 4) = 3 rows
//
//     rows 0-2 ─▶ d0     rows 3-5 ─▶ d1     rows 6-8 ─▶ d2     row 9 ─▶ d3   (uneven last chunk)
//
//   scatter(x [5, ...], 4 devices): chunk = 2 → 2, 2, 1 rows on d0, d1, d2; d3 gets nothing
//   and DataParallel runs only 3 replicas (torch.chunk's rule, which PyTorch's scatter uses).
//
//   gather({y0 on d0, y1 on d1, y2 on d2}, d0) = cat(y0, y1.to(d0), y2.to(d0))
//
// Both are built from differentiable ops (narrow + to, to + cat), so autograd routes
// gradients back: the gradient of a gathered output is split again by rows and sent to
// the device that produced each part; the gradient of a scattered input is reassembled
// on the input's device.
#pragma once

#include <vector>

#include "core/base/device.h"
#include "core/tensor.h"

namespace mg::parallel {

// Splits `input` along `dim` with chunk(input, devices.size(), dim): pieces of
// ceil(rows / devices) rows, the last one possibly smaller, so (10 rows, 4 devices)
// gives 3, 3, 3, 1 and (5, 4) gives 2, 2, 1. Moves piece i to devices[i] and returns
// one tensor per piece, which may be fewer than the devices; a piece that is already
// on its device is a view (no copy).
std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices, int64_t dim = 0);

// Moves every output to `destination` and concatenates them along `dim`. Outputs with
// zero dims (a scalar per replica, e.g. a loss) are stacked into a vector instead, as
// PyTorch's gather does.
Tensor gather(const std::vector<Tensor>& outputs, Device destination, int64_t dim = 0);

}  // namespace mg::parallel
