// The emulated NCCL's operations as stream tasks. Each operation (each group) takes a ticket per
// communicator when it is enqueued, and its task waits for that communicator's turn: one task at
// a time per communicator, in call order, across streams too. (NCCL needs every rank to issue a
// communicator's operations in one order, and MPI collectives on one communicator must not run
// concurrently from two threads.) A group over several streams runs on the first ("leader"), and
// a task on each of the others waits until it is done. A task that fails sets its communicators'
// async error; queued tasks then skip their work.
#include <algorithm>
#include <memory>

#include "cuda_emu/nccl_internal.h"
#include "cuda_emu/runtime_internal.h"

namespace mg_emu::nccl {

std::mutex g_launch_mutex;  // a group takes its tickets on all its communicators at once
thread_local GroupState g_group;

namespace {

// One operation or one group, as enqueued: it runs on its first stream ("leader"); a task on each
// of the group's other streams waits until it is done.
struct Task {
  std::vector<Op> ops;
  std::vector<ncclComm*> comms;  // distinct, in order of first use
  std::vector<uint64_t> tickets;
  int followers = 0;
  std::mutex mutex;  // guards arrived and done
  std::condition_variable cv;
  int arrived = 0;
  bool done = false;
};

// Waits for the ticket's turn on `comm`: true once it has it (release() passes it on), false if the
// communicator is aborted first.
bool take_turn(ncclComm* comm, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(comm->mutex);
  while (comm->turn != ticket && !comm->aborted.load()) comm->cv.wait_for(lock, milliseconds(5));
  return comm->turn == ticket;
}

// With every turn taken: may the task use MPI? Not on an aborted or failed communicator.
bool begin(ncclComm* comm) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (comm->aborted.load() || comm->async.load() != ncclSuccess) return false;
  comm->in_mpi = true;
  return true;
}

void release(ncclComm* comm, bool owned, bool began) {
  std::lock_guard<std::mutex> lock(comm->mutex);
  if (began) comm->in_mpi = false;
  if (owned) ++comm->turn;
  ++comm->finished;
  comm->cv.notify_all();
}

void run_task(Task& task) {
  const size_t count = task.comms.size();
  std::vector<char> owned(count, 0), began(count, 0);
  try {
    {
      std::unique_lock<std::mutex> lock(task.mutex);  // the group's other streams have reached it
      while (task.arrived < task.followers) {
        if (any_aborted(task.comms)) throw Stop{ncclSuccess, std::string()};
        task.cv.wait_for(lock, milliseconds(5));
      }
    }
    // Taking every turn before using MPI on any: an abort never waits for a task that waits for a
    // turn. (All groups take their tickets in one global order, so the turns cannot deadlock.)
    for (size_t i = 0; i < count; ++i)
      if (!(owned[i] = take_turn(task.comms[i], task.tickets[i]))) throw Stop{ncclSuccess, std::string()};
    for (size_t i = 0; i < count; ++i)
      if (!(began[i] = begin(task.comms[i]))) throw Stop{ncclSuccess, std::string()};
    execute(task.comms, task.ops);  // cancels what it can on a Stop
  } catch (const Stop& stop) {
    for (ncclComm* comm : task.comms) {
      if (stop.code != ncclSuccess) {
        set_async(comm, stop.code, stop.message);
      } else if (count > 1 && !comm->aborted.load() && comm->async.load() == ncclSuccess) {
        set_async(comm, ncclSystemError,
                  "a group gave up: another of its communicators was aborted or failed");
      }
    }
  } catch (const std::exception& e) {  // std::bad_alloc for scratch buffers
    for (ncclComm* comm : task.comms)
      set_async(comm, ncclSystemError, std::string("emulated NCCL: ") + e.what());
  }
  // A live communicator must not stall behind this task: turns not taken yet are passed on too.
  for (size_t i = 0; i < count; ++i) {
    if (!owned[i]) owned[i] = take_turn(task.comms[i], task.tickets[i]);
    release(task.comms[i], owned[i], began[i]);
  }
  std::lock_guard<std::mutex> lock(task.mutex);
  task.done = true;
  task.cv.notify_all();
}

void follow(Task& task) {
  std::unique_lock<std::mutex> lock(task.mutex);
  ++task.arrived;
  task.cv.notify_all();
  while (!task.done && !any_aborted(task.comms)) task.cv.wait_for(lock, milliseconds(5));
}

}  // namespace

ncclResult_t launch(std::vector<Op> ops, const char* label) {
  if (ops.empty()) return ncclSuccess;
  auto task = std::make_shared<Task>();
  std::vector<cudaStream_t> streams;
  for (const Op& o : ops) {
    if (std::find(task->comms.begin(), task->comms.end(), o.comm) == task->comms.end())
      task->comms.push_back(o.comm);
    if (std::find(streams.begin(), streams.end(), o.stream) == streams.end()) streams.push_back(o.stream);
  }
  for (ncclComm* comm : task->comms) {  // a group's communicators may have failed since its calls
    const ncclResult_t result = usable(comm, "ncclGroupEnd");
    if (result != ncclSuccess) return result;
  }
  task->ops = std::move(ops);
  task->followers = int(streams.size()) - 1;
  std::lock_guard<std::mutex> launching(g_launch_mutex);
  for (ncclComm* comm : task->comms) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    task->tickets.push_back(comm->tickets++);
  }
  try {
    for (size_t i = 1; i < streams.size(); ++i) mg_emu::enqueue(streams[i], label, [task] { follow(*task); });
    mg_emu::enqueue(streams[0], label, [task] { run_task(*task); });
  } catch (const std::exception& e) {
    // The task will never run and its turns never come: its communicators cannot go on.
    for (ncclComm* comm : task->comms) {
      set_async(comm, ncclUnhandledCudaError,
                std::string(label) + ": enqueueing on the stream failed: " + e.what());
      std::lock_guard<std::mutex> lock(comm->mutex);
      comm->aborted.store(true);
      comm->cv.notify_all();
    }
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

ncclResult_t submit(const Op& o) {
  const ncclResult_t result = validate(o);
  if (result != ncclSuccess) {
    if (g_group.depth > 0 && g_group.error == ncclSuccess) g_group.error = result;
    return result;
  }
  if (o.count == 0) return ncclSuccess;  // nothing moves, on any rank
  if (g_group.depth > 0) {
    g_group.ops.push_back(o);
    return ncclSuccess;
  }
  return launch({o}, label_of(o.kind));
}

}  // namespace mg_emu::nccl
