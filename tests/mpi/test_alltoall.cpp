// The exchange family (alltoall.hpp) over gradsync::mpi::communicator on the
// rank counts the suite is launched with: every schedule against a
// hand-built reference and against MPI_Alltoall(v) itself, count matrices
// (uniform, Zipf-like, MoE top-2 of 64, sparse, zeros), learned counts,
// neighbour exchange, plans both ways, and a count mismatch (the receiving
// rank fails with errc::mismatch); encoded exchanges (exchange_codec.hpp);
// where a plan's run is checked (its messages when dense, a round when sparse).
#include "mpi_test.hpp"

#include <gradsync/alltoall.hpp>
#include <gradsync/exchange_codec.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>

#include <unistd.h>

using namespace gradsync;
using namespace gradsync::test;

namespace {

int value_of(int src, int dst, std::size_t i, int p) {
  return static_cast<int>((static_cast<std::size_t>(src * p + dst) * 7 + i * 3) % 251);
}

using matrix = std::function<std::size_t(int, int)>;

std::vector<std::pair<const char*, matrix>> patterns(int p) {
  return {
      {"uniform", [](int, int) { return std::size_t{5}; }},
      {"zeros", [](int, int) { return std::size_t{0}; }},
      {"zipf", [p](int s, int d) { return static_cast<std::size_t>(40.0 / std::pow(1.0 + (d - s + p) % p, 1.2)); }},
      {"sparse", [p](int s, int d) { return (d == (s + 1) % p) ? std::size_t{20000} : std::size_t{0}; }},
      {"moe", [p](int s, int d) {
         std::mt19937 g(static_cast<unsigned>(99 + s));
         std::size_t n = 0;
         for (int t = 0; t < 64; ++t) {
           const int e1 = static_cast<int>(g() % 64);
           int e2 = static_cast<int>(g() % 63);
           if (e2 >= e1) ++e2;
           n += (e1 % p == d) + (e2 % p == d);
         }
         return n;
       }},
  };
}

} // namespace

TEST_CASE("mpi alltoall: every schedule, blocks 0, 1, 37 and 80 000, equal to MPI_Alltoall") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  // hier: on the node's one group (node_of), and on groups of 1 and 2.
  for (const std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{37}, std::size_t{80000}})
    for (const auto& item : {std::pair{algorithm::automatic, 0}, std::pair{algorithm::pairwise, 0},
                                   std::pair{algorithm::scattered, 0}, std::pair{algorithm::bruck, 0},
                                   std::pair{algorithm::hier, 0}, std::pair{algorithm::hier, 1},
                                   std::pair{algorithm::hier, 2}}) {
      const auto& a = item.first;
      const auto& group = item.second;
      INFO("block=" << block << " schedule=" << algorithm_name(a) << " group size " << group);
      const std::size_t n = block * static_cast<std::size_t>(p);
      std::vector<int> in(n), out(n, -1), ref(n, -2);
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < block; ++i) in[static_cast<std::size_t>(q) * block + i] = value_of(r, q, i, p);
      options o;
      o.algo = a;
      o.group_size = group;
      alltoall(c, std::span<const int>(in), std::span<int>(out), o);
      MPI_Alltoall(in.data(), static_cast<int>(block), MPI_INT, ref.data(), static_cast<int>(block), MPI_INT,
                   MPI_COMM_WORLD);
      CHECK(out == ref);
      std::size_t wrong = 0;
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < block; ++i) wrong += out[static_cast<std::size_t>(q) * block + i] != value_of(q, r, i, p);
      CHECK(wrong == 0);
      alltoall(c, std::span<const int>(in), std::span<int>(in), o); // in place
      CHECK(in == ref);
    }
}

TEST_CASE("mpi alltoallv: count matrices, known and learned, equal to MPI_Alltoallv; plans both ways") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  const auto np = static_cast<std::size_t>(p);
  for (const auto& item : patterns(p)) {
    const auto& name = item.first;
    const auto& m = item.second;
    INFO("pattern " << name);
    std::vector<std::size_t> sc(np), rc(np);
    std::vector<int> sci(np), rci(np), sdi(np), rdi(np);
    for (int q = 0; q < p; ++q) {
      sc[static_cast<std::size_t>(q)] = m(r, q);
      rc[static_cast<std::size_t>(q)] = m(q, r);
    }
    std::vector<int> in;
    for (int q = 0; q < p; ++q) {
      sdi[static_cast<std::size_t>(q)] = static_cast<int>(in.size());
      sci[static_cast<std::size_t>(q)] = static_cast<int>(sc[static_cast<std::size_t>(q)]);
      for (std::size_t i = 0; i < sc[static_cast<std::size_t>(q)]; ++i) in.push_back(value_of(r, q, i, p));
    }
    int total = 0;
    for (int q = 0; q < p; ++q) {
      rdi[static_cast<std::size_t>(q)] = total;
      rci[static_cast<std::size_t>(q)] = static_cast<int>(rc[static_cast<std::size_t>(q)]);
      total += rci[static_cast<std::size_t>(q)];
    }
    std::vector<int> ref(static_cast<std::size_t>(total), -2);
    MPI_Alltoallv(in.data(), sci.data(), sdi.data(), MPI_INT, ref.data(), rci.data(), rdi.data(), MPI_INT,
                  MPI_COMM_WORLD);
    // hier: on the node's one group (node_of), and on groups of 1 and 2
    for (const auto& item : {std::pair{algorithm::automatic, 0}, std::pair{algorithm::pairwise, 0},
                                  std::pair{algorithm::scattered, 0}, std::pair{algorithm::hier, 0},
                                  std::pair{algorithm::hier, 1}, std::pair{algorithm::hier, 2}}) {
      const auto& a = item.first;
      const auto& group = item.second;
      std::vector<int> out(static_cast<std::size_t>(total), -1);
      options o;
      o.algo = a;
      o.group_size = group;
      alltoallv(c, std::span<const int>(in), sc, std::span<int>(out), rc, o);
      CHECK_MESSAGE(out == ref, algorithm_name(a) << " group " << group);
    }
    std::vector<int> dyn;
    std::vector<std::size_t> learned(np);
    CHECK(alltoallv_dynamic(c, std::span<const int>(in), sc, dyn, std::span<std::size_t>(learned)) ==
          static_cast<std::size_t>(total));
    CHECK(learned == rc);
    CHECK(dyn == ref);
    const exchange_plan plan(c, sc, rc);
    std::vector<int> fwd(static_cast<std::size_t>(total)), back(in.size());
    plan.run(c, std::span<const int>(in), std::span<int>(fwd));
    CHECK(fwd == ref);
    plan.run_back(c, std::span<const int>(fwd), std::span<int>(back));
    CHECK(back == in);
    // hier on groups of 2 keeps its buffers between runs: the second run of
    // each direction reuses them and must give MPI_Alltoallv's result again.
    options h;
    h.algo = algorithm::hier;
    h.group_size = 2;
    const exchange_plan hplan(c, sc, rc, h);
    for (int run = 0; run < 2; ++run) {
      std::vector<int> hf(static_cast<std::size_t>(total), -1), hb(in.size(), -1);
      hplan.run(c, std::span<const int>(in), std::span<int>(hf));
      CHECK_MESSAGE(hf == ref, "hier plan, run " << run);
      hplan.run_back(c, std::span<const int>(hf), std::span<int>(hb));
      CHECK_MESSAGE(hb == in, "hier plan backwards, run " << run);
    }
  }
}

TEST_CASE("mpi neighbor_alltoallv: the exponential graph with uneven counts") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  const neighbors g = neighbors_of(gossip::exponential(p).at(0), r);
  auto count = [](int s, int d) { return std::size_t(1 + (s + 2 * d) % 5); };
  std::vector<std::size_t> sc, rc;
  std::vector<float> in;
  for (const int d : g.destinations) {
    sc.push_back(count(r, d));
    for (std::size_t i = 0; i < sc.back(); ++i) in.push_back(float(value_of(r, d, i, p)));
  }
  std::size_t total = 0;
  for (const int s : g.sources) total += rc.emplace_back(count(s, r));
  std::vector<float> out(total, -1);
  neighbor_alltoallv(c, g, std::span<const float>(in), sc, std::span<float>(out), rc);
  std::size_t at = 0, wrong = 0;
  for (std::size_t k = 0; k < g.sources.size(); ++k) {
    for (std::size_t i = 0; i < rc[k]; ++i) wrong += out[at + i] != float(value_of(g.sources[k], r, i, p));
    at += rc[k];
  }
  CHECK(wrong == 0);
}

TEST_CASE("mpi exchange_plan: a pairwise count disagreement fails every rank with one message") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  std::vector<std::size_t> sc(static_cast<std::size_t>(p), 2), rc(static_cast<std::size_t>(p), 2);
  if (r == p - 1) rc[0] = 3; // rank 0 sends 2, rank p-1 expects 3
  std::string msg;
  try {
    exchange_plan plan(c, sc, rc);
  } catch (const error& e) {
    CHECK(e.kind() == errc::mismatch);
    msg = e.reason();
  }
  CHECK(msg == "rank 0 sends rank " + std::to_string(p - 1) + " 2 items but rank " + std::to_string(p - 1) +
                   " expects 3");
}

TEST_CASE("mpi encoded alltoallv and plan: every block is decode(encode(block))") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  auto block = [](int s, int d, std::size_t n) {
    std::vector<float> b(n);
    for (std::size_t i = 0; i < n; ++i) b[i] = std::sin(0.3f * static_cast<float>(s * 7 + d) + 0.01f * static_cast<float>(i)) * 3.0f;
    return b;
  };
  for (const char* name : {"fp16", "int8:block=32", "int4"}) {
    INFO("codec " << name);
    const auto s = compress::parse_spec(name);
    auto roundtrip = [&](const std::vector<float>& b) {
      std::vector<float> back(b.size());
      detail::with_exchange_codec<float>(s, "test", r, [&](const auto& k) {
        typename std::decay_t<decltype(k)>::state st{};
        std::vector<std::byte> wire(k.max_encoded_bytes(b.size()));
        k.decode(std::span<const std::byte>(wire).first(k.encode(std::span<const float>(b), st, {}, wire)),
                 std::span<float>(back));
      });
      return back;
    };
    std::vector<std::size_t> sc(static_cast<std::size_t>(p)), rc(sc.size());
    std::vector<float> in;
    for (int q = 0; q < p; ++q) {
      sc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(100 + 37 * ((r + 2 * q) % 3));
      rc[static_cast<std::size_t>(q)] = static_cast<std::size_t>(100 + 37 * ((q + 2 * r) % 3));
      const auto b = block(r, q, sc[static_cast<std::size_t>(q)]);
      in.insert(in.end(), b.begin(), b.end());
    }
    std::size_t total = 0;
    for (const std::size_t n : rc) total += n;
    std::vector<float> out(total), out_plan(total);
    alltoallv_encoded<float>(c, in, sc, std::span<float>(out), rc, s);
    const exchange_plan plan(c, sc, rc);
    run_encoded<float>(plan, c, in, std::span<float>(out_plan), 1, s);
    std::size_t at = 0;
    for (int q = 0; q < p; ++q) {
      const auto want = roundtrip(block(q, r, rc[static_cast<std::size_t>(q)]));
      CHECK(std::equal(want.begin(), want.end(), out.begin() + static_cast<std::ptrdiff_t>(at)));
      CHECK(std::equal(want.begin(), want.end(), out_plan.begin() + static_cast<std::ptrdiff_t>(at)));
      at += want.size();
    }
  }
}

// How many phases `name` rank r's trace of `run` holds (a fresh trace file
// per call of this; every rank calls it).
template <class F> std::size_t phases_in_trace(mpi::communicator& c, const char* name, F&& run) {
  long long id = c.rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  static int calls = 0;
  const std::string file = "/tmp/gradsync-mpi-plan-" + std::to_string(id) + "-" + std::to_string(calls++) + "-%r.json";
  c.set_trace(timeline::open(file, c.rank(), c.size()));
  run();
  const std::string mine = timeline::path_of(file, c.rank(), c.size());
  c.set_trace(nullptr); // closes the file
  std::ifstream f(mine);
  const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::remove(mine.c_str());
  const std::string key = std::string("{\"name\":\"") + name + "\"";
  std::size_t n = 0;
  for (std::size_t at = s.find(key); at != std::string::npos; at = s.find(key, at + 1)) ++n;
  return n;
}

TEST_CASE("mpi exchange_plan: a dense plan's run is checked in its own messages (no round), a sparse one's in a "
          "round; results exact; a rank in another call fails every rank with errc::mismatch") {
  auto c = make_comm();
  const int p = c.size(), r = c.rank();
  if (p < 2) return;
  const auto up = static_cast<std::size_t>(p);
  for (const bool sparse : {false, true})
    for (const algorithm a : {algorithm::scattered, algorithm::pairwise, algorithm::hier}) {
      INFO((sparse ? "sparse " : "dense ") << algorithm_name(a));
      // dense: rank s sends d 1 + (s + 2d) mod 3 items; sparse: only to s + 1
      auto count = [&](int s, int d) -> std::size_t {
        if (sparse) return d == s + 1 ? 3 : 0; // a chain: rank p - 1 sends nothing
        return 1 + static_cast<std::size_t>((s + 2 * d) % 3);
      };
      std::vector<std::size_t> sc(up), rc(up);
      for (int q = 0; q < p; ++q) sc[static_cast<std::size_t>(q)] = count(r, q), rc[static_cast<std::size_t>(q)] = count(q, r);
      const exchange_plan plan(c, sc, rc, {.algo = a, .group_size = p > 2 ? 2 : 1});
      CHECK(plan.sparse() == sparse);
      std::vector<int> in, want;
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < count(r, q); ++i) in.push_back(value_of(r, q, i, p));
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < count(q, r); ++i) want.push_back(value_of(q, r, i, p));
      std::vector<int> out(want.size(), -1);
      const std::size_t rounds = phases_in_trace(c, "verify", [&] { plan.run(c, std::span<const int>(in), std::span<int>(out)); });
      CHECK(out == want);
      CHECK(rounds == (sparse ? 1u : 0u));
      // Rank p - 1 makes another call (a barrier) where the others run the plan.
      auto d = make_comm();
      d.set_timeout(std::chrono::seconds(20));
      errc got = errc::invalid_argument;
      std::string why;
      try {
        if (r == p - 1) barrier(d);
        else plan.run(d, std::span<const int>(in), std::span<int>(out));
      } catch (const error& e) {
        got = e.kind();
        why = e.what();
      }
      INFO(why);
      CHECK(got == errc::mismatch);
    }
}
