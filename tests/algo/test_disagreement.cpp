// Issue 27 over inproc: every scenario of disagreement.hpp (one rank, the
// last, deviating in one field) at every payload size on 2, 3 and 4 ranks
// fails every rank with the same errc::mismatch naming the field, within the
// timeout; the same calls without a deviating rank complete.
#include "disagreement.hpp"
#include "mismatch.hpp"

#include <gradsync/transport/inproc.hpp>

namespace {

using namespace gradsync;
namespace dis = gradsync::test::disagreement;
using inproc::communicator;

// Runs scenario `s` on p inproc ranks (run_each: a fresh world, each rank
// catching its own gradsync::error), rank `odd` deviating.
std::vector<dis::rank_result> run(const dis::scenario<communicator>& s, int p, std::size_t bytes, int odd) {
  std::vector<dis::rank_result> out(static_cast<std::size_t>(p));
  const auto seen = gradsync::test::run_each(
      p,
      [&](communicator& c) {
        auto& mine = out[static_cast<std::size_t>(c.rank())];
        mine = dis::run_one(s, c, bytes, odd);
        if (mine.threw) throw error(mine.kind, mine.op, c.rank(), -1, mine.reason); // for run_each's record
      },
      dis::timeout);
  for (std::size_t q = 0; q < seen.size(); ++q) { // run_each saw what run_one did
    CHECK(seen[q].threw == out[q].threw);
    CHECK(seen[q].reason == out[q].reason);
  }
  return out;
}

} // namespace

TEST_CASE("disagreement (inproc): one deviating rank fails every rank with one mismatch; none, all complete") {
  const auto table = dis::scenarios<communicator>();
  for (const auto& s : table) {
    for (const std::size_t bytes : dis::sizes_of(s)) {
      for (const int p : {2, 3, 4}) {
        if (p < s.min_ranks) continue;
        INFO(s.name << " at " << bytes << " B on " << p << " ranks");
        dis::check_disagreement(s, run(s, p, bytes, p - 1), p - 1);
        dis::check_control(run(s, p, bytes, -1));
      }
    }
  }
}
