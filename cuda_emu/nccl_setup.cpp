// The emulated NCCL's communicator set-up: ncclGetUniqueId and ncclCommInitRank.
//
// One rank needs no MPI. More need MPI initialised by the program with MPI_THREAD_MULTIPLE. A
// communicator of the whole MPI world splits MPI_COMM_WORLD (key = nccl rank). A smaller one (a
// subgroup's) meets at the process that made its unique id, whose world rank the id carries and
// which must be its rank 0 (meet_members). Then every rank's unique id, rank, host and emulated
// device are allgathered and checked as NCCL does (check_peers).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "cuda_emu/nccl_internal.h"
#include "cuda_emu/runtime_internal.h"

using namespace mg_emu::nccl;

namespace {

std::mutex g_init_mutex;  // one MPI_Comm_split of MPI_COMM_WORLD at a time

struct PeerInfo {  // what ncclCommInitRank allgathers
  char id[NCCL_UNIQUE_ID_BYTES];
  int32_t rank;
  int32_t device;
  char host[256];
};

// A communicator smaller than the MPI world: its members meet at the id's creator (its rank 0),
// which tells each of them every member's world rank; then MPI_Comm_create_group, over the
// members only. Blocking, like ncclCommInitRank.
constexpr size_t kIdCreatorOffset = 16;  // after the (pid, counter) stamp
constexpr int kMeetTag = 0x4e43;         // "NC", on MPI_COMM_WORLD

struct Registration {  // a member to the creator
  char id[NCCL_UNIQUE_ID_BYTES];
  int32_t rank;
  int32_t world_rank;
};

ncclResult_t meet_members(const ncclUniqueId& id, int nranks, int rank, MPI_Comm* out) {
  int32_t creator = -1, me = 0;
  std::memcpy(&creator, id.internal + kIdCreatorOffset, sizeof(creator));
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  int world = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (creator < 0 || creator >= world)
    return fail(nullptr, ncclInvalidArgument,
                "ncclCommInitRank: this unique id names no MPI process (made before MPI started?); a "
                "communicator of %d of the %d MPI ranks meets at the process that made its id",
                nranks, world);
  if ((rank == 0) != (creator == me))
    return fail(
        nullptr, ncclInvalidUsage,
        "ncclCommInitRank: the emulated NCCL needs the unique id of a communicator smaller than the MPI "
        "world (%d of %d ranks) made by its rank 0's process (world rank %d made it; this is world rank "
        "%d, nccl rank %d)",
        nranks, world, creator, me, rank);
  std::vector<int32_t> members(static_cast<size_t>(nranks), -1);
  if (rank == 0) {
    // Every registration is answered, even after a bad one: the table, or -1s (the member fails).
    members[0] = me;
    std::vector<int32_t> registrants;
    char problem[256] = "";
    for (int k = 1; k < nranks; ++k) {
      Registration r{};
      MPI_Recv(&r, int(sizeof r), MPI_BYTE, MPI_ANY_SOURCE, kMeetTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      registrants.push_back(r.world_rank);
      if (std::memcmp(r.id, id.internal, sizeof(r.id)) != 0)
        std::snprintf(problem, sizeof problem, "world rank %d joined with another unique id", r.world_rank);
      else if (r.rank <= 0 || r.rank >= nranks || members[static_cast<size_t>(r.rank)] >= 0)
        std::snprintf(problem, sizeof problem,
                      "world rank %d joined as nccl rank %d of %d, which is out of range or taken",
                      r.world_rank, r.rank, nranks);
      else
        members[static_cast<size_t>(r.rank)] = r.world_rank;
    }
    if (problem[0] != '\0') std::fill(members.begin(), members.end(), -1);
    for (int32_t registrant : registrants)
      MPI_Send(members.data(), nranks, MPI_INT32_T, registrant, kMeetTag, MPI_COMM_WORLD);
    if (problem[0] != '\0') return fail(nullptr, ncclInvalidUsage, "ncclCommInitRank: %s", problem);
  } else {
    Registration r{};
    std::memcpy(r.id, id.internal, sizeof(r.id));
    r.rank = rank;
    r.world_rank = me;
    MPI_Send(&r, int(sizeof r), MPI_BYTE, creator, kMeetTag, MPI_COMM_WORLD);
    MPI_Recv(members.data(), nranks, MPI_INT32_T, creator, kMeetTag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (members[0] < 0)
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: rank 0 (world rank %d) refused the members' registrations (see its error)",
          creator);
  }
  MPI_Group world_group = MPI_GROUP_NULL, group = MPI_GROUP_NULL;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  MPI_Group_incl(world_group, nranks, members.data(), &group);
  const int rc = MPI_Comm_create_group(MPI_COMM_WORLD, group, kMeetTag, out);
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS)
    return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_create_group failed: %s",
                mpi_text(rc).c_str());
  return ncclSuccess;
}

// Every rank has the same table, so every rank reaches the same verdict.
ncclResult_t check_peers(const std::vector<PeerInfo>& peers, int rank) {
  const int n = int(peers.size());
  std::vector<bool> taken(peers.size(), false);
  for (const PeerInfo& p : peers) {
    if (std::memcmp(p.id, peers[0].id, sizeof(p.id)) != 0)
      return fail(nullptr, ncclInvalidArgument,
                  "ncclCommInitRank: ranks %d and %d were given different unique ids (every rank of a "
                  "communicator must pass the same ncclUniqueId)",
                  peers[0].rank, p.rank);
    if (taken[size_t(p.rank)])
      return fail(nullptr, ncclInvalidArgument, "ncclCommInitRank: two processes asked to be rank %d of %d",
                  p.rank, n);
    taken[size_t(p.rank)] = true;
  }
  for (int i = 0; i < n; ++i) {
    for (int j = i + 1; j < n; ++j) {
      const PeerInfo &a = peers[size_t(i)], &b = peers[size_t(j)];
      if (a.device != b.device || std::strncmp(a.host, b.host, sizeof(a.host)) != 0) continue;
      const int me = b.rank == rank ? b.rank : a.rank;  // NCCL: the reporting rank first
      return fail(nullptr, ncclInvalidUsage,
                  "Duplicate GPU detected : rank %d and rank %d both on CUDA device %d", me,
                  me == a.rank ? b.rank : a.rank, a.device);
    }
  }
  return ncclSuccess;
}

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (id == nullptr) return fail(nullptr, ncclInvalidArgument, "GetUniqueId : uniqueId argument is NULL");
  static std::atomic<uint64_t> counter{0};
  uint64_t seed = uint64_t(Clock::now().time_since_epoch().count()) ^ (uint64_t(getpid()) << 32);
  try {
    seed ^= std::random_device{}();
  } catch (const std::exception&) {  // no entropy source: the time, the pid and the counter
  }
  std::mt19937_64 random(seed);
  for (size_t i = 0; i < NCCL_UNIQUE_ID_BYTES; i += 8) {
    const uint64_t word = random();
    std::memcpy(id->internal + i, &word, 8);
  }
  const uint64_t stamp[2] = {uint64_t(getpid()), counter.fetch_add(1)};  // ids differ within a process
  std::memcpy(id->internal, stamp, sizeof(stamp));
  // Where a communicator smaller than the world meets: this process's MPI world rank (-1 without MPI).
  int32_t world_rank = -1;
  if (mpi_usable()) MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::memcpy(id->internal + kIdCreatorOffset, &world_rank, sizeof(world_rank));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (out == nullptr) return fail(nullptr, ncclInvalidArgument, "CommInitRank : comm argument is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(nullptr, ncclInvalidArgument, "Invalid rank requested : %d/%d", rank, nranks);
  const int device = mg_emu::current_device();
  MPI_Comm mpi = MPI_COMM_NULL;
  if (nranks > 1) {
    if (!mpi_usable())
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: the emulated NCCL carries its traffic over MPI, and MPI is not initialised "
          "(MPI_Init_thread with MPI_THREAD_MULTIPLE must come before a communicator of %d ranks)",
          nranks);
    int level = MPI_THREAD_SINGLE, world = 0;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE)
      return fail(
          nullptr, ncclInvalidUsage,
          "ncclCommInitRank: the emulated NCCL needs MPI initialised with MPI_THREAD_MULTIPLE (stream "
          "threads call MPI), not thread level %d",
          level);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (nranks > world)
      return fail(nullptr, ncclInvalidUsage,
                  "ncclCommInitRank: %d ranks, but the MPI world (the emulated NCCL's transport) has %d",
                  nranks, world);
    PeerInfo mine{};
    std::memcpy(mine.id, id.internal, sizeof(mine.id));
    mine.rank = rank;
    mine.device = device;
    gethostname(mine.host, sizeof(mine.host) - 1);
    std::vector<PeerInfo> peers(static_cast<size_t>(nranks));
    std::unique_lock<std::mutex> lock(g_init_mutex);
    if (nranks == world) {
      const int rc = MPI_Comm_split(MPI_COMM_WORLD, 0, rank, &mpi);  // blocks until every rank is here
      if (rc != MPI_SUCCESS)
        return fail(nullptr, ncclSystemError, "ncclCommInitRank: MPI_Comm_split failed: %s",
                    mpi_text(rc).c_str());
    } else {
      const ncclResult_t met = meet_members(id, nranks, rank, &mpi);
      if (met != ncclSuccess) return met;
    }
    int rc = MPI_SUCCESS;
    MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN);
    rc = MPI_Allgather(&mine, int(sizeof(PeerInfo)), MPI_BYTE, peers.data(), int(sizeof(PeerInfo)), MPI_BYTE,
                       mpi);
    lock.unlock();
    const ncclResult_t verdict =
        rc != MPI_SUCCESS ? fail(nullptr, ncclRemoteError, "ncclCommInitRank: MPI_Allgather failed: %s",
                                 mpi_text(rc).c_str())
                          : check_peers(peers, rank);
    if (verdict != ncclSuccess) {
      MPI_Comm_free(&mpi);
      return verdict;
    }
  }
  auto* comm = new ncclComm;
  comm->nranks = nranks;
  comm->rank = rank;
  comm->device = device;
  comm->mpi = mpi;
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    g_comms.insert(comm);
  }
  *out = comm;
  return ncclSuccess;
}
