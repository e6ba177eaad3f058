// The schedules' orders (pipeline_order), run as a timeline on paper: one unit of time per
// forward, per B and per W (a whole backward: B + W), messages free. Every order must run every
// unit once in a valid sequence, finish without a deadlock, keep 1F1B's bound on the micro-batches
// in flight, and take the time its bubble formula says.
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "multigrad.h"

using namespace mg;
using namespace mg::parallel;

namespace {

struct Timeline {
  int makespan = 0;
  double bubble = 0;  // idle share over all ranks
};

// Runs every rank's order against the others': a forward waits for the previous rank's forward of
// the micro-batch, a backward (or B) for the next rank's (the last rank: for its own forward), a W
// for its own B. Fails the test on a deadlock.
Timeline run_on_paper(PipelineSchedule schedule, int p, int m) {
  std::vector<std::vector<PipelineUnit>> orders;
  for (int r = 0; r < p; ++r) orders.push_back(pipeline_order(schedule, p, r, m));
  auto cost = [](PipelineUnit::Kind k) { return k == PipelineUnit::Backward ? 2 : 1; };
  std::map<std::tuple<int, char, int>, int> done_at;  // (rank, kind, micro-batch) -> end time
  std::vector<int> clock(static_cast<size_t>(p), 0), next(static_cast<size_t>(p), 0);
  int busy = 0;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      auto& order = orders[static_cast<size_t>(r)];
      while (next[static_cast<size_t>(r)] < static_cast<int>(order.size())) {
        const PipelineUnit u = order[static_cast<size_t>(next[static_cast<size_t>(r)])];
        const bool backwardish = u.kind == PipelineUnit::Backward || u.kind == PipelineUnit::InputGrad;
        std::tuple<int, char, int> needs{-1, 0, 0};
        if (u.kind == PipelineUnit::Forward && r > 0) needs = {r - 1, 'F', u.micro_batch};
        if (backwardish)
          needs = r < p - 1 ? std::make_tuple(r + 1, static_cast<char>(u.kind), u.micro_batch)
                            : std::make_tuple(r, 'F', u.micro_batch);
        if (u.kind == PipelineUnit::WeightGrad) needs = {r, 'B', u.micro_batch};
        int start = clock[static_cast<size_t>(r)];
        if (std::get<0>(needs) >= 0) {
          auto it = done_at.find(needs);
          if (it == done_at.end()) break;
          start = std::max(start, it->second);
        }
        clock[static_cast<size_t>(r)] = start + cost(u.kind);
        busy += cost(u.kind);
        done_at[{r, static_cast<char>(u.kind), u.micro_batch}] = clock[static_cast<size_t>(r)];
        ++next[static_cast<size_t>(r)];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r << " stopped at unit " << next[static_cast<size_t>(r)] << " of "
                 << orders[static_cast<size_t>(r)].size());
    REQUIRE(next[static_cast<size_t>(r)] == static_cast<int>(orders[static_cast<size_t>(r)].size()));
  }
  Timeline t;
  for (int c : clock) t.makespan = std::max(t.makespan, c);
  t.bubble = 1.0 - static_cast<double>(busy) / (static_cast<double>(p) * t.makespan);
  return t;
}

}  // namespace

TEST_CASE("every schedule's order runs each unit once, in a valid sequence, within 1F1B's memory",
          "[pipeline][order]") {
  for (PipelineSchedule s :
       {PipelineSchedule::GPipe, PipelineSchedule::OneForwardOneBackward, PipelineSchedule::ZeroBubbleH1}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m : {1, 2, 3, 4, 8, 16}) {
        for (int r = 0; r < p; ++r) {
          INFO("schedule " << static_cast<int>(s) << ", rank " << r << " of " << p << ", m = " << m);
          std::set<std::pair<char, int>> seen;
          int in_flight = 0, max_in_flight = 0, w_waiting = 0, max_w_waiting = 0;
          for (const PipelineUnit& u : pipeline_order(s, p, r, m)) {
            CHECK(u.chunk == 0);
            CHECK(seen.insert({static_cast<char>(u.kind), u.micro_batch}).second);
            if (u.kind == PipelineUnit::Forward) max_in_flight = std::max(max_in_flight, ++in_flight);
            if (u.kind == PipelineUnit::Backward || u.kind == PipelineUnit::InputGrad) {
              CHECK(seen.count({'F', u.micro_batch}) == 1);
              --in_flight;
            }
            if (u.kind == PipelineUnit::InputGrad) max_w_waiting = std::max(max_w_waiting, ++w_waiting);
            if (u.kind == PipelineUnit::WeightGrad) {
              CHECK(seen.count({'B', u.micro_batch}) == 1);
              --w_waiting;
            }
          }
          CHECK(in_flight == 0);
          CHECK(w_waiting == 0);
          CHECK(seen.size() == static_cast<size_t>(s == PipelineSchedule::ZeroBubbleH1 ? 3 * m : 2 * m));
          if (s != PipelineSchedule::GPipe) CHECK(max_in_flight <= std::min(p - r, m));
          // ZB-H1: rank r lets at most r W's wait (r + 1 just after a B).
          if (s == PipelineSchedule::ZeroBubbleH1) CHECK(max_w_waiting <= r + 1);
        }
      }
    }
  }
}

TEST_CASE("the orders take the time their bubble formulas say", "[pipeline][order]") {
  for (int p = 1; p <= 6; ++p) {
    for (int m : {1, 2, 4, 8, 16}) {
      INFO(p << " stages, " << m << " micro-batches");
      // GPipe and 1F1B: m (F + B + W) of work and (p - 1)(F + B + W) of fill and drain.
      for (PipelineSchedule s : {PipelineSchedule::GPipe, PipelineSchedule::OneForwardOneBackward}) {
        const Timeline t = run_on_paper(s, p, m);
        CHECK(t.makespan == 3 * m + 3 * (p - 1));
        CHECK(t.bubble == Approx(static_cast<double>(p - 1) / (m + p - 1)));
      }
      // ZB-H1: only the B's are on the critical path; (p - 1)(F + B - W) once m >= p.
      const Timeline zb = run_on_paper(PipelineSchedule::ZeroBubbleH1, p, m);
      CHECK(zb.makespan <= 3 * m + 3 * (p - 1));
      if (m >= p) {
        CHECK(zb.makespan == 3 * m + (p - 1));
        CHECK(zb.bubble == Approx(static_cast<double>(p - 1) / (3 * m + p - 1)));
      }
    }
  }
}

TEST_CASE("pipeline_order refuses what no schedule runs", "[pipeline][order]") {
  CHECK_THROWS_WITH(pipeline_order(PipelineSchedule::ZeroBubbleH1, 2, 0, 4, 2),
                    Catch::Matchers::Contains("only the interleaved schedule"));
  CHECK_THROWS_WITH(pipeline_order(PipelineSchedule::GPipe, 2, 2, 4),
                    Catch::Matchers::Contains("rank 2 of 2"));
}
