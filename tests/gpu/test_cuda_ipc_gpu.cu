// tests/gpu: the CUDA-IPC transport (transport/cuda_ipc.cuh): the direct
// collectives on device memory, every rank a forked process over a
// shm::communicator (tests/transport/spawn.hpp), all on one GPU (and across
// two GPUs where the machine has them). Exits 77 (skipped) without a CUDA
// device. The parent never calls CUDA (a CUDA context does not survive
// fork): main asks a forked child for the device count.
//
// - allreduce, 2, 3 and 4 ranks: f32 sum / avg / max and f64 sum, counts 0,
//   1, 1001 (no rank count divides it) and 2^22, out of place and in place,
//   and 1001 with every odd rank's buffers one element off 16-byte alignment
//   (the executor's scalar path; the ranks' offsets differ). Inputs are
//   seeded full-precision values in [-1, 1), so the result depends on the
//   order of the reduction: each rank compares bitwise with the host
//   reference of algo/shm_direct.hpp's order (core/reduce.hpp's combine over
//   ranks 0, 1, ..., p-1, then finalize), computed from every rank's inputs.
//   Outputs start poisoned (0xA5 bytes); the element past the output keeps
//   its poison, an out-of-place input is left as it was.
// - reduce_scatter (f32 sum / avg, f64 sum), allgather (f32, f64) and
//   broadcast (every root), counts 0, 1, 1001, 2^20, in and out of place.
// - The mapping cache: 10 calls on the same buffers open each peer
//   allocation once; a sub-range of a mapped allocation opens nothing; new
//   buffers are opened; forget() closes one allocation's mappings,
//   release_mappings() all, and the next call maps again.
// - A count mismatch is errc::mismatch on every rank naming both ranks and
//   counts, after which the communicator fails fast (errc::aborted); a host
//   buffer on one rank is errc::invalid_argument there and
//   errc::peer_failed naming it on the others.
// - As a transport: gradsync::allreduce with the ring schedule and
//   exec::cuda over the staged messages.
// Ranks never use doctest: they throw on a wrong result (the first few
// described), and the parent checks how every rank ended.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/collectives.hpp>
#include <gradsync/core/reduce.hpp>
#include <gradsync/exec/cuda.cuh>
#include <gradsync/transport/cuda_ipc.cuh>

#include "../transport/spawn.hpp"
#include "gpu_test.hpp"

namespace gs = gradsync;

namespace {

int devices = 0; // found by main's probe child

void cu(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

/// Wrong results of one rank: described (the first few), raised at the end.
struct faults {
  std::vector<std::string> seen;
  std::size_t count = 0;
  void add(const std::string& s) {
    if (++count <= 6) seen.push_back(s);
  }
  void check(bool ok, const std::string& s) {
    if (!ok) add(s);
  }
  void raise() const {
    if (count == 0) return;
    std::string m = std::to_string(count) + " wrong result(s):";
    for (const auto& s : seen) m += "\n  " + s;
    throw std::runtime_error(m);
  }
};

/// A rank's CUDA side: its device (0, or rank % devices when `spread`), a
/// non-blocking stream, the communicator over the boot transport.
struct rank_env {
  cudaStream_t s{};
  std::unique_ptr<gs::cuda_ipc::communicator> c;
  rank_env(gs::shm::communicator& boot, bool spread) {
    cu(cudaSetDevice(spread ? boot.rank() % std::max(devices, 1) : 0), "cudaSetDevice");
    cu(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    c = std::make_unique<gs::cuda_ipc::communicator>(boot, s);
  }
  ~rank_env() {
    c.reset();
    cudaStreamDestroy(s);
  }
  rank_env(const rank_env&) = delete;
  rank_env& operator=(const rank_env&) = delete;
};

/// A cudaMalloc allocation; byte-poisoned and carved by the tests.
using dmem = gpu_test::device_buffer<std::byte>;

constexpr unsigned char poison = 0xA5;

/// cudaMemset / cudaMemcpy go on the legacy stream, which the
/// communicator's non-blocking stream does not wait for: settle them.
void settle() { cu(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
void fill_poison(void* p, std::size_t bytes) {
  cu(cudaMemset(p, poison, bytes), "cudaMemset");
  settle();
}
template <class T> void put(T* d, const std::vector<T>& v) {
  if (!v.empty()) cu(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  settle();
}
template <class T> std::vector<T> get(const T* d, std::size_t n) {
  std::vector<T> v(n);
  if (n) cu(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), "download");
  return v;
}

/// Rank r's input of case `seed`: full-precision values in [-1, 1) (exact
/// = false), or quarters in [-2, 2] whose sums are exact in any order.
template <class T> std::vector<T> input(int r, std::size_t n, std::uint64_t seed, bool exact = false) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(r) * 0xD1B54A32D192ED03ull + i;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    v[i] = exact ? static_cast<T>(static_cast<double>(static_cast<int>(z % 17) - 8) / 4)
                 : static_cast<T>(static_cast<double>(z >> 11) * 0x1p-52 - 1.0);
  }
  return v;
}

/// algo/shm_direct.hpp's order: op over ranks 0..p-1 of their inputs (the
/// elements [from, from + n) of each), then avg's division.
template <class T, class Op>
std::vector<T> reference(int p, std::size_t count, std::size_t from, std::size_t n, std::uint64_t seed, Op op,
                         bool exact = false) {
  std::vector<T> acc;
  for (int q = 0; q < p; ++q) {
    const std::vector<T> x = input<T>(q, count, seed, exact);
    if (q == 0) acc.assign(x.begin() + static_cast<std::ptrdiff_t>(from), x.begin() + static_cast<std::ptrdiff_t>(from + n));
    else gs::combine(acc.data(), static_cast<const T*>(acc.data()), x.data() + from, n, op);
  }
  gs::finalize(acc.data(), n, op, p);
  return acc;
}

/// Bitwise equality of got[0, want.size()) with want; the first difference described.
template <class T> void same(faults& f, const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      f.add(what + ": first difference at " + std::to_string(i) + " of " + std::to_string(want.size()) + ": got " +
            std::to_string(static_cast<double>(got[i])) + ", want " + std::to_string(static_cast<double>(want[i])));
      return;
    }
}
/// Whether the element at d still holds the poison.
template <class T> bool poisoned(const T* d) {
  const std::vector<T> g = get(d, 1);
  const auto* b = reinterpret_cast<const unsigned char*>(g.data());
  return std::all_of(b, b + sizeof(T), [](unsigned char c) { return c == poison; });
}

constexpr std::size_t align_up(std::size_t v, std::size_t a) { return (v + a - 1) / a * a; }

/// Each rank's buffers of the matrix cases: one allocation, carved anew per
/// case (so the peers' mappings of it are reused throughout).
struct arena {
  dmem m;
  explicit arena(std::size_t bytes) : m(bytes) {}
  /// Two ranges of n + 1 elements of T (the last one a guard), 256-byte
  /// aligned, the first `skew` elements further on.
  template <class T> std::pair<T*, T*> carve(std::size_t n, std::size_t skew = 0) {
    const std::size_t a = 256 + skew * sizeof(T);
    const std::size_t b = align_up(a + (n + 1) * sizeof(T), 256);
    if (b + (n + 1) * sizeof(T) > m.n) throw std::runtime_error("test arena too small");
    fill_poison(m.p, m.n);
    return {reinterpret_cast<T*>(m.p + a), reinterpret_cast<T*>(m.p + b)};
  }
};

template <class T, class Op>
void allreduce_case(gs::cuda_ipc::communicator& c, arena& ar, std::size_t n, bool in_place, bool skew,
                    std::uint64_t seed, Op op, faults& f) {
  const int p = c.size(), r = c.rank();
  auto [in, out] = ar.carve<T>(n, skew && r % 2 ? 1 : 0);
  if (in_place) out = in;
  const std::vector<T> x = input<T>(r, n, seed);
  put(in, x);
  c.allreduce(static_cast<const T*>(in), out, n, op);
  const std::string what = "allreduce " + std::string(gs::dtype_traits<T>::name) + " " + std::string(Op::name) + " n=" +
                           std::to_string(n) + (in_place ? " in place" : "") + (skew ? " skewed" : "") + " p=" +
                           std::to_string(p) + " rank " + std::to_string(r);
  same(f, get(out, n), reference<T>(p, n, 0, n, seed, op), what);
  f.check(poisoned(out + n), what + ": wrote past the output");
  if (!in_place) same(f, get(in, n), x, what + ": input changed");
}

template <class T, class Op>
void reduce_scatter_case(gs::cuda_ipc::communicator& c, arena& ar, std::size_t block, bool in_place,
                         std::uint64_t seed, Op op, faults& f) {
  const int p = c.size(), r = c.rank();
  const std::size_t all = block * static_cast<std::size_t>(p), mine = block * static_cast<std::size_t>(r);
  auto [in, out] = ar.carve<T>(all);
  if (in_place) out = in + mine;
  const std::vector<T> x = input<T>(r, all, seed);
  put(in, x);
  c.reduce_scatter(static_cast<const T*>(in), out, block, op);
  const std::string what = "reduce_scatter " + std::string(gs::dtype_traits<T>::name) + " " + std::string(Op::name) +
                           " block=" + std::to_string(block) + (in_place ? " in place" : "") + " p=" +
                           std::to_string(p) + " rank " + std::to_string(r);
  same(f, get(out, block), reference<T>(p, all, mine, block, seed, op), what);
  std::vector<T> rest = get(in, all); // all of the input but (in place) its block r
  if (in_place) std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(mine), block, rest.begin() + static_cast<std::ptrdiff_t>(mine));
  else f.check(poisoned(out + block), what + ": wrote past the output");
  same(f, rest, x, what + ": input changed");
}

template <class T>
void allgather_case(gs::cuda_ipc::communicator& c, arena& ar, std::size_t block, bool in_place, std::uint64_t seed,
                    faults& f) {
  const int p = c.size(), r = c.rank();
  const std::size_t all = block * static_cast<std::size_t>(p);
  auto [in, out] = ar.carve<T>(all);
  if (in_place) in = out + block * static_cast<std::size_t>(r);
  put(in, input<T>(r, block, seed));
  c.allgather(static_cast<const T*>(in), out, block);
  std::vector<T> want;
  for (int q = 0; q < p; ++q) {
    const std::vector<T> x = input<T>(q, block, seed);
    want.insert(want.end(), x.begin(), x.end());
  }
  const std::string what = "allgather " + std::string(gs::dtype_traits<T>::name) + " block=" + std::to_string(block) +
                           (in_place ? " in place" : "") + " p=" + std::to_string(p) + " rank " + std::to_string(r);
  same(f, get(out, all), want, what);
  f.check(poisoned(out + all), what + ": wrote past the output");
}

template <class T>
void broadcast_case(gs::cuda_ipc::communicator& c, arena& ar, std::size_t n, int root, std::uint64_t seed, faults& f) {
  const int r = c.rank();
  T* data = ar.carve<T>(n).first;
  const std::vector<T> x = input<T>(root, n, seed);
  if (r == root) put(data, x);
  c.broadcast(data, n, root);
  const std::string what = "broadcast " + std::string(gs::dtype_traits<T>::name) + " n=" + std::to_string(n) +
                           " root " + std::to_string(root) + " rank " + std::to_string(r);
  same(f, get(data, n), x, what);
  f.check(poisoned(data + n), what + ": wrote past the data");
}

/// Every rank ended normally; otherwise what it said.
void all_ok(const std::vector<gs::test::outcome>& res) {
  for (std::size_t r = 0; r < res.size(); ++r)
    CHECK_MESSAGE((res[r].exited && res[r].code == 0 && !res[r].hung), "rank ", r,
                  (res[r].hung ? " hung" : ""), (res[r].signal ? " killed by signal " + std::to_string(res[r].signal) : ""),
                  ": ", res[r].message);
}

/// Runs `fn(comm, faults)` on p forked ranks, each with its rank_env.
template <class F> void ranks(int p, F fn, bool spread = false) {
  all_ok(gs::test::spawn(
      p,
      [&](gs::shm::communicator& boot) {
        rank_env env(boot, spread);
        faults f;
        fn(*env.c, f);
        f.raise();
      },
      std::chrono::seconds(240)));
}

/// call() fails with `kind`, its text holding `part`; else throws.
template <class F> void expect_error(gs::errc kind, const std::string& part, const char* what, F call) {
  try {
    call();
  } catch (const gs::error& e) {
    if (e.kind() != kind || std::string(e.what()).find(part) == std::string::npos)
      throw std::runtime_error(std::string(what) + ": wrong error [" + gs::errc_name(e.kind()) + "] " + e.what());
    return;
  }
  throw std::runtime_error(std::string(what) + ": no error");
}

} // namespace

TEST_CASE("cuda_ipc allreduce: bitwise the host's rank-order reduction, 2-4 ranks, in and out of place") {
  for (int p : {2, 3, 4}) {
    INFO("ranks: ", p);
    ranks(p, [](gs::cuda_ipc::communicator& c, faults& f) {
      arena ar(2 * (((std::size_t{1} << 22) + 1) * sizeof(double) + 1024));
      std::uint64_t seed = 1;
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, std::size_t{1} << 22})
        for (bool in_place : {false, true}) {
          allreduce_case<float>(c, ar, n, in_place, false, ++seed, gs::op::sum{}, f);
          allreduce_case<float>(c, ar, n, in_place, false, ++seed, gs::op::avg{}, f);
          allreduce_case<float>(c, ar, n, in_place, false, ++seed, gs::op::max{}, f);
          allreduce_case<double>(c, ar, n, in_place, false, ++seed, gs::op::sum{}, f);
          if (n == 1001) {
            allreduce_case<float>(c, ar, n, in_place, true, ++seed, gs::op::avg{}, f);
            allreduce_case<double>(c, ar, n, in_place, true, ++seed, gs::op::sum{}, f);
          }
        }
      // One allocation per rank for all of it: mapped once per peer.
      if (c.opened_mappings() != static_cast<std::uint64_t>(c.size() - 1))
        f.add("opened " + std::to_string(c.opened_mappings()) + " mappings, want one per peer");
      c.release_mappings();
    });
  }
}

TEST_CASE("cuda_ipc reduce_scatter, allgather, broadcast") {
  for (int p : {2, 3, 4}) {
    INFO("ranks: ", p);
    ranks(p, [](gs::cuda_ipc::communicator& c, faults& f) {
      const std::size_t big = std::size_t{1} << 20;
      arena ar(2 * ((big * 4 + 1) * sizeof(double) + 1024));
      std::uint64_t seed = 100;
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{1001}, big}) {
        for (bool in_place : {false, true}) {
          reduce_scatter_case<float>(c, ar, n, in_place, ++seed, gs::op::sum{}, f);
          reduce_scatter_case<float>(c, ar, n, in_place, ++seed, gs::op::avg{}, f);
          reduce_scatter_case<double>(c, ar, n, in_place, ++seed, gs::op::sum{}, f);
          allgather_case<float>(c, ar, n, in_place, ++seed, f);
          allgather_case<double>(c, ar, n, in_place, ++seed, f);
        }
        for (int root = 0; root < c.size(); ++root) {
          broadcast_case<float>(c, ar, n, root, ++seed, f);
          broadcast_case<double>(c, ar, n, root, ++seed, f);
        }
      }
      c.release_mappings();
    });
  }
}

TEST_CASE("cuda_ipc mapping cache: reused across calls, new buffers mapped, forget and release close") {
  ranks(3, [](gs::cuda_ipc::communicator& c, faults& f) {
    const int p = c.size(), r = c.rank();
    const auto peers = static_cast<std::uint64_t>(p - 1);
    const std::size_t n = 1001;
    auto expect = [&](std::uint64_t opened, std::size_t cached, const char* when) {
      f.check(c.opened_mappings() == opened && c.cached_mappings() == cached,
              std::string(when) + ": opened " + std::to_string(c.opened_mappings()) + " (want " +
                  std::to_string(opened) + "), cached " + std::to_string(c.cached_mappings()) + " (want " +
                  std::to_string(cached) + ")");
    };
    auto call = [&](float* in, float* out, std::size_t count, std::uint64_t seed) {
      put(in, input<float>(r, count, seed));
      c.allreduce(static_cast<const float*>(in), out, count, gs::op::sum{});
      same(f, get(out, count), reference<float>(p, count, 0, count, seed, gs::op::sum{}),
           "cache call " + std::to_string(seed));
    };
    dmem a_in(n * sizeof(float)), a_out(n * sizeof(float));
    auto* ai = reinterpret_cast<float*>(a_in.p);
    auto* ao = reinterpret_cast<float*>(a_out.p);
    for (std::uint64_t it = 0; it < 10; ++it) {
      call(ai, ao, n, 10 + it);
      expect(2 * peers, 2 * peers, "same buffers");
    }
    call(ai + 4, ao + 4, n - 4, 30); // other ranges of the same allocations
    expect(2 * peers, 2 * peers, "sub-ranges");
    {
      dmem b_in(n * sizeof(float)), b_out(n * sizeof(float));
      call(reinterpret_cast<float*>(b_in.p), reinterpret_cast<float*>(b_out.p), n, 31);
      expect(4 * peers, 4 * peers, "new buffers");
      c.forget(b_in.p);
      expect(4 * peers, 3 * peers, "after forget(b_in)");
      c.forget(b_out.p);
      expect(4 * peers, 2 * peers, "after forget(b_out)");
    } // freed only now
    c.forget(r == 0 ? a_in.p : nullptr); // only rank 0's a_in is forgotten
    expect(4 * peers, r == 0 ? 2 * peers : 2 * peers - 1, "after rank 0's forget(a_in)");
    call(ai, ao, n, 32);
    expect(r == 0 ? 4 * peers : 4 * peers + 1, 2 * peers, "a_in mapped again");
    c.release_mappings();
    expect(c.opened_mappings(), 0, "after release_mappings");
    call(ai, ao, n, 33);
    f.check(c.cached_mappings() == 2 * peers, "mapped again after release_mappings");
    c.release_mappings();
  });
}

TEST_CASE("cuda_ipc errors: count mismatch on every rank, host memory, fail fast after") {
  ranks(3, [](gs::cuda_ipc::communicator& c, faults&) {
    const int r = c.rank();
    dmem m(2048 * sizeof(float));
    auto* d = reinterpret_cast<float*>(m.p);
    const std::size_t n = r == 1 ? 1000 : 1001;
    expect_error(gs::errc::mismatch, "rank 0 calls allreduce of 1001 f32 (sum), rank 1 calls allreduce of 1000 f32 (sum)",
                        "count mismatch", [&] { c.allreduce(static_cast<const float*>(d), d, n, gs::op::sum{}); });
    expect_error(gs::errc::aborted, "failed in an earlier call", "after the mismatch",
                        [&] { c.allreduce(static_cast<const float*>(d), d, 1001, gs::op::sum{}); });
  });
  ranks(2, [](gs::cuda_ipc::communicator& c, faults&) {
    dmem m(64 * sizeof(float));
    std::vector<float> host(64, 1.0f);
    float* in = c.rank() == 1 ? host.data() : reinterpret_cast<float*>(m.p);
    if (c.rank() == 1)
      expect_error(gs::errc::invalid_argument, "host memory", "host input",
                          [&] { c.allreduce(static_cast<const float*>(in), reinterpret_cast<float*>(m.p), 64, gs::op::sum{}); });
    else
      expect_error(gs::errc::peer_failed, "rank 1 cannot take part", "peer's host input",
                          [&] { c.allreduce(static_cast<const float*>(in), reinterpret_cast<float*>(m.p), 64, gs::op::sum{}); });
  });
}

TEST_CASE("cuda_ipc as a transport: the ring schedule over staged messages") {
  ranks(3, [](gs::cuda_ipc::communicator& c, faults& f) {
    const int p = c.size(), r = c.rank();
    const std::size_t n = 100003;
    dmem in(n * sizeof(float)), out(n * sizeof(float));
    auto* di = reinterpret_cast<float*>(in.p);
    auto* dout = reinterpret_cast<float*>(out.p);
    put(di, input<float>(r, n, 7, true));
    gs::exec::cuda ex(c.stream());
    gs::options o;
    o.algo = gs::algorithm::ring;
    gs::allreduce(c, ex, std::span<const float>(di, n), std::span<float>(dout, n), gs::op::sum{}, o);
    cu(cudaStreamSynchronize(c.stream()), "cudaStreamSynchronize");
    same(f, get(dout, n), reference<float>(p, n, 0, n, 7, gs::op::sum{}, true), "ring over cuda_ipc");
    f.check(c.opened_mappings() == 0, "the message path mapped memory");
  });
}

TEST_CASE("cuda_ipc across GPUs (two or more devices)") {
  if (devices < 2) {
    MESSAGE("one device: skipped");
    return;
  }
  ranks(2, [](gs::cuda_ipc::communicator& c, faults& f) {
    arena ar(2 * (((std::size_t{1} << 20) + 1) * sizeof(float) + 1024));
    allreduce_case<float>(c, ar, 1001, false, false, 200, gs::op::avg{}, f);
    allreduce_case<float>(c, ar, std::size_t{1} << 20, true, false, 201, gs::op::sum{}, f);
    allgather_case<float>(c, ar, 1001, false, 202, f);
    c.release_mappings();
  }, true);
}

int main(int argc, char** argv) {
  // The device count from a child: CUDA must not be initialised here
  // before the ranks are forked.
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(std::min(gpu_test::device_count(), 100));
  int st = 0;
  if (pid < 0 || ::waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) == 0)
    return gpu_test::skip_no_device();
  devices = WEXITSTATUS(st);
  return gpu_test::run_doctest(argc, argv);
}
