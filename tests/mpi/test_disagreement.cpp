// Issue 27 over MPI: every scenario of tests/algo/disagreement.hpp (the last
// rank deviating in one field) at every payload size, on the ranks the job
// was launched with, fails every rank with the same errc::mismatch naming
// the field, within the timeout; the same calls without a deviating rank
// complete. Each rank catches its own error; the results are then gathered
// with plain MPI calls so that every rank checks every rank's. Each run gets
// a fresh duplicate of MPI_COMM_WORLD (a communicator that failed must be
// rebuilt, and a failed run must leave nothing behind for the next).
#include "../algo/disagreement.hpp"
#include "mpi_test.hpp"

#include <gradsync/transport/mpi.hpp>

#include <mpi.h>

#include <string>
#include <vector>

namespace {

using namespace gradsync;
namespace dis = gradsync::test::disagreement;

// Every rank's `mine`, on every rank (MPI_Allgather of the lengths, then
// MPI_Allgatherv of the texts, over MPI_COMM_WORLD).
std::vector<dis::rank_result> gather(const dis::rank_result& mine) {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const std::string text = dis::encode(mine);
  const int len = static_cast<int>(text.size());
  std::vector<int> lens(static_cast<std::size_t>(p)), offs(static_cast<std::size_t>(p));
  MPI_Allgather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, MPI_COMM_WORLD);
  int total = 0;
  for (int q = 0; q < p; ++q) {
    offs[static_cast<std::size_t>(q)] = total;
    total += lens[static_cast<std::size_t>(q)];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  MPI_Allgatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, MPI_COMM_WORLD);
  std::vector<dis::rank_result> out;
  for (int q = 0; q < p; ++q)
    out.push_back(dis::decode(all.substr(static_cast<std::size_t>(offs[static_cast<std::size_t>(q)]),
                                         static_cast<std::size_t>(lens[static_cast<std::size_t>(q)]))));
  return out;
}

// Runs scenario `s` on this rank over a fresh duplicate of MPI_COMM_WORLD,
// rank `odd` deviating, and returns every rank's result.
std::vector<dis::rank_result> run(const dis::scenario<mpi::communicator>& s, std::size_t bytes, int odd) {
  dis::rank_result mine;
  {
    mpi::communicator c(MPI_COMM_WORLD);
    c.set_timeout(dis::timeout);
    mine = dis::run_one(s, c, bytes, odd);
  }
  return gather(mine);
}

} // namespace

TEST_CASE("disagreement (MPI): one deviating rank fails every rank with one mismatch; none, all complete") {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  const auto table = dis::scenarios<mpi::communicator>();
  for (const auto& s : table) {
    if (p < s.min_ranks) continue;
    for (const std::size_t bytes : dis::sizes_of(s)) {
      INFO(s.name << " at " << bytes << " B on " << p << " ranks");
      dis::check_disagreement(s, run(s, bytes, p - 1), p - 1);
      dis::check_control(run(s, bytes, -1));
    }
  }
}
