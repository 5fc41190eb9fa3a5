// Hierarchical and 2-D allreduce: group sizes that do and do not divide the
// rank count, node_of grouping (also non-contiguous), the two-communicator
// form, every inner schedule; the subgroup view; and, for every allreduce
// schedule, bitwise agreement across ranks and runs on order-sensitive
// (random float) data.
#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/transport/inproc.hpp>
#include <gradsync/transport/subgroup.hpp>

#include "noded.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

using namespace gradsync;

namespace {

constexpr int rank_counts[] = {1, 2, 3, 4, 5, 6, 7, 8, 16};

// Element i of rank r: exact in int64, so the sum has a closed form.
std::int64_t input(int r, std::size_t i) { return static_cast<std::int64_t>((r + 1) * 1000003 + 7 * i); }
std::int64_t expected(int p, std::size_t i) {
  return 1000003LL * p * (p + 1) / 2 + 7LL * p * static_cast<std::int64_t>(i);
}

// Runs allreduce with `o` on p ranks (in place or not) and checks the closed form.
template <class Comm = inproc::communicator, class Wrap>
void check_sum(int p, std::size_t n, const options& o, bool in_place, Wrap&& wrap) {
  inproc::run(p, [&](inproc::communicator& base) {
    auto&& c = wrap(base);
    std::vector<std::int64_t> in(n), out(n + 1, -1);
    for (std::size_t i = 0; i < n; ++i) in[i] = input(base.rank(), i);
    if (in_place) {
      allreduce(c, std::span<std::int64_t>(in), op::sum{}, o);
      out.assign(in.begin(), in.end());
      out.push_back(-1);
    } else {
      allreduce(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(out), op::sum{}, o);
      for (std::size_t i = 0; i < n; ++i) REQUIRE(in[i] == input(base.rank(), i));
    }
    for (std::size_t i = 0; i < n; ++i)
      if (out[i] != expected(p, i)) FAIL("rank " << base.rank() << " element " << i << ": " << out[i] << " != " << expected(p, i));
    CHECK(out[n] == -1);
  });
}
auto same = [](inproc::communicator& c) -> inproc::communicator& { return c; };

using test::noded;

} // namespace

TEST_CASE("hier: group sizes that divide the rank count and ones that do not") {
  for (int p : rank_counts)
    for (int g : {1, 2, 3, 4, 5})
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{37}, std::size_t{1001}})
        for (bool in_place : {false, true}) {
          INFO("p=" << p << " group=" << g << " n=" << n << " in_place=" << in_place);
          options o;
          o.algo = algorithm::hier;
          o.group_size = g;
          o.segment_bytes = 64; // many segments in every step
          check_sum(p, n, o, in_place, same);
        }
}

TEST_CASE("hier: every inner schedule") {
  for (auto inner : {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd, algorithm::rabenseifner})
    for (int p : {4, 7, 16})
      for (int g : {2, 3}) {
        INFO("inner=" << algorithm_name(inner) << " p=" << p << " group=" << g);
        options o;
        o.algo = algorithm::hier;
        o.group_size = g;
        o.inner = inner;
        o.segment_bytes = 128;
        check_sum(p, 999, o, false, same);
      }
}

TEST_CASE("hier: groups from node_of, contiguous or interleaved, even or not") {
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 0, 0, 1, 1, 1, 1},       // two nodes of four
      {0, 1, 0, 1, 0, 1, 0, 1},       // interleaved
      {5, 5, 5, 2, 2, 9, 9, 9},       // 3 + 2 + 3, arbitrary ids
      {0, 0, 0, 0, 0, 0, 0, 0},       // one node
      {0, 1, 2, 3, 4, 5, 6},          // one rank per node
  };
  for (const auto& nodes : layouts)
    for (std::size_t n : {std::size_t{3}, std::size_t{1000}}) {
      const int p = static_cast<int>(nodes.size());
      INFO("nodes of " << p << " ranks, n=" << n << ", first layout entry " << nodes[1]);
      options o;
      o.algo = algorithm::hier;
      o.segment_bytes = 256;
      check_sum(p, n, o, false, [&](inproc::communicator& c) { return noded{c, nodes}; });
      // automatic sees the groups too and still gets the right answer
      o.algo = algorithm::automatic;
      check_sum(p, n, o, true, [&](inproc::communicator& c) { return noded{c, nodes}; });
    }
}

TEST_CASE("hier broadcast and reduce: nodes contiguous, interleaved or uneven, every root, in place") {
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1}, {5, 5, 5, 2, 2, 9, 9, 9},
      {0, 1, 1, 2, 2, 2, 3, 3, 3, 3}, {0, 1, 2, 3, 4, 5, 6}, {0, 0, 0, 0, 0}};
  for (const auto& nodes : layouts)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{999}}) {
      const int p = static_cast<int>(nodes.size());
      for (int root = 0; root < p; ++root) {
        INFO("nodes of " << p << " ranks, node of rank 1 " << nodes[1] << ", n=" << n << ", root " << root);
        std::vector<std::string> errs(static_cast<std::size_t>(p));
        inproc::run(p, [&](inproc::communicator& base) {
          noded c{base, nodes};
          const int r = base.rank();
          std::string& e = errs[static_cast<std::size_t>(r)];
          options o;
          o.algo = algorithm::hier;
          o.segment_bytes = 256;
          std::vector<std::int64_t> d(n, -1);
          if (r == root)
            for (std::size_t i = 0; i < n; ++i) d[i] = input(root, i);
          broadcast(c, std::span<std::int64_t>(d), root, o);
          for (std::size_t i = 0; i < n && e.empty(); ++i)
            if (d[i] != input(root, i)) e = "broadcast element " + std::to_string(i);
          std::vector<std::int64_t> in(n), out(n + 1, -1);
          for (std::size_t i = 0; i < n; ++i) in[i] = input(r, i);
          reduce(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(out), root, op::sum{}, o);
          if (r == root) {
            for (std::size_t i = 0; i < n && e.empty(); ++i)
              if (out[i] != expected(p, i)) e = "reduce element " + std::to_string(i);
            if (out[n] != -1) e = "reduce wrote past the output";
          }
          reduce(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(in), root, op::sum{}, o); // in place
          if (r == root)
            for (std::size_t i = 0; i < n && e.empty(); ++i)
              if (in[i] != expected(p, i)) e = "in-place reduce element " + std::to_string(i);
        });
        for (std::size_t r = 0; r < errs.size(); ++r) CHECK_MESSAGE(errs[r].empty(), "rank " << r << ": " << errs[r]);
      }
    }
}

TEST_CASE("hier allgather and reduce_scatter: nodes contiguous, interleaved or uneven, in place, avg") {
  const std::vector<std::vector<int>> layouts = {
      {0, 0, 0, 0, 1, 1, 1, 1}, {0, 1, 0, 1, 0, 1, 0, 1}, {5, 5, 5, 2, 2, 9, 9, 9},
      {0, 1, 1, 2, 2, 2, 3, 3, 3, 3}, {0, 1, 2, 3, 4, 5, 6}, {0, 0, 0, 0, 0}, {0, 0, 0, 1, 1, 1}};
  for (const auto& nodes : layouts)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{333}}) {
      const int p = static_cast<int>(nodes.size());
      const auto P = static_cast<std::size_t>(p);
      INFO("nodes of " << p << " ranks, node of rank 1 " << nodes[1] << ", n=" << n);
      std::vector<std::string> errs(P);
      inproc::run(p, [&](inproc::communicator& base) {
        noded c{base, nodes};
        const int r = base.rank();
        const auto R = static_cast<std::size_t>(r);
        std::string& e = errs[R];
        options o;
        o.algo = algorithm::hier;
        o.segment_bytes = 256;
        // allgather: block q of every rank is rank q's input
        std::vector<std::int64_t> mine(n), out(n * P + 1, -1);
        for (std::size_t i = 0; i < n; ++i) mine[i] = input(r, i);
        allgather(c, std::span<const std::int64_t>(mine), std::span<std::int64_t>(out).first(n * P), o);
        for (std::size_t q = 0; q < P && e.empty(); ++q)
          for (std::size_t i = 0; i < n && e.empty(); ++i)
            if (out[q * n + i] != input(static_cast<int>(q), i))
              e = "allgather block " + std::to_string(q) + " element " + std::to_string(i);
        if (out[n * P] != -1) e = "allgather wrote past the output";
        std::vector<std::int64_t> again(n * P, -1); // in place: the input is the own block
        for (std::size_t i = 0; i < n; ++i) again[R * n + i] = input(r, i);
        allgather(c, std::span<const std::int64_t>(again.data() + R * n, n), std::span<std::int64_t>(again), o);
        if (e.empty() && again != std::vector<std::int64_t>(out.begin(), out.end() - 1)) e = "in-place allgather";
        // reduce_scatter: element j of the whole vector sums input(q, j) over q
        std::vector<std::int64_t> in(n * P), got(n + 1, -1);
        for (std::size_t j = 0; j < n * P; ++j) in[j] = input(r, j);
        reduce_scatter(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(got).first(n), op::sum{}, o);
        for (std::size_t i = 0; i < n && e.empty(); ++i)
          if (got[i] != expected(p, R * n + i)) e = "reduce_scatter element " + std::to_string(i);
        if (got[n] != -1) e = "reduce_scatter wrote past the output";
        reduce_scatter(c, std::span<const std::int64_t>(in), std::span<std::int64_t>(in.data() + R * n, n), op::sum{},
                       o); // in place
        for (std::size_t i = 0; i < n && e.empty(); ++i)
          if (in[R * n + i] != expected(p, R * n + i)) e = "in-place reduce_scatter element " + std::to_string(i);
        // avg divides once by p: p x 2 x (i + 1), averaged, is 2 (i + 1) on every rank
        std::vector<double> a(n * P), b(n, -1);
        for (std::size_t j = 0; j < n * P; ++j) a[j] = 2.0 * static_cast<double>(j % 7 + 1);
        reduce_scatter(c, std::span<const double>(a), std::span<double>(b), op::avg{}, o);
        for (std::size_t i = 0; i < n && e.empty(); ++i)
          if (b[i] != 2.0 * static_cast<double>((R * n + i) % 7 + 1)) e = "avg reduce_scatter element " + std::to_string(i);
      });
      for (std::size_t r = 0; r < errs.size(); ++r) CHECK_MESSAGE(errs[r].empty(), "rank " << r << ": " << errs[r]);
    }
}

TEST_CASE("hier: two communicators (intra-node and cross-node)") {
  for (int nodes : {1, 2, 3})
    for (int per : {1, 2, 4})
      for (std::size_t n : {std::size_t{0}, std::size_t{2}, std::size_t{777}}) {
        const int p = nodes * per;
        INFO("nodes=" << nodes << " per node=" << per << " n=" << n);
        inproc::run(p, [&](inproc::communicator& c) {
          const int node = c.rank() / per, lr = c.rank() % per;
          std::vector<int> local_ranks, cross_ranks;
          for (int i = 0; i < per; ++i) local_ranks.push_back(node * per + i);
          for (int k = 0; k < nodes; ++k) cross_ranks.push_back(k * per + lr);
          subgroup<inproc::communicator> local(c, local_ranks), cross(c, cross_ranks, 100);
          exec::host ex;
          std::vector<std::int64_t> in(n), out(n);
          for (std::size_t i = 0; i < n; ++i) in[i] = input(c.rank(), i);
          std::vector<std::int64_t> ws(algo::hierarchical::allreduce_scratch_elems(n, 8, 64, per, nodes));
          algo::hierarchical::allreduce(local, cross, ex, static_cast<const std::int64_t*>(in.data()), out.data(), n,
                                        op::sum{}, algorithm::automatic, selector{}, 64, 7, ws.data());
          for (std::size_t i = 0; i < n; ++i) REQUIRE(out[i] == expected(p, i));
          // avg divides by all ranks once
          std::vector<double> d(n, static_cast<double>(c.rank()));
          std::vector<double> dws(algo::hierarchical::allreduce_scratch_elems(n, 8, 64, per, nodes));
          algo::hierarchical::allreduce(local, cross, ex, static_cast<const double*>(d.data()), d.data(), n, op::avg{},
                                        algorithm::ring, selector{}, 64, 7, dws.data());
          for (double x : d) REQUIRE(x == (p - 1) / 2.0);
        });
      }
}

TEST_CASE("2d: row lengths that do and do not divide the rank count") {
  for (int p : rank_counts)
    for (int row : {0, 2, 3, 5})
      for (std::size_t n : {std::size_t{1}, std::size_t{6}, std::size_t{1000}}) {
        INFO("p=" << p << " row=" << row << " n=" << n);
        options o;
        o.algo = algorithm::twod;
        o.group_size = row;
        o.segment_bytes = 128;
        check_sum(p, n, o, n == 6, same);
      }
}

TEST_CASE("hier: clear errors") {
  inproc::run(4, [](inproc::communicator& c) {
    std::vector<float> v(10, 1.0f);
    options o;
    o.algo = algorithm::hier; // inproc has no node_of and no group size was given
    CHECK_THROWS_WITH_AS(allreduce(c, std::span<float>(v), op::sum{}, o), doctest::Contains("needs groups"), error);
    std::vector<float> all(8);
    CHECK_THROWS_WITH_AS(allgather(c, std::span<const float>(v.data(), 2), std::span<float>(all), o),
                         doctest::Contains("allgather (rank"), error);
    CHECK_THROWS_WITH_AS(allgather(c, std::span<const float>(v.data(), 2), std::span<float>(all), o),
                         doctest::Contains("needs groups"), error);
    CHECK_THROWS_WITH_AS(reduce_scatter(c, std::span<const float>(all), std::span<float>(v.data(), 2), op::sum{}, o),
                         doctest::Contains("reduce_scatter (rank"), error);
    CHECK_THROWS_WITH_AS(reduce_scatter(c, std::span<const float>(all), std::span<float>(v.data(), 2), op::sum{}, o),
                         doctest::Contains("needs groups"), error);
    o.group_size = 2;
    o.inner = algorithm::hier;
    CHECK_THROWS_WITH_AS(allreduce(c, std::span<float>(v), op::sum{}, o), doctest::Contains("not a single-level"), error);
    o.inner = algorithm::automatic;
    o.group_size = -1;
    CHECK_THROWS_WITH_AS(allreduce(c, std::span<float>(v), op::sum{}, o), doctest::Contains("negative"), error);
    o = options{};
    o.algo = algorithm::tree;
    CHECK_THROWS_WITH_AS(reduce_scatter(c, std::span<const float>(v.data(), 8), std::span<float>(v.data() + 8, 2), op::sum{}, o),
                         doctest::Contains("not available for reduce_scatter"), error);
    o.algo = algorithm::dbtree;
    CHECK_THROWS_WITH_AS(broadcast(c, std::span<float>(v), 0, o), doctest::Contains("not available for broadcast"), error);
  });
}

TEST_CASE("subgroup: renumbering, tag shift, validation") {
  inproc::run(6, [](inproc::communicator& c) {
    const bool odd = c.rank() % 2;
    subgroup<inproc::communicator> g(c, odd ? std::vector<int>{5, 1, 3} : std::vector<int>{0, 2, 4}, 10);
    CHECK(g.size() == 3);
    CHECK(g.parent_rank(g.rank()) == c.rank());
    // a ring inside each subgroup, the same tag in both: the views keep them apart
    int token = c.rank(), got = -1;
    auto rq = g.irecv(std::as_writable_bytes(std::span<int>(&got, 1)), (g.rank() + 2) % 3, 1);
    g.isend(std::as_bytes(std::span<const int>(&token, 1)), (g.rank() + 1) % 3, 1).wait();
    rq.wait();
    CHECK(got == g.parent_rank((g.rank() + 2) % 3));
    // the shifted tag is what the parent sees
    if (c.rank() == 0) {
      int x = 42;
      c.isend(std::as_bytes(std::span<const int>(&x, 1)), 2, 11).wait();
    }
    if (c.rank() == 2) {
      int y = 0;
      g.irecv(std::as_writable_bytes(std::span<int>(&y, 1)), 0, 1).wait();
      CHECK(y == 42);
    }
    CHECK_THROWS_WITH_AS(subgroup<inproc::communicator>(c, {0, 0, 1}), doctest::Contains("twice"), error);
    CHECK_THROWS_WITH_AS(subgroup<inproc::communicator>(c, {0, 9}), doctest::Contains("out of range"), error);
    if (c.rank() != 1) CHECK_THROWS_WITH_AS(subgroup<inproc::communicator>(c, {1}), doctest::Contains("not a member"), error);
    CHECK_THROWS_WITH_AS(g.isend({}, 3, 0), doctest::Contains("out of range"), error);
  });
}

TEST_CASE("every allreduce schedule: bitwise equal on all ranks and from run to run") {
  const algorithm algos[] = {algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                             algorithm::rabenseifner, algorithm::hier, algorithm::twod, algorithm::automatic};
  for (auto a : algos)
    for (int p : {3, 6, 8})
      for (std::size_t n : {std::size_t{2}, std::size_t{3001}}) {
        INFO(algorithm_name(a) << " p=" << p << " n=" << n);
        std::vector<std::vector<float>> first;
        for (int run = 0; run < 2; ++run) {
          std::vector<std::vector<float>> res(static_cast<std::size_t>(p));
          inproc::run(p, [&](inproc::communicator& c) {
            std::mt19937 gen(static_cast<unsigned>(1234 + c.rank()));
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            std::vector<float> v(n);
            for (auto& x : v) x = dist(gen) * std::exp2(static_cast<float>(c.rank() % 5) * 6.0f); // order-sensitive sums
            options o;
            o.algo = a;
            o.group_size = 2;
            o.segment_bytes = 256;
            allreduce(c, std::span<float>(v), op::sum{}, o);
            res[static_cast<std::size_t>(c.rank())] = v;
          });
          for (int r = 1; r < p; ++r)
            REQUIRE(std::memcmp(res[0].data(), res[static_cast<std::size_t>(r)].data(), n * sizeof(float)) == 0);
          // and close to the exact sum (inputs regenerated independently)
          std::vector<double> want(n, 0.0);
          for (int r = 0; r < p; ++r) {
            std::mt19937 gen(static_cast<unsigned>(1234 + r));
            std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
            for (std::size_t i = 0; i < n; ++i) want[i] += static_cast<double>(dist(gen) * std::exp2(static_cast<float>(r % 5) * 6.0f));
          }
          for (std::size_t i = 0; i < n; ++i) REQUIRE(std::abs(res[0][i] - want[i]) <= 1e-5 * std::exp2(24.0));
          if (run == 0) first = res;
          else REQUIRE(std::memcmp(first[0].data(), res[0].data(), n * sizeof(float)) == 0);
        }
      }
}
