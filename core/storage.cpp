#include "core/storage.h"

#include "base/error.h"
#include "core/allocator.h"

namespace mg {

Storage::Storage(size_t nbytes, Device device, bool pinned)
    : nbytes_(nbytes), device_(device), pinned_(pinned) {
  if (pinned) {
    MG_CHECK(device.is_cpu(), "Storage: pinned memory is host memory; asked for it on ", device);
    data_ = pinned_allocate(nbytes);
  } else {
    data_ = device_allocate(nbytes, device);
  }
}

void Storage::release_memory() {
  MG_CHECK(!pinned_, "Storage::release_memory: pinned host memory cannot be released and reallocated");
  if (data_ == nullptr) return;
  device_free(data_, nbytes_, device_);
  data_ = nullptr;
}

void Storage::reallocate_memory() {
  if (data_ != nullptr || nbytes_ == 0) return;
  data_ = device_allocate(nbytes_, device_);
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  if (pinned_) {
    pinned_free(data_, nbytes_);
  } else {
    device_free(data_, nbytes_, device_);
  }
}

}  // namespace mg
