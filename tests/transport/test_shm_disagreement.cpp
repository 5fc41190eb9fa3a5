// Issue 27 over the shared-memory transport: every scenario of
// tests/algo/disagreement.hpp (the last rank deviating in one field) at
// every payload size on 2 and 3 forked ranks fails every rank with the same
// errc::mismatch naming the field, within the timeout, whether the check
// travels in band (the first arena round of a direct schedule) or in an
// arena round of its own; the same calls without a deviating rank complete.
#include "../algo/disagreement.hpp"
#include "spawn.hpp"

#include <gradsync/transport/shm.hpp>

#include <stdexcept>
#include <string>
#include <vector>

namespace {

using namespace gradsync;
namespace dis = gradsync::test::disagreement;
using shm::communicator;

// What rank q said: nothing when it completed, else its result
// (dis::encode) as the text of the exception that ended it.
dis::rank_result result_of(const gradsync::test::outcome& o) {
  if (o.code == 0 || o.hung) return {}; // completed (hung: checked by the caller)
  return dis::decode(o.message);
}

// Runs scenario `s` on p forked ranks, rank `odd` deviating; every rank
// must have ended (none killed as hung) and removed its segment.
std::vector<dis::rank_result> run(const dis::scenario<communicator>& s, int p, std::size_t bytes, int odd) {
  const auto res = gradsync::test::spawn(
      p,
      [&](communicator& c) {
        c.set_timeout(dis::timeout);
        const dis::rank_result x = dis::run_one(s, c, bytes, odd);
        if (x.threw || !x.other.empty()) throw std::runtime_error(dis::encode(x));
      },
      4 * dis::timeout);
  std::vector<dis::rank_result> out;
  for (std::size_t q = 0; q < res.size(); ++q) {
    INFO("rank " << q << ": " << res[q].message);
    CHECK_FALSE(res[q].hung);
    CHECK(res[q].exited);
    CHECK(gradsync::test::segment_gone(res[q].segment));
    out.push_back(result_of(res[q]));
  }
  return out;
}

} // namespace

TEST_CASE("disagreement (shm): one deviating rank fails every rank with one mismatch; none, all complete") {
  const auto table = dis::scenarios<communicator>();
  for (const auto& s : table) {
    for (const std::size_t bytes : dis::sizes_of(s)) {
      for (const int p : {2, 3}) {
        if (p < s.min_ranks) continue;
        INFO(s.name << " at " << bytes << " B on " << p << " ranks");
        dis::check_disagreement(s, run(s, p, bytes, p - 1), p - 1);
        dis::check_control(run(s, p, bytes, -1));
      }
    }
  }
}
