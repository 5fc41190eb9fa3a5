// The shared-memory transport: every rank is a forked process meeting the
// others through a fresh rendezvous directory (no MPI needed). Covers matching
// rules, sizes around the inline/frame/ring boundaries, errors on both sides,
// crashed peers, cleanup of /dev/shm, and every public collective over shm.
#include <doctest/doctest.h>

#include <gradsync/collectives.hpp>
#include <gradsync/transport/shm.hpp>

#include "spawn.hpp"
#include "trace_calls.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

namespace fs = std::filesystem;
using gradsync::error;
using gradsync::shm::communicator;
using namespace std::chrono_literals;

using gradsync::test::outcome;
using gradsync::test::segment_gone;
using gradsync::test::spawn;

static_assert(gradsync::transport<communicator>);

// A failed expectation inside a rank (doctest's macros only work in the parent).
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}
// Per element in hot loops: the message is only assembled on failure.
void expect(bool ok, const char* what, const std::string& where) {
  if (!ok) throw std::runtime_error("expectation failed: " + std::string(what) + where);
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Every rank finished cleanly and its segment left no trace.
void check_all_ok(const std::vector<outcome>& res) {
  for (std::size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(res[r].exited);
    CHECK(res[r].code == 0);
    CHECK(segment_gone(res[r].segment));
  }
}

std::span<const std::byte> cbytes(const std::vector<std::uint8_t>& v) { return std::as_bytes(std::span(v)); }
std::span<std::byte> wbytes(std::vector<std::uint8_t>& v) { return std::as_writable_bytes(std::span(v)); }

// Deterministic content of message `k` of `n` bytes from rank `src`.
// The kind a rank's exception had, as spawn() reports it.
std::string kind_tag(gradsync::errc k) { return std::string("[kind: ") + gradsync::errc_name(k) + "]"; }

std::vector<std::uint8_t> pattern(std::size_t n, int src, int k) {
  std::vector<std::uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::uint8_t>((i * 31 + static_cast<std::size_t>(src) * 7 + static_cast<std::size_t>(k) * 13) & 0xff);
  return v;
}

// A size that goes by rendezvous (above policy::shm_eager_bytes).
constexpr std::size_t eager_probe = gradsync::policy::shm_eager_bytes + 100;

// After a size mismatch the rings are still consistent: a following
// exchange between ranks 0 and 1 works.
void exchange_after_mismatch(communicator& c) {
  const auto v = pattern(1000, c.rank(), 3);
  std::vector<std::uint8_t> in(1000);
  auto r = c.irecv(wbytes(in), 1 - c.rank(), 2);
  c.isend(cbytes(v), 1 - c.rank(), 2).wait();
  r.wait();
  expect(in == pattern(1000, 1 - c.rank(), 3), "exchange after mismatch");
}

} // namespace

TEST_CASE("shm: messages of every size class arrive intact, both directions and to self") {
  // 0, inline (<= 32), one cell over, frame-sized, larger than the ring
  // (several wrap-arounds) and odd.
  const std::size_t ring = gradsync::policy::shm_ring_bytes;
  const std::size_t eager = gradsync::policy::shm_eager_bytes; // larger ones go by rendezvous
  const std::vector<std::size_t> sizes{0, 1, 31, 32, 33, 64, 4095, 65536 + 3, eager, eager + 1, ring - 1, 3 * ring + 7};
  auto res = spawn(2, [&](communicator& c) {
    const int me = c.rank(), other = 1 - me;
    expect(c.size() == 2, "size");
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto out = pattern(sizes[k], me, static_cast<int>(k));
      std::vector<std::uint8_t> in(sizes[k]), self(sizes[k]);
      auto r = c.irecv(wbytes(in), other, 3);
      auto s = c.isend(cbytes(out), other, 3);
      auto rs = c.irecv(wbytes(self), me, 4);
      auto ss = c.isend(cbytes(out), me, 4);
      r.wait();
      s.wait();
      ss.wait();
      rs.wait();
      expect(in == pattern(sizes[k], other, static_cast<int>(k)), "payload of " + std::to_string(sizes[k]) + " bytes");
      expect(self == out, "self payload of " + std::to_string(sizes[k]) + " bytes");
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: per-(peer, tag) FIFO matching, with messages arriving before their receives") {
  // Rank 0 sends tag 1, 2, 1, 2, ... (small and large interleaved); rank 1
  // receives all of tag 2 first, so every tag-1 message (including ones larger
  // than the ring, redirected mid-stream) arrives unexpected.
  const std::size_t big = 2 * gradsync::policy::shm_ring_bytes + 13;
  const std::vector<std::size_t> sizes{5, big, 40, 1000, big, 0, 77};
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      std::vector<std::vector<std::uint8_t>> msgs;
      std::vector<gradsync::shm::request> reqs;
      for (std::size_t k = 0; k < sizes.size(); ++k) msgs.push_back(pattern(sizes[k], 0, static_cast<int>(k)));
      for (std::size_t k = 0; k < sizes.size(); ++k)
        for (int tag : {1, 2}) reqs.push_back(c.isend(cbytes(msgs[k]), 1, tag));
      for (auto& r : reqs) r.wait();
    } else {
      for (int tag : {2, 1})
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          std::vector<std::uint8_t> in(sizes[k]);
          c.irecv(wbytes(in), 0, tag).wait();
          expect(in == pattern(sizes[k], 0, static_cast<int>(k)),
                 "tag " + std::to_string(tag) + " message " + std::to_string(k) + " out of order or corrupt");
        }
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: rendezvous messages whose receives are not posted hold nothing up, in any order") {
  // Rank 0 posts many large messages on tag 1 (more than the ring holds),
  // then small and large ones on tag 2; rank 1 takes all of tag 2 first,
  // then tag 1 in order, a few receives ahead (as a pipelined schedule does).
  const std::size_t eager = gradsync::policy::shm_eager_bytes, ring = gradsync::policy::shm_ring_bytes;
  const std::vector<std::size_t> ones{eager + 1, ring, 256 * 1024, ring + 4096 + 5, 256 * 1024, 300'001, eager + 64};
  const std::vector<std::size_t> twos{7, 2 * ring + 3, 0, eager + 1};
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      std::vector<std::vector<std::uint8_t>> msgs;
      std::vector<gradsync::shm::request> reqs;
      for (std::size_t k = 0; k < ones.size(); ++k) msgs.push_back(pattern(ones[k], 0, static_cast<int>(k)));
      for (std::size_t k = 0; k < twos.size(); ++k) msgs.push_back(pattern(twos[k], 0, 100 + static_cast<int>(k)));
      for (std::size_t k = 0; k < ones.size(); ++k) reqs.push_back(c.isend(cbytes(msgs[k]), 1, 1));
      for (std::size_t k = 0; k < twos.size(); ++k) reqs.push_back(c.isend(cbytes(msgs[ones.size() + k]), 1, 2));
      for (auto& r : reqs) r.wait();
    } else {
      for (std::size_t k = 0; k < twos.size(); ++k) {
        std::vector<std::uint8_t> in(twos[k]);
        c.irecv(wbytes(in), 0, 2).wait();
        expect(in == pattern(twos[k], 0, 100 + static_cast<int>(k)), "tag 2 message " + std::to_string(k));
      }
      constexpr std::size_t ahead = 3;
      std::vector<std::vector<std::uint8_t>> in(ones.size());
      std::vector<gradsync::shm::request> reqs(ones.size());
      auto post = [&](std::size_t k) {
        in[k].resize(ones[k]);
        reqs[k] = c.irecv(wbytes(in[k]), 0, 1);
      };
      for (std::size_t k = 0; k < std::min(ahead, ones.size()); ++k) post(k);
      for (std::size_t k = 0; k < ones.size(); ++k) {
        reqs[k].wait();
        expect(in[k] == pattern(ones[k], 0, static_cast<int>(k)), "tag 1 message " + std::to_string(k));
        if (k + ahead < ones.size()) post(k + ahead);
      }
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: a matched rendezvous receive withdrawn mid-payload stops the sender, which completes") {
  const std::size_t n = 8 * gradsync::policy::shm_ring_bytes + 3;
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      const auto big = pattern(n, 0, 5);
      auto s = c.isend(cbytes(big), 1, 1);
      // A small message behind the announcement: once the receiver has it,
      // it has matched the big one (a receive withdrawn before its message
      // is announced leaves the message unmatched, and its send waiting, as
      // in MPI: the test must not depend on which comes first).
      const std::vector<std::uint8_t> marker(1, 42);
      c.isend(cbytes(marker), 1, 3).wait();
      s.wait(); // completes although only part of it was read
      const auto after = pattern(eager_probe, 0, 6);
      c.isend(cbytes(after), 1, 2).wait();
    } else {
      {
        std::vector<std::uint8_t> gone(n), marker(1);
        auto r = c.irecv(wbytes(gone), 0, 1);
        c.irecv(wbytes(marker), 0, 3).wait(); // the big message is matched by now
        for (int i = 0; i < 5 && !r.test(); ++i) std::this_thread::sleep_for(1ms); // part of it arrives
      } // withdrawn
      std::vector<std::uint8_t> in(eager_probe);
      c.irecv(wbytes(in), 0, 2).wait();
      expect(in == pattern(eager_probe, 0, 6), "the message after the withdrawn one");
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: a partly arrived unexpected message is handed over mid-stream") {
  const std::size_t n = 4 * gradsync::policy::shm_ring_bytes + 1;
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      const auto big = pattern(n, 0, 9);
      auto s = c.isend(cbytes(big), 1, 7);
      c.isend({}, 1, 8).wait(); // posted behind the big one: forces it to be drained
      s.wait();
    } else {
      c.irecv({}, 0, 8).wait(); // receives tag 8 while tag 7 streams in unexpected
      std::vector<std::uint8_t> in(n);
      c.irecv(wbytes(in), 0, 7).wait();
      expect(in == pattern(n, 0, 9), "redirected payload");
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: size mismatch fails both sides naming both sizes, and the pair stays usable") {
  for (std::size_t sent : {std::size_t{100}, 3 * gradsync::policy::shm_ring_bytes}) {
    const std::size_t posted = sent / 2 + 1;
    for (bool recv_first : {true, false}) {
      CAPTURE(sent);
      CAPTURE(recv_first);
      auto res = spawn(2, [&](communicator& c) {
        const std::string s1 = std::to_string(sent), s2 = std::to_string(posted);
        std::string got;
        if (c.rank() == 0) {
          if (recv_first) c.irecv({}, 1, 9).wait(); // the receive is posted by now
          const auto v = pattern(sent, 0, 0);
          try {
            c.isend(cbytes(v), 1, 1).wait();
          } catch (const error& e) {
            got = e.what();
            expect(e.kind() == gradsync::errc::mismatch, "send side kind");
          }
        } else {
          if (!recv_first) std::this_thread::sleep_for(20ms); // it arrives unexpected
          std::vector<std::uint8_t> in(posted);
          try {
            auto r = c.irecv(wbytes(in), 0, 1);
            if (recv_first) c.isend({}, 0, 9).wait();
            r.wait();
          } catch (const error& e) {
            got = e.what();
            expect(e.kind() == gradsync::errc::mismatch, "receive side kind");
          }
        }
        expect(contains(got, "size mismatch") && contains(got, s1) && contains(got, s2),
               "rank " + std::to_string(c.rank()) + " error names both sizes: '" + got + "'");
        exchange_after_mismatch(c);
      });
      check_all_ok(res);
    }
  }
}

TEST_CASE("shm: invalid peers, ranks and buffers are errors") {
  auto res = spawn(2, [](communicator& c) {
    std::vector<std::uint8_t> v(8);
    for (int peer : {-1, 2, 100}) {
      bool threw = false;
      try {
        c.isend(cbytes(v), peer, 0).wait();
      } catch (const error& e) {
        threw = contains(e.what(), "out of range") && e.peer() == -1 && e.rank() == c.rank();
      }
      expect(threw, "send to peer " + std::to_string(peer));
      threw = false;
      try {
        c.irecv(wbytes(v), peer, 0).wait();
      } catch (const error& e) {
        threw = contains(e.what(), "out of range");
      }
      expect(threw, "recv from peer " + std::to_string(peer));
    }
    bool threw = false;
    try {
      c.isend(std::span<const std::byte>(static_cast<const std::byte*>(nullptr), 4), 0, 0);
    } catch (const error& e) {
      threw = contains(e.what(), "null buffer");
    }
    expect(threw, "null buffer");
  });
  check_all_ok(res);
  const fs::path dir = fs::temp_directory_path();
  CHECK_THROWS_AS(communicator(dir, 2, 2), error);
  CHECK_THROWS_AS(communicator(dir, -1, 2), error);
  CHECK_THROWS_AS(communicator(dir, 0, 0), error);
  std::string what;
  try {
    communicator c(dir / "no-such-directory", 0, 2);
  } catch (const error& e) {
    what = e.what();
  }
  CHECK(contains(what, "does not exist"));
}

TEST_CASE("shm: a stale rendezvous file of a crashed run is ignored") {
  auto res = spawn(3, [](communicator& c) {
    std::vector<float> v(5, static_cast<float>(c.rank()));
    gradsync::allreduce(c, std::span<float>(v));
    expect(v[4] == 3.0f, "allreduce after a stale rendezvous");
  }, 40s, [](const fs::path& dir) {
    // A creator pid that cannot exist (above pid_max) and a vanished segment.
    std::ofstream(dir / "gradsync-shm.rendezvous") << "/gradsync-00000000000000000000000000000000 3 2147483000\n";
  });
  check_all_ok(res);
}

// A creator killed (kill -9) after creating its segment and before publishing
// the rendezvous file leaves only its intent file (.gradsync-shm.<name>.tmp,
// written before the segment exists). The next join in that directory unlinks
// the segment and removes the file; an intent of a live creator stays.
TEST_CASE("shm: a segment whose creator died before publishing it is unlinked by the next join") {
  const std::string dead = "/gradsync-test-intent-dead-" + std::to_string(::getpid());
  const std::string live = "/gradsync-test-intent-live-" + std::to_string(::getpid());
  for (const auto& nm : {dead, live}) {
    const int fd = ::shm_open(nm.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  // A pid that has exited (reaped) stands for the killed creator.
  const pid_t gone = ::fork();
  REQUIRE(gone >= 0);
  if (gone == 0) ::_exit(0);
  ::waitpid(gone, nullptr, 0);
  fs::path dir_seen;
  auto res = spawn(2, [](communicator& c) {
    std::vector<float> v(5, static_cast<float>(c.rank()));
    gradsync::allreduce(c, std::span<float>(v));
    expect(v[4] == 1.0f, "allreduce after a stale intent");
  }, 40s, [&](const fs::path& dir) {
    std::ofstream(dir / (".gradsync-shm." + dead.substr(10) + ".tmp")) << dead << " 2 " << gone << "\n";
    // (this test process is alive: its intent is another group's, starting)
    std::ofstream(dir / (".gradsync-shm." + live.substr(10) + ".tmp")) << live << " 2 " << ::getpid() << "\n";
    dir_seen = dir;
  }, /*expect_empty=*/false);
  check_all_ok(res);
  CHECK(gradsync::test::segment_gone(dead));
  CHECK(!gradsync::test::segment_gone(live));
  CHECK(!fs::exists(dir_seen / (".gradsync-shm." + dead.substr(10) + ".tmp")));
  CHECK(fs::exists(dir_seen / (".gradsync-shm." + live.substr(10) + ".tmp")));
  ::shm_unlink(live.c_str());
  std::error_code ec;
  fs::remove_all(dir_seen, ec);
}

TEST_CASE("shm: 12 ranks on 2 cores (smaller rings, oversubscribed waits)") {
  CHECK(gradsync::shm::detail::ring_bytes_for(12) * 144 <= gradsync::policy::shm_rings_budget);
  CHECK(gradsync::shm::detail::ring_bytes_for(2) == gradsync::policy::shm_ring_bytes);
  CHECK(gradsync::shm::detail::ring_bytes_for(1000) == gradsync::policy::shm_min_ring_bytes);
  auto res = spawn(12, [](communicator& c) {
    const int p = c.size();
    for (auto a : {gradsync::algorithm::automatic, gradsync::algorithm::ring}) {
      gradsync::options o;
      o.algo = a;
      std::vector<std::int32_t> v(100'003);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = (c.rank() + 1) * static_cast<int>(i % 5);
      gradsync::allreduce(c, std::span<std::int32_t>(v), gradsync::op::sum{}, o);
      for (std::size_t i = 0; i < v.size(); ++i)
        expect(v[i] == p * (p + 1) / 2 * static_cast<int>(i % 5), "12-rank allreduce");
    }
  }, 90s);
  check_all_ok(res);
}

TEST_CASE("shm: a single rank works alone") {
  auto res = spawn(1, [](communicator& c) {
    std::vector<float> v{1, 2, 3};
    gradsync::allreduce(c, std::span<float>(v));
    expect(v == std::vector<float>{1, 2, 3}, "allreduce on one rank");
  });
  check_all_ok(res);
}

TEST_CASE("shm: a receive nobody matches times out with an error") {
  auto res = spawn(2, [](communicator& c) {
    if (c.rank() == 0) {
      c.set_timeout(300ms);
      std::vector<std::uint8_t> v(4);
      std::string got;
      try {
        c.irecv(wbytes(v), 1, 42).wait();
      } catch (const error& e) {
        got = e.what();
        expect(e.kind() == gradsync::errc::timeout, "timeout kind");
      }
      expect(contains(got, "timed out") && contains(got, "peer 1"), "timeout error: '" + got + "'");
      c.isend({}, 1, 1).wait();
    } else {
      c.irecv({}, 0, 1).wait(); // stays alive until rank 0 timed out
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: a rank killed mid-transfer fails the others with an error naming it") {
  // Rank 2 starts a transfer larger than the ring to rank 0 (at most a ring's
  // worth gets written, as nobody drains it yet) and is SIGKILLed; rank 0
  // then waits on that receive, rank 1 on rank 0.
  const std::size_t n = 8 * gradsync::policy::shm_ring_bytes;
  const auto t0 = std::chrono::steady_clock::now();
  auto res = spawn(3, [&](communicator& c) {
    std::vector<std::uint8_t> v(n, 1);
    if (c.rank() == 2) {
      auto s = c.isend(cbytes(v), 0, 5);
      ::raise(SIGKILL);
    } else if (c.rank() == 0) {
      std::this_thread::sleep_for(100ms);
      c.irecv(wbytes(v), 2, 5).wait();
    } else {
      c.irecv(wbytes(v), 0, 6).wait();
    }
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK(res[2].signal == SIGKILL);
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(res[r].code == 1);
    CHECK(contains(res[r].message, "rank 2"));
    CHECK(contains(res[r].message, "died"));
    CHECK(contains(res[r].message, kind_tag(gradsync::errc::peer_failed)));
  }
  for (auto& o : res) CHECK(segment_gone(o.segment));
}

TEST_CASE("shm: a rank killed inside a collective does not hang the others") {
  for (int p : {2, 4}) {
    CAPTURE(p);
    auto res = spawn(p, [&](communicator& c) {
      std::vector<float> v(1 << 18, 1.0f);
      if (c.rank() == p - 1)
        std::thread([] {
          std::this_thread::sleep_for(30ms);
          ::raise(SIGKILL);
        }).detach();
      for (;;) gradsync::allreduce(c, std::span<float>(v));
    });
    CHECK(res[static_cast<std::size_t>(p - 1)].signal == SIGKILL);
    for (int r = 0; r + 1 < p; ++r) {
      INFO("rank " << r << ": " << res[static_cast<std::size_t>(r)].message);
      CHECK(!res[static_cast<std::size_t>(r)].hung);
      CHECK(res[static_cast<std::size_t>(r)].code == 1);
      CHECK(contains(res[static_cast<std::size_t>(r)].message, "rank " + std::to_string(p - 1)));
    }
    for (auto& o : res) CHECK(segment_gone(o.segment));
  }
}

TEST_CASE("shm: a rank that leaves early fails a peer waiting for it") {
  auto res = spawn(2, [](communicator& c) {
    if (c.rank() == 1) return; // leaves without sending
    std::vector<std::uint8_t> v(16);
    c.irecv(wbytes(v), 1, 1).wait();
  });
  INFO("rank 0: " << res[0].message);
  CHECK(res[1].code == 0);
  CHECK(res[0].code == 1);
  CHECK(contains(res[0].message, "rank 1 left")); // not "died": it left first, then exited
  CHECK(contains(res[0].message, kind_tag(gradsync::errc::peer_failed)));
}

TEST_CASE("shm: messages sent just before a peer leaves are still delivered") {
  auto res = spawn(2, [](communicator& c) {
    const auto v = pattern(3 * gradsync::policy::shm_ring_bytes, 1, 1);
    if (c.rank() == 1) {
      c.isend(cbytes(v), 0, 1).wait();
      return;
    }
    std::this_thread::sleep_for(50ms);
    std::vector<std::uint8_t> in(v.size());
    c.irecv(wbytes(in), 1, 1).wait();
    expect(in == v, "payload");
  });
  check_all_ok(res);
}

TEST_CASE("shm: abandoned requests never touch their buffers afterwards") {
  auto res = spawn(2, [](communicator& c) {
    const std::size_t n = 3 * gradsync::policy::shm_ring_bytes;
    if (c.rank() == 0) {
      {
        std::vector<std::uint8_t> gone(n);
        auto r = c.irecv(wbytes(gone), 1, 1); // withdrawn unmatched
      }
      {
        std::vector<std::uint8_t> gone(n);
        auto r = c.irecv(wbytes(gone), 1, 2);
        c.isend({}, 1, 9).wait();
        std::this_thread::sleep_for(5ms);
        r.test(); // partly received, then abandoned: the rest is discarded
      }
      std::vector<std::uint8_t> in(100);
      c.irecv(wbytes(in), 1, 1).wait(); // tag 1 now matches the next send
      expect(in == pattern(100, 1, 1), "message after withdrawn receive");
    } else {
      const auto big = pattern(n, 1, 2);
      c.irecv({}, 0, 9).wait();
      auto s = c.isend(cbytes(big), 0, 2);
      const auto small = pattern(100, 1, 1);
      c.isend(cbytes(small), 0, 1).wait();
      s.wait();
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: a send abandoned half written still delivers its bytes, from a private copy") {
  const std::size_t n = 3 * gradsync::policy::shm_ring_bytes + 11;
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      {
        auto big = pattern(n, 0, 4);
        auto s = c.isend(cbytes(big), 1, 1);
        s.test(); // about a ring's worth is in shared memory now
        expect(!s.test(), "the send cannot be complete before the receiver reads");
      } // request, then buffer, released mid-message
      std::vector<std::uint8_t> scribble(n, 0xee); // likely reuses the freed memory
      c.irecv({}, 1, 9).wait(); // progresses the rest of the message
      expect(scribble[n / 2] == 0xee, "scribble intact");
    } else {
      std::this_thread::sleep_for(30ms);
      std::vector<std::uint8_t> in(n);
      c.irecv(wbytes(in), 0, 1).wait();
      expect(in == pattern(n, 0, 4), "payload of the abandoned send");
      c.isend({}, 0, 9).wait();
    }
  });
  check_all_ok(res);
}

// ---- collectives over shm, closed-form results --------------------------------

namespace {

template <class T> T val(int r, std::size_t i) { return static_cast<T>((r + 1) * static_cast<int>(i % 7 + 1)); }

void run_collectives(communicator& c, std::size_t count, const gradsync::options& o) {
  using namespace gradsync;
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p);
  const int tri = p * (p + 1) / 2;
  { // allreduce sum, out of place and in place, float and int32
    std::vector<float> in(count), out(count + 3, -1.0f);
    for (std::size_t i = 0; i < count; ++i) in[i] = val<float>(r, i);
    allreduce(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    for (std::size_t i = 0; i < count; ++i)
      expect(out[i] == static_cast<float>(tri * static_cast<int>(i % 7 + 1)), "allreduce sum at " + std::to_string(i));
    for (std::size_t i = count; i < count + 3; ++i) expect(out[i] == -1.0f, "allreduce wrote past the end");
    std::vector<std::int32_t> d(count);
    for (std::size_t i = 0; i < count; ++i) d[i] = val<std::int32_t>(r, i);
    allreduce(c, std::span<std::int32_t>(d), op::sum{}, o);
    for (std::size_t i = 0; i < count; ++i) expect(d[i] == tri * static_cast<int>(i % 7 + 1), "in-place int sum");
  }
  { // max and avg (double)
    std::vector<double> m(count), a(count);
    for (std::size_t i = 0; i < count; ++i) {
      m[i] = static_cast<double>(r) * static_cast<double>(i % 5) - static_cast<double>(i % 3);
      a[i] = static_cast<double>(r + 1) + static_cast<double>(i % 4);
    }
    allreduce(c, std::span<double>(m), op::max{}, o);
    allreduce(c, std::span<double>(a), op::avg{}, o);
    for (std::size_t i = 0; i < count; ++i) {
      expect(m[i] == static_cast<double>(p - 1) * static_cast<double>(i % 5) - static_cast<double>(i % 3), "max");
      expect(a[i] == static_cast<double>(p + 1) / 2 + static_cast<double>(i % 4), "avg");
    }
  }
  { // reduce_scatter: block b of the sum
    const std::size_t n = count / P + 1;
    std::vector<float> in(n * P), out(n);
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = val<float>(r, i);
    reduce_scatter(c, std::span<const float>(in), std::span<float>(out), op::sum{}, o);
    for (std::size_t i = 0; i < n; ++i)
      expect(out[i] == static_cast<float>(tri * static_cast<int>((static_cast<std::size_t>(r) * n + i) % 7 + 1)),
             "reduce_scatter at " + std::to_string(i));
  }
  { // allgather
    const std::size_t n = count / P + 2;
    std::vector<std::int32_t> in(n), out(n * P);
    for (std::size_t i = 0; i < n; ++i) in[i] = r * 100000 + static_cast<int>(i);
    allgather(c, std::span<const std::int32_t>(in), std::span<std::int32_t>(out), o);
    for (std::size_t b = 0; b < P; ++b)
      for (std::size_t i = 0; i < n; ++i)
        expect(out[b * n + i] == static_cast<int>(b) * 100000 + static_cast<int>(i), "allgather");
  }
  for (int root = 0; root < p; ++root) { // broadcast and reduce from every root
    std::vector<std::int32_t> b(count);
    for (std::size_t i = 0; i < count; ++i) b[i] = r == root ? root * 1000 + static_cast<int>(i % 1000) : -7;
    broadcast(c, std::span<std::int32_t>(b), root, o);
    for (std::size_t i = 0; i < count; ++i) expect(b[i] == root * 1000 + static_cast<int>(i % 1000), "broadcast");
    std::vector<float> in(count), out(r == root ? count : 0);
    for (std::size_t i = 0; i < count; ++i) in[i] = val<float>(r, i);
    reduce(c, std::span<const float>(in), std::span<float>(out), root, op::sum{}, o);
    if (r == root)
      for (std::size_t i = 0; i < count; ++i)
        expect(out[i] == static_cast<float>(tri * static_cast<int>(i % 7 + 1)), "reduce");
  }
  barrier(c, o);
}

} // namespace

TEST_CASE("shm: every public collective on 1..4 ranks matches its closed form") {
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [](communicator& c) {
      gradsync::options small_segments;
      small_segments.segment_bytes = 4096; // many pipeline segments
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        run_collectives(c, count, {});
        run_collectives(c, count, small_segments);
      }
      gradsync::options ring; // the message schedules over shm, not the arena
      ring.algo = gradsync::algorithm::ring;
      ring.segment_bytes = 8192;
      run_collectives(c, 1000, ring);
      run_collectives(c, 100'003, ring);
      run_collectives(c, 300'007, {}); // one large, odd count
    }, 90s);
    check_all_ok(res);
  }
}

// ---- algo/shm_direct.hpp: allreduce through the shared arena ------------------

#include <gradsync/algo/shm_direct.hpp>

TEST_CASE("shm_direct: allreduce on 1..4 ranks, every path, in and out of place") {
  using gradsync::algo::shm_direct::allreduce;
  namespace op = gradsync::op;
  const std::size_t half = gradsync::policy::shm_arena_bytes / 2;
  const std::size_t small = gradsync::policy::shm_direct_small_bytes / sizeof(float);
  // empty, one element, the small path and its edge, one round, many rounds, odd
  const std::vector<std::size_t> counts{0, 1, 5, small, small + 1, 3 * half / sizeof(float) + 17};
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [&](communicator& c) {
      const int r = c.rank();
      const int tri = p * (p + 1) / 2;
      for (std::size_t n : counts) {
        const std::string at = " (count " + std::to_string(n) + ")";
        std::vector<float> in(n), out(n + 1, -3.0f);
        for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 11 + 1));
        allreduce(c, in.data(), out.data(), n, op::sum{});
        for (std::size_t i = 0; i < n; ++i)
          expect(out[i] == static_cast<float>(tri * static_cast<int>(i % 11 + 1)), "sum", at);
        expect(out[n] == -3.0f, "wrote past the end", at);
        // in place, integer max and avg
        std::vector<std::int64_t> m(n);
        for (std::size_t i = 0; i < n; ++i) m[i] = (static_cast<std::int64_t>(r) - 1) * static_cast<std::int64_t>(i % 13) + (std::int64_t{1} << 40);
        allreduce(c, m.data(), m.data(), n, op::max{});
        for (std::size_t i = 0; i < n; ++i)
          expect(m[i] == static_cast<std::int64_t>(p - 2) * static_cast<std::int64_t>(i % 13) + (std::int64_t{1} << 40), "max", at);
        std::vector<double> a(n);
        for (std::size_t i = 0; i < n; ++i) a[i] = static_cast<double>(r + 1) + static_cast<double>(i % 3);
        allreduce(c, a.data(), a.data(), n, op::avg{});
        for (std::size_t i = 0; i < n; ++i)
          expect(a[i] == static_cast<double>(p + 1) / 2 + static_cast<double>(i % 3), "avg", at);
        // half precision: every rank holds the bitwise same rounding
        std::vector<gradsync::half> hv(n);
        for (std::size_t i = 0; i < n; ++i) hv[i] = gradsync::half(0.1f * static_cast<float>(r + 1) + 0.01f * static_cast<float>(i % 5));
        allreduce(c, hv.data(), hv.data(), n, op::sum{});
        float want = 0; // the sum in rank order, rounded after each step
        for (std::size_t i = 0; i < std::min<std::size_t>(n, 5); ++i) {
          gradsync::half acc(0.1f + 0.01f * static_cast<float>(i % 5));
          for (int q = 1; q < p; ++q)
            acc = gradsync::half(static_cast<float>(acc) + static_cast<float>(gradsync::half(0.1f * static_cast<float>(q + 1) + 0.01f * static_cast<float>(i % 5))));
          want = static_cast<float>(acc);
          expect(static_cast<float>(hv[i]) == want, "half sum in rank order", at);
        }
      }
    }, 90s);
    check_all_ok(res);
  }
}

TEST_CASE("shm_direct: reduce_scatter and allgather on 1..4 ranks, in and out of place") {
  namespace sd = gradsync::algo::shm_direct;
  const std::size_t big = gradsync::policy::shm_arena_bytes / sizeof(float) + 7; // several rounds
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [&](communicator& c) {
      const int r = c.rank();
      const auto P = static_cast<std::size_t>(p), R = static_cast<std::size_t>(r);
      const int tri = p * (p + 1) / 2;
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1000}, big}) {
        const std::string at = " (block " + std::to_string(n) + ")";
        std::vector<float> in(n * P), out(n);
        for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>((r + 1) * static_cast<int>(i % 9 + 1));
        sd::reduce_scatter(c, in.data(), out.data(), n, gradsync::op::sum{});
        for (std::size_t i = 0; i < n; ++i)
          expect(out[i] == static_cast<float>(tri * static_cast<int>((R * n + i) % 9 + 1)), "reduce_scatter", at);
        // in place: the result lands on block r of the input
        sd::reduce_scatter(c, in.data(), in.data() + R * n, n, gradsync::op::max{});
        for (std::size_t i = 0; i < n; ++i)
          expect(in[R * n + i] == static_cast<float>(p * static_cast<int>((R * n + i) % 9 + 1)), "in-place reduce_scatter", at);
        std::vector<std::int32_t> mine(n), all(n * P, -1);
        for (std::size_t i = 0; i < n; ++i) mine[i] = r * 1'000'000 + static_cast<int>(i);
        sd::allgather(c, mine.data(), all.data(), n);
        for (std::size_t q = 0; q < P; ++q)
          for (std::size_t i = 0; i < n; ++i)
            expect(all[q * n + i] == static_cast<int>(q) * 1'000'000 + static_cast<int>(i), "allgather", at);
        std::fill(all.begin(), all.end(), -1);
        std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(R * n));
        sd::allgather(c, all.data() + R * n, all.data(), n); // in place
        for (std::size_t q = 0; q < P; ++q)
          for (std::size_t i = 0; i < n; ++i)
            expect(all[q * n + i] == static_cast<int>(q) * 1'000'000 + static_cast<int>(i), "in-place allgather", at);
      }
    }, 90s);
    check_all_ok(res);
  }
}

// ---- direct broadcast and reduce (algo/shm_direct_rooted.hpp) ---------------

namespace {

// Rank q's element i of the rooted tests: small integers, exact in every dtype.
template <class T> T rooted_val(int q, std::size_t i) {
  return static_cast<T>(static_cast<int>((i * 7 + static_cast<std::size_t>(q) * 3) % 23) - 11 + q);
}

// Broadcast and reduce with `algo` from every root, checked against
// references computed here element by element from rooted_val.
template <class T> void rooted_direct_case(communicator& c, std::size_t n, const gradsync::options& o) {
  using namespace gradsync;
  const int p = c.size(), r = c.rank();
  const std::string at = " (count " + std::to_string(n) + ", " + std::string(dtype_name(dtype_traits<T>::id)) + ")";
  for (int root = 0; root < p; ++root) {
    const std::string where = at + " root " + std::to_string(root);
    std::vector<T> b(n + 1, T(-99));
    for (std::size_t i = 0; i < n; ++i) b[i] = r == root ? rooted_val<T>(root, i) : T(-5);
    broadcast(c, std::span<T>(b).first(n), root, o);
    for (std::size_t i = 0; i < n; ++i)
      if (b[i] != rooted_val<T>(root, i)) throw std::runtime_error("broadcast wrong at " + std::to_string(i) + where);
    expect(b[n] == T(-99), "broadcast wrote past the end" + where);

    std::vector<T> in(n), out(n + 1, T(-99));
    for (std::size_t i = 0; i < n; ++i) in[i] = rooted_val<T>(r, i);
    reduce(c, std::span<const T>(in), std::span<T>(out).first(r == root ? n : 0), root, op::sum{}, o);
    for (std::size_t i = 0; i < n; ++i) {
      if (r != root) {
        expect(out[i] == T(-99), "reduce touched a non-root's output" + where);
        break;
      }
      T want = rooted_val<T>(0, i);
      for (int q = 1; q < p; ++q) want = static_cast<T>(want + rooted_val<T>(q, i));
      if (out[i] != want) throw std::runtime_error("reduce sum wrong at " + std::to_string(i) + where);
    }
    expect(out[n] == T(-99), "reduce wrote past the end" + where);
    // in place at the root, max
    std::vector<T> m(n);
    for (std::size_t i = 0; i < n; ++i) m[i] = rooted_val<T>(r, i);
    reduce(c, std::span<const T>(m), r == root ? std::span<T>(m) : std::span<T>(), root, op::max{}, o);
    if (r == root)
      for (std::size_t i = 0; i < n; ++i) {
        T want = rooted_val<T>(0, i);
        for (int q = 1; q < p; ++q) want = std::max(want, rooted_val<T>(q, i));
        if (m[i] != want) throw std::runtime_error("in-place reduce max wrong at " + std::to_string(i) + where);
      }
  }
}

} // namespace

TEST_CASE("shm_direct: broadcast and reduce through the arena, 2..4 ranks, every root, f32/i32/f64") {
  const std::size_t small = gradsync::policy::shm_direct_small_bytes;
  auto counts = [&](std::size_t elem) {
    // empty, one, odd, the small path's edge and one past it, several rounds
    // (odd), several MiB (odd)
    return std::vector<std::size_t>{0, 1, 7, small / elem, small / elem + 1,
                                    3 * gradsync::policy::shm_rooted_round_bytes / elem + 17,
                                    (std::size_t{5} << 20) / elem + 3};
  };
  for (int p = 2; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [&](communicator& c) {
      gradsync::options o;
      o.algo = gradsync::algorithm::direct;
      for (std::size_t n : counts(4)) rooted_direct_case<float>(c, n, o);
      for (std::size_t n : counts(4)) rooted_direct_case<std::int32_t>(c, n, o);
      for (std::size_t n : counts(8)) rooted_direct_case<double>(c, n, o);
      // automatic takes the arena here (uncalibrated shm model) at small and large sizes
      for (std::size_t n : {std::size_t{3}, std::size_t{1} << 20}) {
        expect(gradsync::broadcast_algorithm<float>(c, n) == gradsync::algorithm::direct, "auto broadcast is direct");
        expect(gradsync::reduce_algorithm<float>(c, n) == gradsync::algorithm::direct, "auto reduce is direct");
      }
      rooted_direct_case<float>(c, 100'003, {});
    }, 120s);
    check_all_ok(res);
  }
}

TEST_CASE("shm_direct: ranks that disagree on a direct broadcast's root or a reduce's count all fail") {
  for (bool verify : {true, false}) {
    CAPTURE(verify);
    auto res = spawn(2, [&](communicator& c) {
      gradsync::options o;
      o.algo = gradsync::algorithm::direct;
      o.verify = verify ? gradsync::verification::automatic : gradsync::verification::never;
      if (verify) { // the root is only in the fingerprint
        std::vector<float> b(1000, 1.0f);
        gradsync::broadcast(c, std::span<float>(b), c.rank(), o);
      } else {
        std::vector<float> in(1000 + 500 * static_cast<std::size_t>(c.rank())), out(in.size());
        gradsync::reduce(c, std::span<const float>(in), std::span<float>(out), 0, gradsync::op::sum{}, o);
      }
    });
    for (std::size_t r = 0; r < res.size(); ++r) {
      INFO("rank " << r << ": " << res[r].message);
      CHECK(!res[r].hung);
      CHECK(res[r].code == 1);
      CHECK(contains(res[r].message, verify ? "broadcast" : "reduce"));
    }
  }
}

// ---- gossip over the arena (neighbor_allreduce's shared-memory path) --------

#include <gradsync/gossip/neighbor_allreduce.hpp>

#include "../gossip/reference.hpp"

TEST_CASE("shm: neighbor_allreduce through the arena equals the serial replay bitwise, 1..4 ranks") {
  namespace gs = gradsync::gossip;
  namespace ref = gradsync::test::gossip_ref;
  const std::size_t big = 3 * gradsync::policy::shm_arena_bytes / 2 / sizeof(float) + 17; // several rounds
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    std::vector<gs::graph> graphs{gs::one_peer_exponential(p), gs::ring(p), gs::ring(p, gs::weighting::metropolis_hastings),
                                  gs::full(p), gs::star(p), gs::exponential(p)};
    auto res = spawn(p, [&](communicator& c) {
      const int r = c.rank();
      const auto R = static_cast<std::size_t>(r);
      auto check = [&]<class T>(T, const gs::graph& g, std::size_t n) {
        const std::string at = " (" + g.name() + ", " + std::string(gradsync::dtype_name(gradsync::dtype_traits<T>::id)) +
                               ", count " + std::to_string(n) + ")";
        std::vector<std::vector<T>> want(static_cast<std::size_t>(p), std::vector<T>(n));
        for (int q = 0; q < p; ++q)
          for (std::size_t i = 0; i < n; ++i) want[static_cast<std::size_t>(q)][i] = ref::to_elem<T>(ref::input(q, i));
        std::vector<T> x = want[R];
        std::size_t sent = 0, want_sent = 0;
        for (std::uint64_t s = 0; s < 3; ++s) {
          sent += gs::neighbor_allreduce(c, std::span<T>(x), g, s).bytes_sent;
          ref::replay(g.at(s), want);
          want_sent += g.at(s).out(r).size() * n * sizeof(T);
        }
        expect(n == 0 || std::memcmp(x.data(), want[R].data(), n * sizeof(T)) == 0, "bitwise equal to the replay", at);
        expect(sent == want_sent, "bytes sent", at);
      };
      for (const gs::graph& g : graphs)
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{37}}) {
          check(float{}, g, n);
          check(double{}, g, n);
          check(std::int32_t{}, g, n);
          check(gradsync::half{}, g, n);
        }
      check(float{}, graphs[0], big);
      check(double{}, graphs[1], big / 2 + 3);
      // interleaved with an arena allreduce (they share the arena's rounds)
      std::vector<float> v(1000, static_cast<float>(r + 1));
      gradsync::allreduce(c, std::span<float>(v), gradsync::op::sum{});
      expect(v[999] == static_cast<float>(p * (p + 1) / 2), "allreduce after gossip");
      check(float{}, graphs[0], 5000);
    }, 120s);
    check_all_ok(res);
  }
}

TEST_CASE("shm: neighbor_allreduce ranks that disagree on the count all fail") {
  auto res = spawn(3, [](communicator& c) {
    std::vector<float> x(c.rank() == 1 ? 1000 : 999, 1.0f);
    gradsync::gossip::neighbor_allreduce(c, std::span<float>(x), gradsync::gossip::ring(3), 0);
  });
  for (std::size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(res[r].code == 1);
    CHECK((contains(res[r].message, "1000") || contains(res[r].message, "aborted")));
  }
}

TEST_CASE("shm_direct: ranks that disagree on the call all fail with an error naming both") {
  auto res = spawn(3, [](communicator& c) {
    const std::size_t n = c.rank() == 1 ? 1000 : 999;
    std::vector<float> v(n, 1.0f);
    gradsync::algo::shm_direct::allreduce(c, v.data(), v.data(), n, gradsync::op::sum{});
  });
  for (std::size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(res[r].code == 1);
    CHECK((contains(res[r].message, "count 1000") || contains(res[r].message, "aborted")));
  }
}

TEST_CASE("shm_direct: a rank missing from a collective times the caller out and fails the group") {
  auto res = spawn(2, [](communicator& c) {
    std::vector<float> v(100, 1.0f);
    if (c.rank() == 0) {
      c.set_timeout(300ms);
      gradsync::algo::shm_direct::allreduce(c, v.data(), v.data(), v.size(), gradsync::op::sum{});
    } else {
      std::vector<std::uint8_t> never(4);
      c.irecv(wbytes(never), 0, 77).wait(); // rank 0 never sends: must fail, not hang
    }
  });
  CHECK(contains(res[0].message, "timed out"));
  CHECK(contains(res[1].message, "aborted"));
  for (auto& o : res) {
    CHECK(!o.hung);
    CHECK(o.code == 1);
  }
}

TEST_CASE("shm_direct: a rank killed mid-allreduce fails the others") {
  auto res = spawn(3, [](communicator& c) {
    std::vector<float> v(1 << 20, 1.0f);
    if (c.rank() == 1)
      std::thread([] {
        std::this_thread::sleep_for(30ms);
        ::raise(SIGKILL);
      }).detach();
    for (;;) gradsync::algo::shm_direct::allreduce(c, v.data(), v.data(), v.size(), gradsync::op::max{});
  });
  CHECK(res[1].signal == SIGKILL);
  for (std::size_t r : {std::size_t{0}, std::size_t{2}}) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(contains(res[r].message, "rank 1"));
  }
  for (auto& o : res) CHECK(segment_gone(o.segment));
}

// ---- how shm_direct writes the arena: streaming or ordinary stores ---------

namespace {

// The shm communicator with its own store chooser, so that each rank can be
// given a different way (the communicator's own is per rank too, but set
// from the environment alike on all ranks).
struct own_ways {
  static constexpr std::string_view name = "shm";
  communicator& c;
  gradsync::detail::timed_choice tc;
  int rank() const { return c.rank(); }
  int size() const { return c.size(); }
  auto isend(std::span<const std::byte> d, int peer, int tag) { return c.isend(d, peer, tag); }
  auto irecv(std::span<std::byte> d, int peer, int tag) { return c.irecv(d, peer, tag); }
  std::byte* arena(int q) const { return c.arena(q); }
  std::size_t arena_bytes() const { return c.arena_bytes(); }
  void arena_post(int k, std::uint64_t v) { c.arena_post(k, v); }
  void arena_await(int k, std::uint64_t v, const char* op) { c.arena_await(k, v, op); }
  std::uint64_t& arena_epoch() { return c.arena_epoch(); }
  std::atomic<std::uint64_t>& arena_signature(int q, int h) const { return c.arena_signature(q, h); }
  std::byte* arena_note(int q, int h) const { return c.arena_note(q, h); }
  static void arena_copy(std::byte* d, const std::byte* s, std::size_t n) { communicator::arena_copy(d, s, n); }
  gradsync::detail::timed_choice& arena_stores() { return tc; }
  void abort(const std::string& why) { c.abort(why); }
};
static_assert(gradsync::shared_arena<own_ways>);

// Sets an environment variable for the scope (forked ranks inherit it).
struct env_var {
  std::string name;
  env_var(std::string n, const char* v) : name(std::move(n)) { ::setenv(name.c_str(), v, 1); }
  ~env_var() { ::unsetenv(name.c_str()); }
};

} // namespace

TEST_CASE("shm_direct: ranks writing the arena in different ways (streaming, ordinary, measured) agree") {
  namespace sd = gradsync::algo::shm_direct;
  const std::size_t small = gradsync::policy::shm_direct_small_bytes / sizeof(float);
  const std::size_t round = gradsync::policy::shm_allreduce_round_bytes / sizeof(float);
  // below and at the timed minimum, the small path, one round, many rounds,
  // and outputs large enough for streaming stores (the fused pass when the
  // arena is written with streaming stores too)
  const std::size_t streamed_out = gradsync::policy::shm_stream_out_bytes / sizeof(float) + 21;
  const std::vector<std::size_t> counts{1, 63, 64, small - 3, small + 1, round / 2 + 5, 3 * round + 17, streamed_out};
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [&](communicator& base) {
      const int r = base.rank();
      // rank 0 streams, rank 1 stores, ranks 2 and 3 measure (and so switch)
      own_ways c{base, gradsync::detail::timed_choice(r >= 2 ? -1 : r)};
      const auto P = static_cast<std::size_t>(p), R = static_cast<std::size_t>(r);
      const int tri = p * (p + 1) / 2;
      for (std::size_t n : counts)
        for (int rep = 0; rep < (n == streamed_out ? 3 : 12); ++rep) {
          const std::string at = " (count " + std::to_string(n) + ", call " + std::to_string(rep) + ")";
          std::vector<float> v(n);
          for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((r + 1) * static_cast<int>((i + rep) % 7 + 1));
          sd::allreduce(c, v.data(), v.data(), n, gradsync::op::sum{});
          for (std::size_t i = 0; i < n; ++i)
            expect(v[i] == static_cast<float>(tri * static_cast<int>((i + rep) % 7 + 1)), "allreduce", at);
          if (rep % 4 != 0 || n > round) continue;
          std::vector<std::int32_t> in(n * P), out(n), all(n * P, -1);
          for (std::size_t i = 0; i < in.size(); ++i) in[i] = (r + 1) * static_cast<int>(i % 5 + 1);
          sd::reduce_scatter(c, in.data(), out.data(), n, gradsync::op::sum{});
          for (std::size_t i = 0; i < n; ++i)
            expect(out[i] == tri * static_cast<int>((R * n + i) % 5 + 1), "reduce_scatter", at);
          sd::allgather(c, out.data(), all.data(), n);
          for (std::size_t q = 0; q < P; ++q)
            for (std::size_t i = 0; i < n; ++i)
              expect(all[q * n + i] == tri * static_cast<int>((q * n + i) % 5 + 1), "allgather", at);
        }
    }, 120s);
    check_all_ok(res);
  }
}

TEST_CASE("shm: GRADSYNC_SHM_STORES fixes the arena stores; a bad value fails every rank before the group forms") {
  for (const auto& vw : std::vector<std::pair<const char*, int>>{{"stream", 0}, {"plain", 1}}) {
    const char* value = vw.first; // copies: the lambda below captures them (clang 14)
    const int way = vw.second;
    CAPTURE(value);
    env_var e("GRADSYNC_SHM_STORES", value);
    auto res = spawn(2, [&, way = way](communicator& c) {
      for (std::size_t k : {std::size_t{0}, std::size_t{77}}) {
        expect(c.arena_stores().current(k) == way, "current way");
        for (int i = 0; i < 20; ++i) {
          expect(c.arena_stores().pick(k) == way, "picked way");
          c.arena_stores().record(k, 1 - way, 1e-9); // the other way "faster": ignored when fixed
        }
      }
      std::vector<float> v(100000, static_cast<float>(c.rank() + 1));
      gradsync::algo::shm_direct::allreduce(c, v.data(), v.data(), v.size(), gradsync::op::sum{});
      for (float x : v) expect(x == 3.0f, "allreduce");
    });
    check_all_ok(res);
  }
  env_var e("GRADSYNC_SHM_STORES", "fast");
  auto res = spawn(2, [](communicator&) {});
  for (auto& o : res) {
    INFO(o.message);
    CHECK(!o.hung);
    CHECK(o.code == 1);
    CHECK(contains(o.message, "GRADSYNC_SHM_STORES=\"fast\""));
    CHECK(contains(o.message, "shm.communicator"));
  }
}

// ---- capabilities, receives up to a capacity, error kinds --------------------

static_assert(gradsync::upto_receiver<communicator> && gradsync::shared_arena<communicator> &&
              gradsync::abortable<communicator> && gradsync::timed<communicator>);
static_assert(gradsync::detail::subgroup_forwards<communicator>);

TEST_CASE("shm: irecv_upto takes any size up to its capacity, posted before or after the message") {
  const std::size_t ring = gradsync::policy::shm_ring_bytes;
  // 0, inline, one cell over, a frame, more than the ring (streamed and, when
  // it arrives first, drained into a private buffer), and exactly the capacity
  const std::size_t cap = 3 * ring + 7;
  const std::vector<std::size_t> sizes{0, 1, 32, 33, 4095, ring + 5, cap};
  for (bool recv_first : {true, false}) {
    CAPTURE(recv_first);
    auto res = spawn(2, [&](communicator& c) {
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const int tag = static_cast<int>(k);
        if (c.rank() == 0) {
          if (recv_first) c.irecv({}, 1, 100).wait(); // rank 1's receive is posted
          const auto v = pattern(sizes[k], 0, tag);
          auto s = c.isend(cbytes(v), 1, tag);
          s.wait();
          expect(s.received() == 0, "a send receives nothing");
        } else {
          std::vector<std::uint8_t> in(cap + 16, 0xEE);
          auto r = c.irecv_upto(std::as_writable_bytes(std::span(in).first(cap)), 0, tag);
          if (recv_first) c.isend({}, 0, 100).wait();
          else std::this_thread::sleep_for(5ms); // let the message arrive unexpected
          r.wait();
          const std::string what = std::to_string(sizes[k]) + " bytes";
          expect(r.received() == sizes[k], "received() for " + what + ": " + std::to_string(r.received()));
          const auto want = pattern(sizes[k], 0, tag);
          expect(std::equal(want.begin(), want.end(), in.begin()), "payload of " + what);
          expect(std::all_of(in.begin() + static_cast<std::ptrdiff_t>(sizes[k]), in.end(),
                             [](std::uint8_t b) { return b == 0xEE; }),
                 "bytes past a message of " + what + " untouched");
        }
      }
      // to self
      const auto v = pattern(100, c.rank(), 9);
      std::vector<std::uint8_t> in(128);
      auto r = c.irecv_upto(wbytes(in), c.rank(), 50);
      c.isend(cbytes(v), c.rank(), 50).wait();
      r.wait();
      expect(r.received() == 100 && std::equal(v.begin(), v.end(), in.begin()), "up-to receive from self");
    });
    check_all_ok(res);
  }
}

TEST_CASE("shm: a message larger than an irecv_upto's capacity fails both sides with errc::mismatch") {
  const std::size_t ring = gradsync::policy::shm_ring_bytes;
  for (const auto& sc : {std::pair<std::size_t, std::size_t>{65, 64}, {3 * ring, ring}}) {
    const std::size_t sent = sc.first, cap = sc.second; // copies: lambdas capture them (clang 14)
    for (bool recv_first : {true, false}) {
      CAPTURE(sent);
      CAPTURE(recv_first);
      auto res = spawn(2, [&, sent = sent, cap = cap](communicator& c) {
        std::string got;
        gradsync::errc kind = gradsync::errc::internal;
        try {
          if (c.rank() == 0) {
            if (recv_first) c.irecv({}, 1, 9).wait();
            const auto v = pattern(sent, 0, 0);
            c.isend(cbytes(v), 1, 1).wait();
          } else {
            if (!recv_first) std::this_thread::sleep_for(20ms); // it arrives unexpected
            std::vector<std::uint8_t> in(cap);
            auto r = c.irecv_upto(wbytes(in), 0, 1);
            if (recv_first) c.isend({}, 0, 9).wait();
            r.wait();
          }
        } catch (const error& e) {
          got = e.what();
          kind = e.kind();
        }
        expect(kind == gradsync::errc::mismatch, "rank " + std::to_string(c.rank()) + " kind: '" + got + "'");
        expect(contains(got, "sent " + std::to_string(sent) + " bytes") &&
                   contains(got, "receive of up to " + std::to_string(cap) + " bytes"),
               "rank " + std::to_string(c.rank()) + " error names both sizes: '" + got + "'");
        exchange_after_mismatch(c);
      });
      check_all_ok(res);
    }
  }
}

TEST_CASE("shm: exact and up-to receives on one tag match in posting order") {
  // Rank 1 alternates exact and up-to receives on one tag; half the messages
  // are sent before their receives are posted, half after.
  const std::size_t big = 2 * gradsync::policy::shm_ring_bytes + 13;
  const std::vector<std::size_t> sizes{5, 0, big, 40, big, 1, 77, 0};
  auto res = spawn(2, [&](communicator& c) {
    if (c.rank() == 0) {
      std::vector<std::vector<std::uint8_t>> msgs;
      std::vector<gradsync::shm::request> reqs;
      for (std::size_t k = 0; k < sizes.size(); ++k) msgs.push_back(pattern(sizes[k], 0, static_cast<int>(k)));
      for (std::size_t k = 0; k < sizes.size() / 2; ++k) reqs.push_back(c.isend(cbytes(msgs[k]), 1, 3));
      c.irecv({}, 1, 100).wait(); // rank 1 posted all its receives
      for (std::size_t k = sizes.size() / 2; k < sizes.size(); ++k) reqs.push_back(c.isend(cbytes(msgs[k]), 1, 3));
      for (auto& r : reqs) r.wait();
    } else {
      std::this_thread::sleep_for(20ms); // the first half arrives unexpected
      std::vector<std::vector<std::uint8_t>> in;
      std::vector<gradsync::shm::request> reqs;
      for (std::size_t k = 0; k < sizes.size(); ++k) in.emplace_back(k % 2 ? big + 100 : sizes[k]);
      for (std::size_t k = 0; k < sizes.size(); ++k)
        reqs.push_back(k % 2 ? c.irecv_upto(wbytes(in[k]), 0, 3) : c.irecv(wbytes(in[k]), 0, 3));
      c.isend({}, 0, 100).wait();
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        reqs[k].wait();
        const auto want = pattern(sizes[k], 0, static_cast<int>(k));
        expect(reqs[k].received() == sizes[k] && std::equal(want.begin(), want.end(), in[k].begin()),
               "message " + std::to_string(k) + " out of order or corrupt");
      }
    }
  });
  check_all_ok(res);
}

TEST_CASE("shm: abort frees every rank's blocked wait with errc::aborted") {
  const auto t0 = std::chrono::steady_clock::now();
  auto res = spawn(3, [](communicator& c) {
    c.set_timeout(60s); // the abort, not the timeout, must end the waits
    if (c.rank() == 2) {
      std::this_thread::sleep_for(50ms); // let the others block first
      c.abort("test abort");
      return;
    }
    std::vector<std::uint8_t> v(16);
    c.irecv(wbytes(v), 2, 1).wait();
  });
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK(res[2].code == 0);
  for (int r : {0, 1}) {
    INFO("rank " << r << ": " << res[r].message);
    CHECK(!res[r].hung);
    CHECK(res[r].code == 1);
    CHECK(contains(res[r].message, "rank 2 aborted: test abort"));
    CHECK(contains(res[r].message, kind_tag(gradsync::errc::aborted)));
  }
}

TEST_CASE("shm: without a calibrated selector, automatic allreduces through the arena at every size") {
  // The shared-memory default model (policy::shm_model_*). With the in-process
  // defaults instead, automatic ran the ring from 1 MiB up, 2-3x slower here.
  for (int p : {2, 3, 4}) {
    INFO(p << " ranks");
    auto res = spawn(p, [](communicator& c) {
      for (std::size_t n : {std::size_t{2}, std::size_t{1} << 10, std::size_t{1} << 18, std::size_t{1} << 22,
                            std::size_t{1} << 24}) {
        const auto a = gradsync::allreduce_algorithm<float>(c, n);
        expect(a == gradsync::algorithm::direct,
               std::to_string(n) + " floats: " + std::string(gradsync::algorithm_name(a)) + ", not direct");
      }
      std::vector<float> x(1 << 20, 1.0f); // and the call itself runs it
      gradsync::allreduce(c, std::span(x), gradsync::op::sum{});
      expect(x.front() == static_cast<float>(c.size()) && x.back() == static_cast<float>(c.size()), "the sum");
    });
    check_all_ok(res);
  }
}

TEST_CASE("shm: GRADSYNC_TIMELINE writes one trace per rank process (.rank<r>), each with its calls and phases") {
  constexpr int p = 3;
  char tmpl[] = "/tmp/gradsync-shm-trace-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path dir = tmpl, file = dir / "t.json";
  ::setenv("GRADSYNC_TIMELINE", file.c_str(), 1); // inherited by the forked ranks
  auto res = spawn(p, [](communicator& c) {
    expect(c.trace() != nullptr && c.trace()->pid() == c.rank(), "a timeline with pid = rank");
    std::vector<float> x(300, 1.0f);
    gradsync::allreduce(c, std::span(x), gradsync::op::sum{}, {.algo = gradsync::algorithm::ring});
    expect(x[299] == 3.0f, "the sum");
    // The direct schedule's rounds: staging, the share's reduction, copying out, arena waits.
    std::vector<float> y(1 << 18, static_cast<float>(c.rank()));
    gradsync::allreduce(c, std::span(y), gradsync::op::sum{}, {.algo = gradsync::algorithm::direct});
    expect(y.front() == 3.0f && y.back() == 3.0f, "the direct sum");
    // direct reduce-scatter and allgather through the arena
    std::vector<float> in(3 * 1000, 2.0f), out(1000);
    gradsync::reduce_scatter(c, std::span<const float>(in), std::span(out), gradsync::op::sum{},
                             {.algo = gradsync::algorithm::direct});
    expect(out.front() == 6.0f && out.back() == 6.0f, "the direct reduce_scatter");
    std::vector<float> all(3 * 1000);
    gradsync::allgather(c, std::span<const float>(out), std::span(all), {.algo = gradsync::algorithm::direct});
    expect(all.front() == 6.0f && all.back() == 6.0f, "the direct allgather");
  });
  ::unsetenv("GRADSYNC_TIMELINE");
  check_all_ok(res);
  for (int r = 0; r < p; ++r) {
    std::ifstream f(dir / ("t.json.rank" + std::to_string(r)));
    const std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    INFO("rank " << r << ": " << s.substr(0, 300));
    CHECK(s.rfind("{\"traceEvents\":[", 0) == 0);
    CHECK(s.size() >= 4);
    CHECK(s.substr(s.size() - 4) == "\n]}\n"); // closed when the communicator went
    CHECK(contains(s, "{\"name\":\"allreduce\",\"cat\":\"call\""));
    CHECK(contains(s, "\"pid\":" + std::to_string(r) + ",\"tid\":0"));
    for (const char* phase : {"\"name\":\"send\"", "\"name\":\"recv\"", "\"name\":\"wait\"", "\"name\":\"reduce\"",
                              "\"name\":\"stage\"", "\"name\":\"copy_out\"", "\"for\":\"shm.arena\""})
      CHECK(contains(s, phase));
    // Each direct call's own phases (the ring's are send/recv/reduce).
    // The 1 MiB allreduce is verified first (automatic from 256 KiB): its
    // own call event, not counted with the four collectives.
    const auto traced = trace_test::calls_of(s);
    INFO("calls: " << trace_test::names_of(traced));
    std::vector<trace_test::traced_call> calls;
    for (const auto& c : traced)
      if (c.name != "verify") calls.push_back(c);
    REQUIRE(calls.size() == 4);
    CHECK(calls[0].name == "allreduce");
    CHECK(calls[0].phases.count("send") == 1);
    const std::pair<std::string, std::set<std::string>> want[] = {
        {"allreduce", {"stage", "reduce", "copy_out", "wait"}},
        {"reduce_scatter", {"stage", "reduce", "wait"}},
        {"allgather", {"stage", "copy_out", "wait"}}};
    for (int k = 0; k < 3; ++k) {
      const auto& got = calls[static_cast<std::size_t>(k) + 1];
      CHECK(got.name == want[k].first);
      for (const auto& ph : want[k].second) {
        INFO(got.name << " has phase " << ph);
        CHECK(got.phases.count(ph) == 1);
      }
      if (k > 0) CHECK(got.phases.count("send") == 0); // through the arena, no messages (too small to verify)
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// ---- alltoall.hpp over shm: eager and rendezvous blocks, every schedule ------

#include <gradsync/alltoall.hpp>

TEST_CASE("shm: alltoall, alltoallv (known and learned) and a plan on 2..4 ranks, eager and rendezvous blocks, "
          "every schedule, direct over several arena rounds") {
  for (int p = 2; p <= 4; ++p) {
    CAPTURE(p);
    auto res = spawn(p, [p](communicator& c) {
      const int r = c.rank();
      auto value = [p](int src, int dst, std::size_t i) {
        return static_cast<int>((static_cast<std::size_t>(src * p + dst) * 7 + i * 3) % 251);
      };
      // 0, 3 elements (eager), 40 000 (160 KB: rendezvous; one arena
      // round) and 600 001 (2.4 MB: direct takes several rounds, the last
      // short) per peer; out of place and in place.
      // (The multi-round size only for the arena's schedules: the message
      // schedules move it as they move 40 000, and the suite also runs
      // under ASan.)
      for (const std::size_t block : {std::size_t{0}, std::size_t{3}, std::size_t{40000}, std::size_t{600001}})
        for (const auto a : {gradsync::algorithm::pairwise, gradsync::algorithm::scattered,
                             gradsync::algorithm::bruck, gradsync::algorithm::direct, gradsync::algorithm::automatic})
          for (const bool in_place : {false, true}) {
            if (block > 40000 && a != gradsync::algorithm::direct && a != gradsync::algorithm::automatic) continue;
            std::vector<int> in(block * static_cast<std::size_t>(p)), out(in.size());
            for (int q = 0; q < p; ++q)
              for (std::size_t i = 0; i < block; ++i) in[static_cast<std::size_t>(q) * block + i] = value(r, q, i);
            gradsync::options o;
            o.algo = a;
            if (in_place) {
              out = in;
              gradsync::alltoall(c, std::span<const int>(out), std::span<int>(out), o);
            } else {
              gradsync::alltoall(c, std::span<const int>(in), std::span<int>(out), o);
            }
            bool ok = true;
            for (int q = 0; q < p; ++q)
              for (std::size_t i = 0; i < block; ++i) ok &= out[static_cast<std::size_t>(q) * block + i] == value(q, r, i);
            if (!ok)
              expect(false, "alltoall",
                     std::string(gradsync::algorithm_name(a)) + " block " + std::to_string(block) +
                         (in_place ? " in place" : ""));
          }
      // Uneven: rank s sends d (s + d) * 5000 elements (0 to 30 000).
      std::vector<std::size_t> sc, rc;
      std::vector<int> in;
      for (int q = 0; q < p; ++q) {
        sc.push_back(static_cast<std::size_t>(r + q) * 5000);
        rc.push_back(static_cast<std::size_t>(q + r) * 5000);
        for (std::size_t i = 0; i < sc.back(); ++i) in.push_back(value(r, q, i));
      }
      std::size_t total = 0;
      for (const auto n : rc) total += n;
      std::vector<int> want;
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < rc[static_cast<std::size_t>(q)]; ++i) want.push_back(value(q, r, i));
      for (const auto a : {gradsync::algorithm::scattered, gradsync::algorithm::direct, gradsync::algorithm::automatic}) {
        const std::string how(gradsync::algorithm_name(a));
        gradsync::options o;
        o.algo = a;
        std::vector<int> out(total), dyn;
        gradsync::alltoallv(c, std::span<const int>(in), sc, std::span<int>(out), rc, o);
        expect(out == want, "alltoallv", how);
        std::vector<std::size_t> learned(static_cast<std::size_t>(p));
        gradsync::alltoallv_dynamic(c, std::span<const int>(in), sc, dyn, std::span<std::size_t>(learned), o);
        expect(dyn == want && learned == rc, "alltoallv_dynamic equals alltoallv", how);
        std::vector<int> fixed(total + 5, -1);
        std::fill(learned.begin(), learned.end(), 0);
        const std::size_t got = gradsync::alltoallv_dynamic(c, std::span<const int>(in), sc, std::span<int>(fixed),
                                                            std::span<std::size_t>(learned), o);
        expect(got == total && learned == rc && std::equal(want.begin(), want.end(), fixed.begin()) &&
                   fixed[total] == -1,
               "alltoallv_dynamic into a span", how);
        const gradsync::exchange_plan plan(c, sc, rc, o);
        std::vector<int> fwd(total), back(in.size());
        plan.run(c, std::span<const int>(in), std::span<int>(fwd));
        plan.run_back(c, std::span<const int>(fwd), std::span<int>(back));
        expect(fwd == want && back == in, "plan forwards and backwards", how);
      }
      // Nothing to move at all still runs (and checks) the call.
      const std::vector<std::size_t> zeros(static_cast<std::size_t>(p), 0);
      std::vector<int> none;
      gradsync::alltoallv(c, std::span<const int>(none), zeros, std::span<int>(none), zeros);
    }, 90s);
    check_all_ok(res);
  }
}

TEST_CASE("shm: direct alltoallv whose counts disagree, or whose learned output is short, fails every rank alike") {
  for (int p = 2; p <= 3; ++p) {
    CAPTURE(p);
    for (const std::size_t elems : {std::size_t{1}, std::size_t{1000}, std::size_t{300000}}) {
      CAPTURE(elems);
      // Rank 1 expects one element more from rank 0 than rank 0 sends.
      auto res = spawn(p, [p, elems](communicator& c) {
        const int r = c.rank();
        std::vector<std::size_t> sc(static_cast<std::size_t>(p), elems), rc = sc;
        if (r == 1) rc[0] += 1;
        std::vector<float> in(elems * static_cast<std::size_t>(p), 1.0f), out(elems * static_cast<std::size_t>(p) + 1);
        gradsync::options o;
        o.algo = gradsync::algorithm::direct;
        o.timeout = 5s;
        try {
          gradsync::alltoallv(c, std::span<const float>(in), sc, std::span<float>(out), rc, o);
          expect(false, "a disagreeing alltoallv returned");
        } catch (const gradsync::error& e) {
          expect(e.kind() == gradsync::errc::mismatch, "kind", e.what());
          const std::string want = "rank 0 sends rank 1 " + std::to_string(elems) + " items but rank 1 expects " +
                                   std::to_string(elems + 1);
          expect(std::string(e.what()).find(want) != std::string::npos, "names the pair", e.what());
        }
      }, 30s);
      check_all_ok(res);
      // The last rank's output holds one element less than it is sent.
      res = spawn(p, [p, elems](communicator& c) {
        const int r = c.rank();
        std::vector<std::size_t> sc(static_cast<std::size_t>(p), elems), learned(static_cast<std::size_t>(p));
        const std::size_t total = elems * static_cast<std::size_t>(p);
        std::vector<float> in(total, 2.0f), out(r == p - 1 ? total - 1 : total);
        gradsync::options o;
        o.timeout = 5s;
        try {
          gradsync::alltoallv_dynamic(c, std::span<const float>(in), sc, std::span<float>(out),
                                      std::span<std::size_t>(learned), o);
          expect(false, "a short output went unnoticed");
        } catch (const gradsync::error& e) {
          expect(e.kind() == gradsync::errc::invalid_argument, "kind", e.what());
          const std::string want = "rank " + std::to_string(p - 1) + " receives " + std::to_string(total) +
                                   " elements but its output holds " + std::to_string(total - 1);
          expect(std::string(e.what()).find(want) != std::string::npos, "names the rank", e.what());
        }
      }, 30s);
      check_all_ok(res);
    }
  }
}
