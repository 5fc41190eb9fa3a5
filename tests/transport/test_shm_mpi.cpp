// The shared-memory transport bootstrapped through MPI (run with mpiexec -n
// 2, 3, 4): point-to-point around a ring, every allreduce path against MPI's
// own MPI_Allreduce, call mismatches, and no segment left in /dev/shm.
#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/transport/shm_mpi.hpp>

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace {

using gradsync::error;
namespace op = gradsync::op;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

} // namespace

TEST_CASE("shm over MPI: same ranks as MPI, segment unlinked after setup") {
  gradsync::mpi::communicator m;
  auto c = gradsync::shm::from_mpi(m);
  CHECK(c.rank() == m.rank());
  CHECK(c.size() == m.size());
  CHECK(!std::filesystem::exists("/dev/shm" + c.segment_name()));
}

TEST_CASE("shm over MPI: ring exchange of odd sizes") {
  auto c = gradsync::shm::from_mpi(MPI_COMM_WORLD);
  const int p = c.size(), r = c.rank(), next = (r + 1) % p, prev = (r + p - 1) % p;
  for (std::size_t n : {std::size_t{0}, std::size_t{3}, std::size_t{33}, std::size_t{100'003}, 3 * gradsync::policy::shm_ring_bytes + 5}) {
    CAPTURE(n);
    std::vector<std::uint8_t> out(n), in(n);
    for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(r));
    auto rr = c.irecv(std::as_writable_bytes(std::span(in)), prev, 1);
    auto sr = c.isend(std::as_bytes(std::span(out)), next, 1);
    rr.wait();
    sr.wait();
    bool ok = true;
    for (std::size_t i = 0; i < n; ++i) ok &= in[i] == static_cast<std::uint8_t>(i * 7 + static_cast<std::size_t>(prev));
    CHECK(ok);
  }
}

TEST_CASE("shm over MPI: allreduce (every algorithm) equals MPI_Allreduce") {
  gradsync::mpi::communicator m;
  auto c = gradsync::shm::from_mpi(m);
  const int r = c.rank();
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{2'000'003}}) {
    std::vector<std::int64_t> in(n), want(n);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::int64_t>(i % 1009) * (r + 1) - r;
    gradsync::mpi::native::allreduce(m, std::span<const std::int64_t>(in), std::span<std::int64_t>(want));
    for (auto a : {gradsync::algorithm::automatic, gradsync::algorithm::direct, gradsync::algorithm::ring}) {
      CAPTURE(n);
      CAPTURE(gradsync::algorithm_name(a));
      gradsync::options o;
      o.algo = a;
      std::vector<std::int64_t> got(n);
      gradsync::allreduce(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(got), op::sum{}, o);
      CHECK(got == want);
    }
  }
}

TEST_CASE("shm over MPI: ranks calling allreduce with different counts all fail") {
  auto c = gradsync::shm::from_mpi(MPI_COMM_WORLD);
  std::vector<float> v(c.rank() == 0 ? 10 : 11, 1.0f);
  std::string what;
  try {
    gradsync::allreduce(c, std::span<float>(v), op::sum{});
  } catch (const error& e) {
    what = e.what();
  }
  CAPTURE(what);
  CHECK((what.find("disagree") != std::string::npos || what.find("aborted") != std::string::npos));
  CHECK(world_rank() == c.rank());
}
