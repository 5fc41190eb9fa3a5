// The exchange family (alltoall.hpp) over inproc ranks: every schedule
// against a reference built by hand (each element's expected source rank,
// destination rank and position), ranks 1..16, block lengths 0, 1, odd and
// large, every dtype, in and out of place; alltoallv with uniform, skewed
// (Zipf-like), MoE top-k and sparse count matrices, known and learned;
// neighbour exchange over gossip graphs; plans forwards and backwards; and
// the failures: bad arguments, counts that disagree between ranks, graphs
// whose edges lack an end.
#include <doctest/doctest.h>

#include <gradsync/alltoall.hpp>
#include <gradsync/transport/inproc.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../transport/rank_pool.hpp"
#include "all_fail.hpp"
#include "noded.hpp"

namespace {

using namespace gradsync;
using namespace std::chrono_literals;
using inproc::communicator;

constexpr int sweep_ranks[] = {1, 2, 3, 4, 5, 7, 8, 16};
constexpr algorithm schedules[] = {algorithm::automatic, algorithm::pairwise, algorithm::scattered, algorithm::bruck,
                                   algorithm::hier};

// Options running `a`; the two-level schedule on groups of 3 (uneven for
// most rank counts of the sweep).
options forced(algorithm a) {
  options o;
  o.algo = a;
  if (a == algorithm::hier) o.group_size = 3;
  return o;
}

using test::pool_of;

// The value element i of the block rank `src` sends rank `dst` carries:
// distinct for every (src, dst, i) within what every dtype holds exactly
// (bf16: integers up to 256).
long long tag_of(int src, int dst, std::size_t i, int p) {
  return static_cast<long long>((static_cast<std::size_t>(src * p + dst) * 7 + i * 3) % 251);
}
template <class T> T elem(long long v) { return static_cast<T>(static_cast<float>(v)); }

// Runs body on p ranks (threads kept between cases); the first failure,
// with the rank, comes back as a string ("" when all passed).
// The first rank's error of `errs` (one per rank), or "".
std::string first_error(const std::vector<std::string>& errs) {
  for (std::size_t r = 0; r < errs.size(); ++r)
    if (!errs[r].empty()) return "rank " + std::to_string(r) + ": " + errs[r];
  return {};
}

std::string on_ranks(int p, const std::function<void(communicator&, std::string&)>& body) {
  std::vector<std::string> errs(static_cast<std::size_t>(p));
  try {
    pool_of(p).run([&](communicator& c) {
      c.group().set_timeout(30s);
      body(c, errs[static_cast<std::size_t>(c.rank())]);
    });
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
  return first_error(errs);
}

// `body(c, err)` on ranks whose node_of is `nodes` (test::noded); the first
// rank's error, or "".
std::string on_noded(const std::vector<int>& nodes, const std::function<void(test::noded&, std::string&)>& body) {
  std::vector<std::string> errs(nodes.size());
  inproc::run(static_cast<int>(nodes.size()), [&](communicator& base) {
    test::noded c{base, nodes};
    body(c, errs[static_cast<std::size_t>(c.rank())]);
  });
  return first_error(errs);
}

template <class T> void alltoall_sweep(std::size_t block, bool in_place) {
  for (const int p : sweep_ranks)
    for (const algorithm a : schedules) {
      INFO("p=" << p << " block=" << block << " schedule=" << algorithm_name(a) << " in_place=" << in_place
                << " dtype=" << dtype_name(dtype_traits<T>::id));
      const std::string err = on_ranks(p, [&](communicator& c, std::string& e) {
        const int r = c.rank();
        const std::size_t n = block * static_cast<std::size_t>(p);
        std::vector<T> in(n), out(n, elem<T>(255));
        for (int q = 0; q < p; ++q)
          for (std::size_t i = 0; i < block; ++i) in[static_cast<std::size_t>(q) * block + i] = elem<T>(tag_of(r, q, i, p));
        const options o = forced(a);
        if (in_place) {
          alltoall(c, std::span<const T>(in), std::span<T>(in), o);
          out = in;
        } else {
          alltoall(c, std::span<const T>(in), std::span<T>(out), o);
        }
        for (int q = 0; q < p && e.empty(); ++q)
          for (std::size_t i = 0; i < block; ++i)
            if (!(out[static_cast<std::size_t>(q) * block + i] == elem<T>(tag_of(q, r, i, p)))) {
              e = "element " + std::to_string(i) + " of the block from rank " + std::to_string(q) + " is wrong";
              break;
            }
      });
      CHECK_MESSAGE(err.empty(), err);
    }
}

TEST_CASE("alltoall: every schedule, ranks 1..16, blocks 0, 1, 37, in and out of place, every dtype") {
  for (const std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{37}})
    for (const bool in_place : {false, true}) {
      alltoall_sweep<float>(block, in_place);
      alltoall_sweep<std::int32_t>(block, in_place);
    }
  alltoall_sweep<double>(5, false);
  alltoall_sweep<half>(5, true);
  alltoall_sweep<bfloat16>(5, false);
  alltoall_sweep<std::int64_t>(5, true);
}

TEST_CASE("alltoall: large blocks (256 KiB per peer, past the shm eager limit) on 4 ranks") {
  const std::size_t block = std::size_t{64} << 10;
  for (const algorithm a : schedules) {
    const std::string err = on_ranks(4, [&](communicator& c, std::string& e) {
      const int r = c.rank();
      std::vector<float> in(block * 4), out(block * 4);
      for (int q = 0; q < 4; ++q)
        for (std::size_t i = 0; i < block; ++i) in[static_cast<std::size_t>(q) * block + i] = float(tag_of(r, q, i, 4));
      const options o = forced(a);
      alltoall(c, std::span<const float>(in), std::span<float>(out), o);
      for (int q = 0; q < 4 && e.empty(); ++q)
        for (std::size_t i = 0; i < block; ++i)
          if (out[static_cast<std::size_t>(q) * block + i] != float(tag_of(q, r, i, 4))) {
            e = "wrong element from rank " + std::to_string(q);
            break;
          }
    });
    CHECK_MESSAGE(err.empty(), algorithm_name(a) << ": " << err);
  }
}

// Two-level alltoall over `nodes` (node_of) or blocks of `group` ranks:
// every block checked, in or out of place; "" when right.
std::string two_level(const std::vector<int>& nodes, int group, std::size_t block, bool in_place) {
  const int p = static_cast<int>(nodes.size());
  return on_noded(nodes, [&](test::noded& c, std::string& e) {
    const int r = c.rank();
    const std::size_t n = block * static_cast<std::size_t>(p);
    std::vector<std::int32_t> in(n), out(n, -1);
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < block; ++i) in[static_cast<std::size_t>(q) * block + i] = static_cast<std::int32_t>(tag_of(r, q, i, p));
    options o = forced(algorithm::hier);
    o.group_size = group;
    o.workspace = {}; // sized by the query below, then passed
    std::vector<std::byte> ws(alltoall_workspace_bytes<std::int32_t>(c, block, o, in_place));
    o.workspace = ws;
    if (in_place) {
      alltoall(c, std::span<const std::int32_t>(in), std::span<std::int32_t>(in), o);
      out = in;
    } else {
      alltoall(c, std::span<const std::int32_t>(in), std::span<std::int32_t>(out), o);
    }
    for (int q = 0; q < p && e.empty(); ++q)
      for (std::size_t i = 0; i < block; ++i)
        if (out[static_cast<std::size_t>(q) * block + i] != static_cast<std::int32_t>(tag_of(q, r, i, p))) {
          e = "element " + std::to_string(i) + " of the block from rank " + std::to_string(q) + " is wrong";
          break;
        }
  });
}

TEST_CASE("alltoall hier: every group size on 1..16 ranks, and nodes contiguous, interleaved or uneven") {
  for (const int p : sweep_ranks)
    for (int g = 1; g <= p; ++g)
      for (const std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{9}})
        for (const bool in_place : {false, true}) {
          const std::string err = two_level(std::vector<int>(static_cast<std::size_t>(p), 0), g, block, in_place);
          CHECK_MESSAGE(err.empty(), "p=" << p << " group=" << g << " block=" << block << " in_place=" << in_place
                                          << ": " << err);
        }
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 0, 0, 1, 1, 1, 1},             // two nodes of four
      {0, 1, 0, 1, 0, 1, 0, 1},             // interleaved (staged receives)
      {5, 5, 5, 2, 2, 9, 9, 9},             // 3 + 2 + 3, arbitrary ids
      {0, 1, 1, 2, 2, 2, 3, 3, 3, 3},       // 1 + 2 + 3 + 4
      {3, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3}, // interleaved groups of three
      {0, 1, 2, 3, 4, 5, 6},                // one rank per node
  };
  for (const auto& nodes : layouts)
    for (const std::size_t block : {std::size_t{1}, std::size_t{1000}})
      for (const bool in_place : {false, true}) {
        const std::string err = two_level(nodes, 0, block, in_place);
        CHECK_MESSAGE(err.empty(), nodes.size() << " ranks, node of rank 1 " << nodes[1] << ", block=" << block
                                               << " in_place=" << in_place << ": " << err);
      }
}

// Two-level alltoallv over `nodes` (node_of) or blocks of `group` ranks with
// the count matrix m: every element checked; "" when right.
std::string two_level_v(const std::vector<int>& nodes, int group, const std::function<std::size_t(int, int)>& m) {
  const int p = static_cast<int>(nodes.size());
  return on_noded(nodes, [&](test::noded& c, std::string& e) {
    const int r = c.rank();
    std::vector<std::size_t> sc, rc;
    std::vector<std::int32_t> in;
    for (int q = 0; q < p; ++q) {
      sc.push_back(m(r, q));
      rc.push_back(m(q, r));
      for (std::size_t i = 0; i < m(r, q); ++i) in.push_back(static_cast<std::int32_t>(tag_of(r, q, i, p)));
    }
    std::size_t total = 0;
    for (const std::size_t n : rc) total += n;
    std::vector<std::int32_t> out(total + 2, -1);
    options o = forced(algorithm::hier);
    o.group_size = group;
    alltoallv(c, std::span<const std::int32_t>(in), sc, std::span<std::int32_t>(out), rc, o);
    std::size_t at = 0;
    for (int q = 0; q < p && e.empty(); ++q) {
      for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
        if (out[at + i] != static_cast<std::int32_t>(tag_of(q, r, i, p))) {
          e = "element " + std::to_string(i) + " from rank " + std::to_string(q) + " is wrong";
          break;
        }
      at += rc[static_cast<std::size_t>(q)];
    }
    if (e.empty() && (out[total] != -1 || out[total + 1] != -1)) e = "wrote past the received blocks";
  });
}

TEST_CASE("alltoallv hier: every group size on 1..16 ranks, uneven nodes, skewed and sparse counts") {
  // counts: skewed by distance, zero on the diagonal and every third pair
  const auto skewed = [](int s, int d) { return s == d || (s + 2 * d) % 3 == 0 ? std::size_t{0} : std::size_t((s * 7 + d * 3) % 11 + 1); };
  for (const int p : sweep_ranks)
    for (int g = 1; g <= p; ++g) {
      const std::string err = two_level_v(std::vector<int>(static_cast<std::size_t>(p), 0), g, skewed);
      CHECK_MESSAGE(err.empty(), "p=" << p << " group=" << g << ": " << err);
    }
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1}, {5, 5, 5, 2, 2, 9, 9, 9},
      {0, 1, 1, 2, 2, 2, 3, 3, 3, 3}, {3, 0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3}, {0, 1, 2, 3, 4, 5, 6},
  };
  const auto big = [](int s, int d) { return std::size_t((s + 1) * 1000 + d * 37); };
  const auto zeros = [](int, int) { return std::size_t{0}; };
  const auto one_sender = [](int s, int d) { return s == 2 ? std::size_t(d + 5) : std::size_t{0}; };
  for (const auto& nodes : layouts)
    for (const auto& item : std::vector<std::pair<const char*, std::function<std::size_t(int, int)>>>{
             {"skewed", skewed}, {"large", big}, {"zeros", zeros}, {"one sender", one_sender}}) {
      const auto& what = item.first;
      const auto& m = item.second;
      const std::string err = two_level_v(nodes, 0, m);
      CHECK_MESSAGE(err.empty(), nodes.size() << " ranks, node of rank 1 " << nodes[1] << ", " << what << ": " << err);
    }
}

TEST_CASE("alltoallv hier: counts that disagree fail the receiving group with the pair named, inside a group and across") {
  // Groups {0, 1} and {2, 3}. Rank 1 expects from `from` one element more
  // and (across groups, case 2) one less from rank 2: the totals between
  // the groups agree, and only the counts in phase B's header show it.
  struct trial {
    int from;
    bool shift; // rank 1 expects one less from rank 2 (equal totals across)
    const char* names;
  };
  for (const trial t : {trial{0, false, "rank 0 sends rank 1 2 elements, which expects 3"},
                        trial{3, true, "rank 2 sends rank 1 2 elements, which expects 1"},
                        trial{3, false, "mismatch"}}) {
    CAPTURE(t.from);
    CAPTURE(t.shift);
    std::vector<std::string> what(4);
    std::vector<int> kinds(4, -1);
    inproc::run(4, [&](communicator& c) {
      c.group().set_timeout(std::chrono::seconds(20));
      const int r = c.rank();
      std::vector<std::size_t> sc(4, 2), rc(4, 2);
      if (r == 1) {
        rc[static_cast<std::size_t>(t.from)] = 3;
        if (t.shift) rc[2] = 1;
      }
      std::size_t total = 0;
      for (const std::size_t n : rc) total += n;
      std::vector<float> in(8, 1.0f), out(total);
      options o = forced(algorithm::hier);
      o.group_size = 2;
      try {
        alltoallv(c, std::span<const float>(in), sc, std::span<float>(out), rc, o);
      } catch (const error& e) {
        what[static_cast<std::size_t>(r)] = e.what();
        kinds[static_cast<std::size_t>(r)] = static_cast<int>(e.kind());
      }
    });
    for (const int r : {0, 1}) { // the receiving group (both ranks, inside one group too)
      INFO("rank " << r << ": " << what[static_cast<std::size_t>(r)]);
      CHECK(kinds[static_cast<std::size_t>(r)] == static_cast<int>(errc::mismatch));
    }
    CHECK_MESSAGE(what[1].find(t.names) != std::string::npos, what[1]);
    for (const int r : {2, 3}) { // the other group: done, or failed alike where its send failed its size
      INFO("rank " << r << ": " << what[static_cast<std::size_t>(r)]);
      CHECK((kinds[static_cast<std::size_t>(r)] == -1 || kinds[static_cast<std::size_t>(r)] == static_cast<int>(errc::mismatch)));
    }
  }
}

TEST_CASE("exchange_plan automatic: hier on a network of several nodes (the agreed largest block), never on one") {
  // 8 ranks per node, 30 us per message across nodes that a window does not
  // overlap (latency 0): each remote peer costs a scattered exchange 30 us,
  // hier one message per node pair.
  cost_model m;
  m.local = link_cost{1e-6, 1e-10, 0, 1e-6};
  m.global = link_cost{30e-6, 1e-9, 0, 0};
  m.nic_share = 8;
  const selector sel(m);
  const int p = 16;
  std::vector<std::string> errs(static_cast<std::size_t>(p));
  inproc::run(p, [&](communicator& base) {
    test::noded c{base, {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}};
    const int r = c.rank();
    std::string& e = errs[static_cast<std::size_t>(r)];
    // Skewed small counts: rank r sends q (r + 2q) % 5 items.
    std::vector<std::size_t> sc, rc;
    for (int q = 0; q < p; ++q) {
      sc.push_back(static_cast<std::size_t>((r + 2 * q) % 5));
      rc.push_back(static_cast<std::size_t>((q + 2 * r) % 5));
    }
    options o;
    o.select = &sel;
    const exchange_plan plan(c, sc, rc, o);
    if (plan.algorithm_for(c, sizeof(float)) != algorithm::hier) e = "automatic did not pick hier for 4-byte items";
    if (plan.algorithm_for(c, std::size_t{1} << 20) == algorithm::hier) e = "automatic picked hier for 4 MiB blocks";
    std::vector<float> in, out(plan.recv_items(), -1.0f), back(plan.send_items());
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) in.push_back(float(tag_of(r, q, i, p)));
    plan.run(c, std::span<const float>(in), std::span<float>(out));
    std::size_t at = 0;
    for (int q = 0; q < p && e.empty(); ++q)
      for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
        if (out[at++] != float(tag_of(q, r, i, p))) {
          e = "wrong element from rank " + std::to_string(q);
          break;
        }
    plan.run_back(c, std::span<const float>(out), std::span<float>(back));
    if (e.empty() && back != in) e = "backward did not return every item";
    // One node: no hier, whatever the model.
    const exchange_plan flat(base, sc, rc, o);
    if (flat.algorithm_for(base, sizeof(float)) == algorithm::hier) e = "hier picked without groups";
  });
  for (std::size_t r = 0; r < errs.size(); ++r) CHECK_MESSAGE(errs[r].empty(), "rank " << r << ": " << errs[r]);
}

TEST_CASE("exchange_plan hier: ranks that disagree on the groups all fail at creation") {
  test::expect_all_fail(4, errc::mismatch, "groups", [](communicator& c) {
    const std::vector<std::size_t> counts(4, 2);
    options o = forced(algorithm::hier);
    o.group_size = c.rank() == 3 ? 4 : 2;
    const exchange_plan plan(c, counts, counts, o);
  });
}

TEST_CASE("alltoall: the model picks Bruck for small blocks on many ranks, scattered for large ones") {
  pool_of(16).run([](communicator& c) {
    CHECK(alltoall_algorithm<float>(c, 1) == algorithm::bruck);
    CHECK(alltoall_algorithm<float>(c, 1 << 20) == algorithm::scattered);
  });
  pool_of(2).run([](communicator& c) { CHECK(alltoall_algorithm<float>(c, 1) != algorithm::bruck); });
}

TEST_CASE("alltoall: pairwise and scattered pay the own block's local copy") {
  // One group, no per-size extras, no latency: p - 1 messages of alpha +
  // beta m each, and m bytes copied at arena.copy.
  cost_model m;
  m.local = m.global = link_cost{2e-6, 1e-10, 0, 0};
  m.arena.copy = 7e-11;
  for (const int p : {2, 3, 8}) {
    const topology t{.ranks = p};
    for (const double bytes : {8.0, 4096.0, 8.0 * (1 << 20)}) {
      CAPTURE(p);
      CAPTURE(bytes);
      const double want = (p - 1) * (2e-6 + bytes * 1e-10) + bytes * 7e-11;
      CHECK(m.exchange(algorithm::pairwise, bytes, t) == doctest::Approx(want).epsilon(1e-12));
      // scattered: the same less the tie-break, 1e-3 alpha per extra message in flight.
      const double ties = (std::min(policy::alltoall_window, p - 1) - 1) * 1e-3 * 2e-6;
      CHECK(m.exchange(algorithm::scattered, bytes, t) == doctest::Approx(want - ties).epsilon(1e-12));
    }
  }
  // On 2 shm ranks with the arena as calibrated on the CI VM (copy 7.28e-11
  // s/B, sync 0.51 us; messages alpha 1.39 us, beta 1.02e-10): 8 MiB blocks
  // go direct (measured 1377 us against pairwise's 1556); without the own
  // block's copy the model put pairwise at 853 us and picked it.
  cost_model vm;
  vm.local = vm.global = link_cost{1.39e-6, 1.02e-10, 3.24e-11, 4.82e-7};
  vm.arena.copy = 7.28e-11;
  vm.arena.sync = 5.1e-7;
  const topology shm2{.ranks = 2, .shared_arena = true};
  CHECK(selector(vm).choose_alltoall(std::size_t{8} << 20, shm2, true) == algorithm::direct);
  CHECK(selector(vm).choose_alltoall(std::size_t{128} << 10, shm2, true) == algorithm::direct);
}

TEST_CASE("alltoall: the direct schedule's cost on a shared arena, and the picks it leads to") {
  const cost_model m = cost_model::shared_memory();
  const selector sel(m);
  for (const int p : {2, 4, 16}) {
    CAPTURE(p);
    const topology shm{.ranks = p, .shared_arena = true}, msgs{.ranks = p};
    // Closed form: ceil(m / slice) rounds of one synchronisation, slices of
    // (half - 16 p) / p bytes, and p m bytes through memory once (staged and
    // copied out through the cached arena; the own block copied).
    for (const double bytes : {8.0, 65536.0, 3.0 * (1 << 20)}) {
      const double slice = (m.arena.half_bytes - 16.0 * p) / p;
      const double want = std::max(1.0, std::ceil(bytes / slice)) * m.arena.sync + p * bytes * m.arena.copy;
      CHECK(m.exchange(algorithm::direct, bytes, shm) == doctest::Approx(want).epsilon(1e-12));
      CHECK(std::isinf(m.exchange(algorithm::direct, bytes, msgs)));
      CHECK(sel.choose_alltoall(static_cast<std::size_t>(bytes), msgs, true) != algorithm::direct);
    }
    // No message's alpha: the arena wins at every size on shared memory.
    for (const std::size_t bytes : {std::size_t{8}, std::size_t{4096}, std::size_t{1} << 20})
      CHECK(sel.choose_alltoall(bytes, shm, false) == algorithm::direct);
  }
  // Pinned by the table (GRADSYNC_ALGO): honoured where it can run.
  const selector pinned(m, {size_rule{algorithm::direct}});
  CHECK(pinned.choose_alltoall(64, topology{.ranks = 4, .shared_arena = true}, true) == algorithm::direct);
  CHECK(pinned.choose_alltoall(64, topology{.ranks = 4}, true) != algorithm::direct);
  // alltoallv on a transport without an arena never runs direct.
  pool_of(3).run([](communicator& c) {
    CHECK(alltoallv_algorithm(c, 8) != algorithm::direct);
    options o;
    o.algo = algorithm::direct;
    CHECK_THROWS_WITH_AS(alltoallv_algorithm(c, 8, o), doctest::Contains("not available"), error);
  });
}

TEST_CASE("alltoall hier: its cost in closed form, and where the model picks it") {
  // A network like the simulated clusters': 8 ranks per node behind one
  // NIC, 30 us across nodes (all of it latency a window overlaps), 1 us inside.
  cost_model m;
  m.local = link_cost{1e-6, 1e-10, 0, 1e-6};
  m.global = link_cost{30e-6, 1e-9, 0, 30e-6};
  m.nic_share = 8;
  const selector sel(m);
  for (const auto& item : {std::pair{64, 8}, std::pair{256, 8}, std::pair{1024, 8}, std::pair{48, 4}}) {
    const auto& p = item.first;
    const auto& g = item.second;
    const topology t{.ranks = p, .group_size = g, .groups = p / g};
    const double n = p / g;
    for (const double bytes : {8.0, 256.0, 65536.0}) {
      CAPTURE(p);
      CAPTURE(bytes);
      // Inside the group twice: g - 1 messages of n blocks, one window
      // (latency once); across: ceil((n - 1) / g) messages of g^2 blocks,
      // the NIC shared g ways, a latency per window of 32; four passes over
      // the p blocks.
      const double in = 1e-6 + (g - 1) * (n * bytes * 1e-10);
      const double k = std::ceil((n - 1) / g);
      const double out = std::ceil(k / 32) * 30e-6 + k * (g * g * bytes * 1e-9 * g);
      const double want = 2 * in + out + 4.0 * p * bytes * m.arena.copy;
      CHECK(m.exchange(algorithm::hier, bytes, t) == doctest::Approx(want).epsilon(1e-12));
    }
    // Small blocks: far fewer latencies than any flat schedule.
    CHECK(sel.choose_alltoall(8, t, true) == algorithm::hier);
    CHECK(sel.choose_alltoall(8, t, false) != algorithm::hier); // alltoallv: ranks could split
    CHECK(sel.choose_alltoall(8, t, false, true) == algorithm::hier); // a plan's agreed largest block
    CHECK(sel.choose_alltoall(8, t, false, true) != algorithm::bruck);
  }
  // Not a candidate on one group, or on groups of one rank.
  CHECK(std::isinf(m.exchange(algorithm::hier, 8, topology{.ranks = 16, .group_size = 16, .groups = 1})));
  CHECK(std::isinf(m.exchange(algorithm::hier, 8, topology{.ranks = 16, .group_size = 1, .groups = 16})));
  // Pinned by the table: honoured where there are groups.
  const selector pinned(m, {size_rule{algorithm::hier}});
  CHECK(pinned.choose_alltoall(1 << 20, topology{.ranks = 16, .group_size = 4, .groups = 4}, true) == algorithm::hier);
  CHECK(pinned.choose_alltoall(64, topology{.ranks = 16}, true) != algorithm::hier);
}

// Count matrices: counts(src, dst) for p ranks.
using matrix = std::function<std::size_t(int, int)>;

std::vector<std::pair<std::string, matrix>> patterns(int p) {
  std::vector<std::pair<std::string, matrix>> v;
  v.emplace_back("uniform", [](int, int) { return std::size_t{3}; });
  v.emplace_back("zeros", [](int, int) { return std::size_t{0}; });
  v.emplace_back("zipf", [p](int s, int d) { // 1/(1 + distance)^1.2, the largest block 40
    const int dist = (d - s + p) % p;
    return static_cast<std::size_t>(40.0 / std::pow(1.0 + dist, 1.2));
  });
  v.emplace_back("zero-row", [](int s, int d) { return s == 0 ? std::size_t{0} : std::size_t(1 + (s + d) % 4); });
  v.emplace_back("sparse", [p](int s, int d) { return (d == (s + 1) % p || d == (s + p - 1) % p) ? std::size_t{5} : 0; });
  v.emplace_back("moe-top2-of-64", [p](int s, int d) { // 64 experts, 2 per token, 32 tokens per rank
    std::mt19937 g(static_cast<unsigned>(1234 + s));
    std::size_t n = 0;
    for (int t = 0; t < 32; ++t) {
      const int e1 = static_cast<int>(g() % 64);
      int e2 = static_cast<int>(g() % 63);
      if (e2 >= e1) ++e2;
      n += (e1 % p == d) + (e2 % p == d);
    }
    return n;
  });
  return v;
}

template <class T> void alltoallv_sweep(int p, const std::string& name, const matrix& m, algorithm a, bool dynamic) {
  INFO("p=" << p << " pattern=" << name << " schedule=" << algorithm_name(a) << " dynamic=" << dynamic);
  const std::string err = on_ranks(p, [&](communicator& c, std::string& e) {
    const int r = c.rank();
    const auto np = static_cast<std::size_t>(p);
    std::vector<std::size_t> sc(np), rc(np);
    for (int q = 0; q < p; ++q) {
      sc[static_cast<std::size_t>(q)] = m(r, q);
      rc[static_cast<std::size_t>(q)] = m(q, r);
    }
    std::vector<T> in;
    for (int q = 0; q < p; ++q)
      for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) in.push_back(elem<T>(tag_of(r, q, i, p)));
    std::size_t total = 0;
    for (const std::size_t n : rc) total += n;
    std::vector<T> out(total + 3, elem<T>(255)); // room past the end stays untouched
    options o = forced(a);
    if (dynamic) {
      std::vector<std::size_t> learned(np, 99);
      const std::size_t got = alltoallv_dynamic(c, std::span<const T>(in), sc, std::span<T>(out), std::span<std::size_t>(learned), o);
      if (got != total) e = "learned a total of " + std::to_string(got) + ", expected " + std::to_string(total);
      if (learned != rc) e = "learned counts differ from the matrix";
    } else {
      alltoallv(c, std::span<const T>(in), sc, std::span<T>(out), rc, o);
    }
    std::size_t at = 0;
    for (int q = 0; q < p && e.empty(); ++q) {
      for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
        if (!(out[at + i] == elem<T>(tag_of(q, r, i, p)))) {
          e = "element " + std::to_string(i) + " from rank " + std::to_string(q) + " is wrong";
          break;
        }
      at += rc[static_cast<std::size_t>(q)];
    }
    for (std::size_t i = total; i < out.size() && e.empty(); ++i)
      if (!(out[i] == elem<T>(255))) e = "wrote past the received blocks";
  });
  CHECK_MESSAGE(err.empty(), err);
}

TEST_CASE("alltoallv: uniform, zero, Zipf, zero-row, sparse and MoE count matrices, known and learned counts") {
  for (const int p : sweep_ranks)
    for (const auto& item : patterns(p)) {
      const auto& name = item.first;
      const auto& m = item.second;
      for (const algorithm a : {algorithm::automatic, algorithm::pairwise, algorithm::scattered, algorithm::hier})
        alltoallv_sweep<float>(p, name, m, a, false);
      alltoallv_sweep<float>(p, name, m, algorithm::automatic, true);
    }
  alltoallv_sweep<double>(5, "zipf", patterns(5)[2].second, algorithm::automatic, false);
  alltoallv_sweep<half>(7, "zipf", patterns(7)[2].second, algorithm::hier, false);
  alltoallv_sweep<std::int64_t>(3, "zipf", patterns(3)[2].second, algorithm::automatic, true);
}

TEST_CASE("alltoallv: explicit displacements (gaps and reversed order) as MPI_Alltoallv") {
  const std::string err = on_ranks(3, [](communicator& c, std::string& e) {
    const int r = c.rank();
    // Rank r sends q+1 elements to q; the receive blocks go in reverse rank
    // order with a gap of 2 between them.
    std::vector<std::size_t> sc{1, 2, 3}, sd{0, 1, 3}, rc(3, std::size_t(r + 1)), rd(3);
    std::size_t at = 0;
    for (int q = 2; q >= 0; --q) {
      rd[static_cast<std::size_t>(q)] = at;
      at += rc[static_cast<std::size_t>(q)] + 2;
    }
    std::vector<int> in(6), out(at, -1);
    for (int q = 0; q < 3; ++q)
      for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) in[sd[static_cast<std::size_t>(q)] + i] = int(tag_of(r, q, i, 3));
    alltoallv(c, std::span<const int>(in), sc, sd, std::span<int>(out), rc, rd);
    for (int q = 0; q < 3; ++q) {
      for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
        if (out[rd[static_cast<std::size_t>(q)] + i] != int(tag_of(q, r, i, 3))) e = "wrong element";
      for (std::size_t g = 0; g < 2; ++g)
        if (out[rd[static_cast<std::size_t>(q)] + rc[static_cast<std::size_t>(q)] + g] != -1) e = "gap overwritten";
    }
  });
  CHECK_MESSAGE(err.empty(), err);
}

TEST_CASE("alltoallv_dynamic: into a vector sized by what arrives") {
  const std::string err = on_ranks(4, [](communicator& c, std::string& e) {
    const int r = c.rank();
    std::vector<std::size_t> sc(4), learned(4);
    std::vector<int> in;
    for (int q = 0; q < 4; ++q) {
      sc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(r * q);
      for (int i = 0; i < r * q; ++i) in.push_back(int(tag_of(r, q, static_cast<std::size_t>(i), 4)));
    }
    std::vector<int> out;
    const std::size_t n = alltoallv_dynamic(c, std::span<const int>(in), sc, out, std::span<std::size_t>(learned));
    std::size_t want = 0;
    for (int q = 0; q < 4; ++q) want += static_cast<std::size_t>(q * r);
    if (n != want || out.size() != want) e = "total " + std::to_string(n) + " expected " + std::to_string(want);
  });
  CHECK_MESSAGE(err.empty(), err);
}

TEST_CASE("neighbor_alltoallv: rings, torus, exponential graph, self edges, uneven counts") {
  for (const int p : {1, 2, 3, 4, 6, 8, 16}) {
    std::vector<std::pair<std::string, gossip::graph>> graphs;
    graphs.emplace_back("ring", gossip::ring(p));
    graphs.emplace_back("exponential", gossip::exponential(p));
    if (p == 6) graphs.emplace_back("torus", gossip::torus(2, 3));
    for (const auto& item : graphs) {
      const auto& name = item.first;
      const auto& gr = item.second;
      INFO("p=" << p << " graph=" << name);
      const std::string err = on_ranks(p, [&](communicator& c, std::string& e) {
        const int r = c.rank();
        const neighbors g = neighbors_of(gr.at(0), r);
        // Edge (s -> d) carries 1 + (s + 2 d) % 5 elements.
        auto count = [](int s, int d) { return std::size_t(1 + (s + 2 * d) % 5); };
        std::vector<std::size_t> sc, rc;
        std::vector<float> in;
        for (const int d : g.destinations) {
          sc.push_back(count(r, d));
          for (std::size_t i = 0; i < sc.back(); ++i) in.push_back(float(tag_of(r, d, i, p)));
        }
        std::size_t total = 0;
        for (const int s : g.sources) total += rc.emplace_back(count(s, r));
        std::vector<float> out(total, -1);
        neighbor_alltoallv(c, g, std::span<const float>(in), sc, std::span<float>(out), rc);
        std::size_t at = 0;
        for (std::size_t k = 0; k < g.sources.size(); ++k) {
          for (std::size_t i = 0; i < rc[k]; ++i)
            if (out[at + i] != float(tag_of(g.sources[k], r, i, p))) e = "wrong element from " + std::to_string(g.sources[k]);
          at += rc[k];
        }
      });
      CHECK_MESSAGE(err.empty(), err);
    }
  }
  // A self edge is a local copy.
  const std::string err = on_ranks(2, [](communicator& c, std::string& e) {
    const int r = c.rank();
    const neighbors g{{r, 1 - r}, {1 - r, r}};
    std::vector<int> in{10 * r, 10 * r + 1, 10 * r + 2}, out(3, -1);
    const std::vector<std::size_t> sc{1, 2}, rc{2, 1};
    neighbor_alltoallv(c, g, std::span<const int>(in), sc, std::span<int>(out), rc);
    if (out[0] != 10 * r + 1 || out[1] != 10 * r + 2 || out[2] != 10 * (1 - r)) e = "self edge or peer block wrong";
  });
  CHECK_MESSAGE(err.empty(), err);
}

TEST_CASE("exchange_plan: forwards then backwards restores the input; several dtypes and widths on one plan") {
  // automatic, the message schedules (empty blocks skipped where the plan
  // is sparse), and hier over groups of 3 (its group counts fixed at creation)
  for (const algorithm a : {algorithm::automatic, algorithm::scattered, algorithm::pairwise, algorithm::hier})
  for (const int p : sweep_ranks)
    for (const auto& item : patterns(p)) {
      const auto& name = item.first;
      const auto& m = item.second;
      INFO("p=" << p << " pattern=" << name << " schedule=" << algorithm_name(a));
      const std::string err = on_ranks(p, [&](communicator& c, std::string& e) {
        const int r = c.rank();
        std::vector<std::size_t> sc, rc;
        for (int q = 0; q < p; ++q) {
          sc.push_back(m(r, q));
          rc.push_back(m(q, r));
        }
        const exchange_plan plan(c, sc, rc, forced(a));
        for (const std::size_t width : {std::size_t{1}, std::size_t{4}}) {
          std::vector<float> tokens(plan.send_items() * width), got(plan.recv_items() * width),
              back(plan.send_items() * width);
          std::size_t at = 0;
          for (int q = 0; q < p; ++q)
            for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)] * width; ++i) tokens[at++] = float(tag_of(r, q, i, p));
          plan.run(c, std::span<const float>(tokens), std::span<float>(got), width);
          at = 0;
          for (int q = 0; q < p && e.empty(); ++q)
            for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)] * width; ++i)
              if (got[at++] != float(tag_of(q, r, i, p))) {
                e = "forward: wrong element from rank " + std::to_string(q);
                break;
              }
          plan.run_back(c, std::span<const float>(got), std::span<float>(back), width);
          if (back != tokens) e = "backward did not return every token to its sender";
        }
        std::vector<std::int32_t> idx(plan.send_items()), idx_out(plan.recv_items());
        for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<std::int32_t>(i + 1000u * static_cast<unsigned>(r));
        plan.run(c, std::span<const std::int32_t>(idx), std::span<std::int32_t>(idx_out));
        // Another element size on the same plan (hier keeps its buffers from
        // run to run): rank q's item j for this rank is q's send offset + j.
        std::size_t got_at = 0;
        for (int q = 0; q < p && e.empty(); ++q) {
          std::size_t q_offset = 0;
          for (int t = 0; t < r; ++t) q_offset += m(q, t);
          for (std::size_t j = 0; j < m(q, r); ++j, ++got_at)
            if (idx_out[got_at] != static_cast<std::int32_t>(q_offset + j + 1000u * static_cast<unsigned>(q))) {
              e = "int32 run: wrong item from rank " + std::to_string(q);
              break;
            }
        }
      });
      CHECK_MESSAGE(err.empty(), err);
    }
}

TEST_CASE("exchange_plan: a graph plan over a directed ring, forwards and backwards") {
  for (const int p : {2, 3, 5}) {
    const std::string err = on_ranks(p, [&](communicator& c, std::string& e) {
      const int r = c.rank();
      const neighbors g{{(r + p - 1) % p}, {(r + 1) % p}};
      const std::vector<std::size_t> sc{std::size_t(r + 1)}, rc{std::size_t((r + p - 1) % p + 1)};
      const exchange_plan plan(c, g, sc, rc);
      std::vector<double> x(sc[0], double(r)), y(rc[0]), z(sc[0]);
      plan.run(c, std::span<const double>(x), std::span<double>(y));
      for (const double v : y)
        if (v != double((r + p - 1) % p)) e = "forward wrong";
      plan.run_back(c, std::span<const double>(y), std::span<double>(z));
      if (z != x) e = "backward wrong";
    });
    CHECK_MESSAGE(err.empty(), err);
  }
}

// inproc ranks that count the messages they send on one tag (the
// schedule's; the call check's own messages use another).
struct counted {
  static constexpr std::string_view name = "counted";
  communicator& c;
  int tag;
  std::size_t sends = 0;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> d, int peer, int t) {
    sends += t == tag;
    return c.isend(d, peer, t);
  }
  auto irecv(std::span<std::byte> d, int peer, int t) { return c.irecv(d, peer, t); }
};

TEST_CASE("exchange_plan: a plan with empty blocks sends nothing for them (scattered, pairwise, automatic)") {
  // Each rank sends r + 1 items to r + 1 and one to itself, nothing else
  // (empty blocks from 3 ranks on): one message forwards and one backwards;
  // with every block filled (dense) p - 1 each way.
  for (const int p : {2, 3, 5, 8})
    for (const bool dense : {false, true})
      for (const algorithm a : {algorithm::automatic, algorithm::scattered, algorithm::pairwise}) {
        INFO("p=" << p << " dense=" << dense << " schedule=" << algorithm_name(a));
        auto m = [&](int s, int d) -> std::size_t {
          if (dense) return std::size_t(1 + (s + 2 * d) % 3);
          return d == s ? 1 : d == (s + 1) % p ? std::size_t(s + 1) : 0;
        };
        const std::string err = on_ranks(p, [&](communicator& base, std::string& e) {
          const int r = base.rank();
          counted c{base, 7};
          std::vector<std::size_t> sc, rc;
          for (int q = 0; q < p; ++q) {
            sc.push_back(m(r, q));
            rc.push_back(m(q, r));
          }
          options o = forced(a);
          o.tag = 7;
          const exchange_plan plan(c, sc, rc, o);
          bool empty_block = false; // some rank's block to another has no items
          for (int s = 0; s < p; ++s)
            for (int d = 0; d < p; ++d) empty_block |= s != d && m(s, d) == 0;
          if (plan.sparse() != empty_block) e = "sparse() is " + std::to_string(plan.sparse());
          std::vector<float> x, y(plan.recv_items()), z(plan.send_items());
          for (int q = 0; q < p; ++q)
            for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) x.push_back(float(tag_of(r, q, i, p)));
          c.sends = 0;
          plan.run(c, std::span<const float>(x), std::span<float>(y));
          const std::size_t forward = c.sends;
          std::size_t at = 0;
          for (int q = 0; q < p; ++q)
            for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i)
              if (y[at++] != float(tag_of(q, r, i, p))) e = "wrong element from rank " + std::to_string(q);
          c.sends = 0;
          plan.run_back(c, std::span<const float>(y), std::span<float>(z));
          if (z != x) e = "backward did not restore the input";
          std::size_t want_fwd = 0, want_back = 0; // blocks to and from other ranks with items
          for (int q = 0; q < p; ++q)
            if (q != r) want_fwd += m(r, q) != 0, want_back += m(q, r) != 0;
          if (forward != want_fwd || c.sends != want_back)
            e = "sent " + std::to_string(forward) + " forwards and " + std::to_string(c.sends) + " backwards, expected " +
                std::to_string(want_fwd) + " and " + std::to_string(want_back);
        });
        CHECK_MESSAGE(err.empty(), err);
      }
}

TEST_CASE("exchange_plan::run_bytes: bytes for a block the plan has empty are refused, naming the entry") {
  inproc::run(2, [](communicator& c) {
    const int r = c.rank();
    const std::vector<std::size_t> counts = r == 0 ? std::vector<std::size_t>{2, 0} : std::vector<std::size_t>{0, 2};
    const exchange_plan plan(c, counts, counts, forced(algorithm::scattered));
    CHECK(plan.sparse());
    std::vector<std::byte> in(16), out(16);
    const std::vector<std::size_t> bytes{4, 4}; // 4 bytes to and from the other rank, which has no items
    CHECK_THROWS_WITH_AS(plan.run_bytes(c, std::span<const std::byte>(in), bytes, std::span<std::byte>(out), bytes,
                                        false, 8, dtype::f32, 0),
                         doctest::Contains("has no items in the plan but 4 bytes"), error);
  });
}

using test::expect_all_fail;

TEST_CASE("alltoall(v): bad arguments fail with the operation, rank and reason") {
  inproc::run(3, [](communicator& c) {
    std::vector<float> a(7), b(7), six(6);
    CHECK_THROWS_WITH_AS(alltoall(c, std::span<const float>(a), std::span<float>(b)),
                         doctest::Contains("does not split into 3 equal blocks"), error);
    CHECK_THROWS_WITH_AS(alltoall(c, std::span<const float>(six), std::span<float>(b)),
                         doctest::Contains("input holds 6 elements, output 7"), error);
    std::vector<std::size_t> two{1, 1}, three{1, 1, 1}, big{1, 1, 9};
    CHECK_THROWS_WITH_AS(alltoallv(c, std::span<const float>(six), two, std::span<float>(b), three),
                         doctest::Contains("2 send and 3 receive counts for 3 ranks"), error);
    CHECK_THROWS_WITH_AS(alltoallv(c, std::span<const float>(six), big, std::span<float>(b), three),
                         doctest::Contains("outside the buffer"), error);
    std::vector<std::size_t> rd{0, 0, 1}; // blocks 0 and 1 overlap
    CHECK_THROWS_WITH_AS(alltoallv(c, std::span<const float>(six), three, three, std::span<float>(b), three, rd),
                         doctest::Contains("overlap"), error);
    options o;
    o.algo = algorithm::bruck;
    CHECK_THROWS_WITH_AS(alltoallv(c, std::span<const float>(six), three, std::span<float>(b), three, o),
                         doctest::Contains("not available for alltoallv"), error);
    CHECK_THROWS_WITH_AS(alltoallv(c, std::span<const float>(six), three, std::span<float>(six), three),
                         doctest::Contains("overlap"), error);
    const neighbors g{{5}, {1}};
    CHECK_THROWS_WITH_AS(neighbor_alltoallv(c, g, std::span<const float>(six), std::span<const std::size_t>(two).first(1), std::span<float>(b), std::span<const std::size_t>(two).first(1)),
                         doctest::Contains("source 5 out of range"), error);
  });
}

TEST_CASE("alltoallv: a count that disagrees with the peer's fails both ranks of the pair (errc::mismatch)") {
  for (const std::size_t base : {std::size_t{0}, std::size_t{2}, std::size_t{1} << 16}) {
    INFO("base count " << base);
    expect_all_fail(2, errc::mismatch, "mismatch", [&](communicator& c) {
      const int r = c.rank();
      std::vector<std::size_t> sc(2, base), rc(2, base);
      if (r == 1) sc[0] = base + 1; // rank 0 expects base from rank 1
      std::vector<float> in(2 * base + 1), out(2 * base + 1);
      alltoallv(c, std::span<const float>(in), sc, std::span<float>(out), rc);
    });
  }
}

TEST_CASE("alltoall: ranks that disagree on the block length or the dtype fail alike at every size") {
  for (const std::size_t n : {std::size_t{1}, std::size_t{512}, std::size_t{131072}}) {
    INFO("block " << n);
    expect_all_fail(3, errc::mismatch, "alltoall", [&](communicator& c) {
      const std::size_t block = c.rank() == 2 ? n + 1 : n;
      std::vector<float> in(3 * block), out(3 * block);
      alltoall(c, std::span<const float>(in), std::span<float>(out));
    });
    expect_all_fail(2, errc::mismatch, "alltoall", [&](communicator& c) {
      if (c.rank() == 0) {
        std::vector<float> in(2 * n), out(2 * n);
        alltoall(c, std::span<const float>(in), std::span<float>(out));
      } else {
        std::vector<std::int32_t> in(2 * n), out(2 * n);
        alltoall(c, std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
      }
    });
  }
}

TEST_CASE("exchange_plan: counts that disagree pairwise fail every rank with the same message") {
  std::vector<std::string> msgs(3);
  inproc::run(3, [&](communicator& c) {
    c.group().set_timeout(5s);
    const int r = c.rank();
    std::vector<std::size_t> sc(3, 2), rc(3, 2);
    if (r == 2) rc[1] = 3; // rank 1 sends rank 2 two items, rank 2 expects three
    try {
      exchange_plan plan(c, sc, rc);
    } catch (const error& e) {
      CHECK(e.kind() == errc::mismatch);
      msgs[static_cast<std::size_t>(r)] = e.reason();
    }
  });
  CHECK(msgs[0] == "rank 1 sends rank 2 2 items but rank 2 expects 3");
  CHECK(msgs[1] == msgs[0]);
  CHECK(msgs[2] == msgs[0]);
}

TEST_CASE("exchange_plan: a graph edge without its other end fails within the timeout, naming the graphs") {
  expect_all_fail(2, errc::timeout, "could not agree the plan", [](communicator& c) {
    c.group().set_timeout(300ms);
    const int r = c.rank();
    // Rank 0 expects a message from 1; rank 1 sends nothing.
    const neighbors g = r == 0 ? neighbors{{1}, {}} : neighbors{{}, {}};
    const std::vector<std::size_t> sc, rc = r == 0 ? std::vector<std::size_t>{1} : std::vector<std::size_t>{};
    exchange_plan plan(c, g, sc, rc);
  });
}

TEST_CASE("alltoallv_dynamic: an output too small names the size needed; the senders fail too") {
  std::vector<std::string> what(2);
  inproc::run(2, [&](communicator& c) {
    c.group().set_timeout(5s);
    const int r = c.rank();
    std::vector<std::size_t> sc{3, 3}, learned(2);
    std::vector<float> in(6), out(r == 0 ? 4 : 6);
    try {
      alltoallv_dynamic(c, std::span<const float>(in), sc, std::span<float>(out), std::span<std::size_t>(learned));
    } catch (const error& e) {
      what[static_cast<std::size_t>(r)] = e.what();
    }
  });
  CHECK(what[0].find("receives 6 elements but the output holds 4") != std::string::npos);
  CHECK(!what[1].empty());
}

} // namespace

TEST_CASE("alltoall hier: no groups is a clear error; ranks that disagree on the groups all fail") {
  expect_all_fail(2, errc::invalid_argument, "needs groups", [](communicator& c) {
    std::vector<float> v(2);
    options o;
    o.algo = algorithm::hier; // inproc has no node_of and no group size was given
    alltoall(c, std::span<const float>(v), std::span<float>(v), o);
  });
  for (const std::size_t block : {std::size_t{2}, std::size_t{1024}, std::size_t{65536}})
    expect_all_fail(4, errc::mismatch, "alltoall", [&](communicator& c) {
      std::vector<float> in(4 * block, 1.0f), out(4 * block);
      options o = forced(algorithm::hier);
      o.group_size = c.rank() == 3 ? 4 : 2;
      alltoall(c, std::span<const float>(in), std::span<float>(out), o);
    });
}
