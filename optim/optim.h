// optim/: everything for updating parameters in one include -- optimizers
// (SGD, Adam, AdamW), learning-rate schedulers, gradient clipping and
// gradient accumulation. See docs/nn-and-optim.md.
#pragma once

#include "optim/adam.h"
#include "optim/clip_grad.h"
#include "optim/grad_accumulation.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "optim/sgd.h"
