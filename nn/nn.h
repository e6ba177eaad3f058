// Everything in nn/ in one include: Module, the layers, init, losses, the zoo.
#pragma once

#include "nn/activation.h"
#include "nn/activation_checkpoint.h"
#include "nn/attention.h"
#include "nn/container.h"
#include "nn/conv.h"
#include "nn/dropout.h"
#include "nn/embedding.h"
#include "nn/flatten.h"
#include "nn/init.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/module.h"
#include "nn/normalization.h"
#include "nn/pooling.h"
#include "nn/transformer.h"
#include "nn/zoo.h"
