// The flight recorder's ring buffer (parallel/comm/flight_recorder.h) in one process: what each
// collective leaves in it, the wrap-around, the states, the callers, the dump file and SIGUSR1.
// The multi-rank behaviour (dumps on a timeout, a mismatch, a peer's request; scripts/flight-report)
// is tested by tests/parallel/resilience/check_flight_report.sh.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/tensor.h"
#include "parallel/comm/flight_recorder.h"
#include "parallel/comm/process_group.h"

using namespace mg;
using namespace mg::parallel;

namespace {

// A world of one (single-process backend) and a fresh recorder of `entries` entries.
ProcessGroup fresh_group(size_t entries, const std::string& dir = "") {
  configure_flight_recorder(entries, dir);
  return init_process_group();
}

std::string temporary_dir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "mg-flight-test.XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

std::string read_text(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

}  // namespace

TEST_CASE("flight recorder: every collective with its group, sequence, op, sizes and state", "[flight]") {
  ProcessGroup pg = fresh_group(16);
  Tensor a = ones({6});
  Tensor gathered = zeros({6});
  pg.allreduce(a)->wait();
  pg.broadcast(a, 0)->wait();
  pg.allgather(gathered, a)->wait();
  pg.barrier()->wait();
  const std::vector<FlightEntry> entries = flight_recorder_entries();
  REQUIRE(entries.size() == 4);
  CHECK(entries[0].op == "allreduce(sum)");
  CHECK(entries[1].op == "broadcast(root 0)");
  CHECK(entries[2].op == "allgather");
  CHECK(entries[3].op == "barrier");
  for (size_t i = 0; i < entries.size(); ++i) {
    CHECK(entries[i].sequence == entries[0].sequence + static_cast<int64_t>(i));
    CHECK(entries[i].group == entries[0].group);
    CHECK(entries[i].group_size == 1);
    CHECK(entries[i].backend == "single-process");
    CHECK(entries[i].device == "cpu");
    CHECK(entries[i].state == FlightState::Completed);
    CHECK(entries[i].queued_ns > 0);
    CHECK(entries[i].started_ns >= entries[i].queued_ns);
    CHECK(entries[i].finished_ns >= entries[i].started_ns);
  }
  CHECK(entries[0].in_count == 6);
  CHECK(entries[0].dtype == "f32");
  CHECK(entries[3].dtype.empty());
  // No CollectiveCaller: the calling function, found from the return address (this test's symbol,
  // or this executable plus an offset when its symbols are not exported).
  CHECK_FALSE(entries[0].caller.empty());
}

TEST_CASE("flight recorder: keeps the last N, oldest first", "[flight]") {
  ProcessGroup pg = fresh_group(5);
  Tensor t = ones({3});
  for (int i = 0; i < 12; ++i) {
    CollectiveCaller caller(str_cat("call ", i));
    pg.allreduce(t)->wait();
  }
  const std::vector<FlightEntry> entries = flight_recorder_entries();
  REQUIRE(entries.size() == 5);
  for (int i = 0; i < 5; ++i) {
    CHECK(entries[static_cast<size_t>(i)].caller == str_cat("call ", 7 + i));
    if (i > 0)
      CHECK(entries[static_cast<size_t>(i)].sequence == entries[static_cast<size_t>(i - 1)].sequence + 1);
  }
}

TEST_CASE("flight recorder: queued, started and failed transitions follow the Work", "[flight]") {
  configure_flight_recorder(8, "");
  // A Work of a backend that has not finished yet: the entry follows its transitions.
  parallel::detail::FlightCall call;
  call.group = parallel::detail::flight_register_group("test group", 2, 0, "mpi", "none");
  call.sequence = 1;
  call.op = "allreduce";
  call.reduce = "sum";
  call.in_count = call.out_count = 4;
  call.dtype = "f32";
  auto work = std::make_shared<Work>("allreduce under test");
  const int64_t id = parallel::detail::flight_record(call);
  work->attach_flight_record(id);
  CHECK(flight_recorder_entries().back().state == FlightState::Queued);
  work->mark_started();
  CHECK(flight_recorder_entries().back().state == FlightState::Started);
  work->mark_failed("allreduce under test: did not complete within 2 s");
  FlightEntry entry = flight_recorder_entries().back();
  CHECK(entry.state == FlightState::Failed);
  CHECK(entry.error == "allreduce under test: did not complete within 2 s");
  CHECK(entry.group == "test group");
  CHECK(entry.backend == "mpi");

  // Attached after it completed (a world of one completes at once): the record catches up.
  auto done = completed_work("done already");
  const int64_t later = parallel::detail::flight_record(call);
  done->attach_flight_record(later);
  entry = flight_recorder_entries().back();
  CHECK(entry.state == FlightState::Completed);
  CHECK(entry.started_ns == entry.finished_ns);

  // A call ProcessGroup refuses never reached the other ranks' order: it is not recorded.
  ProcessGroup pg = init_process_group();
  Tensor strided = ones({4, 4}).transpose(0, 1);
  CHECK_THROWS(pg.allreduce(strided));  // refused before it is recorded: not contiguous
  CHECK(flight_recorder_entries().back().id == later);
}

TEST_CASE("flight recorder: 0 entries turns it off", "[flight]") {
  ProcessGroup pg = fresh_group(0);
  Tensor t = ones({3});
  pg.allreduce(t)->wait();
  CHECK(flight_recorder_entries().empty());
  CHECK(dump_flight_recorder("off").empty());
}

TEST_CASE("flight recorder: the dump is one JSON file per rank, written atomically", "[flight]") {
  const std::string dir = temporary_dir();
  ProcessGroup pg = fresh_group(4, dir + "/sub");
  Tensor t = ones({3});
  {
    CollectiveCaller outer("outer");
    {
      CollectiveCaller inner("Reducer \"bucket\" 3");
      pg.allreduce(t)->wait();
    }
    pg.allreduce(t)->wait();
  }
  const std::string path = dump_flight_recorder("asked by the test");
  CHECK(path == dir + "/sub/rank-0.json");
  const std::string text = read_text(path);
  CHECK(text.find("\"format\": \"multigrad-flight-recorder/1\"") != std::string::npos);
  CHECK(text.find("\"reason\": \"asked by the test\"") != std::string::npos);
  CHECK(text.find("\"caller\": \"Reducer \\\"bucket\\\" 3\"") != std::string::npos);  // escaped
  CHECK(text.find("\"caller\": \"outer\"") != std::string::npos);
  CHECK(text.find("\"state\": \"completed\"") != std::string::npos);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/sub")) {
    static_cast<void>(entry);
    ++files;  // no temporary left behind
  }
  CHECK(files == 1);
  std::filesystem::remove_all(dir);
}

TEST_CASE("flight recorder: SIGUSR1 dumps from a thread", "[flight]") {
  const std::string dir = temporary_dir();
  ProcessGroup pg = fresh_group(4, dir);  // init_process_group installs the handler
  Tensor t = ones({3});
  pg.allreduce(t)->wait();
  REQUIRE(std::raise(SIGUSR1) == 0);  // with the default action the process would end here
  const std::string path = dir + "/rank-0.json";
  for (int i = 0; i < 200 && !std::filesystem::exists(path); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(std::filesystem::exists(path));
  CHECK(read_text(path).find("\"reason\": \"SIGUSR1\"") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("flight recorder: cost per recorded collective", "[flight]") {
  // Not a limit, a figure (docs/fault-tolerance.md): a world-of-one all-reduce with and without it.
  Tensor t = ones({1});
  auto time_per_call = [&](size_t entries) {
    ProcessGroup pg = fresh_group(entries);
    const int calls = 20000;
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) pg.allreduce(t);
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
  };
  time_per_call(2000);  // warm-up
  const double off = time_per_call(0), on = time_per_call(2000);
  WARN("world-of-one allreduce: " << off << " ns without the flight recorder, " << on << " ns with it (+"
                                  << on - off << " ns per call)");
  configure_flight_recorder(2000, "");
}
