#include "core/storage.h"

#include "core/allocator.h"

namespace mg {

Storage::Storage(size_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  data_ = device_allocate(nbytes, device);
}

Storage::~Storage() { device_free(data_, nbytes_, device_); }

}  // namespace mg
