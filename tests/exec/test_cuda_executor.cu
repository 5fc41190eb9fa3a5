// tests/exec: the CUDA executor (exec/cuda.cuh) bitwise against the host
// executor, which tests/exec/test_host_executor.cpp checks against scalar
// definitions. Exits 77 (skipped) without a CUDA device.
//
// For every dtype x operator and sizes 0, 1, 4097, 2^20 (seeded inputs):
// reduce (separate output, y == a, y == b, and the one-element-per-thread
// path through pointers one element off 16-byte alignment), finish for every
// operator and several rank counts, copy, axpby; outputs are poisoned first,
// and one element past n is checked untouched. Scratch: carved from a
// workspace, rejected when too small or misaligned, owned (device memory,
// usable, freed on the stream), and a failed CUDA call is errc::internal.
// The stream is non-blocking, so every download must follow fence(), and
// every upload or memset is complete (settle()) before the next launch.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/exec/cuda.cuh>
#include <gradsync/exec/host.hpp>

#include "../gpu/gpu_test.hpp"
#include "inputs.hpp"

namespace gs = gradsync;
using exec_test::first_difference;
using exec_test::random_values;

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  REQUIRE_MESSAGE(e == cudaSuccess, what, ": ", cudaGetErrorString(e));
}

/// Owning device buffer of `count` T plus one guard element, poisoned (all
/// bytes 0xA5) so that elements a call should not write show.
template <class T> struct dvec {
  gpu_test::device_buffer<T> mem; // the n elements and the guard
  T* p;
  std::size_t n;
  explicit dvec(std::size_t count) : mem(count + 1), p(mem.p), n(count) {
    cuda_ok(cudaMemset(p, 0xA5, (n + 1) * sizeof(T)), "cudaMemset");
    settle();
  }
  dvec(const std::vector<T>& v) : dvec(v.size()) { upload(v); }
  void upload(const std::vector<T>& v) {
    if (v.empty()) return;
    cuda_ok(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
    settle();
  }
  /// cudaMemset is asynchronous, and cudaMemcpy from pageable memory may
  /// return before its DMA lands; neither is ordered with the executor's
  /// non-blocking stream. Seen on an H200: a reduce read the tail of an
  /// upload's destination stale (first difference at 999680 of 2^20).
  static void settle() { cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  /// The n elements and the guard (call after the executor's fence()).
  std::vector<T> download() const {
    std::vector<T> v(n + 1);
    cuda_ok(cudaMemcpy(v.data(), p, (n + 1) * sizeof(T), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

template <class T> T poison() {
  T v;
  std::memset(static_cast<void*>(&v), 0xA5, sizeof v); // T is trivially copyable
  return v;
}

/// Device result (n elements and the guard) equals the host's n elements
/// bit for bit, the guard still poisoned.
template <class T>
void expect_same(const std::vector<T>& dev, const std::vector<T>& host, std::size_t n,
                 const std::string& what) {
  INFO(what);
  CHECK(first_difference(dev.data(), host.data(), n) == n); // index of the first difference
  const T guard = poison<T>();
  CHECK_MESSAGE(first_difference(&dev[n], &guard, 1) == 1, "element past n written");
}

template <class T> const char* tname() { return gs::dtype_name(gs::dtype_traits<T>::id).data(); }

template <class T, class Op>
void check_reduce(const gs::exec::cuda& dev, std::size_t n, Op op) {
  const gs::exec::host host;
  const std::string what = std::string("reduce<") + tname<T>() + "> " +
                           std::string(Op::name) + " n=" + std::to_string(n);
  const auto a = random_values<T>(n, 1000 + n), b = random_values<T>(n, 2000 + n);
  std::vector<T> want(n);
  host.reduce(want.data(), a.data(), b.data(), n, op);

  dvec<T> da(a), db(b), dy(n);
  dev.reduce(dy.p, da.p, db.p, n, op);
  dev.fence();
  expect_same(dy.download(), want, n, what);

  dev.reduce(da.p, da.p, db.p, n, op); // y == a
  dev.fence();
  expect_same(da.download(), want, n, what + " (y == a)");
  da.upload(a);
  dev.reduce(db.p, da.p, db.p, n, op); // y == b
  dev.fence();
  expect_same(db.download(), want, n, what + " (y == b)");

  if (n > 1 && sizeof(T) < 16) { // one element off 16-byte alignment: the scalar kernel
    db.upload(b);
    dvec<T> dz(n);
    std::vector<T> want1(n - 1);
    host.reduce(want1.data(), a.data() + 1, b.data() + 1, n - 1, op);
    dev.reduce(dz.p + 1, da.p + 1, db.p + 1, n - 1, op);
    dev.fence();
    auto got = dz.download();
    expect_same(std::vector<T>(got.begin() + 1, got.end()), want1, n - 1, what + " (unaligned)");
  }
}

template <class T, class Op>
void check_finish(const gs::exec::cuda& dev, std::size_t n, Op op) {
  for (int ranks : {1, 3, 8}) {
    const std::string what = std::string("finish<") + tname<T>() + "> " +
                             std::string(Op::name) + " ranks=" + std::to_string(ranks) +
                             " n=" + std::to_string(n);
    auto want = random_values<T>(n, 3000 + n);
    dvec<T> dy(want);
    gs::exec::host{}.finish(want.data(), n, op, ranks);
    dev.finish(dy.p, n, op, ranks);
    dev.fence();
    expect_same(dy.download(), want, n, what);
  }
}

template <class T> void check_copy_axpby(const gs::exec::cuda& dev, std::size_t n) {
  const std::string sfx = std::string("<") + tname<T>() + "> n=" + std::to_string(n);
  const auto x = random_values<T>(n, 4000 + n), y0 = random_values<T>(n, 5000 + n);
  dvec<T> dx(x), dy(n);
  dev.copy(dy.p, dx.p, n);
  dev.copy(dx.p, dx.p, n); // dst == src: nothing
  dev.fence();
  expect_same(dy.download(), x, n, "copy" + sfx);
  expect_same(dx.download(), x, n, "copy onto itself" + sfx);

  for (auto [a, b] : {std::pair{0.3, 0.7}, std::pair{-1.25, 2.0}, std::pair{1.0 / 3, 1.0 / 3}}) {
    auto want = y0;
    gs::exec::host{}.axpby(want.data(), a, x.data(), b, n);
    dy.upload(y0);
    dev.axpby(dy.p, a, dx.p, b, n);
    dev.fence();
    expect_same(dy.download(), want, n, "axpby" + sfx + " a=" + std::to_string(a));
  }
}

#define EXEC_ALL_DTYPES float, double, gradsync::half, gradsync::bfloat16, std::int32_t, std::int64_t

TEST_CASE_TEMPLATE("cuda executor: every operation bitwise equal to exec::host", T, EXEC_ALL_DTYPES) {
  const gpu_test::device_stream st;
  const gs::exec::cuda dev(st.s);
  CHECK(dev.stream() == st.s);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{4097}, std::size_t{1} << 20}) {
    for (gs::op_kind k : {gs::op_kind::sum, gs::op_kind::prod, gs::op_kind::min,
                          gs::op_kind::max, gs::op_kind::avg}) {
      gs::dispatch_op(k, [&](auto op) {
        check_reduce<T>(dev, n, op);
        check_finish<T>(dev, n, op);
      });
    }
    check_copy_axpby<T>(dev, n);
  }
}

template <class F> bool throws_kind(gs::errc kind, F f, std::string* text = nullptr) {
  try {
    f();
  } catch (const gs::error& e) {
    if (text) *text = e.what();
    return e.kind() == kind;
  }
  return false;
}

TEST_CASE("cuda executor: scratch from the workspace, owned, or rejected; CUDA failures") {
  const gpu_test::device_stream st;
  const gs::exec::cuda dev(st.s);
  const std::size_t n = 4097;
  dvec<std::byte> ws(n * sizeof(double) + 16);
  const std::span<std::byte> all(ws.p, ws.n);
  {
    auto s = dev.scratch<double>(all, n, "t.scratch", 2);
    CHECK(static_cast<void*>(s.data()) == static_cast<void*>(ws.p)); // carved from the workspace
  }
  std::string text;
  // Too small a workspace: invalid_argument naming the call.
  CHECK(throws_kind(gs::errc::invalid_argument, [&] {
    (void)dev.scratch<double>(all.first(n * sizeof(double) - 1), n, "t.scratch", 2);
  }, &text));
  CHECK(text.find("t.scratch") != std::string::npos);
  // Misaligned workspace: rejected.
  CHECK(throws_kind(gs::errc::invalid_argument,
                    [&] { (void)dev.scratch<double>(all.subspan(4), n, "t.scratch", 2); }));
  {
    auto s = dev.scratch<float>({}, n, "t.scratch", 2);
    cudaPointerAttributes attr{};
    cuda_ok(cudaPointerGetAttributes(&attr, s.data()), "cudaPointerGetAttributes");
    CHECK(s.data() != nullptr);
    CHECK(attr.type == cudaMemoryTypeDevice); // owned scratch is device memory
    // Usable as an output on the stream it was allocated on.
    const auto a = random_values<float>(n, 7), b = random_values<float>(n, 8);
    std::vector<float> want(n);
    gs::exec::host{}.reduce(want.data(), a.data(), b.data(), n, gs::op::prod{});
    dvec<float> da(a), db(b);
    dev.reduce(s.data(), da.p, db.p, n, gs::op::prod{});
    dev.fence();
    std::vector<float> got(n);
    cuda_ok(cudaMemcpy(got.data(), s.data(), n * sizeof(float), cudaMemcpyDeviceToHost), "download");
    CHECK(first_difference(got.data(), want.data(), n) == n); // usable as a reduce output
  } // freed with cudaFreeAsync on the stream
  dev.fence();
  CHECK(dev.scratch<float>({}, 0, "t", 0).data() == nullptr); // 0 elements: nothing
  // A failed cudaMallocAsync: errc::internal naming the call.
  CHECK(throws_kind(gs::errc::internal, [&] {
    (void)dev.scratch<std::byte>({}, std::size_t{1} << 60, "t.scratch", 2);
  }, &text));
  CHECK(text.find("cudaMallocAsync") != std::string::npos);
  // The failure was reported once: the next launch is not blamed for it.
  dvec<float> d(n);
  CHECK_NOTHROW(dev.reduce(d.p, d.p, d.p, n, gs::op::sum{}));
  CHECK_NOTHROW(dev.fence());
}

} // namespace

int main(int argc, char** argv) { return gpu_test::run_doctest_or_skip(argc, argv); }
