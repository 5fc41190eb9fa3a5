// The in-process transport: matching rules, errors, aborts and withdrawn requests.
#include <doctest/doctest.h>

#include <gradsync/transport/inproc.hpp>
#include <gradsync/transport/subgroup.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using gradsync::error;
using gradsync::inproc::communicator;
using namespace std::chrono_literals;

static_assert(gradsync::transport<communicator>);

template <class T> std::span<const std::byte> out_bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}
template <class T> std::span<std::byte> in_bytes(std::vector<T>& v) {
  return std::as_writable_bytes(std::span<T>(v));
}

// Blocking helpers.
template <class T> void send_vec(communicator& c, const std::vector<T>& v, int peer, int tag) {
  c.isend(out_bytes(v), peer, tag).wait();
}
template <class T> std::vector<T> recv_vec(communicator& c, std::size_t n, int peer, int tag) {
  std::vector<T> v(n);
  c.irecv(in_bytes(v), peer, tag).wait();
  return v;
}
void signal(communicator& c, int peer, int tag) { c.isend({}, peer, tag).wait(); }
void await_signal(communicator& c, int peer, int tag) { c.irecv({}, peer, tag).wait(); }

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Collects per-rank messages from inside inproc::run.
struct msg_log {
  std::mutex m;
  std::vector<std::string> lines;
  void add(std::string s) {
    std::lock_guard g(m);
    lines.push_back(std::move(s));
  }
};

constexpr int tag_data = 5, tag_sync = 100; // tests also use tag_data + 1, + 2

} // namespace

TEST_CASE("inproc: messages of one (pair, tag) arrive in posting order") {
  for (const bool receives_first : {false, true}) {
    INFO("receives posted first: " << receives_first);
    gradsync::inproc::run(2, [&](communicator& c) {
      constexpr int n = 64;
      if (c.rank() == 0) {
        if (receives_first) await_signal(c, 1, tag_sync);
        std::vector<std::vector<std::uint32_t>> msgs;
        for (int i = 0; i < n; ++i) msgs.push_back(std::vector<std::uint32_t>(3, 1000u + static_cast<unsigned>(i)));
        std::vector<gradsync::inproc::request> rq;
        for (const auto& m : msgs) rq.push_back(c.isend(out_bytes(m), 1, tag_data));
        for (auto& r : rq) r.wait();
      } else {
        std::vector<std::vector<std::uint32_t>> got(n, std::vector<std::uint32_t>(3));
        std::vector<gradsync::inproc::request> rq;
        for (auto& g : got) rq.push_back(c.irecv(in_bytes(g), 0, tag_data));
        if (receives_first) signal(c, 0, tag_sync);
        for (auto& r : rq) r.wait();
        for (int i = 0; i < n; ++i) CHECK(got[static_cast<std::size_t>(i)] == std::vector<std::uint32_t>(3, 1000u + static_cast<unsigned>(i)));
      }
    });
  }
}

TEST_CASE("inproc: different tags never match each other") {
  gradsync::inproc::run(2, [](communicator& c) {
    if (c.rank() == 0) {
      const std::vector<int> va{11}, vb{22};
      auto a = c.isend(out_bytes(va), 1, 1);
      auto b = c.isend(out_bytes(vb), 1, 2);
      a.wait();
      b.wait();
      await_signal(c, 1, tag_sync);
      send_vec(c, std::vector<int>{33}, 1, 3);
    } else {
      std::vector<int> v3(1, -1);
      auto r3 = c.irecv(in_bytes(v3), 0, 3); // posted first, must not take tag 1 or 2
      CHECK(recv_vec<int>(c, 1, 0, 2) == std::vector<int>{22}); // out of send order: other tag
      CHECK(recv_vec<int>(c, 1, 0, 1) == std::vector<int>{11});
      CHECK_FALSE(r3.test());
      CHECK(v3[0] == -1);
      signal(c, 0, tag_sync);
      r3.wait();
      CHECK(v3[0] == 33);
    }
  });
}

TEST_CASE("inproc: messages from different sources never match each other") {
  gradsync::inproc::run(3, [](communicator& c) {
    if (c.rank() == 0) {
      CHECK(recv_vec<int>(c, 2, 2, tag_data) == std::vector<int>{2, 2});
      CHECK(recv_vec<int>(c, 2, 1, tag_data) == std::vector<int>{1, 1});
    } else {
      send_vec(c, std::vector<int>(2, c.rank()), 0, tag_data);
    }
  });
}

TEST_CASE("inproc: a size mismatch fails both sides, naming both sizes") {
  for (const bool send_first : {true, false}) {
    INFO("send posted first: " << send_first);
    msg_log lg;
    gradsync::inproc::run(2, [&](communicator& c) {
      try {
        if (c.rank() == 0) {
          std::vector<std::uint64_t> v(1, 42); // 8 bytes
          if (!send_first) await_signal(c, 1, tag_sync);
          auto s = c.isend(out_bytes(v), 1, tag_data);
          if (send_first) signal(c, 1, tag_sync);
          s.wait();
        } else {
          std::vector<std::uint32_t> v(1); // 4 bytes
          if (send_first) await_signal(c, 0, tag_sync);
          auto r = c.irecv(in_bytes(v), 0, tag_data);
          if (!send_first) signal(c, 0, tag_sync);
          r.wait();
        }
        lg.add("rank " + std::to_string(c.rank()) + ": no error");
      } catch (const error& e) {
        CHECK(e.op() == (c.rank() == 0 ? "inproc.send" : "inproc.recv"));
        CHECK(e.rank() == c.rank());
        CHECK(e.peer() == 1 - c.rank());
        CHECK(e.kind() == gradsync::errc::mismatch);
        lg.add(e.what());
      }
    });
    REQUIRE(lg.lines.size() == 2);
    for (const auto& m : lg.lines) {
      INFO(m);
      CHECK(contains(m, "size mismatch"));
      CHECK(contains(m, "sent 8 bytes"));
      CHECK(contains(m, "receive of 4 bytes"));
    }
  }
  // through run(): the error reaches the caller
  try {
    gradsync::inproc::run(2, [](communicator& c) {
      if (c.rank() == 0) send_vec(c, std::vector<char>(3), 1, tag_data);
      else recv_vec<char>(c, 5, 0, tag_data);
    });
    FAIL("no error");
  } catch (const error& e) {
    CHECK(contains(e.what(), "3 bytes"));
    CHECK(contains(e.what(), "5 bytes"));
  }
}

TEST_CASE("inproc: a peer out of range is an error") {
  gradsync::inproc::run(2, [](communicator& c) {
    std::vector<int> v(2);
    for (const int peer : {-1, 2, 1000}) {
      try {
        c.isend(out_bytes(v), peer, 0).wait();
        FAIL("send to peer " << peer << " did not fail");
      } catch (const error& e) {
        CHECK(e.op() == "inproc.send");
        CHECK(e.rank() == c.rank());
        CHECK(contains(e.reason(), "peer " + std::to_string(peer) + " out of range [0, 2)"));
      }
      try {
        c.irecv(in_bytes(v), peer, 0).wait();
        FAIL("receive from peer " << peer << " did not fail");
      } catch (const error& e) {
        CHECK(e.op() == "inproc.recv");
        CHECK(contains(e.reason(), "out of range"));
      }
    }
  });
}

TEST_CASE("inproc: worlds and communicators validate their arguments") {
  CHECK_THROWS_AS(gradsync::inproc::world(0), error);
  CHECK_THROWS_AS(gradsync::inproc::run(-1, [](communicator&) {}), error);
  auto w = std::make_shared<gradsync::inproc::world>(3);
  CHECK_THROWS_AS(communicator(w, 3), error);
  CHECK_THROWS_AS(communicator(w, -1), error);
  CHECK_THROWS_AS(communicator(nullptr, 0), error);
  const communicator c(w, 2);
  CHECK(c.rank() == 2);
  CHECK(c.size() == 3);
  CHECK(communicator::name == "inproc");
  int ran = 0;
  gradsync::inproc::run(1, [&](communicator& one) {
    CHECK(one.size() == 1);
    ++ran;
  });
  CHECK(ran == 1);
}

TEST_CASE("inproc: zero-byte messages match, in order with the others") {
  gradsync::inproc::run(2, [](communicator& c) {
    if (c.rank() == 0) {
      std::vector<gradsync::inproc::request> rq;
      const std::vector<int> a{1, 2}, b{3, 4};
      rq.push_back(c.isend({}, 1, tag_data));
      rq.push_back(c.isend(out_bytes(a), 1, tag_data));
      rq.push_back(c.isend(std::span<const std::byte>(static_cast<const std::byte*>(nullptr), 0), 1, tag_data));
      rq.push_back(c.isend(out_bytes(b), 1, tag_data));
      for (auto& r : rq) r.wait();
    } else {
      await_signal(c, 0, tag_data);
      CHECK(recv_vec<int>(c, 2, 0, tag_data) == std::vector<int>{1, 2});
      await_signal(c, 0, tag_data);
      CHECK(recv_vec<int>(c, 2, 0, tag_data) == std::vector<int>{3, 4});
    }
  });
  // an empty receive does not accept a non-empty message
  CHECK_THROWS_AS(gradsync::inproc::run(2, [](communicator& c) {
                    if (c.rank() == 0) send_vec(c, std::vector<int>{1}, 1, 0);
                    else await_signal(c, 0, 0);
                  }),
                  error);
}

TEST_CASE("inproc: test() polls, default requests are complete") {
  gradsync::inproc::request none;
  CHECK(none.test());
  CHECK_NOTHROW(none.wait());
  gradsync::inproc::run(2, [](communicator& c) {
    std::vector<int> v(4, c.rank());
    if (c.rank() == 0) {
      auto r = c.irecv(in_bytes(v), 1, tag_data);
      CHECK_FALSE(r.test());
      signal(c, 1, tag_sync);
      while (!r.test()) std::this_thread::yield();
      CHECK(v == std::vector<int>(4, 1));
      CHECK(r.test()); // stays complete
    } else {
      await_signal(c, 0, tag_sync);
      send_vec(c, v, 0, tag_data);
    }
  });
}

TEST_CASE("inproc: a throwing rank fails every other rank's wait, and run rethrows the cause") {
  for (const int culprit : {0, 2}) {
    INFO("rank " << culprit << " throws");
    msg_log lg;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      gradsync::inproc::run(4, [&](communicator& c) {
        c.group().set_timeout(60s); // an abort must not need the timeout
        std::vector<int> v(8, c.rank());
        try {
          if (c.rank() == culprit) {
            std::this_thread::sleep_for(20ms); // let the others block first
            throw std::runtime_error("boom");
          }
          // every other rank blocks on something that never happens
          if (c.rank() % 2) c.isend(out_bytes(v), culprit, tag_data).wait();
          else c.irecv(in_bytes(v), culprit, tag_data).wait();
        } catch (const error& e) {
          CHECK(e.kind() == gradsync::errc::aborted);
          lg.add(e.what());
          // an operation posted after the abort fails at once
          CHECK_THROWS_AS(c.irecv(in_bytes(v), (c.rank() + 1) % 4, tag_sync).wait(), error);
          throw;
        }
      });
      FAIL("run did not throw");
    } catch (const error& e) {
      FAIL("run rethrew a secondary error: " << e.what());
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == "boom");
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 20s);
    REQUIRE(lg.lines.size() == 3);
    for (const auto& m : lg.lines) {
      INFO(m);
      CHECK(contains(m, "aborted: rank " + std::to_string(culprit) + " failed: boom"));
    }
  }
  // a gradsync::error as the cause is rethrown as is, even when others fail too
  try {
    gradsync::inproc::run(3, [](communicator& c) {
      if (c.rank() == 2) throw error("my_collective", 2, -1, "bad input");
      std::vector<int> v(1);
      c.irecv(in_bytes(v), 2, 0).wait();
    });
    FAIL("run did not throw");
  } catch (const error& e) {
    CHECK(e.op() == "my_collective");
    CHECK(e.reason() == "bad input");
  }
}

TEST_CASE("inproc: abandoned requests are withdrawn before their buffers go away") {
  // A receive and a send are posted and dropped unmatched; their buffers are
  // freed. The peer's later operations must match new requests instead
  // (run under AddressSanitizer, a stale match would be a use after free).
  gradsync::inproc::run(2, [](communicator& c) {
    c.group().set_timeout(20s);
    if (c.rank() == 0) {
      {
        auto dead = std::make_unique<std::vector<int>>(4, -7);
        auto r = c.irecv(in_bytes(*dead), 1, tag_data);
      }
      {
        auto dead = std::make_unique<std::vector<int>>(4, -9);
        auto s = c.isend(out_bytes(*dead), 1, tag_data + 1);
      }
      { // move-assigning over a pending request withdraws it too
        auto dead = std::make_unique<std::vector<int>>(4, -5);
        auto r = c.irecv(in_bytes(*dead), 1, tag_data + 2);
        r = gradsync::inproc::request{};
      }
      signal(c, 1, tag_sync);
      CHECK(recv_vec<int>(c, 4, 1, tag_data) == std::vector<int>{1, 2, 3, 4});
      send_vec(c, std::vector<int>{5, 6, 7, 8}, 1, tag_data + 1);
      CHECK(recv_vec<int>(c, 4, 1, tag_data + 2) == std::vector<int>{9, 9, 9, 9});
    } else {
      await_signal(c, 0, tag_sync);
      send_vec(c, std::vector<int>{1, 2, 3, 4}, 0, tag_data);
      CHECK(recv_vec<int>(c, 4, 0, tag_data + 1) == std::vector<int>{5, 6, 7, 8});
      send_vec(c, std::vector<int>{9, 9, 9, 9}, 0, tag_data + 2);
    }
  });
}

TEST_CASE("inproc: a wait with no matching peer times out and is withdrawn") {
  msg_log lg;
  std::atomic<bool> timed_out{false}; // the timeout is per world: rank 1 posts only after
  gradsync::inproc::run(2, [&](communicator& c) {
    if (c.rank() == 0) {
      c.group().set_timeout(100ms);
      auto dead = std::make_unique<std::vector<int>>(2, -1);
      try {
        c.irecv(in_bytes(*dead), 1, tag_data).wait();
        lg.add("no timeout");
      } catch (const error& e) {
        CHECK(e.kind() == gradsync::errc::timeout);
        lg.add(e.what());
      }
      dead.reset();
      c.group().set_timeout(20s);
      timed_out = true;
      signal(c, 1, tag_sync);
      CHECK(recv_vec<int>(c, 2, 1, tag_data) == std::vector<int>{3, 4});
    } else {
      while (!timed_out) std::this_thread::sleep_for(1ms);
      await_signal(c, 0, tag_sync);
      send_vec(c, std::vector<int>{3, 4}, 0, tag_data);
    }
  });
  REQUIRE(lg.lines.size() == 1);
  CHECK(contains(lg.lines[0], "inproc.recv (rank 0, peer 1)"));
  CHECK(contains(lg.lines[0], "timed out"));
}

TEST_CASE("inproc: all-to-all stress with interleaved tags and sizes") {
  constexpr int p = 8, per_pair = 24;
  // message k from s to d on tag k % 2 holds k + 1 values of s * 1000 + d * 100 + k
  auto content = [](int s, int d, int k) {
    return std::vector<std::int32_t>(static_cast<std::size_t>(k + 1), s * 1000 + d * 100 + k);
  };
  gradsync::inproc::run(p, [&](communicator& c) {
    const int me = c.rank();
    std::mt19937 rng(static_cast<unsigned>(me));
    std::vector<std::vector<std::int32_t>> outs, ins;
    struct op { bool send; int peer, k; };
    std::vector<op> ops;
    for (int peer = 0; peer < p; ++peer)
      if (peer != me)
        for (int k = 0; k < per_pair; ++k) {
          ops.push_back({true, peer, k});
          ops.push_back({false, peer, k});
        }
    // random posting order that keeps each (peer, tag, direction) in order
    std::shuffle(ops.begin(), ops.end(), rng);
    for (int peer = 0; peer < p; ++peer)
      for (const bool send : {true, false})
        for (int tag = 0; tag < 2; ++tag) {
          std::vector<int> ks;
          for (auto& o : ops)
            if (o.peer == peer && o.send == send && o.k % 2 == tag) ks.push_back(o.k);
          std::sort(ks.begin(), ks.end());
          std::size_t i = 0;
          for (auto& o : ops)
            if (o.peer == peer && o.send == send && o.k % 2 == tag) o.k = ks[i++];
        }
    outs.reserve(ops.size());
    ins.reserve(ops.size());
    std::vector<gradsync::inproc::request> rq;
    std::vector<std::tuple<int, int, std::size_t>> expect; // (peer, k, ins index)
    for (const auto& o : ops) {
      if (o.send) {
        outs.push_back(content(me, o.peer, o.k));
        rq.push_back(c.isend(out_bytes(outs.back()), o.peer, o.k % 2));
      } else {
        ins.emplace_back(static_cast<std::size_t>(o.k + 1));
        expect.emplace_back(o.peer, o.k, ins.size() - 1);
        rq.push_back(c.irecv(in_bytes(ins.back()), o.peer, o.k % 2));
      }
    }
    for (auto& r : rq) r.wait();
    int bad = 0;
    for (const auto& [peer, k, i] : expect) bad += ins[i] != content(peer, me, k);
    CHECK(bad == 0);
  });
}

// ---- capabilities ----------------------------------------------------------

static_assert(gradsync::upto_receiver<communicator> && gradsync::abortable<communicator> &&
              gradsync::timed<communicator>);
static_assert(!gradsync::node_map<communicator> && !gradsync::shared_arena<communicator>);
// a view forwards exactly what its parent has
static_assert(gradsync::detail::subgroup_forwards<communicator>);
static_assert(gradsync::upto_receiver<gradsync::subgroup<communicator>> &&
              gradsync::abortable<gradsync::subgroup<communicator>> &&
              gradsync::timed<gradsync::subgroup<communicator>>);

namespace {
// Byte k of a message of n bytes on tag t (no two messages alike).
std::vector<std::uint8_t> pattern(std::size_t n, int t) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t k = 0; k < n; ++k) v[k] = static_cast<std::uint8_t>(k * 7 + n * 13 + static_cast<std::size_t>(t));
  return v;
}
} // namespace

TEST_CASE("inproc: irecv_upto takes any size up to its capacity and reports it") {
  constexpr std::size_t cap = 64;
  const std::vector<std::size_t> sizes{0, 1, 31, 63, 64};
  for (const bool send_first : {true, false}) {
    INFO("send posted first: " << send_first);
    gradsync::inproc::run(2, [&](communicator& c) {
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        const int tag = tag_data + static_cast<int>(i);
        if (c.rank() == 0) {
          const auto v = pattern(sizes[i], tag);
          if (!send_first) await_signal(c, 1, tag_sync);
          auto s = c.isend(out_bytes(v), 1, tag);
          if (send_first) signal(c, 1, tag_sync);
          s.wait();
          CHECK(s.received() == 0);
        } else {
          std::vector<std::uint8_t> buf(cap, 0xEE);
          if (send_first) await_signal(c, 0, tag_sync);
          auto r = c.irecv_upto(in_bytes(buf), 0, tag);
          if (!send_first) signal(c, 0, tag_sync);
          r.wait();
          REQUIRE(r.received() == sizes[i]);
          const auto want = pattern(sizes[i], tag);
          CHECK(std::equal(want.begin(), want.end(), buf.begin()));
          // bytes past the message are untouched
          CHECK(std::all_of(buf.begin() + static_cast<std::ptrdiff_t>(sizes[i]), buf.end(),
                            [](std::uint8_t b) { return b == 0xEE; }));
        }
      }
    });
  }
}

TEST_CASE("inproc: a message larger than an irecv_upto's capacity fails both sides with errc::mismatch") {
  for (const bool send_first : {true, false}) {
    INFO("send posted first: " << send_first);
    msg_log lg;
    gradsync::inproc::run(2, [&](communicator& c) {
      try {
        if (c.rank() == 0) {
          const auto v = pattern(65, tag_data);
          if (!send_first) await_signal(c, 1, tag_sync);
          auto s = c.isend(out_bytes(v), 1, tag_data);
          if (send_first) signal(c, 1, tag_sync);
          s.wait();
        } else {
          std::vector<std::uint8_t> buf(64);
          if (send_first) await_signal(c, 0, tag_sync);
          auto r = c.irecv_upto(in_bytes(buf), 0, tag_data);
          if (!send_first) signal(c, 0, tag_sync);
          r.wait();
        }
        lg.add("rank " + std::to_string(c.rank()) + ": no error");
      } catch (const error& e) {
        CHECK(e.kind() == gradsync::errc::mismatch);
        CHECK(e.peer() == 1 - c.rank());
        lg.add(e.what());
      }
    });
    REQUIRE(lg.lines.size() == 2);
    for (const auto& m : lg.lines) {
      INFO(m);
      CHECK(contains(m, "sent 65 bytes"));
      CHECK(contains(m, "receive of up to 64 bytes"));
    }
  }
}

TEST_CASE("inproc: exact and up-to receives on one tag match in posting order") {
  // rank 0 sends sizes 5, 0, 12, 3, 8; rank 1 alternates exact and up-to
  // receives (all posted before any send), so each message must land in the
  // receive posted in its position
  const std::vector<std::size_t> sizes{5, 0, 12, 3, 8};
  gradsync::inproc::run(2, [&](communicator& c) {
    if (c.rank() == 0) {
      await_signal(c, 1, tag_sync);
      std::vector<std::vector<std::uint8_t>> msgs;
      std::vector<gradsync::inproc::request> rs;
      for (std::size_t i = 0; i < sizes.size(); ++i) msgs.push_back(pattern(sizes[i], static_cast<int>(i)));
      for (const auto& m : msgs) rs.push_back(c.isend(out_bytes(m), 1, tag_data));
      for (auto& r : rs) r.wait();
    } else {
      std::vector<std::vector<std::uint8_t>> bufs;
      std::vector<gradsync::inproc::request> rs;
      for (std::size_t i = 0; i < sizes.size(); ++i) bufs.emplace_back(i % 2 ? 16 : sizes[i]);
      for (std::size_t i = 0; i < sizes.size(); ++i)
        rs.push_back(i % 2 ? c.irecv_upto(in_bytes(bufs[i]), 0, tag_data) : c.irecv(in_bytes(bufs[i]), 0, tag_data));
      signal(c, 0, tag_sync);
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        rs[i].wait();
        CHECK(rs[i].received() == sizes[i]);
        const auto want = pattern(sizes[i], static_cast<int>(i));
        CHECK(std::equal(want.begin(), want.end(), bufs[i].begin()));
      }
    }
  });
}

TEST_CASE("inproc: communicator::abort frees every rank's blocked wait with errc::aborted") {
  msg_log lg;
  const auto t0 = std::chrono::steady_clock::now();
  gradsync::inproc::run(3, [&](communicator& c) {
    c.set_timeout(60s); // the abort, not the timeout, must end the waits
    if (c.rank() == 2) {
      std::this_thread::sleep_for(20ms); // let the others block first
      c.abort("test abort");
      return;
    }
    std::vector<int> v(4);
    try {
      c.irecv(in_bytes(v), 2, tag_data).wait();
      lg.add("no error");
    } catch (const error& e) {
      CHECK(e.kind() == gradsync::errc::aborted);
      lg.add(e.what());
    }
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  REQUIRE(lg.lines.size() == 2);
  for (const auto& m : lg.lines) CHECK(contains(m, "rank 2 aborted: test abort"));
}

TEST_CASE("inproc: timeouts are per communicator; scoped_timeout sets one and restores it") {
  auto w = std::make_shared<gradsync::inproc::world>(2);
  w->set_timeout(7s);
  communicator a(w, 0), b(w, 1);
  CHECK(a.timeout() == 7s); // the world's until set
  a.set_timeout(250ms);
  CHECK(a.timeout() == 250ms);
  CHECK(b.timeout() == 7s); // the other rank keeps the world's
  {
    gradsync::scoped_timeout g(b, 40ms);
    CHECK(b.timeout() == 40ms);
    CHECK(a.timeout() == 250ms);
    std::vector<int> v(1);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      b.irecv(in_bytes(v), 0, tag_data).wait(); // nobody sends
      FAIL("no timeout");
    } catch (const error& e) {
      CHECK(e.kind() == gradsync::errc::timeout);
      CHECK(contains(e.what(), "timed out after 40 ms"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
  CHECK(b.timeout() == 7s);
  {
    gradsync::scoped_timeout g(a, 0ms); // 0: leave it
    CHECK(a.timeout() == 250ms);
  }
  CHECK(a.timeout() == 250ms);
  try {
    gradsync::scoped_timeout g(a, -1ms);
    FAIL("negative timeout accepted");
  } catch (const error& e) {
    CHECK(e.kind() == gradsync::errc::invalid_argument);
    CHECK(e.op() == "scoped_timeout");
  }
  // a view's timeout is its parent's
  gradsync::subgroup<communicator> view(a, {0});
  {
    gradsync::scoped_timeout g(view, 90ms);
    CHECK(a.timeout() == 90ms);
  }
  CHECK(a.timeout() == 250ms);
}
