// mg::data in one include: datasets, samplers, transforms and the DataLoader.
#pragma once

#include "data/dataloader.h"
#include "data/dataset.h"
#include "data/distributed_sampler.h"
#include "data/fashion_mnist.h"
#include "data/gzip.h"
#include "data/idx.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "data/transforms.h"
