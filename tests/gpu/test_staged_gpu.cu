// tests/gpu: the collectives on device memory through staged<C, cuda_copier>
// (transport/staged.hpp, transport/cuda_staging.cuh) and the CUDA executor
// (exec/cuda.cuh), bitwise against the same collectives on host copies of
// the same inputs over the plain inproc communicator with the host executor
// (the reference: both executors run core/reduce.hpp's per-element math).
// Exits 77 (skipped) without a CUDA device. The CPU analogue, with host
// memory standing in for a device's, is tests/transport/test_staged.cpp.
//
// One GPU; ranks 1-4 are inproc threads, each with its own non-blocking
// stream, staged view and executor on it. Per dtype (f32, f64, f16, bf16) and
// count (0, 1, 5003: odd, no rank count divides it, and 2^20 + 7: many
// segments, an uneven tail):
// - allreduce with automatic, ring, tree, dbtree, rd, rabenseifner and hier
//   (group_size 2), sum / avg / max, out of place (one guard element past the
//   output, left as it was; the input left as it was) and in place; every
//   rank's result also bitwise equal to every other rank's;
// - reduce_scatter ring; allgather ring, rd, bruck; broadcast tree, ring,
//   scatter_allgather from every root; reduce tree, ring to every root (sum).
// Device buffers start as byte copies of the host buffers (outputs poisoned,
// 0xA5 bytes), so the whole buffer is compared, written or not. Inputs are
// quarters in [-2, 2] that differ per rank and index: every partial sum is
// exact in every dtype, so the comparison does not depend on the order of
// the reduction (should automatic choose differently on the two sides, the
// results still agree), while avg's division by the rank count still rounds.
// Also: host (malloc) buffers through the staged view with the host executor
// go unstaged (cuda_copier::is_device false, no staging block taken), and
// with the CUDA executor are refused by name; managed memory is staged and
// gives the host's results.
//
// Rank threads never use doctest: a wrong result is recorded (first few
// descriptions kept) and the ranks go on with the same calls; CUDA failures
// and the library's errors are thrown, inproc::run rethrows the first, and
// the main thread checks both.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/collectives.hpp>
#include <gradsync/exec/cuda.cuh>
#include <gradsync/exec/host.hpp>
#include <gradsync/transport/cuda_staging.cuh>
#include <gradsync/transport/inproc.hpp>
#include <gradsync/transport/staged.hpp>

#include "gpu_test.hpp"

namespace gs = gradsync;

namespace {

using dev_comm = gs::staged<gs::inproc::communicator, gs::cuda_copier>;
static_assert(gs::device_memory<dev_comm>);
static_assert(gs::detail::carries<dev_comm, gs::exec::cuda>);
static_assert(!gs::detail::carries<gs::inproc::communicator, gs::exec::cuda>);

using gpu_test::ok;

/// Wrong results from every rank thread: the first few descriptions and a count.
struct failures {
  std::mutex m;
  std::vector<std::string> first;
  std::size_t count = 0;

  void add(std::string what) {
    std::lock_guard g(m);
    ++count;
    if (first.size() < 12) first.push_back(std::move(what));
  }
  std::string summary() {
    std::lock_guard g(m);
    std::string s = std::to_string(count) + " wrong result(s)";
    for (const std::string& f : first) s += "\n  " + f;
    if (count > first.size()) s += "\n  ...";
    return s;
  }
};

template <class T> inline constexpr bool is_16bit = std::is_same_v<T, gs::half> || std::is_same_v<T, gs::bfloat16>;

template <class T> T of_double(double d) {
  if constexpr (is_16bit<T>) return T(static_cast<float>(d));
  else return static_cast<T>(d);
}
template <class T> double to_double(T v) {
  if constexpr (is_16bit<T>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}
/// "value (bits 0x...)" of one element.
template <class T> std::string show(const T& v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  char buf[64];
  int k = std::snprintf(buf, sizeof buf, "%.9g (bits 0x", to_double(v));
  for (std::size_t i = sizeof(T); i-- > 0 && k > 0 && k < 60;) k += std::snprintf(buf + k, sizeof buf - static_cast<std::size_t>(k), "%02x", b[i]);
  return std::string(buf) + ")";
}

/// Input of rank r at index i: a quarter in [-2, 2], hashed from (r, i) so
/// that a misplaced segment or block shows. Sums over 4 ranks are exact in
/// every dtype here (bf16 included: at most 6 significant bits).
template <class T> T value(int r, std::size_t i) {
  std::uint64_t z = static_cast<std::uint64_t>(i) * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(r) * 0xD1B54A32D192ED03ull;
  z ^= z >> 31;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 29;
  return of_double<T>((static_cast<double>(z % 17) - 8.0) * 0.25);
}
template <class T> std::vector<T> inputs(int r, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = value<T>(r, i);
  return v;
}
/// Every byte 0xA5 (a finite value in each dtype here).
template <class T> T poison() {
  T v;
  std::memset(static_cast<void*>(&v), 0xA5, sizeof v);
  return v;
}

template <class T> const char* tname() { return gs::dtype_name(gs::dtype_traits<T>::id).data(); }

/// One rank's view: the host communicator (reference), the staged view of it
/// and the CUDA executor on this rank's stream.
struct rank_env {
  gs::inproc::communicator& c;
  dev_comm& s;
  gs::exec::cuda& ex;
  cudaStream_t st;
  failures& f;

  std::string at(std::size_t n) const {
    return std::string(" (rank ") + std::to_string(c.rank()) + " of " + std::to_string(c.size()) +
           ", count " + std::to_string(n) + ")";
  }
  /// The device result equals the host's bit for bit (all n elements).
  template <class T>
  bool same(const std::vector<T>& dev, const std::vector<T>& host, std::size_t n, const std::string& what) {
    for (std::size_t i = 0; i < n; ++i)
      if (std::memcmp(&dev[i], &host[i], sizeof(T)) != 0) {
        f.add(what + ": element " + std::to_string(i) + " is " + show(dev[i]) + " on the device, " + show(host[i]) +
              " on the host");
        return false;
      }
    return true;
  }
  /// Every rank's n elements are bitwise those of every other rank (a hash
  /// of each, allgathered over the host communicator).
  template <class T> void agree(const std::vector<T>& mine, std::size_t n, const std::string& what) {
    std::uint64_t h = 1469598103934665603ull; // FNV-1a
    const auto* b = reinterpret_cast<const unsigned char*>(mine.data());
    for (std::size_t i = 0; i < n * sizeof(T); ++i) h = (h ^ b[i]) * 1099511628211ull;
    const auto hv = static_cast<std::int64_t>(h);
    std::vector<std::int64_t> all(static_cast<std::size_t>(c.size()));
    gs::allgather(c, std::span<const std::int64_t>(&hv, 1), std::span(all));
    for (int q = 1; q < c.size(); ++q)
      if (all[static_cast<std::size_t>(q)] != all[0] && c.rank() == 0)
        f.add(what + ": rank " + std::to_string(q) + "'s result differs from rank 0's");
  }
};

const gs::algorithm allreduce_algos[] = {gs::algorithm::automatic, gs::algorithm::ring,  gs::algorithm::tree,
                                         gs::algorithm::dbtree,    gs::algorithm::rd,    gs::algorithm::rabenseifner,
                                         gs::algorithm::hier};

std::string name_of(gs::algorithm a) { return std::string(gs::algorithm_name(a)); }

/// Every collective of the file comment for dtype T and count n, on rank e.
template <class T> void collectives(rank_env& e, std::size_t n) {
  const int p = e.c.size(), r = e.c.rank();
  const auto up = static_cast<std::size_t>(p);
  const std::string at = e.at(n) + " " + tname<T>();
  const std::vector<T> in = inputs<T>(r, n), in_all = inputs<T>(r, n * up);
  const std::vector<T> poisoned(std::max(n * up, n + 1), poison<T>());
  gpu_test::device_buffer<T> da(std::max(n * up, n + 1)), db(std::max(n * up, n + 1));

  for (const gs::algorithm a : allreduce_algos) {
    gs::options o;
    o.algo = a;
    if (a == gs::algorithm::hier) o.group_size = 2;
    std::apply(
        [&](auto... ops) {
          (
              [&](auto op) {
                const std::string name = "allreduce " + name_of(a) + " " + std::string(decltype(op)::name) + at;
                // Out of place, one guard element past the output.
                std::vector<T> want(poisoned.begin(), poisoned.begin() + static_cast<std::ptrdiff_t>(n + 1));
                gs::allreduce(e.c, std::span<const T>(in), std::span<T>(want), op, o);
                gpu_test::upload(e.st, da.p, in.data(), n);
                gpu_test::upload(e.st, db.p, poisoned.data(), n + 1);
                gs::allreduce(e.s, e.ex, std::span<const T>(da.p, n), std::span<T>(db.p, n + 1), op, o);
                const std::vector<T> got = gpu_test::download(e.st, db.p, n + 1);
                e.same(got, want, n, name + " out of place");
                e.same(std::vector<T>(got.begin() + static_cast<std::ptrdiff_t>(n), got.end()),
                       std::vector<T>(1, poison<T>()), 1, name + " out of place: the guard past the output");
                e.same(gpu_test::download(e.st, da.p, n), in, n, name + " out of place: the input");
                e.agree(got, n, name + " out of place");
                // In place.
                std::vector<T> want_in = in;
                gs::allreduce(e.c, std::span<T>(want_in), op, o);
                gpu_test::upload(e.st, da.p, in.data(), n);
                gs::allreduce(e.s, e.ex, std::span<T>(da.p, n), op, o);
                const std::vector<T> got_in = gpu_test::download(e.st, da.p, n);
                e.same(got_in, want_in, n, name + " in place");
                e.agree(got_in, n, name + " in place");
              }(ops),
              ...);
        },
        std::tuple<gs::op::sum, gs::op::avg>{});
  }
  {
    gs::options o;
    o.algo = gs::algorithm::ring;
    std::vector<T> want(poisoned.begin(), poisoned.begin() + static_cast<std::ptrdiff_t>(n));
    gs::reduce_scatter(e.c, std::span<const T>(in_all), std::span<T>(want), gs::op::sum{}, o);
    gpu_test::upload(e.st, da.p, in_all.data(), n * up);
    gpu_test::upload(e.st, db.p, poisoned.data(), n);
    gs::reduce_scatter(e.s, e.ex, std::span<const T>(da.p, n * up), std::span<T>(db.p, n), gs::op::sum{}, o);
    e.same(gpu_test::download(e.st, db.p, n), want, n, "reduce_scatter ring" + at);
  }
  for (const gs::algorithm a : {gs::algorithm::ring, gs::algorithm::rd, gs::algorithm::bruck}) {
    gs::options o;
    o.algo = a;
    std::vector<T> want(poisoned.begin(), poisoned.begin() + static_cast<std::ptrdiff_t>(n * up));
    gs::allgather(e.c, std::span<const T>(in), std::span<T>(want), o);
    gpu_test::upload(e.st, da.p, in.data(), n);
    gpu_test::upload(e.st, db.p, poisoned.data(), n * up);
    gs::allgather(e.s, e.ex, std::span<const T>(da.p, n), std::span<T>(db.p, n * up), o);
    e.same(gpu_test::download(e.st, db.p, n * up), want, n * up, "allgather " + name_of(a) + at);
  }
  for (int root = 0; root < p; ++root) {
    const std::string from = " root " + std::to_string(root);
    for (const gs::algorithm a : {gs::algorithm::tree, gs::algorithm::ring, gs::algorithm::scatter_allgather}) {
      gs::options o;
      o.algo = a;
      std::vector<T> want = r == root ? in : std::vector<T>(poisoned.begin(), poisoned.begin() + static_cast<std::ptrdiff_t>(n));
      const std::vector<T> start = want;
      gs::broadcast(e.c, std::span<T>(want), root, o);
      gpu_test::upload(e.st, da.p, start.data(), n);
      gs::broadcast(e.s, e.ex, std::span<T>(da.p, n), root, o);
      e.same(gpu_test::download(e.st, da.p, n), want, n, "broadcast " + name_of(a) + from + at);
    }
    for (const gs::algorithm a : {gs::algorithm::tree, gs::algorithm::ring}) {
      gs::options o;
      o.algo = a;
      std::vector<T> want(poisoned.begin(), poisoned.begin() + static_cast<std::ptrdiff_t>(n));
      gs::reduce(e.c, std::span<const T>(in), std::span<T>(want), root, gs::op::sum{}, o);
      gpu_test::upload(e.st, da.p, in.data(), n);
      gpu_test::upload(e.st, db.p, poisoned.data(), n);
      gs::reduce(e.s, e.ex, std::span<const T>(da.p, n), std::span<T>(db.p, n), root, gs::op::sum{}, o);
      // Every rank: the root's result, and elsewhere the output as it was.
      e.same(gpu_test::download(e.st, db.p, n), want, n, "reduce " + name_of(a) + from + at);
    }
  }
}

/// Runs body(e) on p inproc rank threads, each on device 0 with its own
/// stream, staged view and CUDA executor; then checks that no rank threw
/// and none recorded a wrong result.
template <class F> void on_ranks(int p, F body) {
  CAPTURE(p);
  failures f;
  CHECK_NOTHROW(gs::inproc::run(p, [&](gs::inproc::communicator& c) {
    ok(cudaSetDevice(0), "cudaSetDevice");
    const gpu_test::device_stream st;
    dev_comm s(c, gs::cuda_copier(st.s));
    gs::exec::cuda ex(st.s);
    rank_env e{c, s, ex, st.s, f};
    body(e);
  }));
  CHECK_MESSAGE(f.count == 0, f.summary());
}

/// Ranks 1-4 (inproc threads) run collectives<T> for every count.
template <class T> void staged_sweep() {
  for (const int p : {1, 2, 3, 4})
    on_ranks(p, [p](rank_env& e) {
      for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{5003}, (std::size_t{1} << 20) + 7})
        collectives<T>(e, n);
      // Device ranges were staged (p > 1): the blocks are idle in the pool now.
      if (p > 1 && e.s.idle_staging_blocks() == 0)
        e.f.add("rank " + std::to_string(e.c.rank()) + " of " + std::to_string(p) + ": no staging block in the pool");
    });
}

// Two dtypes and two operators: staging moves bytes whatever they hold, and
// exec_cuda checks every dtype and operator's kernels bitwise (each more here
// cost ~20 s of the CI build).
TEST_CASE_TEMPLATE("staged collectives on device memory: bitwise equal to the host path", T, float,
                   gradsync::bfloat16) {
  staged_sweep<T>();
}

TEST_CASE("staged with cuda_copier: host buffers go unstaged, managed buffers are staged") {
  for (const int p : {2, 3})
    on_ranks(p, [p](rank_env& e) {
      gs::exec::host hex;
      const int r = e.c.rank();
      const std::string at = e.at(70001);
      const std::size_t n = 70001;
      const std::vector<float> in = inputs<float>(r, n);
      gs::options o;
      o.algo = gs::algorithm::ring;
      o.segment_bytes = 16 << 10; // many messages

      // The copier's view of each kind of memory.
      gpu_test::device_buffer<float> dev(n), managed(n, true);
      float* pinned = nullptr;
      ok(cudaMallocHost(reinterpret_cast<void**>(&pinned), n * sizeof(float)), "cudaMallocHost");
      // malloc'ed, as a caller's plain host buffer would be.
      const std::unique_ptr<float, void (*)(void*)> heap_p(static_cast<float*>(std::malloc(n * sizeof(float))), std::free);
      if (!heap_p) throw std::runtime_error("malloc failed");
      const std::span<float> heap(heap_p.get(), n);
      std::copy(in.begin(), in.end(), heap.begin());
      if (!e.s.copier().is_device(dev.p)) e.f.add("cudaMalloc memory is not device memory to the copier" + at);
      if (!e.s.copier().is_device(managed.p)) e.f.add("managed memory is not device memory to the copier" + at);
      if (e.s.copier().is_device(pinned)) e.f.add("pinned host memory is device memory to the copier" + at);
      if (e.s.copier().is_device(heap.data())) e.f.add("malloc'ed memory is device memory to the copier" + at);
      (void)cudaFreeHost(pinned);
      const cudaError_t sticky = cudaGetLastError(); // an unknown pointer left no error behind
      if (sticky != cudaSuccess) e.f.add(std::string("is_device left an error: ") + cudaGetErrorString(sticky) + at);

      // Host buffers with the host executor through the staged view: sent as
      // they are, no staging block ever taken.
      std::vector<float> want = in;
      gs::allreduce(e.c, std::span<float>(want), gs::op::sum{}, o);
      gs::allreduce(e.s, hex, heap, gs::op::sum{}, o);
      e.same(std::vector<float>(heap.begin(), heap.end()), want, n, "allreduce of a malloc'ed buffer via staged" + at);
      std::vector<float> gathered(n * static_cast<std::size_t>(p)), gwant(gathered.size());
      gs::allgather(e.c, std::span<const float>(in), std::span<float>(gwant), o);
      gs::allgather(e.s, hex, std::span<const float>(in), std::span<float>(gathered), o);
      e.same(gathered, gwant, gwant.size(), "allgather of malloc'ed buffers via staged" + at);
      if (e.s.idle_staging_blocks() != 0)
        e.f.add("host buffers were staged: " + std::to_string(e.s.idle_staging_blocks()) + " block(s) in the pool" + at);
      // The same buffer given to the CUDA executor: an error naming the call
      // and the buffer (exec::cuda::check_memory), before any message.
      std::string refused = "no error";
      try {
        gs::allreduce(e.s, e.ex, heap, gs::op::sum{}, o);
      } catch (const gs::error& err) {
        refused = err.what();
      }
      if (refused.find("allreduce") == std::string::npos || refused.find("host memory") == std::string::npos)
        e.f.add("a malloc'ed buffer given to exec::cuda: \"" + refused + "\"" + at);

      // Managed memory with the CUDA executor: staged, the host's result.
      // The host fills and reads it directly where the device allows that
      // while other ranks' kernels run (concurrentManagedAccess), else
      // through copies on the stream.
      int concurrent = 0;
      ok(cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, 0), "cudaDeviceGetAttribute");
      const auto managed_allreduce = [&](auto op) {
        const std::string name = "allreduce " + std::string(decltype(op)::name) + " of a managed buffer" + at;
        std::vector<float> w = in;
        gs::allreduce(e.c, std::span<float>(w), op, o);
        if (concurrent) std::copy(in.begin(), in.end(), managed.p);
        else gpu_test::upload(e.st, managed.p, in.data(), n);
        gs::allreduce(e.s, e.ex, std::span<float>(managed.p, n), op, o);
        ok(cudaStreamSynchronize(e.st), "cudaStreamSynchronize");
        const std::vector<float> got =
            concurrent ? std::vector<float>(managed.p, managed.p + n) : gpu_test::download(e.st, managed.p, n);
        e.same(got, w, n, name);
        e.agree(got, n, name);
      };
      managed_allreduce(gs::op::sum{});
      managed_allreduce(gs::op::max{});
      if (e.s.idle_staging_blocks() == 0) e.f.add("managed memory was not staged" + at);
    });
}

} // namespace

int main(int argc, char** argv) { return gpu_test::run_doctest_or_skip(argc, argv); }
