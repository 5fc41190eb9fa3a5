// tests/gpu: the NCCL transport (transport/nccl.hpp). Exits 77 (skipped)
// without a CUDA device.
//
// One GPU (the default mode, doctest): communicators of one rank,
// bootstrapped over a one-rank inproc world, each on its own non-blocking
// stream:
// - every collective of collectives.hpp (allreduce with automatic, ring,
//   tree and rd; reduce_scatter, allgather, broadcast, reduce) with the CUDA
//   executor on the communicator's stream, on device buffers: at one rank
//   each result is its input, bit for bit (outputs poisoned first);
// - send and receive to self in one group: device, host (staged through
//   device blocks) and mixed ranges, several messages matched in posting
//   order, completion by test(), zero-byte messages, bad peers and tags;
// - four communicators at once, one per thread;
// - native_allreduce / reduce_scatter / allgather / broadcast / reduce for
//   every dtype and operator (identities at one rank);
// - abort: requests posted before it, posts after it and native calls fail
//   with errc::aborted naming the reason; a send and receive of different
//   sizes to self, which NCCL rejects, fails and aborts likewise.
//
// Several processes (GRADSYNC_NCCL_MULTI=1 under mpiexec, in a build with
// -DGRADSYNC_TEST_NCCL_MPI and MPI linked; nothing else runs then): the
// communicator bootstrapped from gradsync::mpi::communicator(MPI_COMM_WORLD),
// rank r on device r % devices, allreduce (sum) with ring, tree and rd, and
// native_allreduce, against closed-form sums; every rank prints its result
// and all exit non-zero when any failed. Correctness only: on one GPU NCCL
// refuses two ranks on one device ("Duplicate GPU detected") unless each
// process claims another host, which also keeps NCCL off its intra-node
// paths (P2P, SHM): NCCL_HOSTID set differently per process and NCCL_NET=
// Socket (NCCL_SOCKET_IFNAME=lo where no other interface is up). With fewer
// devices than ranks the test sets those it finds unset itself
// (NCCL_HOSTID=gradsync-nccl-test-<rank>, NCCL_NET=Socket), so
//   GRADSYNC_NCCL_MULTI=1 mpiexec -n 2 ./test_nccl_gpu
// is enough. Counts 1, 5003 and 2^18 + 3 keep the ring's blocks within
// policy::pipeline_depth segments (see the group completion limit in
// nccl.hpp); GRADSYNC_NCCL_MULTI_LARGE=1 adds 2^22 + 1, beyond it, which
// shows whether NCCL's buffers carry such a call (it fails with errc::timeout
// after 60 s when they do not).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/collectives.hpp>
#include <gradsync/exec/cuda.cuh>
#include <gradsync/transport/inproc.hpp>
#include <gradsync/transport/nccl.hpp>
#if defined(GRADSYNC_TEST_NCCL_MPI)
#include <gradsync/transport/mpi.hpp>
#endif

#include "gpu_test.hpp"

namespace gs = gradsync;

namespace {

using gpu_test::ok;

/// Bytes of device memory, poisoned (0xA5) by fill().
using device_buffer = gpu_test::device_buffer<std::byte>;

/// n bytes that differ per index and seed.
std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 29 + (i >> 8)) & 0xff);
  return v;
}

/// n elements of dtype t (finite, small: quarters in [-2, 2]) as bytes.
std::vector<std::byte> values(gs::dtype t, std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n * gs::dtype_size(t));
  gs::dispatch_dtype(t, [&](auto zero) {
    using T = decltype(zero);
    for (std::size_t i = 0; i < n; ++i) {
      const double d = (static_cast<double>((i * 7 + seed) % 17) - 8.0) * 0.25;
      T x;
      if constexpr (std::is_same_v<T, gs::half> || std::is_same_v<T, gs::bfloat16>) x = T(static_cast<float>(d));
      else x = static_cast<T>(d);
      std::memcpy(v.data() + i * sizeof(T), &x, sizeof(T));
    }
  });
  return v;
}

/// Where two byte vectors first differ ("" when equal).
std::string difference(const std::vector<std::byte>& got, const std::vector<std::byte>& want) {
  if (got.size() != want.size()) return "size " + std::to_string(got.size()) + ", wanted " + std::to_string(want.size());
  const auto m = std::mismatch(got.begin(), got.end(), want.begin());
  if (m.first == got.end()) return "";
  return "byte " + std::to_string(m.first - got.begin()) + " is " + std::to_string(std::to_integer<int>(*m.first)) +
         ", wanted " + std::to_string(std::to_integer<int>(*m.second));
}

/// Runs fn(communicator&, stream) on a fresh one-rank NCCL group
/// bootstrapped over a one-rank inproc world, on a stream of its own.
void one_rank(const std::function<void(gs::nccl::communicator&, cudaStream_t)>& fn) {
  gpu_test::device_stream s;
  gs::inproc::run(1, [&](gs::inproc::communicator& boot) {
    gs::nccl::communicator c(boot, s.s);
    fn(c, s.s);
  });
}

/// The collectives of collectives.hpp on floats at one rank (each result is
/// its input); "" when all are, else what differed first.
std::string collectives_at_one_rank(gs::nccl::communicator& c, cudaStream_t s, std::size_t n) {
  gs::exec::cuda ex(s);
  const auto in = values(gs::dtype::f32, n, 3);
  device_buffer din(n * sizeof(float)), dout(n * sizeof(float));
  din.put(s, in.data());
  const std::span<const float> ins(din.as<float>(), n);
  const std::span<float> outs(dout.as<float>(), n);
  auto check = [&](const char* what) {
    const std::string d = difference(dout.get(s), in);
    return d.empty() ? d : std::string(what) + ": " + d;
  };
  for (const auto a : {gs::algorithm::automatic, gs::algorithm::ring, gs::algorithm::tree, gs::algorithm::rd}) {
    gs::options o;
    o.algo = a;
    dout.fill(s);
    gs::allreduce(c, ex, ins, outs, gs::op::sum{}, o);
    if (auto d = check("allreduce"); !d.empty()) return d + " (" + std::string(gs::algorithm_name(a)) + ")";
  }
  dout.fill(s);
  gs::reduce_scatter(c, ex, ins, outs, gs::op::sum{});
  if (auto d = check("reduce_scatter"); !d.empty()) return d;
  dout.fill(s);
  gs::allgather(c, ex, ins, outs);
  if (auto d = check("allgather"); !d.empty()) return d;
  dout.fill(s);
  gs::reduce(c, ex, ins, outs, 0, gs::op::sum{});
  if (auto d = check("reduce"); !d.empty()) return d;
  dout.put(s, in.data());
  gs::broadcast(c, ex, outs, 0);
  return check("broadcast");
}

/// A send and receive to self of `bytes` in one group; "" when the bytes arrived.
std::string self_message(gs::nccl::communicator& c, cudaStream_t s, std::size_t bytes) {
  const auto want = pattern(bytes, 5);
  device_buffer src(bytes), dst(bytes);
  src.put(s, want.data());
  dst.fill(s);
  auto sr = c.isend(src.span(), 0, 7);
  auto rr = c.irecv(dst.span(), 0, 7);
  sr.wait();
  rr.wait();
  return difference(dst.get(s), want);
}

template <class F> gs::errc kind_thrown(F&& f, std::string* what = nullptr) {
  try {
    f();
  } catch (const gs::error& e) {
    if (what) *what = e.what();
    return e.kind();
  }
  throw std::runtime_error("no gradsync::error was thrown");
}

} // namespace

TEST_CASE("one rank: the collectives on device buffers give their input, bit for bit") {
  one_rank([](gs::nccl::communicator& c, cudaStream_t s) {
    CHECK(c.size() == 1);
    CHECK(c.rank() == 0);
    CHECK(c.stream() == s);
    CHECK(c.handle() != nullptr);
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5003}, (std::size_t{1} << 20) + 7}) {
      INFO("count ", n);
      CHECK(collectives_at_one_rank(c, s, n) == "");
    }
  });
}

TEST_CASE("one rank: sends and receives to self in one group") {
  one_rank([](gs::nccl::communicator& c, cudaStream_t s) {
    SUBCASE("device memory, one message") {
      for (const std::size_t n : {std::size_t{1}, std::size_t{4099}, (std::size_t{8} << 20) + 3}) {
        INFO("bytes ", n);
        CHECK(self_message(c, s, n) == "");
      }
    }
    SUBCASE("several messages match in posting order, whatever their tags") {
      const auto a = pattern(1000, 1), b = pattern(1000, 2);
      device_buffer sa(1000), sb(1000), ra(1000), rb(1000);
      sa.put(s, a.data());
      sb.put(s, b.data());
      ra.fill(s);
      rb.fill(s);
      std::vector<gs::nccl::request> reqs;
      reqs.push_back(c.isend(sa.span(), 0, 1));
      reqs.push_back(c.isend(sb.span(), 0, 2));
      reqs.push_back(c.irecv(ra.span(), 0, 3));
      reqs.push_back(c.irecv(rb.span(), 0, 4));
      for (auto& r : reqs) r.wait();
      CHECK(difference(ra.get(s), a) == "");
      CHECK(difference(rb.get(s), b) == "");
    }
    SUBCASE("test() flushes and completes") {
      const auto a = pattern(70000, 3);
      device_buffer src(a.size()), dst(a.size());
      src.put(s, a.data());
      dst.fill(s);
      auto sr = c.isend(src.span(), 0, 0);
      auto rr = c.irecv(dst.span(), 0, 0);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      bool done = false;
      while (!(done = rr.test()) && std::chrono::steady_clock::now() < until) {
      }
      REQUIRE(done);
      CHECK(sr.test());
      CHECK(difference(dst.get(s), a) == "");
      // Polling left no error behind for the next checked call (exec::cuda's
      // launch check reads cudaGetLastError; cudaErrorNotReady is not one).
      CHECK(cudaGetLastError() == cudaSuccess);
    }
    SUBCASE("host ranges are staged; host and device mix") {
      const auto a = pattern(3000, 4), b = pattern(100, 5);
      std::vector<std::byte> host_in = a, host_out(a.size());
      device_buffer dev_in(b.size()), dev_out(a.size());
      dev_in.put(s, b.data());
      dev_out.fill(s);
      std::vector<std::byte> host_back(b.size());
      auto s1 = c.isend(host_in, 0, 0);                     // host -> host
      auto r1 = c.irecv(host_out, 0, 0);
      auto s2 = c.isend(host_in, 0, 0);                     // host -> device
      auto r2 = c.irecv(dev_out.span(), 0, 0);
      auto s3 = c.isend(std::span<const std::byte>(dev_in.span()), 0, 0); // device -> host
      auto r3 = c.irecv(host_back, 0, 0);
      for (auto* r : {&s1, &r1, &s2, &r2, &s3, &r3}) r->wait();
      CHECK(difference(host_out, a) == "");
      CHECK(difference(dev_out.get(s), a) == "");
      CHECK(difference(host_back, b) == "");
      // Staging blocks are reused by the next groups.
      for (int k = 0; k < 3; ++k) {
        std::fill(host_out.begin(), host_out.end(), std::byte{0});
        auto sk = c.isend(host_in, 0, 0);
        auto rk = c.irecv(host_out, 0, 0);
        rk.wait();
        sk.wait();
        CHECK(difference(host_out, a) == "");
      }
    }
    SUBCASE("zero-byte messages complete at once") {
      auto sr = c.isend({}, 0, 0);
      auto rr = c.irecv({}, 0, 0);
      CHECK(sr.test());
      CHECK(rr.test());
      rr.wait();
      sr.wait();
      CHECK(self_message(c, s, 16) == ""); // nothing was left pending in between
    }
    SUBCASE("peers and tags out of range") {
      std::byte b[4]{};
      CHECK(kind_thrown([&] { (void)c.isend(std::span<const std::byte>(b), 1, 0); }) == gs::errc::invalid_argument);
      CHECK(kind_thrown([&] { (void)c.irecv(std::span<std::byte>(b), -1, 0); }) == gs::errc::invalid_argument);
      CHECK(kind_thrown([&] { (void)c.isend(std::span<const std::byte>(b), 0, -1); }) == gs::errc::invalid_argument);
      CHECK(self_message(c, s, 4) == ""); // the communicator is still usable
    }
  });
}

TEST_CASE("one rank: four communicators at once, one per thread") {
  std::mutex m;
  std::vector<std::string> wrong;
  {
    std::vector<std::jthread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::string d;
        try {
          one_rank([&](gs::nccl::communicator& c, cudaStream_t s) {
            for (int k = 0; k < 3 && d.empty(); ++k) {
              d = collectives_at_one_rank(c, s, 5003 + static_cast<std::size_t>(t));
              if (d.empty()) d = self_message(c, s, 100000 + static_cast<std::size_t>(t));
            }
          });
        } catch (const std::exception& e) {
          d = e.what();
        }
        if (!d.empty()) {
          std::lock_guard g(m);
          wrong.push_back("thread " + std::to_string(t) + ": " + d);
        }
      });
  }
  for (const auto& w : wrong) FAIL_CHECK(w);
  CHECK(wrong.empty());
}

TEST_CASE("one rank: NCCL's own collectives for every dtype and operator") {
  one_rank([](gs::nccl::communicator& c, cudaStream_t s) {
    const std::size_t n = 4099;
    for (const auto t : {gs::dtype::f32, gs::dtype::f64, gs::dtype::f16, gs::dtype::bf16, gs::dtype::i32,
                         gs::dtype::i64}) {
      const auto in = values(t, n, 9);
      device_buffer din(in.size()), dout(in.size());
      din.put(s, in.data());
      for (const auto k : {gs::op_kind::sum, gs::op_kind::prod, gs::op_kind::min, gs::op_kind::max, gs::op_kind::avg}) {
        INFO(gs::dtype_name(t).data(), " ", gs::op_name(k).data());
        dout.fill(s);
        gs::nccl::native_allreduce(c, din.p, dout.p, n, t, k);
        CHECK(difference(dout.get(s), in) == "");
        dout.fill(s);
        gs::nccl::native_reduce_scatter(c, din.p, dout.p, n, t, k);
        CHECK(difference(dout.get(s), in) == "");
        dout.fill(s);
        gs::nccl::native_reduce(c, din.p, dout.p, n, t, k, 0);
        CHECK(difference(dout.get(s), in) == "");
      }
      INFO(gs::dtype_name(t).data());
      dout.fill(s);
      gs::nccl::native_allgather(c, din.p, dout.p, n, t);
      CHECK(difference(dout.get(s), in) == "");
      dout.fill(s);
      gs::nccl::native_broadcast(c, din.p, dout.p, n, t, 0);
      CHECK(difference(dout.get(s), in) == "");
      dout.put(s, in.data());
      gs::nccl::native_allreduce(c, dout.p, dout.p, n, t, gs::op_kind::sum); // in place
      CHECK(difference(dout.get(s), in) == "");
    }
    device_buffer b(64);
    CHECK(kind_thrown([&] { gs::nccl::native_broadcast(c, b.p, b.p, 16, gs::dtype::f32, 1); }) ==
          gs::errc::invalid_argument);
    // Pending messages go first, in the same stream order.
    const auto a = pattern(64, 6);
    device_buffer src(64), dst(64);
    src.put(s, a.data());
    dst.fill(s);
    auto sr = c.isend(src.span(), 0, 0);
    auto rr = c.irecv(dst.span(), 0, 0);
    gs::nccl::native_allreduce(c, b.p, b.p, 16, gs::dtype::f32, gs::op_kind::sum);
    CHECK(rr.test());
    CHECK(sr.test());
    CHECK(difference(dst.get(s), a) == "");
  });
}

TEST_CASE("one rank: abort fails pending and later calls with errc::aborted") {
  one_rank([](gs::nccl::communicator& c, cudaStream_t s) {
    device_buffer src(256), dst(256);
    src.fill(s, 1);
    auto sr = c.isend(src.span(), 0, 0);
    auto rr = c.irecv(dst.span(), 0, 0);
    c.abort("test reason");
    std::string what;
    CHECK(kind_thrown([&] { rr.wait(); }, &what) == gs::errc::aborted);
    CHECK(what.find("aborted") != std::string::npos);
    CHECK(what.find("test reason") != std::string::npos);
    CHECK(what.find("nccl.recv") != std::string::npos);
    CHECK(kind_thrown([&] { (void)sr.test(); }) == gs::errc::aborted);
    CHECK(kind_thrown([&] { (void)c.isend(src.span(), 0, 0); }, &what) == gs::errc::aborted);
    CHECK(what.find("nccl.send") != std::string::npos);
    CHECK(kind_thrown([&] { gs::nccl::native_allreduce(c, src.p, dst.p, 64, gs::dtype::f32, gs::op_kind::sum); }) ==
          gs::errc::aborted);
    CHECK(kind_thrown([&] { (void)c.irecv({}, 0, 0); }) == gs::errc::aborted); // zero bytes too
    CHECK(c.handle() == nullptr);
    c.abort("again"); // a second abort changes nothing
  });
}

TEST_CASE("one rank: a send and receive of different sizes fail and abort") {
  // NCCL rejects a send to self of another size than the receive ("Trying
  // to send ... bytes to self when receiving ..."), at ncclGroupEnd or
  // asynchronously; either way the wait fails naming the call and NCCL's
  // reason, and the communicator is aborted.
  one_rank([](gs::nccl::communicator& c, cudaStream_t) {
    c.set_timeout(std::chrono::seconds(30));
    device_buffer src(8), dst(16);
    auto sr = c.isend(src.span(), 0, 0);
    auto rr = c.irecv(dst.span(), 0, 0);
    std::string what;
    gs::errc k{};
    try {
      rr.wait();
      sr.wait();
      MESSAGE("NCCL accepted a send of 8 bytes to self into a receive of 16: no failure to check");
      return;
    } catch (const gs::error& e) {
      k = e.kind();
      what = e.what();
    }
    CHECK(k != gs::errc::aborted);
    CHECK(what.find("nccl.") != std::string::npos);
    CHECK(kind_thrown([&] { (void)c.isend(src.span(), 0, 0); }) == gs::errc::aborted);
  });
}

#if defined(GRADSYNC_TEST_NCCL_MPI)
namespace {

// The several-process mode (see the file comment); returns the exit status.
int multi_process(int argc, char** argv, int devices) {
  gs::mpi::session mpi(argc, argv);
  gs::mpi::communicator boot(MPI_COMM_WORLD);
  const int r = boot.rank(), p = boot.size();
  if (devices < p) { // one device for several ranks: each process claims a host of its own
    const std::string host = "gradsync-nccl-test-" + std::to_string(r);
    setenv("NCCL_HOSTID", host.c_str(), 0);
    setenv("NCCL_NET", "Socket", 0);
  }
  ok(cudaSetDevice(r % devices), "cudaSetDevice");
  std::vector<std::string> wrong;
  {
    gpu_test::device_stream s;
    gs::nccl::communicator c(boot, s.s);
    c.set_timeout(std::chrono::seconds(60));
    gs::exec::cuda ex(s.s);
    std::vector<std::size_t> counts{1, 5003, (std::size_t{1} << 18) + 3};
    if (const char* e = std::getenv("GRADSYNC_NCCL_MULTI_LARGE"); e && std::string_view(e) == "1")
      counts.push_back((std::size_t{1} << 22) + 1);
    const float ranks_sum = static_cast<float>(p * (p + 1) / 2);
    for (const std::size_t n : counts) {
      std::vector<float> in(n), want(n);
      for (std::size_t i = 0; i < n; ++i) {
        const float v = static_cast<float>(static_cast<int>(i % 13) - 6);
        in[i] = static_cast<float>(r + 1) * v; // sum over ranks: p (p + 1) / 2 * v, exact
        want[i] = ranks_sum * v;
      }
      const std::vector<std::byte> want_bytes(reinterpret_cast<const std::byte*>(want.data()),
                                              reinterpret_cast<const std::byte*>(want.data() + n));
      device_buffer din(n * sizeof(float)), dout(n * sizeof(float));
      din.put(s.s, reinterpret_cast<const std::byte*>(in.data()));
      // Runs one allreduce into dout and records what went wrong.
      auto run = [&](const std::string& what, const std::function<void()>& call) {
        const std::size_t before = wrong.size();
        dout.fill(s.s);
        try {
          call();
          if (auto d = difference(dout.get(s.s), want_bytes); !d.empty()) wrong.push_back(what + ": " + d);
        } catch (const std::exception& e) {
          wrong.push_back(what + ": " + e.what());
        }
        std::printf("[rank %d] %s: %s\n", r, what.c_str(), wrong.size() == before ? "ok" : "FAILED");
        std::fflush(stdout);
      };
      const std::string of = " count " + std::to_string(n);
      for (const auto a : {gs::algorithm::ring, gs::algorithm::tree, gs::algorithm::rd})
        run("allreduce " + std::string(gs::algorithm_name(a)) + of, [&] {
          gs::options o;
          o.algo = a;
          gs::allreduce(c, ex, std::span<const float>(din.as<float>(), n), std::span<float>(dout.as<float>(), n),
                        gs::op::sum{}, o);
        });
      run("native_allreduce" + of,
          [&] { gs::nccl::native_allreduce(c, din.p, dout.p, n, gs::dtype::f32, gs::op_kind::sum); });
    }
  }
  for (const auto& w : wrong) std::printf("[rank %d] FAILED %s\n", r, w.c_str());
  int bad = static_cast<int>(wrong.size());
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (r == 0) std::printf("nccl multi-process (%d ranks, %d device(s)): %s\n", p, devices, bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}

} // namespace
#endif

int main(int argc, char** argv) {
  const int devices = gpu_test::device_count();
  if (devices == 0) return gpu_test::skip_no_device();
  if (const char* m = std::getenv("GRADSYNC_NCCL_MULTI"); m && std::string_view(m) == "1") {
#if defined(GRADSYNC_TEST_NCCL_MPI)
    return multi_process(argc, argv, devices);
#else
    std::printf("GRADSYNC_NCCL_MULTI=1 needs a build with -DGRADSYNC_TEST_NCCL_MPI and MPI linked\n");
    return 1;
#endif
  }
  return gpu_test::run_doctest(argc, argv);
}
