// The ring over a segment operation whose wire sizes vary with the data: a
// sparse (index, value) encoding of int32 segments, received with up-to
// receives. Its reduce-scatter and allgather must equal the dense closed
// forms on every rank, for any rank count, count and segment size. This is
// what a compressed ring plugs into.
#include <doctest/doctest.h>

#include <gradsync/algo/chain.hpp>
#include <gradsync/algo/dbtree.hpp>
#include <gradsync/algo/rabenseifner.hpp>
#include <gradsync/algo/recursive_doubling.hpp>
#include <gradsync/algo/ring.hpp>
#include <gradsync/algo/scatter_allgather.hpp>
#include <gradsync/algo/tree.hpp>
#include <gradsync/exec/host.hpp>
#include <gradsync/transport/inproc.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

namespace gradsync::test {
namespace {

// Wire form of n int32 elements: u32 k, then k pairs (u32 index, i32 value)
// for the nonzero elements. Sizes vary from 4 to 4 + 8n bytes.
struct sparse_sum {
  using value_type = std::int32_t;
  static constexpr bool exact = false;
  static constexpr bool in_place_copy = false;
  static constexpr bool staged_send = true;

  static std::size_t slot_bytes(std::size_t n) { return 4 + 8 * n; }
  static std::span<const std::byte> encode(const std::int32_t* x, std::size_t n, std::byte* out) {
    std::uint32_t k = 0;
    for (std::size_t i = 0; i < n; ++i)
      if (x[i] != 0) {
        const auto idx = static_cast<std::uint32_t>(i);
        std::memcpy(out + 4 + 8 * k, &idx, 4);
        std::memcpy(out + 8 + 8 * k, &x[i], 4);
        ++k;
      }
    std::memcpy(out, &k, 4);
    return {out, 4 + 8 * std::size_t{k}};
  }
  static void decode(std::span<const std::byte> w, std::int32_t* dst, std::size_t n) {
    REQUIRE(w.size() >= 4);
    std::uint32_t k;
    std::memcpy(&k, w.data(), 4);
    REQUIRE(w.size() == 4 + 8 * std::size_t{k}); // exactly what was sent
    std::fill(dst, dst + n, 0);
    for (std::uint32_t j = 0; j < k; ++j) {
      std::uint32_t idx;
      std::int32_t v;
      std::memcpy(&idx, w.data() + 4 + 8 * j, 4);
      std::memcpy(&v, w.data() + 8 + 8 * j, 4);
      REQUIRE(idx < n);
      dst[idx] = v;
    }
  }
  std::span<const std::byte> wire(const std::int32_t* mine, std::size_t n, std::byte* slot) const {
    return encode(mine, n, slot);
  }
  std::span<const std::byte> reduce(std::span<std::byte> got, const std::int32_t* mine, std::size_t n,
                                    std::byte* slot) const {
    std::vector<std::int32_t> acc(n);
    decode(got, acc.data(), n);
    for (std::size_t i = 0; i < n; ++i) acc[i] += mine[i];
    return encode(acc.data(), n, slot);
  }
  std::span<const std::byte> reduce_copy(std::span<std::byte> got, const std::int32_t* mine, std::int32_t* dst,
                                         std::size_t n) const {
    std::vector<std::int32_t> acc(n);
    decode(got, acc.data(), n);
    for (std::size_t i = 0; i < n; ++i) dst[i] = acc[i] + mine[i];
    return {};
  }
  static std::span<std::byte> recv_target(std::int32_t*, std::size_t n, std::byte* slot) {
    return {slot, slot_bytes(n)};
  }
  void copy(std::span<std::byte> got, std::int32_t* dst, std::size_t n) const { decode(got, dst, n); }
  void combine(std::span<std::byte> got, const std::int32_t* mine, std::int32_t* acc, std::size_t n, bool) const {
    std::vector<std::int32_t> g(n);
    decode(got, g.data(), n);
    for (std::size_t i = 0; i < n; ++i) acc[i] = g[i] + mine[i];
  }
  static void finish(std::int32_t*, std::size_t) {}
  static void assign(std::int32_t* dst, const std::int32_t* src, std::size_t n) { std::copy(src, src + n, dst); }
  void local(const std::int32_t* mine, std::int32_t* dst, std::size_t n) const { assign(dst, mine, n); }
  void fence() const {}
};
static_assert(algo::segment_op<sparse_sum>);
static_assert(algo::segment_op<algo::typed_reduce<float, op::avg, exec::host>>);

// Element i of rank r: mostly zeros, a rank-dependent pattern of nonzeros.
std::int32_t value(int r, std::size_t i) {
  return i % static_cast<std::size_t>(r + 2) == 0 ? static_cast<std::int32_t>((r + 1) * (i % 1000 + 1)) : 0;
}

} // namespace

TEST_CASE("segment op: variable-size ring reduce-scatter and allgather equal the closed forms") {
  const sparse_sum sop;
  for (int p : {1, 2, 3, 4, 5, 8})
    for (std::size_t block : {std::size_t{0}, std::size_t{1}, std::size_t{17}, std::size_t{1000}})
      for (std::size_t seg_bytes : {std::size_t{16}, std::size_t{256}, std::size_t{1} << 20}) {
        INFO("ranks=" << p << " block=" << block << " seg_bytes=" << seg_bytes);
        const auto P = static_cast<std::size_t>(p);
        const partition blocks{block * P, P};
        inproc::run(p, [&](inproc::communicator& c) {
          const auto R = static_cast<std::size_t>(c.rank());
          std::vector<std::int32_t> in(block * P), own(block);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = value(c.rank(), i);
          std::vector<std::byte> scratch(algo::ring::phase_scratch_bytes(sop, blocks, 4, seg_bytes, p, true));
          algo::ring::reduce_scatter(c, sop, in.data(), own.data(), blocks, seg_bytes, 3, scratch.data());
          for (std::size_t i = 0; i < block; ++i) {
            std::int32_t want = 0;
            for (int q = 0; q < p; ++q) want += value(q, R * block + i);
            REQUIRE(own[i] == want);
          }
          // Allgather of each rank's block of `in`: everyone ends with the
          // block of every rank, decoded from its sparse wire form.
          std::vector<std::int32_t> out(block * P, -1);
          std::copy(in.begin() + static_cast<std::ptrdiff_t>(R * block),
                    in.begin() + static_cast<std::ptrdiff_t>((R + 1) * block), out.begin() + static_cast<std::ptrdiff_t>(R * block));
          std::vector<std::byte> gs(algo::ring::phase_scratch_bytes(sop, blocks, 4, seg_bytes, p, false));
          algo::ring::allgather(c, sop, out.data(), blocks, seg_bytes, 4, gs.data());
          for (std::size_t q = 0; q < P; ++q)
            for (std::size_t i = 0; i < block; ++i)
              REQUIRE(out[q * block + i] == value(static_cast<int>(q), q * block + i));
        });
      }
}

TEST_CASE("segment op: every allreduce, reduce and broadcast schedule runs a variable-size operation") {
  // The sparse wire form exercises up-to receives, staged sends (rotating
  // staging) and copies that cannot land in place in every schedule; each
  // result must equal the closed form sum over ranks of value(q, i).
  const sparse_sum sop;
  for (int p : {1, 2, 3, 4, 5, 7, 8})
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000}, std::size_t{4099}})
      for (std::size_t seg_bytes : {std::size_t{16}, std::size_t{200}, std::size_t{1} << 20}) {
        INFO("ranks=" << p << " n=" << n << " seg_bytes=" << seg_bytes);
        std::vector<std::int32_t> want(n, 0);
        for (std::size_t i = 0; i < n; ++i)
          for (int q = 0; q < p; ++q) want[i] += value(q, i);
        inproc::run(p, [&](inproc::communicator& c) {
          std::vector<std::int32_t> in(n);
          for (std::size_t i = 0; i < n; ++i) in[i] = value(c.rank(), i);
          auto run = [&](const char* what, std::size_t scratch_bytes, auto&& body) {
            INFO(what);
            std::vector<std::byte> scratch(scratch_bytes);
            std::vector<std::int32_t> out(n, -7);
            body(out, scratch.data());
            REQUIRE(out == want);
          };
          run("rd", algo::pairwise::scratch_bytes(sop, n, seg_bytes, p), [&](auto& out, std::byte* ws) {
            algo::recursive_doubling::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws);
          });
          run("rabenseifner", algo::pairwise::scratch_bytes(sop, n, seg_bytes, p), [&](auto& out, std::byte* ws) {
            algo::rabenseifner::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws);
          });
          run("tree", algo::tree::allreduce_scratch_bytes(sop, n, seg_bytes, p), [&](auto& out, std::byte* ws) {
            algo::tree::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws);
          });
          run("dbtree", algo::dbtree::allreduce_scratch_bytes(sop, n, seg_bytes, p), [&](auto& out, std::byte* ws) {
            algo::dbtree::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws);
          });
          for (int root : {0, p - 1}) {
            INFO("root=" << root);
            // Reduce then broadcast from the same root: every rank ends with the sum.
            run("tree reduce+broadcast",
                std::max(algo::tree::reduce_scratch_bytes(sop, n, seg_bytes, p),
                         algo::tree::broadcast_scratch_bytes(sop, n, seg_bytes, p)),
                [&](auto& out, std::byte* ws) {
                  algo::tree::reduce(c, sop, in.data(), out.data(), n, root, seg_bytes, 6, ws);
                  algo::tree::broadcast(c, sop, out.data(), n, root, seg_bytes, 6, ws);
                });
            run("chain reduce+broadcast",
                std::max(algo::chain::reduce_scratch_bytes(sop, n, seg_bytes, p),
                         algo::chain::broadcast_scratch_bytes(sop, n, seg_bytes, p)),
                [&](auto& out, std::byte* ws) {
                  algo::chain::reduce(c, sop, in.data(), out.data(), n, root, seg_bytes, 6, ws);
                  algo::chain::broadcast(c, sop, out.data(), n, root, seg_bytes, 6, ws);
                });
          }
        });
      }
}


// inproc ranks that track how many receives are posted and not yet
// completed, and the most at once.
struct watched {
  static constexpr std::string_view name = "watched";
  inproc::communicator& c;
  int open = 0, most = 0;
  struct recv_req {
    inproc::request inner;
    int* open;
    bool done = false;
    recv_req(inproc::request r, int* o) : inner(std::move(r)), open(o) {}
    recv_req(recv_req&& o) noexcept : inner(std::move(o.inner)), open(o.open), done(o.done) { o.done = true; }
    recv_req& operator=(recv_req&& o) noexcept {
      finished(); // one overwritten is no longer waited for
      inner = std::move(o.inner);
      open = o.open;
      done = o.done;
      o.done = true;
      return *this;
    }
    void finished() {
      if (!done) --*open;
      done = true;
    }
    void wait() {
      inner.wait();
      finished();
    }
    bool test() {
      const bool t = inner.test();
      if (t) finished();
      return t;
    }
  };
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> d, int peer, int tag) { return c.isend(d, peer, tag); }
  recv_req irecv(std::span<std::byte> d, int peer, int tag) {
    most = std::max(most, ++open);
    return recv_req(c.irecv(d, peer, tag), &open);
  }
};

// Rank r's input (r + 1) (i % 7) and the sum over p ranks, exact in float.
static std::pair<std::vector<float>, std::vector<float>> watched_inputs(std::size_t n, int p, int r) {
  std::vector<float> in(n), want(n);
  for (std::size_t i = 0; i < n; ++i) {
    in[i] = float(r + 1) * float(i % 7);
    want[i] = float(p * (p + 1) / 2) * float(i % 7);
  }
  return {in, want};
}

TEST_CASE("pairwise exchanges keep their receives posted ahead") {
  // Recursive doubling and Rabenseifner combine segment by segment; with
  // one receive posted at a time every segment paid a whole message's
  // latency (SMPI: a rendezvous handshake each). A rank must hold
  // min(segments, recv_slots) receives at once, and the results stay exact.
  static_assert(algo::pairwise::recv_slots == 4);
  exec::host ex;
  for (const std::size_t n : {std::size_t{3}, std::size_t{64}, std::size_t{1000}})
    for (const int p : {2, 4}) {
      INFO("n=" << n << " ranks=" << p);
      const std::size_t seg_bytes = 16; // 4 floats a segment
      inproc::run(p, [&](inproc::communicator& base) {
        watched c{base};
        const algo::typed_reduce<float, op::sum, exec::host> sop{ex, op::sum{}, p};
        const auto [in, want] = watched_inputs(n, p, base.rank());
        std::vector<float> out(n);
        std::vector<std::byte> ws(algo::pairwise::scratch_bytes(sop, n, seg_bytes, p));
        algo::recursive_doubling::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws.data());
        REQUIRE(out == want);
        // the first exchange receives all n elements: ceil(n / 4) segments
        CHECK(c.most == int(std::min<std::size_t>((n + 3) / 4, 4)));
        c.most = 0;
        algo::rabenseifner::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 6, ws.data());
        REQUIRE(out == want);
        // its first halving step receives half the vector (at least a segment)
        CHECK(c.most == int(std::min<std::size_t>(std::max<std::size_t>(1, (n / 2 + 3) / 4), 4)));
        CHECK(c.open == 0);
      });
    }
}


TEST_CASE("dbtree keeps its children's receives posted ahead") {
  // A node waited for each child's segment before posting the next receive,
  // so (under a rendezvous) its incoming transfers followed one another. A
  // rank with two children must hold both children's receives up_ahead
  // segments ahead (plus at most a receive from each tree's parent), and
  // every receive completes; results exact.
  static_assert(algo::dbtree::up_ahead == 2);
  exec::host ex;
  for (const std::size_t n : {std::size_t{2}, std::size_t{40}, std::size_t{1001}})
    for (const int p : {2, 3, 4, 7, 8}) {
      INFO("n=" << n << " ranks=" << p);
      const std::size_t seg_bytes = 16; // 4 floats a segment
      const std::size_t nseg = (n / 2 + 3) / 4;
      inproc::run(p, [&](inproc::communicator& base) {
        watched c{base};
        const algo::typed_reduce<float, op::sum, exec::host> sop{ex, op::sum{}, p};
        const auto [in, want] = watched_inputs(n, p, base.rank());
        std::vector<float> out(n);
        std::vector<std::byte> ws(algo::dbtree::allreduce_scratch_bytes(sop, n, seg_bytes, p));
        algo::dbtree::allreduce(c, sop, in.data(), out.data(), n, seg_bytes, 5, ws.data());
        REQUIRE(out == want);
        const int r = base.rank();
        // children in tree A (heap order) or in its mirror B
        const bool two_children = 2 * r + 2 < p || 2 * (p - 1 - r) + 2 < p;
        if (two_children && nseg >= algo::dbtree::up_ahead) CHECK(c.most >= 2 * int(algo::dbtree::up_ahead));
        CHECK(c.most <= 2 * int(algo::dbtree::up_ahead) + 2);
        CHECK(c.open == 0);
      });
    }
}

// inproc with a synchronous send (as MPI_Issend: a synchronous_sender),
// recording the bytes each rank sent synchronously and in all.
struct turn_taking {
  static constexpr std::string_view name = "turn_taking";
  inproc::communicator& c;
  std::size_t synced = 0, sent = 0;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> d, int peer, int tag) {
    sent += d.size();
    return c.isend(d, peer, tag);
  }
  auto issend(std::span<const std::byte> d, int peer, int tag) {
    synced += d.size();
    return isend(d, peer, tag);
  }
  auto irecv(std::span<std::byte> d, int peer, int tag) { return c.irecv(d, peer, tag); }
};
static_assert(synchronous_sender<turn_taking> && !synchronous_sender<inproc::communicator>);

TEST_CASE("trees send to their children in turn, synchronously from send_in_turn_min_bytes") {
  // A rank with several children waits for each (but the last) to receive:
  // buffered sends to them went out together and the largest subtree's
  // child, which has the most to forward, got its bytes last. 8 ranks,
  // root 3: relative rank 0 has 3 children, 4 has 2, 2 and 6 one, odd none
  // (a binomial tree). Below the size limit no send waits.
  constexpr int p = 8, root = 3;
  exec::host ex;
  constexpr std::size_t big = policy::send_in_turn_min_bytes / sizeof(float); // a message of the limit
  for (const std::size_t n : {std::size_t{5}, big - 1, big, 8 * big})
    for (const bool sa : {false, true}) {
      INFO("n=" << n << " scatter_allgather=" << sa);
      inproc::run(p, [&](inproc::communicator& base) {
        turn_taking c{base};
        const int v = (base.rank() - root + p) % p;
        std::vector<float> data(n, -1.0f);
        if (v == 0)
          for (std::size_t i = 0; i < n; ++i) data[i] = float(i % 1000) + 0.5f;
        const algo::typed_reduce<float, op::sum, exec::host> sop{ex, op::sum{}, p};
        std::size_t want = 0; // synchronous bytes: every child's but the last
        if (!sa) {
          std::vector<std::byte> ws(algo::tree::broadcast_scratch_bytes(sop, n, 1 << 20, p));
          algo::tree::broadcast(c, sop, data.data(), n, root, 1 << 20, 9, ws.data());
          const int children = v == 0 ? 3 : v == 4 ? 2 : v % 4 == 2 ? 1 : 0;
          if (n >= big && children > 1) want = std::size_t(children - 1) * n * sizeof(float);
        } else {
          algo::scatter_allgather::broadcast(c, sop, data.data(), n, root, 1 << 20, 9);
          // the scatter: relative 0 sends blocks [4, 8) then [2, 4) (then [1, 2), last),
          // 4 sends [6, 8) (then [5, 6)); blocks of n / 8 elements
          const std::size_t blk = n / 8 * sizeof(float);
          if (n / 8 >= big) want = v == 0 ? 6 * blk : v == 4 ? 2 * blk : 0;
        }
        for (std::size_t i = 0; i < n; ++i) REQUIRE(data[i] == float(i % 1000) + 0.5f);
        CHECK(c.synced == want);
        CHECK(c.sent >= want);
      });
    }
}

TEST_CASE("ring: items go in waves of pipeline_depth segments along anti-diagonals") {
  // Every (segment, step) once; a step after the same segment's step before
  // it (its forward); the successor's item within `wave` positions of the
  // one it is forwarded from (so pipeline_depth receives ahead and the
  // staging slots never wait on each other around the ring); and, over
  // more than two steps, a wave's later segments start before the one
  // ahead of them finishes (segment-major order, one segment around the
  // ring at a time, fails this).
  constexpr std::size_t wave = policy::pipeline_depth;
  for (const std::size_t nseg : {std::size_t{0}, std::size_t{1}, std::size_t{2}, std::size_t{5}, std::size_t{13}})
    for (const std::size_t steps : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{7}, std::size_t{15}}) {
      INFO("segments=" << nseg << " steps=" << steps);
      const auto order = algo::ring::detail::item_order(nseg, steps);
      REQUIRE(order.size() == nseg * steps);
      std::vector<std::size_t> at(nseg * steps, SIZE_MAX);
      for (std::size_t i = 0; i < order.size(); ++i) {
        const auto [j, s] = order[i];
        REQUIRE(j < nseg);
        REQUIRE(s < steps);
        REQUIRE(at[j * steps + s] == SIZE_MAX);
        at[j * steps + s] = i;
      }
      for (std::size_t j = 0; j < nseg; ++j)
        for (std::size_t s = 1; s < steps; ++s) {
          CHECK(at[j * steps + s] > at[j * steps + s - 1]);
          CHECK(at[j * steps + s] - at[j * steps + s - 1] <= wave);
        }
      for (std::size_t j = 1; j < nseg; ++j)
        if (j % wave != 0 && steps > 2) CHECK(at[j * steps] < at[(j - 1) * steps + steps - 1]);
    }
}

} // namespace gradsync::test
