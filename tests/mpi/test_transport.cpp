// gradsync::mpi specifics: the private duplicate communicator, sessions that
// do not own MPI, sub-communicators, errors instead of undefined behaviour or
// hangs, and the splitting of transfers above policy::mpi_max_message_bytes.
#include "mpi_test.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>

using namespace gradsync;
using namespace gradsync::test;

namespace {

// A communicator that is never freed while MPI runs. Tests that fail on
// purpose leave unmatched messages behind; freeing their communicator could
// let MPI reuse its context id for a later one, which might then match them.
mpi::communicator& lasting_comm(std::chrono::milliseconds timeout) {
  static std::vector<std::unique_ptr<mpi::communicator>> kept; // freed after MPI_Finalize: a no-op
  kept.push_back(std::make_unique<mpi::communicator>(make_comm()));
  kept.back()->set_timeout(timeout);
  return *kept.back();
}

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// Runs f, which must throw gradsync::error; returns it (or nullopt after
// recording a failure).
template <class F> std::optional<error> expect_error(F&& f) {
  try {
    f();
  } catch (const error& e) {
    return e;
  }
  FAIL_CHECK("no gradsync::error was thrown");
  return std::nullopt;
}

} // namespace

TEST_CASE("communicator: rank, size and node of the world") {
  auto c = make_comm();
  int r = -1, p = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  CHECK(c.rank() == r);
  CHECK(c.size() == p);
  CHECK(c.native() != MPI_COMM_WORLD);
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(c.native(), MPI_COMM_WORLD, &cmp);
  CHECK(cmp == MPI_CONGRUENT); // same group and order, different context
  // Every rank of this test runs on one machine: one node, numbered 0.
  for (int q = 0; q < p; ++q) CHECK(c.node_of(q) == 0);
  auto e = expect_error([&] { (void)c.node_of(p); });
  if (e) CHECK(e->op() == "mpi.node_of");
  CHECK(c.timeout() == test_timeout);

  // A moved-from communicator hands its duplicate over.
  auto moved = std::move(c);
  CHECK(moved.rank() == r);
  std::vector<int> v = {1};
  allreduce(moved, std::span(v));
  CHECK(v[0] == p);
}

TEST_CASE("the duplicate communicator isolates gradsync traffic from the user's") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  const int next = (r + 1) % p, prev = (r + p - 1) % p;
  const int tag = policy::default_tag; // the very tag the collectives use
  const std::size_t n = 4 * static_cast<std::size_t>(p); // ring messages of 4 floats = 16 bytes
  auto run_allreduce = [&] {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>(input(op_kind::sum, r, i));
    allreduce(c, std::span(v));
    return first_mismatch(v.data(), n, [&](std::size_t i) { return expected(op_kind::sum, p, i); }) == n;
  };

  // 1. A wildcard receive the user posted on MPI_COMM_WORLD with our tag must
  //    not catch a message of the collective.
  std::array<float, 4> wild{};
  MPI_Request wr;
  MPI_Irecv(wild.data(), 16, MPI_BYTE, MPI_ANY_SOURCE, tag, MPI_COMM_WORLD, &wr);
  CHECK(run_allreduce());
  MPI_Barrier(MPI_COMM_WORLD); // every rank finished the collective
  int done = 1;
  MPI_Test(&wr, &done, MPI_STATUS_IGNORE);
  CHECK(done == 0);
  MPI_Barrier(MPI_COMM_WORLD); // every rank tested before any user message is sent
  const std::array<float, 4> mine = {1.5f, 2.5f, static_cast<float>(r), -7.0f};
  MPI_Send(mine.data(), 16, MPI_BYTE, next, tag, MPI_COMM_WORLD);
  MPI_Status st;
  MPI_Wait(&wr, &st);
  CHECK(st.MPI_SOURCE == prev);
  CHECK(wild[2] == static_cast<float>(prev));

  // 2. A user message already waiting on MPI_COMM_WORLD, same tag, same size as
  //    the collective's first message, must not be taken by the collective.
  const std::array<float, 4> junk = {1e30f, -1e30f, 12345.0f, static_cast<float>(r)};
  MPI_Request sr;
  MPI_Isend(junk.data(), 16, MPI_BYTE, next, tag, MPI_COMM_WORLD, &sr);
  MPI_Barrier(MPI_COMM_WORLD); // the user messages are sent before the collective starts
  CHECK(run_allreduce());
  std::array<float, 4> got{};
  MPI_Recv(got.data(), 16, MPI_BYTE, prev, tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  MPI_Wait(&sr, MPI_STATUS_IGNORE);
  CHECK(got[0] == 1e30f);
  CHECK(got[3] == static_cast<float>(prev));
}

TEST_CASE("a session does not own MPI the program initialised itself") {
  int p = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  {
    // MPI is running (the test main started it), as in a program where a
    // framework called MPI_Init before gradsync was used.
    mpi::session s;
    CHECK_FALSE(s.owner());
    int provided = -1;
    MPI_Query_thread(&provided);
    CHECK(s.thread_level() == provided);
    auto w = s.world();
    CHECK(w.size() == p);
    std::vector<double> v = {1.0, static_cast<double>(w.rank())};
    allreduce(w, std::span(v), op::max{});
    CHECK(v[0] == 1.0);
    CHECK(v[1] == p - 1.0);
  }
  // Leaving the non-owning session did not finalise MPI.
  int fin = 1;
  MPI_Finalized(&fin);
  CHECK(fin == 0);
  auto c = make_comm();
  std::vector<std::int64_t> v = {2};
  allreduce(c, std::span(v), op::prod{});
  CHECK(v[0] == (std::int64_t{1} << p));
}

TEST_CASE("collectives on a user sub-communicator with reordered ranks") {
  int wr = 0, wp = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &wr);
  MPI_Comm_size(MPI_COMM_WORLD, &wp);
  MPI_Comm sub;
  MPI_Comm_split(MPI_COMM_WORLD, wr % 2, -wr, &sub); // evens and odds, in reverse order
  {
    auto c = make_comm(sub);
    const int group = (wp - wr % 2 + 1) / 2; // ranks of this parity
    CHECK(c.size() == group);
    CHECK(c.rank() == (group - 1) - wr / 2);
    std::vector<std::int32_t> v = {wr, 1};
    allreduce(c, std::span(v));
    std::int32_t want = 0;
    for (int q = wr % 2; q < wp; q += 2) want += q;
    CHECK(v[0] == want);
    CHECK(v[1] == group);
    std::vector<std::int32_t> b = {c.rank() == 0 ? wr : -1};
    broadcast(c, std::span(b), 0);
    CHECK(b[0] == wr % 2 + 2 * (group - 1)); // the highest world rank of the group
  }
  MPI_Comm_free(&sub);
}

TEST_CASE("invalid arguments raise gradsync::error on every rank, before any message") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  std::vector<float> a(8 * P, 1.0f), b(8 * P, 0.0f);
  const std::span<const float> in(a);
  auto check = [&](auto f, std::string_view op, std::string_view what) {
    auto e = expect_error(f);
    if (!e) return;
    INFO(e->what());
    CHECK(e->op() == op);
    CHECK(e->rank() == r);
    CHECK(contains(e->reason(), what));
  };
  check([&] { broadcast(c, std::span(a), p); }, "broadcast", "root " + std::to_string(p) + " out of range");
  check([&] { broadcast(c, std::span(a), -1); }, "broadcast", "out of range");
  check([&] { reduce(c, in, std::span(b), p, op::sum{}); }, "reduce", "out of range");
  if (r == 0) // only the root checks its output: a purely local error
    check([&] { reduce(c, in, std::span(b).first(1), 0, op::sum{}); }, "reduce", "root output holds 1");
  check([&] { allreduce(c, in, std::span(b).first(3)); }, "allreduce", "output holds 3");
  check([&] { allreduce(c, in.first(4), std::span(a).subspan(2, 4)); }, "allreduce", "overlap");
  check([&] { reduce_scatter(c, in.first(5), std::span(b).first(2)); }, "reduce_scatter", "expected ranks x output");
  check([&] { allgather(c, in.first(2), std::span(b).first(2 * P + 1)); }, "allgather", "expected ranks x input");
  std::array<std::byte, 4> tiny{};
  check([&] { allreduce(c, std::span(a), op::sum{}, {.workspace = tiny}); }, "allreduce", "workspace holds 4 bytes");
  check([&] { allreduce(c, std::span<float>(static_cast<float*>(nullptr), 3)); }, "allreduce", "null");
  check([&] { (void)c.isend(std::as_bytes(in), p, 0); }, "mpi.send", "peer");
  check([&] { (void)c.irecv(std::as_writable_bytes(std::span(b)), -1, 0); }, "mpi.recv", "peer");
  check([&] { mpi::native::reduce_scatter(c, in.first(5), std::span(b).first(2)); }, "native.reduce_scatter", "ranks");
  check([&] { mpi::native::allgather(c, in.first(2), std::span(b).first(3)); }, "native.allgather", "ranks");

  // No rank sent anything: the communicator is still in step.
  std::vector<float> v(P + 1, static_cast<float>(r));
  allreduce(c, std::span(v));
  CHECK(v[P] == static_cast<float>(p * (p - 1) / 2));
}

TEST_CASE("point to point: polling, and receive sizes that do not match the send") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  if (r >= 2) return; // ranks 0 and 1 only; the others have nothing to do
  std::array<std::int64_t, 2> small = {11, 22};
  std::array<std::int64_t, 4> large = {0, 0, 0, 0};
  if (r == 0) {
    // Poll: nothing can arrive before rank 1 sends, which it does only
    // after rank 0 told it that it polled.
    auto rq = c.irecv(std::as_writable_bytes(std::span(small)), 1, 5);
    CHECK_FALSE(rq.test());
    c.isend(std::as_bytes(std::span(large)), 1, 6).wait();
    rq.wait();
    CHECK(small[0] == 33);
    // Then two messages whose sizes differ from rank 1's receives.
    c.isend(std::as_bytes(std::span(small)), 1, 7).wait();
    c.isend(std::as_bytes(std::span(large)), 1, 8).wait();
  } else {
    c.irecv(std::as_writable_bytes(std::span(large)), 0, 6).wait();
    const std::array<std::int64_t, 2> reply = {33, 44};
    c.isend(std::as_bytes(std::span(reply)), 0, 5).wait();
    // 16 bytes arrive where 32 were posted.
    auto shorter = expect_error([&] { c.irecv(std::as_writable_bytes(std::span(large)), 0, 7).wait(); });
    if (shorter) {
      INFO(shorter->what());
      CHECK(shorter->op() == "mpi.recv");
      CHECK(shorter->peer() == 0);
      CHECK(contains(shorter->reason(), "received 16 bytes where a receive of 32"));
      CHECK(shorter->kind() == errc::mismatch);
    }
    // 32 bytes arrive where 16 were posted (MPI truncation).
    auto longer = expect_error([&] { c.irecv(std::as_writable_bytes(std::span(small)), 0, 8).wait(); });
    if (longer) {
      INFO(longer->what());
      CHECK(longer->op() == "mpi.recv");
      CHECK(longer->peer() == 0);
      CHECK(contains(longer->reason(), "larger than the posted receive of 16 bytes"));
      CHECK(longer->kind() == errc::mismatch);
    }
  }
  (void)p;
}

static_assert(upto_receiver<mpi::communicator> && node_map<mpi::communicator> && timed<mpi::communicator>);
static_assert(abortable<mpi::communicator> && recorded<mpi::communicator> && !shared_arena<mpi::communicator>);
static_assert(detail::subgroup_forwards<mpi::communicator>);
static_assert(synchronous_sender<mpi::communicator> && synchronous_sender<subgroup<mpi::communicator>>);

TEST_CASE("issend completes only once the receiver has matched it; isend of 8 bytes does not wait") {
  // Rank 1 posts its receives 200 ms after a barrier. The synchronous send
  // cannot complete before that; the buffered (eager) 8-byte send does.
  auto c = make_comm();
  const int r = c.rank();
  std::array<std::byte, 8> a{}, b{};
  const auto pause = std::chrono::milliseconds(200);
  MPI_Barrier(MPI_COMM_WORLD);
  if (r == 0) {
    auto t0 = std::chrono::steady_clock::now();
    c.isend(a, 1, 3).wait();
    const auto buffered = std::chrono::steady_clock::now() - t0;
    t0 = std::chrono::steady_clock::now();
    c.issend(b, 1, 3).wait();
    const auto synced = std::chrono::steady_clock::now() - t0;
    CHECK(buffered < pause / 2);
    CHECK(synced >= pause / 2);
  } else if (r == 1) {
    std::this_thread::sleep_for(pause);
    c.irecv(a, 0, 3).wait();
    c.irecv(b, 0, 3).wait();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

namespace {
// Byte k of test message `m` of n bytes.
std::vector<std::byte> upto_pattern(std::size_t n, int m) {
  std::vector<std::byte> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = static_cast<std::byte>((k * 29 + n * 3 + static_cast<std::size_t>(m) * 11) & 0xff);
  return v;
}
} // namespace

TEST_CASE("irecv_upto: any size up to the capacity, in order with exact receives; larger is a mismatch") {
  auto& c = lasting_comm(test_timeout); // the truncated message below is gone, but keep the context unique
  const int r = c.rank();
  if (r < 2) {
    constexpr std::size_t cap = 100;
    // message k goes to receive k: even k exact, odd k up to `cap`
    const std::vector<std::size_t> sizes{7, 0, 100, 1, 0, 100, 33, 64};
    if (r == 0) {
      c.irecv({}, 1, 9).wait(); // rank 1 posted every receive
      std::vector<std::vector<std::byte>> msgs;
      std::vector<mpi::request> rs;
      for (std::size_t k = 0; k < sizes.size(); ++k) msgs.push_back(upto_pattern(sizes[k], static_cast<int>(k)));
      for (const auto& m : msgs) rs.push_back(c.isend(m, 1, 4));
      for (auto& q : rs) q.wait();
      for (auto& q : rs) CHECK(q.received() == 0);
      // one byte more than the capacity
      const auto big = upto_pattern(cap + 1, 99);
      c.isend(big, 1, 5).wait();
    } else {
      std::vector<std::vector<std::byte>> in;
      std::vector<mpi::request> rs;
      for (std::size_t k = 0; k < sizes.size(); ++k) in.emplace_back(k % 2 ? cap : sizes[k], std::byte{0xEE});
      for (std::size_t k = 0; k < sizes.size(); ++k)
        rs.push_back(k % 2 ? c.irecv_upto(in[k], 0, 4) : c.irecv(in[k], 0, 4));
      c.isend({}, 0, 9).wait();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        INFO("message " << k << " of " << sizes[k] << " bytes");
        rs[k].wait();
        CHECK(rs[k].received() == sizes[k]);
        const auto want = upto_pattern(sizes[k], static_cast<int>(k));
        CHECK(std::equal(want.begin(), want.end(), in[k].begin()));
        CHECK(std::all_of(in[k].begin() + static_cast<std::ptrdiff_t>(sizes[k]), in[k].end(),
                          [](std::byte b) { return b == std::byte{0xEE}; }));
      }
      std::vector<std::byte> small(cap);
      auto e = expect_error([&] { c.irecv_upto(small, 0, 5).wait(); });
      if (e) {
        INFO(e->what());
        CHECK(e->kind() == errc::mismatch);
        CHECK(e->peer() == 0);
        CHECK(contains(e->reason(), "larger than the posted receive of up to 100 bytes"));
      }
    }
  }
  // a capacity MPI could not tell the end of is refused before anything is posted
  std::vector<std::byte> none;
  auto e = expect_error([&] {
    c.irecv_upto(std::span<std::byte>(none.data(), policy::mpi_max_message_bytes), (r + 1) % c.size(), 6).wait();
  });
  if (e) {
    CHECK(e->kind() == errc::invalid_argument);
    CHECK(contains(e->reason(), "mpi_max_message_bytes"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a rank that never joins makes the others time out instead of hanging") {
  const auto timeout = 500ms;
  auto& c = lasting_comm(timeout);
  const int p = c.size(), r = c.rank();
  if (r != p - 1) {
    const auto t0 = std::chrono::steady_clock::now();
    auto e = expect_error([&] { barrier(c); });
    const auto waited = std::chrono::steady_clock::now() - t0;
    if (e) {
      INFO(e->what());
      CHECK(contains(e->reason(), "timed out after 500 ms"));
      CHECK(e->kind() == errc::timeout);
      CHECK(e->rank() == r);
    }
    CHECK(waited >= timeout);
    CHECK(waited < timeout + 5s);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a count that differs between ranks fails every rank instead of hanging") {
  const auto timeout = 1s;
  auto& c = lasting_comm(timeout);
  const int p = c.size(), r = c.rank();
  // Rank 0 passes 4p elements, the others 2p: every ring block differs in
  // size, so each rank's first receive either mismatches or never matches.
  std::vector<float> v((r == 0 ? 4 : 2) * static_cast<std::size_t>(p), 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  auto e = expect_error([&] { allreduce(c, std::span(v)); });
  const auto waited = std::chrono::steady_clock::now() - t0;
  // Every call checks its fingerprint first: every rank fails, naming the count.
  REQUIRE(e);
  INFO(e->what());
  CHECK(e->rank() == r);
  CHECK(e->kind() == errc::mismatch);
  CHECK(contains(e->reason(), "count differs"));
  CHECK(waited < timeout + 10s);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Transfers above policy::mpi_max_message_bytes (MPI counts are ints) travel
// as several messages. One transfer of 1 GiB + 3 bytes each way checks the
// split at the MPI level: gradsync's send is received by two plain MPI
// receives (1 GiB, then 3 bytes), and two plain MPI sends by one gradsync
// receive. Needs 1 GiB per process, so it runs on 2 ranks only; it costs
// about 6 s of CPU over both processes (3-4 s wall on an idle 2-core machine).
TEST_CASE("transfers above mpi_max_message_bytes are split into int-sized messages") {
  auto c = make_comm();
  if (c.size() != 2) {
    if (c.rank() == 0) MESSAGE("skipped: runs with 2 ranks only (1 GiB buffer per process)");
    return;
  }
  constexpr std::size_t chunk = policy::mpi_max_message_bytes;
  static_assert(chunk <= static_cast<std::size_t>(INT_MAX));
  const std::size_t n = chunk + 3;
  const int tag = 9;
  // Pattern in 8-byte words (memory-bound fill and check: about 0.2 s per GiB).
  const std::size_t words = (n + 7) / 8;
  auto word_at = [](std::size_t k, std::uint64_t salt) { return (k + salt) * 0x9E3779B97F4A7C15ull; };
  std::vector<std::uint64_t> mem(words);
  const std::span<std::byte> buf(reinterpret_cast<std::byte*>(mem.data()), n);
  auto fill = [&](std::uint64_t salt) {
    for (std::size_t k = 0; k < words; ++k) mem[k] = word_at(k, salt);
  };
  auto first_bad = [&](std::uint64_t salt) { // index of the first wrong byte, or n
    for (std::size_t k = 0; k < words; ++k) {
      const std::uint64_t w = word_at(k, salt);
      const std::size_t len = std::min<std::size_t>(8, n - 8 * k);
      if (std::memcmp(&mem[k], &w, len) != 0) return 8 * k;
    }
    return n;
  };
  if (c.rank() == 0) {
    fill(1);
    c.isend(buf, 1, tag).wait();
    fill(0);
    c.irecv(buf, 1, tag).wait();
    CHECK(first_bad(2) == n);
  } else {
    int got = 0;
    MPI_Status st;
    MPI_Recv(buf.data(), static_cast<int>(chunk), MPI_BYTE, 0, tag, c.native(), &st);
    MPI_Get_count(&st, MPI_BYTE, &got);
    CHECK(static_cast<std::size_t>(got) == chunk);
    MPI_Recv(buf.data() + chunk, 3, MPI_BYTE, 0, tag, c.native(), &st);
    MPI_Get_count(&st, MPI_BYTE, &got);
    CHECK(got == 3);
    CHECK(first_bad(1) == n);
    fill(2);
    MPI_Send(buf.data(), static_cast<int>(chunk), MPI_BYTE, 0, tag, c.native());
    MPI_Send(buf.data() + chunk, 3, MPI_BYTE, 0, tag, c.native());
  }
}

// Self-checks of the MPI test main, skipped in normal runs; meson runs them
// with --no-skip and expects the job to fail (should_fail), within seconds.
// 1. A test case that throws on one rank aborts every rank: the other rank,
//    waiting in a barrier the thrower never joins, must not hang.
TEST_CASE("harness self-check: an exception on one rank aborts the job" * doctest::skip()) {
  auto c = make_comm();
  c.set_timeout(std::chrono::minutes(5)); // only the abort can end rank 0's wait within meson's 60 s
  if (c.rank() == 1) throw std::runtime_error("deliberate failure on rank 1");
  barrier(c);
}
// 2. A failed CHECK on one rank makes every rank's exit status non-zero.
TEST_CASE("harness self-check: a failed check on one rank fails the job" * doctest::skip()) {
  auto c = make_comm();
  CHECK(c.rank() != 1);
  barrier(c);
}

TEST_CASE("ranks that disagree on the count all raise one mismatch error naming the odd rank (verify)") {
  auto& c = lasting_comm(10s);
  const int p = c.size(), r = c.rank();
  options o;
  o.verify = verification::always;
  std::vector<float> v(r == p - 1 ? 1001 : 1000, 1.0f);
  auto e = expect_error([&] { allreduce(c, std::span(v), op::sum{}, o); });
  if (e) {
    INFO(e->what());
    CHECK(e->kind() == errc::mismatch);
    CHECK(e->op() == "allreduce");
    CHECK(contains(e->reason(), "count differs"));
    CHECK(contains(e->reason(), "rank " + std::to_string(p - 1) + ": 1001"));
  }
  // The failed communicator fails fast from now on.
  auto again = expect_error([&] { allreduce(c, std::span(v), op::sum{}, o); });
  if (again) CHECK(again->kind() == errc::aborted);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("after a failed call, a new communicator receives nothing of the old one's messages") {
  for (int round = 0; round < 3; ++round) {
    {
      // Not kept: destroyed right after the failure (retired, not freed).
      auto bad = make_comm();
      bad.set_timeout(300ms);
      const int r = bad.rank();
      // Counts differ and nothing checks first: messages of the failed call stay in flight.
      std::vector<float> v(r == 0 ? 1000 : 1, 1.0f);
      options o;
      o.verify = verification::never;
      o.algo = algorithm::ring;
      (void)expect_error([&] { allreduce(bad, std::span(v), op::sum{}, o); });
      CHECK(bad.calls().failed());
      MPI_Barrier(MPI_COMM_WORLD);
    }
    auto fresh = make_comm();
    fresh.set_timeout(10s);
    const int p = fresh.size();
    std::vector<float> w(1000, static_cast<float>(fresh.rank() + 1));
    options o;
    o.algo = algorithm::ring;
    allreduce(fresh, std::span(w), op::sum{}, o);
    for (const float x : w) REQUIRE(x == static_cast<float>(p * (p + 1) / 2));
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("abort() from another thread frees a blocked wait with errc::aborted") {
  // (abort() makes no MPI call, so MPI_THREAD_SERIALIZED suffices)
  auto& c = lasting_comm(60s); // only the abort can end the wait early
  if (c.rank() == 0) {
    std::array<std::byte, 8> buf{};
    auto rq = c.irecv(std::span(buf), 1, 77); // never sent
    std::thread t([&] {
      std::this_thread::sleep_for(100ms);
      c.abort("test");
    });
    auto e = expect_error([&] { rq.wait(); });
    t.join();
    if (e) {
      CHECK(e->kind() == errc::aborted);
      CHECK(contains(e->reason(), "rank 0 aborted: test"));
    }
    auto later = expect_error([&] { (void)c.isend(std::span<const std::byte>(buf), 1, 78); });
    if (later) CHECK(later->kind() == errc::aborted);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("set_trace: a timeline per process, %r naming its file, written when it goes") {
  auto c = make_comm();
  // One directory for every rank: rank 0's pid names it.
  long long id = c.rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::string file = "/tmp/gradsync-mpi-trace-" + std::to_string(id) + "-%r.json";
  CHECK(c.trace() == nullptr); // GRADSYNC_TIMELINE is not set under meson test
  c.set_trace(timeline::open(file, c.rank(), c.size()));
  REQUIRE(c.trace() != nullptr);
  std::vector<float> x(100, 1.0f);
  allreduce(c, std::span(x), op::sum{}, {.algo = algorithm::ring});
  CHECK(x[99] == static_cast<float>(c.size()));
  const std::string mine = timeline::path_of(file, c.rank(), c.size());
  c.set_trace(nullptr); // closes the file
  std::ifstream f(mine);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::remove(mine.c_str());
  CHECK(contains(s, "{\"name\":\"allreduce\",\"cat\":\"call\""));
  CHECK(contains(s, "\"pid\":" + std::to_string(c.rank()) + ",\"tid\":0"));
  CHECK(contains(s, "\"name\":\"wait\""));
  CHECK(s.substr(s.size() < 4 ? 0 : s.size() - 4) == "\n]}\n");
}

namespace {

// Runs every rank's round_steps as messages would flow (a rank posts its
// step's send with what it knows, then waits for that step's receive; each
// pair's messages arrive in order): whether every rank finishes and then
// knows every rank.
bool round_spreads(const std::vector<int>& node) {
  const int p = static_cast<int>(node.size());
  const auto up = static_cast<std::size_t>(p);
  std::vector<std::vector<std::pair<int, int>>> steps(up);
  for (int r = 0; r < p; ++r) steps[static_cast<std::size_t>(r)] = mpi::detail::round_steps(node, r);
  std::vector<std::vector<bool>> know(up, std::vector<bool>(up, false));
  for (std::size_t r = 0; r < up; ++r) know[r][r] = true;
  std::vector<std::size_t> at(up, 0);
  std::vector<bool> posted(up, false);
  std::vector<std::vector<std::vector<std::vector<bool>>>> channel(up, std::vector<std::vector<std::vector<bool>>>(up));
  std::vector<std::vector<std::size_t>> head(up, std::vector<std::size_t>(up, 0));
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t r = 0; r < up; ++r) {
      if (at[r] == steps[r].size()) continue;
      const auto [to, from] = steps[r][at[r]];
      if (!posted[r]) {
        channel[r][static_cast<std::size_t>(to)].push_back(know[r]);
        posted[r] = true;
      }
      auto& q = channel[static_cast<std::size_t>(from)][r];
      auto& h = head[static_cast<std::size_t>(from)][r];
      if (h == q.size()) continue;
      for (std::size_t i = 0; i < up; ++i) know[r][i] = know[r][i] || q[h][i];
      ++h;
      ++at[r];
      posted[r] = false;
      moved = true;
    }
  }
  for (std::size_t r = 0; r < up; ++r) {
    if (at[r] != steps[r].size()) return false;
    if (std::find(know[r].begin(), know[r].end(), false) != know[r].end()) return false;
  }
  return true;
}

int ceil_log2(int n) { return n <= 1 ? 0 : std::bit_width(static_cast<unsigned>(n - 1)); }

} // namespace

TEST_CASE("agreement round steps: every rank learns every rank's hashes, crossing nodes ceil(log2 nodes) times") {
  // Node maps as the communicator makes them (a rank's node is the lowest
  // rank of its node): one node; one per rank; consecutive nodes of 8 and of
  // 3 (the last shorter); ranks dealt round-robin over 3 nodes; sizes 1, 4,
  // 2, 5, 1, 4, ... in turn.
  for (int p = 1; p <= 40; ++p) {
    const auto up = static_cast<std::size_t>(p);
    std::vector<std::vector<int>> maps(6, std::vector<int>(up));
    for (int r = 0; r < p; ++r) {
      const auto u = static_cast<std::size_t>(r);
      maps[0][u] = 0;
      maps[1][u] = r;
      maps[2][u] = r / 8 * 8;
      maps[3][u] = r / 3 * 3;
      maps[4][u] = r % 3;
    }
    {
      const int sizes[] = {1, 4, 2, 5};
      int first = 0, k = 0;
      for (int r = 0; r < p; ++r) {
        if (r - first == sizes[k % 4]) first = r, ++k;
        maps[5][static_cast<std::size_t>(r)] = first;
      }
    }
    for (std::size_t m = 0; m < maps.size(); ++m) {
      INFO("p " << p << " map " << m);
      const auto& node = maps[m];
      CHECK(round_spreads(node));
      const int nodes = static_cast<int>(std::count_if(node.begin(), node.end(), [&, q = 0](int) mutable {
        const bool first = node[static_cast<std::size_t>(q)] == q;
        ++q;
        return first;
      }));
      for (int r = 0; r < p; ++r) {
        const auto s = mpi::detail::round_steps(node, r);
        const auto crossing = std::count_if(s.begin(), s.end(), [&](const std::pair<int, int>& st) {
          return node[static_cast<std::size_t>(st.first)] != node[static_cast<std::size_t>(r)];
        });
        CHECK(crossing <= ceil_log2(nodes));
        if (m <= 1) CHECK(static_cast<int>(s.size()) == ceil_log2(p)); // as the flat round
      }
    }
  }
}
