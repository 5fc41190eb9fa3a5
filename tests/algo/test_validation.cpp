// Collectives: argument validation, ranks that disagree, barrier semantics
// and run-to-run determinism, for every algorithm in algorithms.hpp.
#include "harness.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <thread>

namespace {

using namespace gradsync;
using gradsync::test::collective;
using gradsync::test::collective_name;
using gradsync::test::implements;
using gradsync::test::selected_algorithms;
using inproc::communicator;
using namespace std::chrono_literals;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs `body` on p ranks; it must fail with a gradsync::error raised by `op`
// whose reason mentions `keyword`. Skipped where algorithm `a` has no
// schedule for `op` (that refusal is tested on its own).
void expect_error(algorithm a, int p, const std::string& op, const std::string& keyword,
                  const std::function<void(communicator&)>& body) {
  for (const auto coll : {collective::allreduce, collective::reduce_scatter, collective::allgather,
                          collective::broadcast, collective::reduce})
    if (collective_name(coll) == op && !implements(coll, a)) return;
  INFO("expected " << op << " to fail with '" << keyword << "'");
  try {
    inproc::run(p, [&](communicator& c) {
      c.group().set_timeout(10s);
      body(c);
    });
    FAIL_CHECK("no error");
  } catch (const error& e) {
    INFO("got: " << std::string(e.what()));
    CHECK(e.op() == op);
    CHECK(contains(e.what(), op));
    CHECK(contains(e.reason(), keyword));
    CHECK_FALSE(contains(e.reason(), "aborted")); // the cause, not a consequence
  }
}

options with_algo(algorithm a) {
  options o;
  o.algo = a;
  gradsync::test::configure(o, a);
  return o;
}

} // namespace

TEST_CASE("collectives: invalid arguments raise gradsync::error naming the op") {
  constexpr int p = 3;
  constexpr std::size_t n = 64;
  for (const algorithm a : selected_algorithms()) {
    INFO("algorithm " << algorithm_name(a));
    const options o = with_algo(a);
    const std::span<float> null_n(static_cast<float*>(nullptr), n);
    const std::span<const float> cnull_n(static_cast<const float*>(nullptr), n);

    // null data with a nonzero count
    expect_error(a, p, "allreduce", "null", [&](communicator& c) { allreduce(c, null_n, op::sum{}, o); });
    expect_error(a, p, "allreduce", "null", [&](communicator& c) {
      std::vector<float> out(n);
      allreduce(c, cnull_n, std::span<float>(out), op::sum{}, o);
    });
    expect_error(a, p, "allreduce", "null", [&](communicator& c) {
      std::vector<float> in(n);
      allreduce(c, std::span<const float>(in), null_n, op::sum{}, o);
    });
    expect_error(a, p, "reduce_scatter", "null", [&](communicator& c) {
      std::vector<float> out(n / p);
      reduce_scatter(c, std::span<const float>(static_cast<const float*>(nullptr), out.size() * p), std::span<float>(out), op::sum{}, o);
    });
    expect_error(a, p, "allgather", "null", [&](communicator& c) {
      std::vector<float> in(n);
      allgather(c, std::span<const float>(in), std::span<float>(static_cast<float*>(nullptr), n * p), o);
    });
    expect_error(a, p, "broadcast", "null", [&](communicator& c) { broadcast(c, null_n, 0, o); });
    expect_error(a, p, "reduce", "null", [&](communicator& c) {
      std::vector<float> out(n);
      reduce(c, cnull_n, std::span<float>(out), 0, op::sum{}, o);
    });

    // output too small
    expect_error(a, p, "allreduce", "output holds", [&](communicator& c) {
      std::vector<float> in(n), out(n - 1);
      allreduce(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    });
    expect_error(a, p, "reduce", "output holds", [&](communicator& c) {
      std::vector<float> in(n), out(c.rank() == 1 ? n - 1 : n);
      reduce(c, std::span<const float>(in), std::span<float>(out), 1, op::sum{}, o);
    });

    // block sizes that do not match the rank count
    expect_error(a, p, "reduce_scatter", "expected ranks x output", [&](communicator& c) {
      std::vector<float> in(n * p + 1), out(n);
      reduce_scatter(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    });
    expect_error(a, p, "allgather", "expected ranks x input", [&](communicator& c) {
      std::vector<float> in(n), out(n * p - 1);
      allgather(c, std::span<const float>(in), std::span<float>(out), o);
    });

    // root out of range
    for (const int root : {-1, p, 1000}) {
      expect_error(a, p, "broadcast", "root " + std::to_string(root) + " out of range", [&](communicator& c) {
        std::vector<float> buf(n);
        broadcast(c, std::span<float>(buf), root, o);
      });
      expect_error(a, p, "reduce", "out of range", [&](communicator& c) {
        std::vector<float> in(n), out(n);
        reduce(c, std::span<const float>(in), std::span<float>(out), root, op::sum{}, o);
      });
    }

    // partially overlapping input and output
    expect_error(a, p, "allreduce", "overlap", [&](communicator& c) {
      std::vector<float> buf(n + 1);
      allreduce(c, std::span<const float>(buf.data(), n), std::span<float>(buf.data() + 1, n), op::sum{}, o);
    });
    expect_error(a, p, "reduce_scatter", "overlap", [&](communicator& c) {
      std::vector<float> buf(n * p);
      // the output must be block `rank` of the input if it lies inside it
      const std::ptrdiff_t shift = c.rank() == p - 1 ? -1 : 1; // stays inside the buffer
      float* own = buf.data() + static_cast<std::ptrdiff_t>(n) * c.rank() + shift;
      reduce_scatter(c, std::span<const float>(buf), std::span<float>(own, n), op::sum{}, o);
    });
    expect_error(a, p, "allgather", "overlap", [&](communicator& c) {
      std::vector<float> buf(n * p);
      const std::size_t off = static_cast<std::size_t>(c.rank()) * n;
      allgather(c, std::span<const float>(buf.data() + (off ? off - 1 : 1), n), std::span<float>(buf), o);
    });
    expect_error(a, p, "reduce", "overlap", [&](communicator& c) {
      std::vector<float> buf(n + 5);
      reduce(c, std::span<const float>(buf.data(), n), std::span<float>(buf.data() + 5, n), 0, op::sum{}, o);
    });

    // caller workspace too small, or misaligned
    expect_error(a, p, "allreduce", "workspace", [&](communicator& c) {
      std::vector<double> in(n);
      std::vector<std::byte> ws(8);
      options w = o;
      w.workspace = ws;
      REQUIRE(allreduce_workspace_bytes<double>(c, n, w) > ws.size());
      allreduce(c, std::span<double>(in), op::sum{}, w);
    });
    expect_error(a, p, "reduce_scatter", "workspace", [&](communicator& c) {
      std::vector<double> in(n * p), out(n);
      std::vector<std::byte> ws(8);
      options w = o;
      w.workspace = ws;
      REQUIRE(reduce_scatter_workspace_bytes<double>(c, n, w) > ws.size());
      reduce_scatter(c, std::span<const double>(in), std::span<double>(out), op::sum{}, w);
    });
    expect_error(a, p, "reduce", "workspace", [&](communicator& c) {
      std::vector<double> in(n), out(n);
      std::vector<std::byte> ws(8);
      options w = o;
      w.workspace = ws;
      REQUIRE(reduce_workspace_bytes<double>(c, n, w) > ws.size());
      reduce(c, std::span<const double>(in), std::span<double>(out), 0, op::sum{}, w);
    });
    expect_error(a, p, "allreduce", "aligned", [&](communicator& c) {
      std::vector<double> in(n);
      options w = o;
      const std::size_t need = allreduce_workspace_bytes<double>(c, n, w);
      auto ws = std::make_unique<double[]>(need / sizeof(double) + 2);
      w.workspace = std::span<std::byte>(reinterpret_cast<std::byte*>(ws.get()) + 1, need + 1);
      allreduce(c, std::span<double>(in), op::sum{}, w);
    });
  }
}

TEST_CASE("collectives: a bad argument on one rank fails every rank with that error") {
  for (const algorithm a : selected_algorithms()) {
    INFO("algorithm " << algorithm_name(a));
    const options o = with_algo(a);
    expect_error(a, 4, "broadcast", "out of range", [&](communicator& c) {
      std::vector<float> buf(100);
      broadcast(c, std::span<float>(buf), c.rank() == 2 ? 7 : 0, o);
    });
    expect_error(a, 4, "allreduce", "output holds", [&](communicator& c) {
      std::vector<float> in(100), out(c.rank() == 3 ? 50 : 100);
      allreduce(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    });
  }
}

TEST_CASE("collectives: algorithms a collective does not implement are refused clearly") {
  for (int i = 0; i < 64; ++i) { // every enumerator, however many there are
    const auto a = static_cast<algorithm>(i);
    if (algorithm_name(a) == "?") continue;
    const options o = with_algo(a);
    auto check = [&](collective coll, const std::function<void(communicator&)>& body) {
      if (implements(coll, a)) return;
      INFO(std::string(collective_name(coll)) << " with " << std::string(algorithm_name(a)));
      try {
        inproc::run(4, [&](communicator& c) {
          c.group().set_timeout(10s);
          body(c);
        });
        FAIL_CHECK("ran although algorithms.hpp says it is not implemented (update implements())");
      } catch (const error& e) {
        CHECK(e.op() == collective_name(coll));
        CHECK(contains(e.reason(), std::string(algorithm_name(a))));
      }
    };
    check(collective::allreduce, [&](communicator& c) {
      std::vector<float> v(10);
      allreduce(c, std::span<float>(v), op::sum{}, o);
    });
    check(collective::reduce_scatter, [&](communicator& c) {
      std::vector<float> in(40), out(10);
      reduce_scatter(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    });
    check(collective::allgather, [&](communicator& c) {
      std::vector<float> in(10), out(40);
      allgather(c, std::span<const float>(in), std::span<float>(out), o);
    });
    check(collective::broadcast, [&](communicator& c) {
      std::vector<float> v(10);
      broadcast(c, std::span<float>(v), 1, o);
    });
    check(collective::reduce, [&](communicator& c) {
      std::vector<float> in(10), out(10);
      reduce(c, std::span<const float>(in), std::span<float>(out), 1, op::sum{}, o);
    });
  }
}

TEST_CASE("collectives: ranks passing different counts fail with an error, not a hang") {
  for (const algorithm a : selected_algorithms()) {
    INFO("algorithm " << algorithm_name(a));
    options o = with_algo(a);
    o.segment_bytes = 64;
    // (rank, its count) pairs that disagree with the others' 100
    for (const auto& odd : std::vector<std::pair<int, std::size_t>>{{0, 101}, {3, 99}, {2, 0}, {1, 300}}) {
      // named copies, not structured bindings: lambdas below capture them (clang 14)
      const int odd_rank = odd.first;
      const std::size_t odd_count = odd.second;
      INFO("rank " << odd_rank << " passes " << odd_count);
      auto count_of = [&](const communicator& c) { return c.rank() == odd_rank ? odd_count : std::size_t{100}; };
      const std::vector<std::pair<collective, std::function<void(communicator&)>>> runs = {
          {collective::allreduce, [&](communicator& c) {
             std::vector<float> v(count_of(c), 1.f);
             allreduce(c, std::span<float>(v), op::sum{}, o);
           }},
          {collective::reduce_scatter, [&](communicator& c) {
             std::vector<float> in(count_of(c) * 4, 1.f), out(count_of(c));
             reduce_scatter(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
           }},
          {collective::allgather, [&](communicator& c) {
             std::vector<float> in(count_of(c), 1.f), out(count_of(c) * 4);
             allgather(c, std::span<const float>(in), std::span<float>(out), o);
           }},
          {collective::broadcast, [&](communicator& c) {
             std::vector<float> v(count_of(c), 1.f);
             broadcast(c, std::span<float>(v), 1, o);
           }},
          {collective::reduce, [&](communicator& c) {
             std::vector<float> in(count_of(c), 1.f), out(count_of(c));
             reduce(c, std::span<const float>(in), std::span<float>(out), 1, op::sum{}, o);
           }},
      };
      for (const auto& run : runs) {
        const collective coll = run.first;
        const auto& body = run.second;
        if (!implements(coll, a)) continue;
        INFO(std::string(collective_name(coll)));
        const auto t0 = std::chrono::steady_clock::now();
        CHECK_THROWS_AS(inproc::run(4, [&](communicator& c) {
                          c.group().set_timeout(300ms); // most mismatches end in a timeout
                          body(c);
                        }),
                        error);
        CHECK(std::chrono::steady_clock::now() - t0 < 30s);
      }
    }
  }
}

TEST_CASE("barrier: no rank leaves before every rank has entered") {
  for (const int p : gradsync::test::sweep_ranks) {
    INFO(p << " ranks");
    constexpr int rounds = 12;
    std::array<std::atomic<int>, rounds> entered{};
    std::atomic<int> early{0};
    inproc::run(p, [&](communicator& c) {
      std::mt19937 rng(static_cast<unsigned>(c.rank() * 7 + p));
      for (int k = 0; k < rounds; ++k) {
        // the last rank to arrive varies from round to round
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
        entered[static_cast<std::size_t>(k)].fetch_add(1);
        barrier(c);
        if (entered[static_cast<std::size_t>(k)].load() != p) early.fetch_add(1);
      }
    });
    CHECK(early.load() == 0);
    for (auto& e : entered) CHECK(e.load() == p);
  }
  // a rank that never arrives makes the others fail instead of hanging
  CHECK_THROWS_AS(inproc::run(4,
                              [](communicator& c) {
                                if (c.rank() == 2) throw std::runtime_error("rank 2 gave up");
                                barrier(c);
                              }),
                  std::runtime_error);
}

namespace {

// Random values of magnitude about 1, different on every rank.
template <class T> std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(d(rng) * (rng() % 8 == 0 ? 50.f : 1.f));
  return v;
}

template <class T> double as_double(T v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<float>(v);
  else return static_cast<double>(v);
}

// Per-step rounding of T's accumulation (half and bf16 narrow after each step).
template <class T> double step_eps() {
  if constexpr (std::is_same_v<T, half>) return std::ldexp(1.0, -11);
  else if constexpr (std::is_same_v<T, bfloat16>) return std::ldexp(1.0, -8);
  else return std::numeric_limits<T>::epsilon();
}

struct det_result {
  std::vector<std::vector<std::byte>> per_rank;
};

// Runs allreduce (in or out of place), reduce_scatter and reduce of random
// data; returns every rank's output bytes of the three, concatenated.
template <class T>
det_result run_random(algorithm a, int p, std::size_t n, std::size_t seg, bool in_place, unsigned seed) {
  det_result res;
  res.per_rank.resize(static_cast<std::size_t>(p));
  inproc::run(p, [&](communicator& c) {
    c.group().set_timeout(60s);
    options o = with_algo(a);
    o.segment_bytes = seg;
    const auto in = random_values<T>(n, seed * 131 + static_cast<unsigned>(c.rank()));
    std::vector<T> ar(in);
    if (in_place) allreduce(c, std::span<T>(ar), op::sum{}, o);
    else allreduce(c, std::span<const T>(in), std::span<T>(ar), op::sum{}, o);
    const std::size_t blk = n / static_cast<std::size_t>(p);
    std::vector<T> rs(blk), rd(n);
    if (implements(collective::reduce_scatter, a))
      reduce_scatter(c, std::span<const T>(in.data(), blk * static_cast<std::size_t>(p)), std::span<T>(rs), op::sum{}, o);
    if (implements(collective::reduce, a))
      reduce(c, std::span<const T>(in), std::span<T>(rd), p - 1, op::sum{}, o);
    auto& out = res.per_rank[static_cast<std::size_t>(c.rank())];
    for (const auto* v : {&ar, &rs, &rd}) {
      const auto b = std::as_bytes(std::span<const T>(*v));
      out.insert(out.end(), b.begin(), b.end());
    }
  });
  return res;
}

template <class T> void check_determinism() {
  for (const algorithm a : selected_algorithms()) {
    if (!implements(collective::allreduce, a)) continue;
    for (const int p : {3, 5, 8})
      for (const std::size_t n : {std::size_t{1000}, std::size_t{10007}})
        for (const std::size_t seg : {std::size_t{64}, std::size_t{0}}) {
          if (n > 1000 && seg == 64) continue; // 64 B segments: small count only
          INFO(algorithm_name(a) << " ranks " << p << " count " << n << " seg " << seg);
          const unsigned seed = static_cast<unsigned>(p * 1000 + n);
          const auto first = run_random<T>(a, p, n, seg, true, seed);
          const auto second = run_random<T>(a, p, n, seg, true, seed);
          const auto outp = run_random<T>(a, p, n, seg, false, seed);
          for (std::size_t r = 0; r < first.per_rank.size(); ++r) {
            CHECK(first.per_rank[r] == second.per_rank[r]); // run to run
            CHECK(first.per_rank[r] == outp.per_rank[r]);   // in place == out of place
          }
          // allreduce: every rank holds the same bits; and they are accurate
          const std::size_t ar_bytes = n * sizeof(T);
          int differ = 0;
          for (std::size_t r = 1; r < first.per_rank.size(); ++r)
            differ += std::memcmp(first.per_rank[r].data(), first.per_rank[0].data(), ar_bytes) != 0;
          CHECK(differ == 0);
          std::vector<std::vector<T>> ins;
          for (int r = 0; r < p; ++r) ins.push_back(random_values<T>(n, seed * 131 + static_cast<unsigned>(r)));
          const auto* got = reinterpret_cast<const T*>(first.per_rank[0].data());
          int inaccurate = 0;
          for (std::size_t i = 0; i < n; ++i) {
            double exact = 0, mag = 0;
            for (const auto& v : ins) {
              exact += as_double(v[i]);
              mag += std::fabs(as_double(v[i]));
            }
            const double tol = 2.0 * p * step_eps<T>() * mag + 1e-300;
            inaccurate += std::fabs(as_double(got[i]) - exact) > tol;
          }
          CHECK(inaccurate == 0);
        }
  }
}

} // namespace

TEST_CASE_TEMPLATE("collectives: same bits run to run and on every rank (random data)", T, float, double,
                   gradsync::half, gradsync::bfloat16) {
  check_determinism<T>();
}

TEST_CASE("collectives: options::timeout bounds one call and leaves the communicator's default") {
  // Rank 1 never joins; rank 0's allreduce must fail with errc::timeout after
  // about the call's 200 ms (the world's timeout is 60 s), and a later call
  // without options::timeout must run under the default again.
  for (const algorithm a : {algorithm::ring, algorithm::rd, algorithm::tree}) {
    INFO("algorithm " << algorithm_name(a));
    std::atomic<long long> elapsed_ms{-1};
    std::atomic<int> kind{-1};
    std::atomic<long long> after_ms{-1};
    inproc::run(2, [&](communicator& c) {
      c.group().set_timeout(60s);
      if (c.rank() == 0) {
        std::vector<float> v(1000, 1.0f);
        options o = with_algo(a);
        o.timeout = 200ms;
        const auto t0 = std::chrono::steady_clock::now();
        try {
          allreduce(c, std::span(v), op::sum{}, o);
        } catch (const error& e) {
          kind = static_cast<int>(e.kind());
        }
        elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
        after_ms = c.timeout().count();
      }
    });
    CHECK(kind.load() == static_cast<int>(errc::timeout));
    CHECK(elapsed_ms.load() >= 150);
    CHECK(elapsed_ms.load() < 5000);
    CHECK(after_ms.load() == 60000);
  }
}
