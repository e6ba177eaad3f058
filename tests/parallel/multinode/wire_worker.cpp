// Bytes on the wire beside the bytes the collectives were asked to move.
//
// ProcessGroup::requested_traffic() is a figure computed per call (the ring algorithm's bytes),
// not a measurement. This worker measures: run with ONE rank per node (check_across_nodes.sh runs
// it as node0:1,node1:1), every byte a collective moves between the ranks crosses a network link,
// so each rank reads its node's interface counters (/sys/class/net/<if>/statistics/{tx,rx}_bytes;
// inside a cluster node's namespace they are that node's own link) around a fixed set of
// collectives, and rank 0 prints both sums and their ratio:
//
//   mpirun -H node0:1,node1:1 -np 2 wire_worker [interface, default eth0] [max ratio, default 1.15]
//
// The wire carries the payload plus Ethernet/IP/TCP headers, MPI's own headers, TCP ACKs, the
// call signatures of verify_collectives and the heartbeat, so it must be >= the requested bytes
// (every algorithm of these collectives moves at least the ring's bytes over two ranks) and
// within `max ratio` of them. Exit 0 inside that band, 1 outside it, 77 when the counters are
// unreadable or the world is not 2 ranks on 2 nodes.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/tensor.h"
#include "parallel/comm/process_group.h"
#include "parallel/comm/ring_allreduce.h"

using namespace mg;
using namespace mg::parallel;

namespace {

// A statistics counter of `interface` in this process's network namespace, or -1.
int64_t interface_counter(const std::string& interface, const char* name) {
  std::ifstream in("/sys/class/net/" + interface + "/statistics/" + name);
  long long value = -1;
  if (!(in >> value)) return -1;
  return value;
}

double sum_over_ranks(ProcessGroup& pg, double v) {
  Tensor t = full({1}, v, TensorOptions{DType::f64});
  pg.allreduce(t)->wait();
  return t.item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string interface = argc > 1 ? argv[1] : "eth0";
  const double max_ratio = argc > 2 ? std::atof(argv[2]) : 1.15;
  ProcessGroup pg = init_process_group();
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  const bool readable = interface_counter(interface, "tx_bytes") >= 0;
  // Two ranks, on two hosts, both able to read their link: else this measures nothing.
  Tensor ok = full({1}, readable ? 1.0 : 0.0, TensorOptions{DType::f64});
  pg.allreduce(ok, ReduceOp::Min)->wait();
  if (pg.size() != 2 || ok.item<double>() == 0.0) {
    if (pg.rank() == 0)
      std::printf(
          "SKIP: wire_worker needs 2 ranks on 2 nodes with /sys/class/net/%s (world %d, readable %d)\n",
          interface.c_str(), pg.size(), readable ? 1 : 0);
    return 77;
  }
  // 4 MiB f32 messages: large enough that launch-time and heartbeat traffic are noise.
  const int64_t n = int64_t{1} << 20;
  Tensor a = ones({n}, TensorOptions{DType::f32});
  Tensor gathered = zeros({2 * n / 2}, TensorOptions{DType::f32});
  Tensor half = ones({n / 2}, TensorOptions{DType::f32});
  pg.barrier()->wait();
  pg.reset_requested_traffic();
  const int64_t tx0 = interface_counter(interface, "tx_bytes"),
                rx0 = interface_counter(interface, "rx_bytes");
  for (int i = 0; i < 4; ++i) pg.allreduce(a)->wait();  // MPI's own algorithm
  for (int i = 0; i < 2; ++i) ring_allreduce(pg, a);    // ours, over send/recv
  pg.allgather(gathered, half)->wait();
  pg.broadcast(a, 0)->wait();
  pg.barrier()->wait();
  const int64_t tx = interface_counter(interface, "tx_bytes") - tx0;
  const int64_t rx = interface_counter(interface, "rx_bytes") - rx0;
  const RequestedTraffic requested = pg.requested_traffic();  // read before the sums add to it
  const double requested_total = sum_over_ranks(pg, static_cast<double>(requested.bytes));
  const double tx_total = sum_over_ranks(pg, static_cast<double>(tx));
  const double rx_total = sum_over_ranks(pg, static_cast<double>(rx));
  const double ratio = tx_total / requested_total;
  const bool in_band = tx_total >= requested_total && ratio <= max_ratio;
  std::printf("rank %d on %s: requested %lld bytes in %lld calls; %s sent %lld, received %lld bytes\n",
              pg.rank(), host, static_cast<long long>(requested.bytes),
              static_cast<long long>(requested.calls), interface.c_str(), static_cast<long long>(tx),
              static_cast<long long>(rx));
  std::fflush(stdout);
  pg.barrier()->wait();
  if (pg.rank() == 0)
    std::printf(
        "wire: %.0f bytes sent on the nodes' %s links (%.0f received) for %.0f bytes requested: ratio %.4f "
        "(band 1 to %.2f) %s\n",
        tx_total, interface.c_str(), rx_total, requested_total, ratio, max_ratio, in_band ? "ok" : "OUTSIDE");
  return in_band ? 0 : 1;
}
