// multigrad's public API in one include.
#pragma once

#include "core/allocator.h"
#include "core/autograd/node.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/grad_mode.h"
#include "core/ops.h"
#include "core/random.h"
#include "core/tensor.h"
#include "core/autocast.h"
#include "core/safetensors.h"
#include "core/state_dict.h"
