// staged<C, M> (transport/staged.hpp): device ranges over host transports
// through staging blocks, with host memory standing in for a device's
// (staged_checks.hpp). The CUDA copier's run on a GPU is tests/gpu.
#include <doctest/doctest.h>

#include <gradsync/gossip.hpp>
#include <gradsync/transport/inproc.hpp>
#include <gradsync/transport/shm.hpp>
#include <gradsync/transport/subgroup.hpp>

#include "spawn.hpp"
#include "staged_checks.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace gradsync;
using gradsync::test::counting_copier;
using gradsync::test::device_host;

static_assert(detail::staged_forwards<inproc::communicator>);
static_assert(detail::staged_forwards<shm::communicator>);
static_assert(detail::staged_forwards<subgroup<inproc::communicator>>);
static_assert(!device_memory<inproc::communicator> && !device_memory<shm::communicator>);
// A device executor's buffers need a transport that moves device memory.
static_assert(!detail::carries<inproc::communicator, device_host>);
static_assert(!detail::carries<shm::communicator, device_host>);
static_assert(detail::carries<staged<inproc::communicator, counting_copier>, device_host>);
static_assert(detail::carries<inproc::communicator, exec::host>);

TEST_CASE("staged over inproc: every collective and schedule on staged ranges, ranks 1-8, closed forms") {
  for (const int p : {1, 2, 3, 4, 5, 8}) {
    CAPTURE(p);
    // 0, 1, a count no rank count divides, and one with many segments.
    const std::vector<std::size_t> counts = {0, 1, static_cast<std::size_t>(p) * 7 + 3, 70001};
    CHECK_NOTHROW(inproc::run(p, [&](inproc::communicator& c) { test::staged_collectives(c, counts); }));
  }
}

TEST_CASE("staged: host ranges pass through, device ranges are staged, blocks are reused") {
  inproc::run(2, [](inproc::communicator& c) {
    std::vector<float> dev_buf(4096, 1.0f + static_cast<float>(c.rank())), host_buf(4096, 2.0f);
    counting_copier m;
    const float* dev_first = dev_buf.data();
    const float* dev_last = dev_buf.data() + dev_buf.size();
    m.device = [=](const void* p) {
      const auto* f = static_cast<const float*>(p);
      return f >= dev_first && f < dev_last;
    };
    staged s(c, m);
    device_host ex;
    options o;
    o.algo = algorithm::ring;
    // Host memory: not one byte staged.
    allreduce(s, ex, std::span(host_buf), op::sum{}, o);
    CHECK(m.n->to_host.load() == 0);
    CHECK(m.n->to_device.load() == 0);
    CHECK(host_buf[17] == 4.0f);
    // Device memory: each message staged, the result back in the device range.
    allreduce(s, ex, std::span(dev_buf), op::sum{}, o);
    CHECK(dev_buf[0] == 3.0f);
    CHECK(dev_buf[4095] == 3.0f);
    const std::size_t sent = m.n->to_host.load(), allocs = m.n->allocs.load();
    CHECK(sent > 0);
    CHECK(m.n->to_device.load() > 0);
    CHECK(allocs > 0);
    CHECK(s.idle_staging_blocks() == allocs); // every block back in the pool
    // Ten more calls reuse the pool: no new block.
    for (int i = 0; i < 10; ++i) allreduce(s, ex, std::span(dev_buf), op::max{}, o);
    CHECK(m.n->allocs.load() == allocs);
    CHECK(m.n->to_host.load() == sent * 11);
    CHECK(dev_buf[5] == 3.0f);
  });
}

TEST_CASE("staged: a receive of up to a capacity lands in the device range with its size") {
  inproc::run(2, [](inproc::communicator& c) {
    auto m = counting_copier::all_device();
    staged s(c, m);
    static_assert(upto_receiver<decltype(s)>);
    if (c.rank() == 0) {
      const std::array<std::byte, 5> msg{std::byte{1}, std::byte{2}, std::byte{3}, std::byte{4}, std::byte{5}};
      s.isend(msg, 1, 3).wait();
    } else {
      std::array<std::byte, 16> cap{};
      auto r = s.irecv_upto(cap, 0, 3);
      r.wait();
      CHECK(r.received() == 5);
      CHECK(cap[4] == std::byte{5});
      CHECK(cap[5] == std::byte{0});
      CHECK(m.n->to_device.load() == 1);
    }
  });
}

TEST_CASE("staged: a failing copier fails the call on its rank, by name; the others do not hang") {
  for (const int p : {2, 3}) {
    CAPTURE(p);
    std::string what;
    try {
      inproc::run(p, [](inproc::communicator& c) {
        c.set_timeout(std::chrono::milliseconds(5000));
        auto m = counting_copier::all_device();
        if (c.rank() == 1) m.fail_after = 1; // the second staged send of rank 1 fails
        staged s(c, m);
        device_host ex;
        std::vector<float> v(10000, 1.0f);
        options o;
        o.algo = algorithm::ring;
        o.segment_bytes = 4096;
        allreduce(s, ex, std::span(v), op::sum{}, o);
      });
    } catch (const error& e) {
      what = e.what();
    }
    CHECK(what.find("allreduce") != std::string::npos);
    CHECK(what.find("injected copy failure") != std::string::npos);
  }
}

TEST_CASE("staged: gossip's neighbour averaging on staged ranges") {
  inproc::run(4, [](inproc::communicator& c) {
    auto m = counting_copier::all_device();
    staged s(c, m);
    device_host ex;
    const int r = c.rank();
    std::vector<float> v(1000, static_cast<float>(r));
    const auto g = gossip::ring(4);
    gossip::neighbor_allreduce(s, ex, std::span(v), g, 0);
    // Ring of 4 with uniform weights 1/3: (r-1 + r + r+1) / 3 = r, exact for the closed form below.
    const double want = (static_cast<double>((r + 3) % 4) + r + static_cast<double>((r + 1) % 4)) / 3.0;
    CHECK(v[0] == doctest::Approx(want).epsilon(1e-6));
    CHECK(v[999] == v[0]);
    CHECK(m.n->to_host.load() > 0);
  });
}

TEST_CASE("staged over shm: allreduce, allgather, broadcast, reduce on staged ranges, 2 and 3 forked ranks") {
  for (const int p : {2, 3}) {
    CAPTURE(p);
    const auto res = test::spawn(p, [](shm::communicator& c) { test::staged_collectives(c, {0, 1, 1001, 200003}); },
                                 std::chrono::seconds(120));
    for (const auto& o : res) {
      CHECK_MESSAGE(o.exited, o.message);
      CHECK_MESSAGE(o.code == 0, o.message);
    }
  }
}

} // namespace

namespace {

// A device executor that rejects one range, as exec::cuda rejects host memory.
struct picky_device : gradsync::test::device_host {
  const void* bad = nullptr;
  void check_memory(const void* p, std::size_t, const char* op, int rank, const char* what) const {
    GRADSYNC_REQUIRE(p != bad, op, rank, std::string(what) + " is host memory");
  }
};

TEST_CASE("staged: the executor's memory check names the collective and the buffer") {
  inproc::run(1, [](inproc::communicator& c) {
    staged s(c, counting_copier::all_device());
    std::vector<float> good(8, 1.0f), host(8, 1.0f), out(8);
    picky_device ex;
    ex.bad = host.data();
    CHECK_NOTHROW(allreduce(s, ex, std::span(good), op::sum{}));
    const auto message = [&](auto f) {
      try {
        f();
      } catch (const error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    std::string m = message([&] { allreduce(s, ex, std::span<const float>(host), std::span(out), op::sum{}); });
    CHECK(m.find("allreduce") != std::string::npos);
    CHECK(m.find("input is host memory") != std::string::npos);
    m = message([&] { allgather(s, ex, std::span<const float>(good), std::span(host)); });
    CHECK(m.find("allgather") != std::string::npos);
    CHECK(m.find("output is host memory") != std::string::npos);
    m = message([&] { broadcast(s, ex, std::span(host), 0); });
    CHECK(m.find("buffer is host memory") != std::string::npos);
    m = message([&] { gossip::neighbor_allreduce(s, ex, std::span(host), gossip::ring(1), 0); });
    CHECK(m.find("neighbor_allreduce") != std::string::npos);
  });
}

} // namespace
