// fusion/engine.hpp over inproc ranks: the engine and grouped_allreduce
// against per-tensor allreduces (bitwise) and closed forms computed here,
// many tiny tensors of mixed types and ops, several submitting threads per
// rank in random orders, compressed buckets against compressed_allreduce on
// the same fused layout, error feedback's conservation law while bucket
// composition changes, failures (an injected send failure, tensors that
// differ between ranks, a peer that never submits) and the destructor.
// Inputs are small integers so that every sum, mean, min, max and product is
// exact whatever order a schedule combines ranks in; no timing is asserted.
#include <doctest/doctest.h>

#include <gradsync/fusion/engine.hpp>
#include <gradsync/transport/inproc.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <variant>
#include <vector>

using namespace gradsync;
using namespace gradsync::fusion;
using namespace std::chrono_literals;

namespace {

using any_vec = std::variant<std::vector<float>, std::vector<double>, std::vector<half>, std::vector<bfloat16>,
                             std::vector<std::int32_t>, std::vector<std::int64_t>>;

// One tensor of a test: what it is, and its data on this rank.
struct tensor {
  std::uint64_t id = 0;
  dtype dt = dtype::f32;
  op_kind op = op_kind::avg;
  std::size_t count = 0;
  any_vec v;
};

// Rank r's element i of tensor `id`: a small integer (1 or 2 for products,
// at most two 2s among 8 ranks).
long long value(int r, std::uint64_t id, std::size_t i, op_kind k) {
  if (k == op_kind::prod) return (id + i + static_cast<std::uint64_t>(r)) % 4 == 0 ? 2 : 1;
  return static_cast<long long>((id * 7 + i * 3 + static_cast<std::uint64_t>(r) * 5) % 13) - 6;
}

// The reduction over p ranks, as the library defines it: exact in the
// accumulation type, avg divided once (integers truncate).
template <class T> T expected(int p, std::uint64_t id, std::size_t i, op_kind k) {
  using A = accum_t<T>;
  long long acc = value(0, id, i, k);
  for (int r = 1; r < p; ++r) {
    const long long v = value(r, id, i, k);
    switch (k) {
    case op_kind::prod: acc *= v; break;
    case op_kind::min: acc = std::min(acc, v); break;
    case op_kind::max: acc = std::max(acc, v); break;
    case op_kind::sum:
    case op_kind::avg: acc += v; break;
    }
  }
  const T s = narrow<T>(static_cast<A>(acc));
  return k == op_kind::avg ? narrow<T>(static_cast<A>(widen(s) / static_cast<A>(p))) : s;
}

any_vec make_vec(dtype dt, std::size_t n) {
  switch (dt) {
  case dtype::f32: return std::vector<float>(n);
  case dtype::f64: return std::vector<double>(n);
  case dtype::f16: return std::vector<half>(n);
  case dtype::bf16: return std::vector<bfloat16>(n);
  case dtype::i32: return std::vector<std::int32_t>(n);
  case dtype::i64: return std::vector<std::int64_t>(n);
  }
  return std::vector<float>(n);
}

tensor make(int r, std::uint64_t id, dtype dt, op_kind op, std::size_t n) {
  tensor t{id, dt, op, n, make_vec(dt, n)};
  std::visit(
      [&](auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        for (std::size_t i = 0; i < n; ++i) v[i] = narrow<T>(static_cast<accum_t<T>>(value(r, id, i, op)));
      },
      t.v);
  return t;
}

// Elements of t that differ from the closed form over p ranks.
std::size_t wrong(const tensor& t, int p) {
  return std::visit(
      [&](const auto& v) {
        using T = typename std::decay_t<decltype(v)>::value_type;
        std::size_t bad = 0;
        for (std::size_t i = 0; i < v.size(); ++i) {
          const T e = expected<T>(p, t.id, i, t.op);
          bad += std::memcmp(&v[i], &e, sizeof(T)) != 0;
        }
        return bad;
      },
      t.v);
}

bool same_bits(const tensor& a, const tensor& b) {
  return std::visit(
      [&](const auto& x) {
        const auto* y = std::get_if<std::decay_t<decltype(x)>>(&b.v);
        return y && x.size() == y->size() && (x.empty() || std::memcmp(x.data(), y->data(), x.size() * sizeof(x[0])) == 0);
      },
      a.v);
}

template <class E> handle submit(E& eng, tensor& t, bool explicit_id = true) {
  return std::visit(
      [&](auto& v) {
        tensor_options o{.op = t.op};
        if (explicit_id) o.id = t.id;
        return eng.submit(std::span(v), o);
      },
      t.v);
}

template <class C> void allreduce_one(C& c, tensor& t) {
  std::visit([&](auto& v) { dispatch_op(t.op, [&](auto op) { allreduce(c, std::span(v), op); }); }, t.v);
}

constexpr dtype all_types[] = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64};
constexpr op_kind all_ops[] = {op_kind::avg, op_kind::sum, op_kind::min, op_kind::max, op_kind::prod};

// A mixed list: every type with every op, assorted sizes (empty included).
std::vector<tensor> mixed(int r, std::uint64_t first_id = 0) {
  const std::size_t sizes[] = {0, 1, 3, 17, 64, 257, 700};
  std::vector<tensor> ts;
  for (std::uint64_t j = 0; j < 42; ++j)
    ts.push_back(make(r, first_id + j, all_types[j % 6], all_ops[(j / 6) % 5], sizes[j % 7] + j % 5));
  return ts;
}

engine_options small_buckets() {
  return {.bucket_bytes = 2048, .first_bucket_bytes = 512, .cycle_time = 2000us, .lookahead = 40};
}

// Only flush() runs a partial bucket (and no key fills its first bucket in
// these tests), so one negotiation sees every tensor: the plan is fixed.
// Every size is fused (no model-derived solo size).
engine_options flush_only(std::size_t bucket = std::size_t{1} << 20) {
  return {.bucket_bytes = bucket, .first_bucket_bytes = bucket, .cycle_time = std::chrono::microseconds(60'000'000),
          .lookahead = 64, .solo_bytes = std::numeric_limits<std::size_t>::max()};
}

} // namespace

TEST_CASE("engine: fused results equal per-tensor allreduces bitwise (every type and op, 1-8 ranks)") {
  for (const int p : {1, 2, 3, 4, 8}) {
    INFO("ranks " << p);
    std::vector<std::vector<tensor>> fused(static_cast<std::size_t>(p)), single(static_cast<std::size_t>(p));
    std::vector<engine_stats> stats(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) {
      auto& mine = fused[static_cast<std::size_t>(c.rank())];
      {
        engine<inproc::communicator> eng(c, small_buckets());
        for (int step = 0; step < 2; ++step) { // the second step starts with a small first bucket again
          mine = mixed(c.rank());
          std::vector<handle> hs;
          for (auto& t : mine) hs.push_back(submit(eng, t));
          eng.flush();
          for (auto& h : hs) CHECK(h.test());
        }
        stats[static_cast<std::size_t>(c.rank())] = eng.stats();
      }
      auto& ref = single[static_cast<std::size_t>(c.rank())];
      ref = mixed(c.rank());
      for (auto& t : ref) allreduce_one(c, t);
    });
    for (int r = 0; r < p; ++r)
      for (std::size_t k = 0; k < fused[r].size(); ++k) {
        INFO("rank " << r << " tensor " << k << " " << dtype_name(fused[r][k].dt) << " " << op_name(fused[r][k].op)
                     << " x " << fused[r][k].count);
        CHECK(wrong(fused[r][k], p) == 0);
        CHECK(same_bits(fused[r][k], single[r][k]));
        CHECK(same_bits(fused[r][k], fused[0][k]));
      }
    CHECK(stats[0].tensors == 84);
    CHECK(stats[0].buckets <= 84);
    for (int r = 1; r < p; ++r) CHECK(stats[static_cast<std::size_t>(r)].buckets == stats[0].buckets); // agreed
  }
}

TEST_CASE("grouped_allreduce equals per-tensor allreduces bitwise") {
  for (const int p : {1, 2, 3, 5}) {
    INFO("ranks " << p);
    inproc::run(p, [&](inproc::communicator& c) {
      const std::size_t sizes[] = {5, 1000, 0, 33, 4096, 1, 250, 77, 3000};
      const auto list = [&](dtype dt, op_kind op) {
        std::vector<tensor> ts;
        for (std::uint64_t j = 0; j < 9; ++j) ts.push_back(make(c.rank(), 100 + j, dt, op, sizes[j]));
        return ts;
      };
      auto run_grouped = [&](dtype dt, op_kind op, std::size_t bucket) {
        auto ts = list(dt, op), ref = list(dt, op);
        for (auto& t : ref) allreduce_one(c, t);
        std::visit(
            [&](auto& first) {
              using T = typename std::decay_t<decltype(first)>::value_type;
              std::vector<std::span<T>> spans;
              for (auto& t : ts) spans.push_back(std::span(std::get<std::vector<T>>(t.v)));
              dispatch_op(op, [&](auto o) { grouped_allreduce(c, spans, o, {}, bucket); });
            },
            ts[0].v);
        for (std::size_t k = 0; k < ts.size(); ++k) {
          CHECK(wrong(ts[k], p) == 0);
          CHECK(same_bits(ts[k], ref[k]));
        }
      };
      run_grouped(dtype::f32, op_kind::sum, 4096);
      run_grouped(dtype::f32, op_kind::avg, std::size_t{1} << 20);
      run_grouped(dtype::f16, op_kind::avg, 1024);
      run_grouped(dtype::i64, op_kind::max, 512);
      run_grouped(dtype::bf16, op_kind::prod, 2000);
    });
  }
}

TEST_CASE("engine: 10,000 tiny tensors of mixed types and ops") {
  constexpr dtype types[] = {dtype::f32, dtype::f64, dtype::i32, dtype::f16};
  constexpr op_kind ops[] = {op_kind::avg, op_kind::sum, op_kind::max};
  for (const int p : {2, 4}) {
    INFO("ranks " << p);
    std::vector<std::size_t> bad(static_cast<std::size_t>(p), 1);
    std::vector<engine_stats> stats(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) {
      std::mt19937_64 rng(42); // the same list on every rank
      std::vector<tensor> ts;
      ts.reserve(10000);
      for (std::uint64_t j = 0; j < 10000; ++j) {
        const dtype dt = types[rng() % 4];
        ts.push_back(make(c.rank(), j, dt, ops[rng() % 3], 1 + rng() % 7));
      }
      engine<inproc::communicator> eng(c);
      std::vector<handle> hs;
      hs.reserve(ts.size());
      for (auto& t : ts) hs.push_back(submit(eng, t, false)); // automatic ids: one thread, same order
      for (auto& h : hs) h.wait();
      std::size_t b = 0;
      for (auto& t : ts) b += wrong(t, p);
      bad[static_cast<std::size_t>(c.rank())] = b;
      stats[static_cast<std::size_t>(c.rank())] = eng.stats();
    });
    for (int r = 0; r < p; ++r) CHECK(bad[static_cast<std::size_t>(r)] == 0);
    CHECK(stats[0].tensors == 10000);
    MESSAGE("ranks " << p << ": " << stats[0].buckets << " buckets, " << stats[0].cycles << " negotiations");
    CHECK(stats[0].buckets < 2000);
  }
}

TEST_CASE("engine: several threads per rank, explicit ids, a different random order on every rank") {
  for (const int p : {2, 3}) {
    INFO("ranks " << p);
    constexpr int threads = 4;
    constexpr std::uint64_t n = 160;
    std::vector<std::size_t> bad(static_cast<std::size_t>(p), 1);
    inproc::run(p, [&](inproc::communicator& c) {
      std::vector<tensor> ts;
      for (std::uint64_t j = 0; j < n; ++j)
        ts.push_back(make(c.rank(), 1000 + j, all_types[j % 6], all_ops[j % 5], 1 + (j * 37) % 300));
      std::vector<std::size_t> order(n);
      for (std::size_t k = 0; k < n; ++k) order[k] = k;
      std::mt19937_64 rng(static_cast<std::uint64_t>(c.rank()) * 7919 + 1);
      std::shuffle(order.begin(), order.end(), rng);
      engine<inproc::communicator> eng(c, {.bucket_bytes = 4096, .first_bucket_bytes = 1024, .cycle_time = 500us,
                                            .lookahead = 8});
      // A rank that has nothing yet while its peers negotiate joins later.
      if (c.rank() == p - 1) std::this_thread::sleep_for(20ms);
      {
        std::vector<std::jthread> pool;
        for (int w = 0; w < threads; ++w)
          pool.emplace_back([&, w] {
            std::vector<handle> hs;
            for (std::size_t k = static_cast<std::size_t>(w); k < n; k += threads) hs.push_back(submit(eng, ts[order[k]]));
            for (auto& h : hs) {
              h.wait();
              CHECK(h.test());
            }
          });
      }
      std::size_t b = 0;
      for (auto& t : ts) b += wrong(t, p);
      bad[static_cast<std::size_t>(c.rank())] = b;
    });
    for (int r = 0; r < p; ++r) CHECK(bad[static_cast<std::size_t>(r)] == 0);
  }
}

namespace {

float grad(int r, std::uint64_t id, std::size_t i, int t) {
  std::uint64_t z = (static_cast<std::uint64_t>(r) << 40) ^ (static_cast<std::uint64_t>(t) << 20) ^ (id << 50) ^ i;
  z = (z ^ (z >> 31)) * 0x7fb5d329728ea185ull;
  z = (z ^ (z >> 27)) * 0x81dadef4bc2dd44dull;
  const double u = static_cast<double>(z >> 11) * 0x1p-53 - 0.5;
  return static_cast<float>(std::sin(0.01 * static_cast<double>(i) + static_cast<double>(id) + r) + u);
}

} // namespace

TEST_CASE("engine: compressed buckets equal compressed_allreduce on the same fused layout") {
  const compression zs[] = {
      {.codec = compress::parse_spec("int8:block=64"), .error_feedback = false, .algo = compressed_algorithm::ring, .seed = 5},
      {.codec = compress::parse_spec("qsgd:levels=7,block=128"), .error_feedback = false,
       .algo = compressed_algorithm::two_step, .seed = 9},
      {.codec = compress::parse_spec("topk:density=0.1"), .error_feedback = false, .seed = 3},
  };
  const std::size_t sizes[] = {300, 1000, 77, 2048, 5, 600, 129, 64, 1500, 8};
  constexpr std::size_t n = 10;
  const auto key_of_tensor = [&](std::size_t j) { return j % 3; };
  const auto op_of_tensor = [&](std::size_t j) { return j % 4 == 3 ? op_kind::sum : op_kind::avg; };
  for (const int p : {2, 3}) {
    INFO("ranks " << p);
    // The plan the engine must make: one negotiation sees all ten, in order.
    std::vector<tensor_desc> descs;
    for (std::size_t j = 0; j < n; ++j)
      descs.push_back({.id = automatic_id_base + j, .dt = dtype::f32, .count = sizes[j], .op = op_of_tensor(j),
                       .codec = fusion::detail::codec_key(zs[key_of_tensor(j)])});
    engine_options eo = flush_only();
    eo.lookahead = 2;
    const auto buckets = plan(descs, {.bucket_bytes = eo.bucket_bytes, .first_bucket_bytes = eo.first_bucket_bytes,
                                      .lookahead = eo.lookahead, .first = true});
    REQUIRE(buckets.size() > 3);
    REQUIRE(buckets.size() < n);
    std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p)), ref(static_cast<std::size_t>(p));
    inproc::run(p, [&](inproc::communicator& c) {
      // This rank's own copies: a spec records which parameters were read.
      const std::vector<compression> z(std::begin(zs), std::end(zs));
      const auto inputs = [&] {
        std::vector<std::vector<float>> v(n);
        for (std::size_t j = 0; j < n; ++j)
          for (std::size_t i = 0; i < sizes[j]; ++i) v[j].push_back(grad(c.rank(), j, i, 0));
        return v;
      };
      auto& mine = got[static_cast<std::size_t>(c.rank())];
      mine = inputs();
      {
        engine<inproc::communicator> eng(c, eo);
        std::vector<handle> hs;
        for (std::size_t j = 0; j < n; ++j)
          hs.push_back(eng.submit(std::span(mine[j]), {.op = op_of_tensor(j), .compress = z[key_of_tensor(j)]}));
        eng.flush();
        for (auto& h : hs) h.wait();
        CHECK(eng.stats().compressed_buckets == buckets.size());
      }
      // The reference: the planned buckets, packed here, in plan order, the
      // noise step being the bucket's index.
      auto& out = ref[static_cast<std::size_t>(c.rank())];
      out = inputs();
      for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
        const bucket& b = buckets[bi];
        std::vector<float> fused(b.elements(), 0.0f);
        for (std::size_t k = 0; k < b.members.size(); ++k)
          std::copy(out[b.members[k]].begin(), out[b.members[k]].end(), fused.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k)));
        compress_state<float> st;
        st.step = bi;
        const compression& zb = z[key_of_tensor(b.members[0])];
        if (b.key.op == op_kind::sum) compressed_allreduce(c, std::span(fused), zb, st, op::sum{});
        else compressed_allreduce(c, std::span(fused), zb, st, op::avg{});
        for (std::size_t k = 0; k < b.members.size(); ++k) {
          auto& d = out[b.members[k]];
          std::copy_n(fused.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k)), d.size(), d.begin());
        }
      }
    });
    for (int r = 0; r < p; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        INFO("rank " << r << " tensor " << j);
        CHECK(std::memcmp(got[r][j].data(), ref[r][j].data(), sizes[j] * sizeof(float)) == 0);
        CHECK(std::memcmp(got[r][j].data(), got[0][j].data(), sizes[j] * sizeof(float)) == 0);
      }
  }
}

namespace {

// Error feedback through fused buckets whose composition changes every step
// (the submission order is reshuffled): sum over steps of the outputs +
// (sum over ranks of the final residuals) / p = sum over steps of the exact
// averages, element by element, for every tensor.
void check_fused_feedback(const char* spec, int p, int steps, double bound) {
  INFO(std::string(spec) << " ranks " << p);
  const compression z{.codec = compress::parse_spec(spec), .error_feedback = true, .algo = compressed_algorithm::ring,
                      .seed = 11, .segment_bytes = 1024};
  const std::size_t sizes[] = {7, 300, 1000, 64, 2000, 129, 513, 40, 900, 1200, 3, 256};
  constexpr std::size_t n = 12;
  std::vector<std::vector<std::vector<double>>> out_sum(static_cast<std::size_t>(p)), res(static_cast<std::size_t>(p));
  std::vector<std::vector<std::vector<float>>> last(static_cast<std::size_t>(p));
  inproc::run(p, [&](inproc::communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    out_sum[r].resize(n);
    last[r].resize(n);
    for (std::size_t j = 0; j < n; ++j) out_sum[r][j].assign(sizes[j], 0.0);
    engine<inproc::communicator> eng(c, {.bucket_bytes = 6000, .first_bucket_bytes = 2000,
                                         .cycle_time = std::chrono::microseconds(60'000'000), .lookahead = 64});
    std::vector<std::size_t> order(n);
    for (std::size_t k = 0; k < n; ++k) order[k] = k;
    for (int t = 0; t < steps; ++t) {
      std::mt19937_64 rng(static_cast<std::uint64_t>(t)); // the same order on every rank
      std::shuffle(order.begin(), order.end(), rng);
      std::vector<std::vector<float>> v(n);
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < sizes[j]; ++i) v[j].push_back(grad(c.rank(), j, i, t));
      for (const std::size_t j : order) eng.submit(std::span(v[j]), {.compress = z, .id = 500 + j});
      eng.flush();
      for (std::size_t j = 0; j < n; ++j)
        for (std::size_t i = 0; i < sizes[j]; ++i) out_sum[r][j][i] += v[j][i];
      last[r] = v;
    }
    res[r].resize(n);
    for (std::size_t j = 0; j < n; ++j) res[r][j] = eng.residual(500 + j);
  });
  double worst = 0, scale = 0, res_sq = 0;
  std::size_t elems = 0;
  for (std::size_t j = 0; j < n; ++j) {
    for (int r = 0; r < p; ++r) REQUIRE(res[r][j].size() == sizes[j]);
    for (std::size_t i = 0; i < sizes[j]; ++i) {
      double exact = 0, rs = 0;
      for (int t = 0; t < steps; ++t)
        for (int r = 0; r < p; ++r) exact += grad(r, j, i, t);
      exact /= p;
      for (int r = 0; r < p; ++r) {
        rs += res[r][j][i];
        res_sq += res[r][j][i] * res[r][j][i];
      }
      worst = std::max(worst, std::abs(out_sum[0][j][i] + rs / p - exact));
      scale = std::max(scale, std::abs(exact));
      ++elems;
    }
    for (int r = 1; r < p; ++r) CHECK(last[r][j] == last[0][j]);
  }
  CHECK(worst <= 1e-3 * std::max(1.0, scale));
  const double rms = std::sqrt(res_sq / static_cast<double>(elems * static_cast<std::size_t>(p)));
  MESSAGE(std::string(spec) << ": RMS residual " << rms << " after " << steps << " steps, worst conservation error " << worst);
  CHECK(rms > 0); // feedback is on: something was held back
  CHECK(rms <= bound);
}

} // namespace

TEST_CASE("engine: error feedback stays exact per tensor while bucket composition changes") {
  check_fused_feedback("int8:block=64", 3, 20, 0.05);
  check_fused_feedback("sign:block=256", 2, 20, 5);
}

TEST_CASE("engine: automatic ids restart at each flush, so residuals carry over between steps") {
  inproc::run(2, [](inproc::communicator& c) {
    const compression z{.codec = compress::parse_spec("int8:block=32"), .algo = compressed_algorithm::ring};
    engine<inproc::communicator> eng(c, flush_only());
    const std::size_t sizes[] = {40, 7, 300};
    std::vector<double> first;
    for (int t = 0; t < 3; ++t) {
      std::vector<std::vector<float>> v(3);
      std::vector<handle> hs;
      for (std::size_t j = 0; j < 3; ++j) {
        for (std::size_t i = 0; i < sizes[j]; ++i) v[j].push_back(grad(c.rank(), j, i, t));
        hs.push_back(eng.submit(std::span(v[j]), {.compress = z}));
        CHECK(hs.back().id() == automatic_id_base + j);
      }
      eng.flush();
      if (t == 0) first = eng.residual(automatic_id_base + 2);
    }
    for (std::size_t j = 0; j < 3; ++j) CHECK(eng.residual(automatic_id_base + j).size() == sizes[j]);
    CHECK(eng.residual(automatic_id_base + 3).empty()); // no ids beyond one step's
    CHECK(first.size() == 300);
    CHECK(first != eng.residual(automatic_id_base + 2)); // the same id's residual moved on
  });
}

TEST_CASE("grouped_compressed_allreduce: residuals per tensor, conservation over steps") {
  constexpr int p = 3, steps = 10;
  const std::size_t sizes[] = {100, 7, 900, 64, 1000};
  const compression z{.codec = compress::parse_spec("int8:block=32"), .error_feedback = true,
                      .algo = compressed_algorithm::ring, .seed = 4};
  std::vector<std::vector<std::vector<double>>> out_sum(p), res(p);
  inproc::run(p, [&](inproc::communicator& c) {
    const auto r = static_cast<std::size_t>(c.rank());
    std::vector<compress_state<float>> st(5);
    out_sum[r].resize(5);
    for (std::size_t j = 0; j < 5; ++j) out_sum[r][j].assign(sizes[j], 0.0);
    for (int t = 0; t < steps; ++t) {
      std::vector<std::vector<float>> v(5);
      std::vector<std::span<float>> spans;
      for (std::size_t j = 0; j < 5; ++j) {
        for (std::size_t i = 0; i < sizes[j]; ++i) v[j].push_back(grad(c.rank(), j, i, t));
        spans.push_back(std::span(v[j]));
      }
      grouped_compressed_allreduce(c, std::span<const std::span<float>>(spans), z, std::span(st), op::avg{}, {}, 2048);
      for (std::size_t j = 0; j < 5; ++j)
        for (std::size_t i = 0; i < sizes[j]; ++i) out_sum[r][j][i] += v[j][i];
    }
    res[r].resize(5);
    for (std::size_t j = 0; j < 5; ++j) res[r][j].assign(st[j].residual.begin(), st[j].residual.end());
    CHECK(st[0].step == steps);
  });
  double worst = 0;
  for (std::size_t j = 0; j < 5; ++j)
    for (std::size_t i = 0; i < sizes[j]; ++i) {
      double exact = 0, rs = 0;
      for (int t = 0; t < steps; ++t)
        for (int r = 0; r < p; ++r) exact += grad(r, j, i, t);
      for (int r = 0; r < p; ++r) rs += res[r][j][i];
      worst = std::max(worst, std::abs(out_sum[0][j][i] + rs / p - exact / p));
    }
  CHECK(worst <= 1e-3 * steps);
}

namespace {

// inproc with a send that fails on demand: messages of at least min_bytes
// fail while `armed` (negotiation messages are smaller, bucket messages
// larger). No irecv_upto, so engines over it have no compressed path.
struct faulty {
  static constexpr std::string_view name = "faulty";
  inproc::communicator* c;
  const std::atomic<bool>* armed;
  std::size_t min_bytes;

  int rank() const { return c->rank(); }
  int size() const { return c->size(); }
  inproc::request isend(std::span<const std::byte> s, int peer, int tag) {
    if (armed->load() && s.size() >= min_bytes)
      throw error(errc::internal, "faulty.send", c->rank(), peer, "injected failure");
    return c->isend(s, peer, tag);
  }
  inproc::request irecv(std::span<std::byte> d, int peer, int tag) { return c->irecv(d, peer, tag); }
  void abort(const std::string& why) { c->abort(why); }
  std::chrono::milliseconds timeout() const { return c->timeout(); }
  void set_timeout(std::chrono::milliseconds t) { c->set_timeout(t); }
};
static_assert(transport<faulty> && abortable<faulty> && timed<faulty> && !upto_receiver<faulty>);

} // namespace

TEST_CASE("engine: a failed bucket fails every handle in it on every rank; the engine is broken after") {
  constexpr int p = 3;
  std::vector<std::atomic<bool>> armed(p);
  inproc::run(p, [&](inproc::communicator& c) {
    const int r = c.rank();
    faulty f{&c, &armed[static_cast<std::size_t>(r)], 4096};
    engine<faulty> eng(f, flush_only());
    // A healthy step first.
    auto ok = mixed(r);
    std::vector<handle> oks;
    for (auto& t : ok) oks.push_back(submit(eng, t));
    eng.flush();
    for (auto& h : oks) CHECK_NOTHROW(h.wait());
    for (auto& t : ok) CHECK(wrong(t, p) == 0);
    // Step 2: rank 1's sends of the large f32 bucket fail. Buckets in plan
    // order: [a0, a1] (f32 avg, 240 KB), [b0] (f64), [c0] (i32).
    if (r == 1) armed[1].store(true);
    std::vector<tensor> ts{make(r, 900, dtype::f32, op_kind::avg, 40000), make(r, 901, dtype::f64, op_kind::avg, 10),
                           make(r, 902, dtype::f32, op_kind::avg, 20000), make(r, 903, dtype::i32, op_kind::sum, 5)};
    std::vector<handle> hs;
    for (auto& t : ts) hs.push_back(submit(eng, t));
    CHECK_THROWS_AS(eng.flush(), error);
    for (const std::size_t k : {0, 2}) { // the failed bucket: its own error on rank 1, the abort elsewhere
      try {
        hs[k].wait();
        FAIL("bucket handle " << k << " did not throw on rank " << r);
      } catch (const error& e) {
        if (r == 1) {
          CHECK(e.kind() == errc::internal);
          CHECK(e.reason().find("injected failure") != std::string::npos); // re-raised by the collective with the call
        } else {
          CHECK(e.kind() == errc::aborted);
        }
      }
      CHECK_THROWS_AS(hs[k].test(), error); // test() rethrows too, every time
      CHECK_THROWS_AS(hs[k].wait(), error);
    }
    for (const std::size_t k : {1, 3}) CHECK_THROWS_AS(hs[k].wait(), error); // broken engine: later buckets fail
    // Later submits fail at once with the same error.
    std::vector<float> late(8, 1.0f);
    const handle h = eng.submit(std::span(late), {.id = 999});
    CHECK_THROWS_AS(h.wait(), error);
    CHECK(late[0] == 1.0f);
  }); // the destructors return: flush rethrows into them and they swallow it
}

TEST_CASE("engine: a tensor submitted differently on two ranks fails alone, on both; the engine goes on") {
  constexpr int p = 2;
  inproc::run(p, [&](inproc::communicator& c) {
    const int r = c.rank();
    engine<inproc::communicator> eng(c, flush_only());
    std::vector<tensor> ts;
    for (std::uint64_t j = 1; j <= 4; ++j) ts.push_back(make(r, j, dtype::f32, op_kind::avg, 10));
    ts.push_back(make(r, 5, dtype::f32, op_kind::avg, r == 0 ? 11 : 10)); // count differs
    ts.push_back(make(r, 6, dtype::f32, op_kind::avg, 10));
    std::vector<handle> hs;
    for (auto& t : ts) hs.push_back(submit(eng, t));
    CHECK_NOTHROW(eng.flush());
    for (std::size_t k = 0; k < ts.size(); ++k) {
      if (k == 4) {
        try {
          hs[k].wait();
          FAIL("the mismatched tensor completed");
        } catch (const error& e) {
          CHECK(e.kind() == errc::mismatch);
          CHECK(e.peer() == 1);
          CHECK(e.reason().find("tensor id 5") != std::string::npos);
        }
      } else {
        CHECK_NOTHROW(hs[k].wait());
        CHECK(wrong(ts[k], p) == 0);
      }
    }
    CHECK(eng.stats().mismatched == 1);
    // The engine is not broken: the next step runs.
    auto more = mixed(r, 50);
    std::vector<handle> hm;
    for (auto& t : more) hm.push_back(submit(eng, t));
    eng.flush();
    for (auto& h : hm) CHECK_NOTHROW(h.wait());
    for (auto& t : more) CHECK(wrong(t, p) == 0);
  });
}

TEST_CASE("engine: the destructor runs what is pending, and gives up on a peer that never submits") {
  SUBCASE("pending tensors run") {
    for (const int p : {1, 3}) {
      std::vector<std::size_t> bad(static_cast<std::size_t>(p), 1);
      inproc::run(p, [&](inproc::communicator& c) {
        auto ts = mixed(c.rank());
        {
          engine<inproc::communicator> eng(c, flush_only());
          for (auto& t : ts) submit(eng, t); // handles dropped; no flush
        }
        std::size_t b = 0;
        for (auto& t : ts) b += wrong(t, p);
        bad[static_cast<std::size_t>(c.rank())] = b;
      });
      for (int r = 0; r < p; ++r) CHECK(bad[static_cast<std::size_t>(r)] == 0);
    }
  }
  SUBCASE("a tensor only rank 0 submits fails at the communicator's timeout") {
    inproc::run(2, [&](inproc::communicator& c) {
      if (c.rank() == 0) c.set_timeout(300ms);
      std::vector<float> x(16, 1.0f);
      handle h;
      {
        engine<inproc::communicator> eng(c, flush_only());
        if (c.rank() == 0) h = eng.submit(std::span(x), {.id = 77});
      }
      if (c.rank() == 0) {
        try {
          h.wait();
          FAIL("no error");
        } catch (const error& e) {
          CHECK(e.kind() == errc::timeout);
        }
      }
    });
  }
}

TEST_CASE("engine: handles, and submit's argument checks") {
  inproc::run(1, [&](inproc::communicator& c) {
    engine<inproc::communicator> eng(c, flush_only());
    const handle none;
    CHECK(none.test());
    CHECK_NOTHROW(none.wait());
    std::vector<float> x{1, 2, 3};
    const handle h = eng.submit(std::span(x), {.id = 3});
    CHECK(h.id() == 3);
    const handle copy = h;
    CHECK_FALSE(copy.test()); // waits for a flush or 60 s
    try {
      eng.submit(std::span(x), {.id = 3});
      FAIL("a pending id was accepted twice");
    } catch (const error& e) {
      CHECK(e.op() == "fusion.submit");
      CHECK(e.kind() == errc::invalid_argument);
    }
    std::vector<std::int32_t> ints{1, 2};
    try {
      eng.submit(std::span(ints), {.compress = compression{}});
      FAIL("compression of i32 was accepted");
    } catch (const error& e) {
      CHECK(e.op() == "fusion.submit");
      CHECK(e.rank() == 0);
      CHECK(e.reason().find("i32") != std::string::npos);
    }
    std::vector<float> y{1, 2};
    CHECK_THROWS_AS(eng.submit(std::span(y), {.op = op_kind::max, .compress = compression{}}), error);
    CHECK_THROWS_AS(eng.submit(std::span(y), {.id = automatic_id_base + 1}), error);
    CHECK_THROWS_AS(eng.submit(std::span(y), {.compress = compression{.codec = compress::parse_spec("int8:blok=3")}}),
                    error);
    const handle a = eng.submit(std::span(y)); // automatic ids count automatic submissions only
    CHECK(a.id() == automatic_id_base);
    eng.flush();
    CHECK(h.test());
    CHECK(copy.test());
    CHECK(a.test());
    CHECK(x == std::vector<float>{1, 2, 3}); // the average over one rank
    const engine_stats s = eng.stats();
    CHECK(s.tensors == 2);
    CHECK(s.buckets == 1); // one key, one bucket
    CHECK(s.cycles == 1);
  });
}

TEST_CASE("engine: one negotiation runs exactly the planner's buckets") {
  constexpr int p = 2;
  std::vector<engine_stats> stats(p);
  // Runs of 20 tensors per type (f32, f64, f16, ...): a window of 8 past the
  // first tensor of the next run closes each bucket, so every run is one.
  std::vector<tensor_desc> descs;
  for (std::uint64_t j = 0; j < 300; ++j)
    descs.push_back({.id = automatic_id_base + j, .dt = all_types[(j / 20) % 3], .count = 8 + j % 5, .op = op_kind::avg});
  engine_options eo = flush_only();
  eo.lookahead = 8;
  const std::size_t planned =
      plan(descs, {.bucket_bytes = eo.bucket_bytes, .first_bucket_bytes = eo.first_bucket_bytes, .lookahead = 8, .first = true})
          .size();
  // Every rank submits all descs and flushes once; each rank's stats kept.
  const auto run_all = [&] {
    inproc::run(p, [&](inproc::communicator& c) {
      std::vector<tensor> ts;
      for (const auto& d : descs) ts.push_back(make(c.rank(), d.id, d.dt, d.op, d.count));
      engine<inproc::communicator> eng(c, eo);
      for (auto& t : ts) submit(eng, t, false);
      eng.flush();
      for (auto& t : ts) CHECK(wrong(t, p) == 0);
      stats[static_cast<std::size_t>(c.rank())] = eng.stats();
    });
  };
  CHECK(planned == 15);
  run_all();
  for (const auto& s : stats) {
    CHECK(s.buckets == planned);
    CHECK(s.cycles == 1);
    CHECK(s.tensors == 300);
  }
  // With solo_bytes 64 the f64 tensors (64-96 bytes) run alone, in place.
  eo.solo_bytes = 64;
  const std::size_t solo_planned = plan(descs, {.bucket_bytes = eo.bucket_bytes, .first_bucket_bytes = eo.first_bucket_bytes,
                                                .lookahead = 8, .first = true, .solo_bytes = 64})
                                       .size();
  CHECK(solo_planned == 10 + 100);
  run_all();
  for (const auto& s : stats) CHECK(s.buckets == solo_planned);
}

TEST_CASE("solo_bytes_of: never on one rank; the model's break-even, at least the floor, on more") {
  inproc::run(1, [](inproc::communicator& c) { CHECK(solo_bytes_of(c) == std::numeric_limits<std::size_t>::max()); });
  // The default model at 2 ranks: one exchange step (alpha + 8 bytes) over two copies of each byte.
  const double expect = (policy::model_alpha + 8 * (policy::model_beta + policy::model_gamma)) / (2 * policy::model_beta);
  REQUIRE(expect > solo_floor_bytes);
  inproc::run(2, [&](inproc::communicator& c) {
    CHECK(static_cast<double>(solo_bytes_of(c)) == std::floor(expect)); // whole bytes, rounded down
    // A fast link: the floor.
    selector fast(cost_model{.local = {1e-8, 1e-11, 1e-11}, .global = {1e-8, 1e-11, 1e-11}}, {});
    CHECK(solo_bytes_of(c, options{.select = &fast}) == solo_floor_bytes);
  });
}
