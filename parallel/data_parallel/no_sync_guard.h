// The guard behind DistributedDataParallel::no_sync() and ZeRO-2's no_sync(): for its scope the
// reducer's backward passes skip their collective and let .grad accumulate locally; the first
// synchronised backward after it reduces the accumulated sum. Restores the previous setting, so
// scopes nest. `SyncReducer` is any class with bool sync() and set_sync(bool).
#pragma once

namespace mg::parallel {

template <class SyncReducer>
class NoSyncGuard {
 public:
  explicit NoSyncGuard(SyncReducer& reducer) : reducer_(&reducer), previous_(reducer.sync()) {
    reducer.set_sync(false);
  }
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_sync(previous_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : reducer_(other.reducer_), previous_(other.previous_) {
    other.reducer_ = nullptr;
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  SyncReducer* reducer_;
  bool previous_;
};

}  // namespace mg::parallel
