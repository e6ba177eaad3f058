// The emulated NCCL's errors and its registry of communicators (nccl_internal.h): what
// ncclGetLastError tells, NCCL_DEBUG's printing, async errors, and whether a handle is live.
#include <strings.h>
#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#include "cuda_emu/nccl_internal.h"

namespace mg_emu::nccl {

std::mutex g_registry_mutex;
std::unordered_set<const ncclComm*> g_comms;
std::mutex g_error_mutex;
std::string g_last_error;

void record(ncclComm* comm, const std::string& text) {
  static const bool warn = [] {
    const char* level = std::getenv("NCCL_DEBUG");
    return level != nullptr &&
           (!strcasecmp(level, "WARN") || !strcasecmp(level, "INFO") || !strcasecmp(level, "TRACE"));
  }();
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    g_last_error = text;
    if (comm != nullptr) comm->last_error = text;
  }
  if (warn) std::fprintf(stderr, "[pid %d] NCCL WARN (emulated) %s\n", int(getpid()), text.c_str());
}

ncclResult_t fail(ncclComm* comm, ncclResult_t result, const char* format, ...) {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  record(comm, text);
  return result;
}

std::string mpi_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, size_t(length));
}

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

void set_async(ncclComm* comm, ncclResult_t code, const std::string& text) {
  int expected = ncclSuccess;
  comm->async.compare_exchange_strong(expected, code);  // the first error sticks
  record(comm, text);
}

bool registered(const ncclComm* comm) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  return g_comms.count(comm) != 0;
}

// May `comm` take a new operation? (NCCL's CommCheck and ncclCommEnsureReady.)
ncclResult_t usable(ncclComm* comm, const char* name) {
  if (comm == nullptr) return fail(nullptr, ncclInvalidArgument, "%s : comm argument is NULL", name);
  if (!registered(comm))
    return fail(nullptr, ncclInvalidArgument, "%s : comm %p was not made by ncclCommInitRank", name,
                static_cast<void*>(comm));
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->dead || comm->closing)
      return fail(comm, ncclInvalidUsage, "%s : the communicator has been destroyed or aborted", name);
  }
  // A failed communicator returns its error; its last error still tells the cause.
  return ncclResult_t(comm->async.load());
}

}  // namespace mg_emu::nccl
