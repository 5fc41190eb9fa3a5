// The paths of algo/shm_direct.hpp that bypass the arena: single copy
// (cross-memory attach) and shared buffers (communicator::alloc_shared). The
// process_vm_readv wrapper against a forked child, the group's join-time
// agreement, results of algo/shm_direct.hpp's single-copy path bitwise equal
// to the rank-order reduction computed here, and peers dying mid-call.
#include <doctest/doctest.h>

#include <gradsync/algo/shm_direct.hpp>
#include <gradsync/collectives.hpp>
#include <gradsync/core/cross_memory.hpp>
#include <gradsync/transport/shm.hpp>

#include "spawn.hpp"
#include "trace_calls.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
namespace sd = gradsync::algo::shm_direct;
namespace cma = gradsync::cma;
using gradsync::shm::communicator;
using namespace std::chrono_literals;

static_assert(gradsync::single_copy_arena<communicator>);

// What one forked rank reported: "ok", or "<errc name>|<what()>", or nothing
// when it was killed or hung.
struct outcome {
  int code = -1, signal = 0;
  bool hung = false;
  std::string said;
};

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}
// Per element in hot loops: the message is only assembled on failure.
void expect(bool ok, const char* what, const std::string& where) {
  if (!ok) throw std::runtime_error("expectation failed: " + std::string(what) + where);
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Runs fn(comm) on `p` forked ranks (spawn.hpp) meeting in a fresh
// directory, `env` (rank -> value of GRADSYNC_SHM_SINGLE_COPY, or nullptr) set
// in each child before it joins; kills ranks still running after `limit`.
// `said` is "ok", or "<error kind>|<what>" ("other|..." for other exceptions).
std::vector<outcome> run_ranks(int p, const std::function<void(communicator&)>& fn,
                               const std::function<const char*(int)>& env = nullptr,
                               std::chrono::milliseconds limit = 60s) {
  fs::path dir;
  auto ranks = gradsync::test::spawn(
      p, fn, limit, [&](const fs::path& d) { dir = d; }, /*expect_empty=*/false, [&](int r) {
        if (const char* v = env ? env(r) : nullptr) ::setenv("GRADSYNC_SHM_SINGLE_COPY", v, 1);
      });
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::vector<outcome> res;
  for (const auto& o : ranks) {
    outcome x;
    x.hung = o.hung;
    x.code = o.code;
    x.signal = o.signal;
    const std::string kind = "[kind: ";
    if (o.exited && o.code == 0) x.said = "ok";
    else if (o.message.rfind(kind, 0) == 0 && o.message.find("] ") != std::string::npos)
      x.said = o.message.substr(kind.size(), o.message.find("] ") - kind.size()) + "|" +
               o.message.substr(o.message.find("] ") + 2);
    else x.said = "other|" + o.message;
    res.push_back(std::move(x));
  }
  return res;
}

void check_all_ok(const std::vector<outcome>& res) {
  for (std::size_t r = 0; r < res.size(); ++r) {
    INFO("rank " << r << ": " << res[r].said);
    CHECK(!res[r].hung);
    CHECK(res[r].said == "ok");
  }
}

// A forked child that holds `n` bytes of its own pattern at the address the
// parent passes, until killed (the parent reads them back through the kernel).
struct child {
  pid_t pid = -1;
  explicit child(std::uint8_t* buf, std::size_t n) {
    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    std::fflush(nullptr);
    pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      for (std::size_t i = 0; i < n; ++i) buf[i] = static_cast<std::uint8_t>(i * 7 + 3); // the child's own copy
      [[maybe_unused]] const ssize_t w = ::write(ready[1], "r", 1);
      for (;;) ::pause();
    }
    char c;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    ::close(ready[0]);
    ::close(ready[1]);
  }
  void kill() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    pid = -1;
  }
  ~child() { kill(); }
};

// Whether this machine lets one process read another's memory (as the
// transport's probe should find); the tests that need it warn and stop if not.
bool cma_works() {
  std::uint8_t b[64] = {};
  child ch(b, sizeof b);
  return cma::probe(ch.pid, cma::probe_address());
}

} // namespace

TEST_CASE("cross_memory: reads a child's memory exactly; a gone process or an unmapped range is an error") {
  const std::size_t n = (std::size_t{3} << 20) + 5; // several pages, odd end
  std::vector<std::uint8_t> buf(n, 0);
  // A readable page followed by an unmapped one, in the child too.
  auto* edge = static_cast<std::byte*>(::mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  REQUIRE(edge != MAP_FAILED);
  ::munmap(edge + 4096, 4096);
  child ch(buf.data(), n);
  if (!cma::probe(ch.pid, cma::probe_address())) {
    WARN("process_vm_readv is not permitted here: cross-memory tests skipped");
    return;
  }
  CHECK(!cma::probe(ch.pid, cma::probe_address() + 8)); // another word: not the probe value
  CHECK(!cma::probe(0, cma::probe_address()));
  std::vector<std::uint8_t> got(n, 0);
  for (std::size_t off : {std::size_t{0}, std::size_t{4095}, std::size_t{12345}}) {
    const std::size_t len = n - off - 1;
    std::fill(got.begin(), got.end(), 0);
    REQUIRE(cma::read(ch.pid, got.data(), buf.data() + off, len) == 0);
    bool same = true;
    for (std::size_t i = 0; i < len; ++i) same &= got[i] == static_cast<std::uint8_t>((off + i) * 7 + 3);
    CHECK(same);
    CHECK(got[len] == 0); // nothing past the end
    CHECK(buf[off] == 0); // our own copy untouched
  }
  CHECK(cma::read(ch.pid, got.data(), buf.data(), 0) == 0);
  // An unmapped page: EFAULT, also when the range starts readable (the
  // kernel copies the readable part, then the next call faults).
  CHECK(cma::read(ch.pid, got.data(), edge + 4096, 16) == EFAULT);
  CHECK(cma::read(ch.pid, got.data(), edge + 4000, 200) == EFAULT);
  CHECK(cma::read(ch.pid, got.data(), edge + 4000, 96) == 0);
  ::munmap(edge, 4096);
  CHECK(!cma::gone(ch.pid, reinterpret_cast<std::uintptr_t>(buf.data())));
  const pid_t dead = ch.pid;
  ch.kill();
  CHECK(cma::read(dead, got.data(), buf.data(), 16) == ESRCH);
  CHECK(cma::gone(dead, reinterpret_cast<std::uintptr_t>(buf.data())));
  CHECK(!cma::probe(dead, cma::probe_address()));
  const auto e = cma::read_error(ESRCH, "allreduce", 0, 1, dead);
  CHECK(e.kind() == gradsync::errc::peer_failed);
  CHECK(e.peer() == 1);
  CHECK(contains(e.what(), "rank 1 (pid " + std::to_string(dead) + ")"));
  CHECK(cma::read_error(EPERM, "allreduce", 0, 1, dead).kind() == gradsync::errc::internal);
}

// ---- the group's agreement ---------------------------------------------------

namespace {

// The smallest single-copy call the tests ask for (GRADSYNC_SHM_SINGLE_COPY),
// whatever the policy's default.
constexpr std::size_t test_min = std::size_t{256} << 10;
const std::string test_min_text = std::to_string(test_min);
const char* test_min_env(int) { return test_min_text.c_str(); }

} // namespace

TEST_CASE("shm: single_copy() and single_copy_min_bytes() are what an independent probe and every rank's setting predict") {
  const bool works = cma_works();
  const std::uint64_t policy_min = gradsync::policy::shm_single_copy_min_bytes;
  for (int p : {1, 2, 3}) {
    CAPTURE(p);
    // (a rank alone never reads a peer: the arena path is all it needs)
    auto agreed = [&](std::uint64_t want) { return works && p > 1 ? want : cma::never; };
    auto check = [&](communicator& c, std::uint64_t want) {
      expect(c.single_copy_min_bytes() == agreed(want), "single_copy_min_bytes()");
      expect(c.single_copy() == (agreed(want) != cma::never), "single_copy()");
    };
    check_all_ok(run_ranks(p, [&](communicator& c) { check(c, test_min); }, test_min_env));
    check_all_ok(run_ranks(p, [&](communicator& c) { check(c, policy_min); }, [](int) { return "auto"; }));
    check_all_ok(run_ranks(p, [&](communicator& c) { check(c, cma::never); }, [](int) { return "off"; }));
    // Every rank takes the largest size any rank asked for; one "off" is enough.
    check_all_ok(run_ranks(p, [&](communicator& c) { check(c, p > 1 ? 3 * test_min : test_min); },
                           [](int r) { return r == 1 ? "786432" : test_min_text.c_str(); }));
    check_all_ok(run_ranks(p, [&](communicator& c) { check(c, p > 2 ? cma::never : test_min); },
                           [](int r) { return r == 2 ? "off" : test_min_text.c_str(); }));
  }
  auto res = run_ranks(2, [](communicator&) {}, [](int) { return "12k"; });
  for (auto& o : res) {
    INFO(o.said);
    CHECK(!o.hung);
    CHECK(contains(o.said, "GRADSYNC_SHM_SINGLE_COPY=\"12k\""));
  }
}

// ---- results ------------------------------------------------------------------

namespace {

// Rank q's element i of each test input (irregular, so that a float sum in
// another order would round differently).
float fin(int q, std::size_t i) {
  return static_cast<float>((i * 2654435761u + static_cast<std::size_t>(q) * 40503u) % 100003u) * 1e-3f +
         1.0f / static_cast<float>(q + 3);
}
gradsync::half hin(int q, std::size_t i) { return gradsync::half(fin(q, i) * 1e-2f); }
std::int64_t iin(int q, std::size_t i) {
  return static_cast<std::int64_t>((i * 7919u + static_cast<std::size_t>(q) * 104729u) % 1000003u) - 500000;
}

// True if rank r's arena shows that the last call took the single-copy path
// (its exposed record: this process, these buffers).
bool took_single_copy(communicator& c, const void* in, const void* out) {
  sd::detail::exposed x{};
  std::memcpy(&x, c.arena(c.rank()) + (c.arena_epoch() & 1) * sd::detail::half_bytes(c), sizeof x);
  return x.pid == ::getpid() && x.in == sd::detail::address(in) && x.out == sd::detail::address(out);
}

// Whether a call moving `bytes` (all ranks' data) should take the single-copy path.
bool single_for(const communicator& c, std::size_t bytes) { return c.single_copy() && bytes >= c.single_copy_min_bytes(); }

// Allreduce of `n` elements (in and out of place) against the rank-order
// reduction computed here, for float sum, half sum, int64 max and double avg.
void check_allreduce(communicator& c, std::size_t n) {
  const int p = c.size(), r = c.rank();
  const std::string at = " (count " + std::to_string(n) + ")";
  std::vector<float> f(n), fo(n + 1, -7.0f);
  for (std::size_t i = 0; i < n; ++i) f[i] = fin(r, i);
  sd::allreduce(c, f.data(), fo.data(), n, gradsync::op::sum{});
  expect(took_single_copy(c, f.data(), fo.data()) == single_for(c, n * sizeof(float)), "path taken", at);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = fin(0, i);
    for (int q = 1; q < p; ++q) acc += fin(q, i);
    expect(std::memcmp(&acc, &fo[i], sizeof acc) == 0, "float sum in rank order", at);
  }
  expect(fo[n] == -7.0f, "wrote past the end", at);
  std::vector<gradsync::half> h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = hin(r, i);
  sd::allreduce(c, h.data(), h.data(), n, gradsync::op::sum{});
  expect(took_single_copy(c, h.data(), h.data()) == single_for(c, n * sizeof(gradsync::half)), "half path", at);
  for (std::size_t i = 0; i < n; ++i) {
    gradsync::half acc = hin(0, i);
    for (int q = 1; q < p; ++q) acc = gradsync::half(static_cast<float>(acc) + static_cast<float>(hin(q, i)));
    expect(static_cast<float>(acc) == static_cast<float>(h[i]), "half sum rounded after each step", at);
  }
  std::vector<std::int64_t> m(n);
  for (std::size_t i = 0; i < n; ++i) m[i] = iin(r, i);
  sd::allreduce(c, m.data(), m.data(), n, gradsync::op::max{});
  for (std::size_t i = 0; i < n; ++i) {
    std::int64_t want = iin(0, i);
    for (int q = 1; q < p; ++q) want = std::max(want, iin(q, i));
    expect(m[i] == want, "int64 max", at);
  }
  std::vector<double> d(n), dout(n);
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<double>(fin(r, i)) * 1e-7;
  sd::allreduce(c, d.data(), dout.data(), n, gradsync::op::avg{});
  for (std::size_t i = 0; i < n; ++i) {
    double acc = static_cast<double>(fin(0, i)) * 1e-7;
    for (int q = 1; q < p; ++q) acc += static_cast<double>(fin(q, i)) * 1e-7;
    acc /= p;
    expect(std::memcmp(&acc, &dout[i], sizeof acc) == 0, "double avg", at);
  }
}

// Allgather of rank r's iin(r, i) from `mine` into `all` (mine.size() per
// rank), out of place (then `after`, e.g. a check of the path taken) and in
// place, against the values computed here.
template <class After>
void check_allgather(communicator& c, std::span<std::int64_t> mine, std::span<std::int64_t> all, const std::string& at,
                     After after) {
  const std::size_t n = mine.size(), R = static_cast<std::size_t>(c.rank());
  for (std::size_t i = 0; i < n; ++i) mine[i] = iin(c.rank(), i);
  auto check = [&](const char* what) {
    for (std::size_t q = 0; q < all.size() / std::max<std::size_t>(1, n); ++q)
      for (std::size_t i = 0; i < n; ++i) expect(all[q * n + i] == iin(static_cast<int>(q), i), what, at);
  };
  std::fill(all.begin(), all.end(), -1);
  sd::allgather(c, mine.data(), all.data(), n);
  after();
  check("allgather");
  std::fill(all.begin(), all.end(), -1);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(R * n));
  sd::allgather(c, all.data() + R * n, all.data(), n); // in place
  check("in-place allgather");
}

// Reduce-scatter and allgather of blocks of `n` elements, in and out of place.
void check_scatter_gather(communicator& c, std::size_t n) {
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p), R = static_cast<std::size_t>(r);
  const std::string at = " (block " + std::to_string(n) + ")";
  std::vector<float> in(n * P), out(n);
  for (std::size_t j = 0; j < in.size(); ++j) in[j] = fin(r, j);
  sd::reduce_scatter(c, in.data(), out.data(), n, gradsync::op::sum{});
  expect(took_single_copy(c, in.data(), out.data()) == single_for(c, in.size() * sizeof(float)), "reduce_scatter path", at);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = fin(0, R * n + i);
    for (int q = 1; q < p; ++q) acc += fin(q, R * n + i);
    expect(std::memcmp(&acc, &out[i], sizeof acc) == 0, "reduce_scatter in rank order", at);
  }
  sd::reduce_scatter(c, in.data(), in.data() + R * n, n, gradsync::op::max{}); // in place
  for (std::size_t i = 0; i < n; ++i) {
    float want = fin(0, R * n + i);
    for (int q = 1; q < p; ++q) want = std::max(want, fin(q, R * n + i));
    expect(in[R * n + i] == want, "in-place reduce_scatter", at);
  }
  std::vector<std::int64_t> mine(n), all(n * P);
  check_allgather(c, std::span(mine), std::span(all), at, [&] {
    expect(took_single_copy(c, mine.data(), all.data()) == single_for(c, all.size() * sizeof(std::int64_t)),
           "allgather path", at);
  });
}

} // namespace

TEST_CASE("shm single copy: allreduce, reduce_scatter and allgather equal the rank-order reduction, both paths, on 2..4 ranks") {
  if (!cma_works()) {
    WARN("process_vm_readv is not permitted here: single-copy path not tested");
    return;
  }
  const std::size_t min = test_min / sizeof(float);
  for (const char* mode : {test_min_text.c_str(), "off"}) {
    for (int p = 2; p <= 4; ++p) {
      CAPTURE(mode);
      CAPTURE(p);
      auto res = run_ranks(p, [&](communicator& c) {
        const bool on = c.single_copy();
        expect(on == (std::string(mode) != "off"), "single_copy()");
        // just below the threshold (arena), at it, odd and several shares
        // of scratch, then the arena again: the paths share the counters
        for (std::size_t n : {min - 1, min, 3 * min + 13, std::size_t{1000}}) check_allreduce(c, n);
        const auto P = static_cast<std::size_t>(p);
        for (std::size_t n : {min / P / 2 - 1, min / P - 1, (min + P - 1) / P, min + 5, std::size_t{100}})
          check_scatter_gather(c, n);
      }, [&](int) { return mode; }, 120s);
      check_all_ok(res);
    }
  }
}

TEST_CASE("shm single copy: ranks on different paths (sizes across the threshold) all fail instead of hanging") {
  if (!cma_works()) return;
  const std::size_t min = test_min / sizeof(float);
  auto res = run_ranks(3, [&](communicator& c) {
    std::vector<float> v(min, 1.0f);
    sd::allreduce(c, v.data(), v.data(), c.rank() == 1 ? min - 1 : min, gradsync::op::sum{});
  }, test_min_env);
  for (auto& o : res) {
    INFO(o.said);
    CHECK(!o.hung);
    CHECK(o.code == 1);
    CHECK((contains(o.said, "ranks disagree") || contains(o.said, "aborted")));
  }
}

// ---- peers dying mid-call -------------------------------------------------------

namespace {

// The shm communicator, except that rank `victim` is killed right after it
// first publishes arena counter `at` (so the survivors are then reading from
// it, or waiting for it, at a known step of the call).
struct dies_after : communicator {
  int victim, at;
  dies_after(communicator&& c, int v, int k) : communicator(std::move(c)), victim(v), at(k) {}
  void arena_post(int k, std::uint64_t v) {
    communicator::arena_post(k, v);
    if (k == at && rank() == victim) ::raise(SIGKILL);
  }
};
static_assert(gradsync::single_copy_arena<dies_after>);

} // namespace

TEST_CASE("shm single copy: a rank killed mid-call fails every survivor with peer_failed naming it") {
  if (!cma_works()) return;
  const std::size_t n = (std::size_t{4} << 20) / sizeof(float);
  // copied: survivors then read its `in`; reduced: its `out`.
  for (int at : {int{sd::detail::copied}, int{sd::detail::reduced}})
    for (int p : {2, 3}) {
      CAPTURE(at);
      CAPTURE(p);
      auto res = run_ranks(p, [&](communicator& base) {
        dies_after c(std::move(base), 1, at);
        std::vector<float> v(n, 1.0f);
        try {
          for (int i = 0; i < 3; ++i) sd::allreduce(c, v.data(), v.data(), n, gradsync::op::sum{});
        } catch (...) { // stay a while (an application would go on): peers then blame only rank 1
          std::this_thread::sleep_for(300ms);
          throw;
        }
      }, test_min_env);
      CHECK(res[1].signal == SIGKILL);
      for (int r = 0; r < p; ++r) {
        if (r == 1) continue;
        INFO("rank " << r << ": " << res[static_cast<std::size_t>(r)].said);
        CHECK(!res[static_cast<std::size_t>(r)].hung);
        CHECK(res[static_cast<std::size_t>(r)].said.rfind("peer failed|", 0) == 0);
        CHECK(contains(res[static_cast<std::size_t>(r)].said, "rank 1 (pid"));
      }
    }
}

// ---- shared buffers (communicator::alloc_shared) ----------------------------------

namespace {

// Whether the last call on `c` ran on shared buffers from these ids: its
// arena record holds the ids and offsets this rank exposed.
bool took_shared(communicator& c, const gradsync::shm::shared_buffer& in, const gradsync::shm::shared_buffer& out) {
  sd::detail::exposed_shared x{};
  std::memcpy(&x, c.arena(c.rank()) + (c.arena_epoch() & 1) * sd::detail::half_bytes(c), sizeof x);
  return x.in_id == in.id() && x.out_id == out.id() && x.in_off == 0 && x.out_off == 0;
}

// Allreduce, reduce_scatter and allgather of `n` elements on shared buffers
// (in and out of place) against the rank-order reduction computed here.
void check_shared(communicator& c, std::size_t n) {
  const int p = c.size(), r = c.rank();
  const auto P = static_cast<std::size_t>(p), R = static_cast<std::size_t>(r);
  const std::string at = " (count " + std::to_string(n) + ", ranks " + std::to_string(p) + ")";
  const bool shared = p > 1 && n * sizeof(float) >= gradsync::policy::shm_shared_min_bytes;
  auto ib = c.alloc_shared(n * sizeof(float)), ob = c.alloc_shared((n + 1) * sizeof(float));
  auto f = ib.as<float>(), fo = ob.as<float>();
  for (std::size_t i = 0; i < n; ++i) f[i] = fin(r, i);
  fo[n] = -7.0f;
  sd::allreduce(c, f.data(), fo.data(), n, gradsync::op::sum{});
  if (p > 1) expect(took_shared(c, ib, ob) == shared, "path taken", at);
  for (std::size_t i = 0; i < n; ++i) {
    float acc = fin(0, i);
    for (int q = 1; q < p; ++q) acc += fin(q, i);
    expect(std::memcmp(&acc, &fo[i], sizeof acc) == 0, "float sum in rank order", at);
  }
  expect(fo[n] == -7.0f, "wrote past the end", at);
  sd::allreduce(c, f.data(), f.data(), n, gradsync::op::max{}); // in place
  for (std::size_t i = 0; i < n; ++i) {
    float want = fin(0, i);
    for (int q = 1; q < p; ++q) want = std::max(want, fin(q, i));
    expect(f[i] == want, "in-place float max", at);
  }
  // Off the vector path: half (reduced in float) and outputs not 16-byte aligned.
  auto hb = c.alloc_shared((n + 1) * sizeof(gradsync::half));
  auto h = hb.as<gradsync::half>().subspan(1, n);
  for (std::size_t i = 0; i < n; ++i) h[i] = hin(r, i);
  sd::allreduce(c, h.data(), h.data(), n, gradsync::op::sum{});
  for (std::size_t i = 0; i < n; ++i) {
    gradsync::half acc = hin(0, i);
    for (int q = 1; q < p; ++q) acc = gradsync::half(static_cast<float>(acc) + static_cast<float>(hin(q, i)));
    expect(static_cast<float>(acc) == static_cast<float>(h[i]), "half sum rounded after each step, unaligned", at);
  }
  for (std::size_t i = 0; i < n; ++i) f[i] = fin(r, i);
  sd::allreduce(c, f.data(), fo.data() + 1, n - 1, gradsync::op::sum{}); // output 4 bytes into its buffer
  for (std::size_t i = 0; i + 1 < n; ++i) {
    float acc = fin(0, i);
    for (int q = 1; q < p; ++q) acc += fin(q, i);
    expect(std::memcmp(&acc, &fo[i + 1], sizeof acc) == 0, "float sum into an unaligned output", at);
  }
  auto db = c.alloc_shared(n * sizeof(double));
  auto d = db.as<double>();
  for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<double>(fin(r, i)) * 1e-7;
  sd::allreduce(c, d.data(), d.data(), n, gradsync::op::avg{});
  for (std::size_t i = 0; i < n; ++i) {
    double acc = static_cast<double>(fin(0, i)) * 1e-7;
    for (int q = 1; q < p; ++q) acc += static_cast<double>(fin(q, i)) * 1e-7;
    acc /= p;
    expect(std::memcmp(&acc, &d[i], sizeof acc) == 0, "double avg", at);
  }
  // Blocks of about n / p elements.
  const std::size_t b = std::max<std::size_t>(1, n / P);
  auto sb = c.alloc_shared(b * P * sizeof(float)), rb = c.alloc_shared(b * sizeof(float));
  auto in = sb.as<float>(), out = rb.as<float>();
  for (std::size_t j = 0; j < b * P; ++j) in[j] = fin(r, j);
  sd::reduce_scatter(c, in.data(), out.data(), b, gradsync::op::sum{});
  if (p > 1) expect(took_shared(c, sb, rb) == (p > 1 && b * P * sizeof(float) >= gradsync::policy::shm_shared_min_bytes), "reduce_scatter path", at);
  for (std::size_t i = 0; i < b; ++i) {
    float acc = fin(0, R * b + i);
    for (int q = 1; q < p; ++q) acc += fin(q, R * b + i);
    expect(std::memcmp(&acc, &out[i], sizeof acc) == 0, "reduce_scatter in rank order", at);
  }
  sd::reduce_scatter(c, in.data(), in.data() + R * b, b, gradsync::op::min{}); // in place
  for (std::size_t i = 0; i < b; ++i) {
    float want = fin(0, R * b + i);
    for (int q = 1; q < p; ++q) want = std::min(want, fin(q, R * b + i));
    expect(in[R * b + i] == want, "in-place reduce_scatter", at);
  }
  auto mb = c.alloc_shared(b * sizeof(std::int64_t)), ab = c.alloc_shared(b * P * sizeof(std::int64_t));
  check_allgather(c, mb.as<std::int64_t>(), ab.as<std::int64_t>(), at, [&] {
    if (p > 1) expect(took_shared(c, mb, ab) == (b * P * sizeof(std::int64_t) >= gradsync::policy::shm_shared_min_bytes),
                      "allgather path", at);
  });
}

} // namespace

TEST_CASE("shm shared buffers: every rank sees every peer's part of a buffer from alloc_shared") {
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    check_all_ok(run_ranks(p, [&](communicator& c) {
      const std::size_t n = 10007; // not a page multiple
      auto buf = c.alloc_shared(n);
      expect(buf.bytes().size() == n, "size");
      for (std::size_t i = 0; i < n; ++i) buf.bytes()[i] = static_cast<std::byte>((i * 31 + static_cast<std::size_t>(c.rank()) * 7) & 0xff);
      const auto v = c.find_shared(buf.bytes().data() + 100, n - 100);
      expect(v && v->id == buf.id() && v->offset == 100, "find_shared of an inner range");
      expect(!c.find_shared(buf.bytes().data() + 100, n - 99), "find_shared past the end");
      int x = 0;
      expect(!c.find_shared(&x, sizeof x), "find_shared of private memory");
      float token = 1.0f;
      sd::allreduce(c, &token, &token, 1, gradsync::op::sum{}); // everyone has written
      for (int q = 0; q < c.size(); ++q) {
        const std::byte* theirs = c.shared_at(q, buf.id(), 0, n);
        expect(theirs != nullptr, "peer part mapped");
        for (std::size_t i = 0; i < n; ++i)
          expect(theirs[i] == static_cast<std::byte>((i * 31 + static_cast<std::size_t>(q) * 7) & 0xff), "peer's bytes");
      }
      expect(c.shared_at(0, buf.id(), 1, n) == nullptr, "shared_at past the end");
      expect(c.shared_at(0, buf.id() + 1, 0, 1) == nullptr, "shared_at of an unknown id");
    }));
  }
  // No object is left behind in /dev/shm.
  for (const auto& e : fs::directory_iterator("/dev/shm"))
    CHECK(e.path().filename().string().rfind("gradsync-buf-", 0) != 0);
}

TEST_CASE("shm shared buffers: collectives on them equal the rank-order reduction, on 1..4 ranks, across the threshold") {
  const std::size_t min = gradsync::policy::shm_shared_min_bytes / sizeof(float);
  for (int p = 1; p <= 4; ++p) {
    CAPTURE(p);
    check_all_ok(run_ranks(p, [&](communicator& c) {
      for (std::size_t n : {std::size_t{1}, min - 1, min, min + 13, 3 * min + 7, std::size_t{1} << 20}) check_shared(c, n);
    }, nullptr, 120s));
  }
}

TEST_CASE("shm shared buffers: a rank on private buffers, different sizes, all fail without hanging") {
  const std::size_t n = (std::size_t{1} << 20) / sizeof(float);
  auto res = run_ranks(3, [&](communicator& c) {
    auto buf = c.alloc_shared(n * sizeof(float));
    std::vector<float> priv(n, 1.0f);
    float* v = c.rank() == 1 ? priv.data() : buf.as<float>().data();
    sd::allreduce(c, v, v, n, gradsync::op::sum{});
  });
  for (auto& o : res) {
    INFO(o.said);
    CHECK(!o.hung);
    CHECK(o.code == 1);
    CHECK((contains(o.said, "on shared buffers") || contains(o.said, "aborted")));
  }
  res = run_ranks(3, [&](communicator& c) { auto b = c.alloc_shared(c.rank() == 2 ? 4096 : 8192); });
  for (auto& o : res) {
    INFO(o.said);
    CHECK(!o.hung);
    CHECK(contains(o.said, "mismatch|"));
    CHECK(contains(o.said, "every rank must allocate alike"));
  }
}

TEST_CASE("shm timeline: the single-copy and shared-buffer paths trace their fetches, reductions and copies") {
  constexpr int p = 2;
  const bool cma = cma_works();
  if (!cma) WARN("process_vm_readv is not permitted here: single-copy path not traced");
  char tmpl[] = "/tmp/gradsync-path-trace-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path dir = tmpl, file = dir / "t.json";
  ::setenv("GRADSYNC_TIMELINE", file.c_str(), 1); // inherited by the forked ranks
  const std::size_t n = 2 * test_min / sizeof(float); // above both paths' thresholds
  // unverified: the fingerprint check would add its messages to each call
  const gradsync::options direct{.algo = gradsync::algorithm::direct, .verify = gradsync::verification::never};
  auto res = run_ranks(p, [&](communicator& c) {
    const float r1 = static_cast<float>(c.rank() + 1);
    auto ib = c.alloc_shared(n * sizeof(float)), ob = c.alloc_shared(2 * n * sizeof(float));
    gradsync::barrier(c); // ends the allocations' own events: the collectives below are the trace's last calls
    if (cma) {
      expect(c.single_copy(), "single copy on");
      std::vector<float> x(n, r1), y(n), all(2 * n);
      gradsync::allreduce(c, std::span<const float>(x), std::span(y), gradsync::op::sum{}, direct);
      expect(took_single_copy(c, x.data(), y.data()) && y.front() == 3.0f && y.back() == 3.0f, "single-copy allreduce");
      gradsync::reduce_scatter(c, std::span<const float>(x), std::span(y).first(n / 2), gradsync::op::sum{}, direct);
      expect(y.front() == 3.0f && y[n / 2 - 1] == 3.0f, "single-copy reduce_scatter");
      gradsync::allgather(c, std::span<const float>(x), std::span(all), direct);
      expect(all.front() == 1.0f && all.back() == 2.0f, "single-copy allgather");
    }
    auto in = ib.as<float>(), out = ob.as<float>();
    for (auto& v : in) v = r1;
    gradsync::allreduce(c, std::span<const float>(in), out.first(n), gradsync::op::sum{}, direct);
    expect(took_shared(c, ib, ob) && out[0] == 3.0f && out[n - 1] == 3.0f, "shared allreduce");
    gradsync::reduce_scatter(c, std::span<const float>(in), out.first(n / 2), gradsync::op::sum{}, direct);
    expect(out[0] == 3.0f && out[n / 2 - 1] == 3.0f, "shared reduce_scatter");
    gradsync::allgather(c, std::span<const float>(in), out, direct);
    expect(out[0] == 1.0f && out[2 * n - 1] == 2.0f, "shared allgather");
  }, [](int) { return test_min_text.c_str(); });
  ::unsetenv("GRADSYNC_TIMELINE");
  check_all_ok(res);
  using phases = std::set<std::string>;
  std::vector<std::pair<std::string, phases>> want;
  if (cma)
    want = {{"allreduce", {"stage", "fetch", "reduce", "wait"}},
            {"reduce_scatter", {"stage", "fetch", "reduce", "wait"}},
            {"allgather", {"stage", "fetch", "wait"}}};
  want.insert(want.end(), {{"allreduce", {"stage", "reduce", "wait"}},
                           {"reduce_scatter", {"stage", "reduce", "wait"}},
                           {"allgather", {"stage", "copy_out", "wait"}}});
  for (int r = 0; r < p; ++r) {
    const auto calls = trace_test::calls_of(trace_test::read_all(dir / ("t.json.rank" + std::to_string(r))));
    INFO("rank " << r);
    REQUIRE(calls.size() >= want.size());
    const std::size_t skip = calls.size() - want.size();
    for (std::size_t k = 0; k < want.size(); ++k) {
      const auto& got = calls[skip + k];
      CHECK(got.name == want[k].first);
      for (const auto& ph : want[k].second) {
        INFO(got.name << " (call " << k << ") has phase " << ph);
        CHECK(got.phases.count(ph) == 1);
      }
      CHECK(got.phases.count("send") == 0); // neither path sends a message
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}
