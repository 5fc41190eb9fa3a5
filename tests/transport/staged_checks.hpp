// The collectives over staged<C, M> (transport/staged.hpp) on any inner
// transport: host memory stands in for a device's (a copier that stages
// every range it is asked about, and an executor declared to work on device
// memory that runs the host math), so every message of every schedule goes
// through a staging block. Each check throws std::runtime_error naming the
// call and the first wrong element; results are closed forms of the inputs.
// Used by tests/transport/test_staged.cpp (inproc, shm) and
// tests/mpi/test_collectives.cpp (MPI).
#pragma once

#include <gradsync/collectives.hpp>
#include <gradsync/exec/host.hpp>
#include <gradsync/transport/staged.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradsync::test {

/// An executor declared to work on device memory, running the host math: it
/// makes the collectives take their device path (no shared arena; the
/// transport must be device_memory) on host memory.
struct device_host : exec::host {
  static constexpr memory_space space = memory_space::device;
};
static_assert(executor<device_host>);

/// host_copier that counts what it stages; `all_device` stages every range.
struct counting_copier : host_copier {
  struct counts {
    std::atomic<std::size_t> to_host{0}, to_device{0}, bytes{0}, allocs{0};
  };
  std::shared_ptr<counts> n = std::make_shared<counts>();
  std::size_t fail_after = ~std::size_t{0}; // to_host calls before one throws

  static counting_copier all_device() {
    counting_copier m;
    m.device = [](const void*) { return true; };
    return m;
  }
  void to_host(std::byte* d, const std::byte* s, std::size_t k) {
    if (n->to_host.load() >= fail_after) throw std::runtime_error("injected copy failure");
    ++n->to_host;
    n->bytes += k;
    host_copier::to_host(d, s, k);
  }
  void to_device(std::byte* d, const std::byte* s, std::size_t k) {
    ++n->to_device;
    n->bytes += k;
    host_copier::to_device(d, s, k);
  }
  std::byte* alloc_host(std::size_t k) {
    ++n->allocs;
    return host_copier::alloc_host(k);
  }
};
static_assert(device_copier<counting_copier>);

namespace staged_detail {

// Exact small integers in every dtype used here: x_r[i] = r + 1 + (i % 7).
inline double x(int r, std::size_t i) { return static_cast<double>(r + 1) + static_cast<double>(i % 7); }

template <class T> void expect(const std::vector<T>& got, std::size_t n, double (*want)(std::size_t, int, int), int p,
                               int extra, const std::string& what) {
  for (std::size_t i = 0; i < n; ++i)
    if (static_cast<double>(got[i]) != want(i, p, extra))
      throw std::runtime_error(what + ": element " + std::to_string(i) + " is " +
                               std::to_string(static_cast<double>(got[i])) + ", expected " +
                               std::to_string(want(i, p, extra)));
}

inline double sum_of(std::size_t i, int p, int) {
  return static_cast<double>(p) * (p + 1) / 2 + static_cast<double>(p) * static_cast<double>(i % 7);
}
inline double max_of(std::size_t i, int p, int) { return x(p - 1, i); }

} // namespace staged_detail

/// Every collective on "device" ranges through staged<C, counting_copier>:
/// allreduce (every flat schedule and hier, sum / avg / max, in and out of
/// place), reduce_scatter, allgather, broadcast and reduce from every root,
/// for each count in `counts`. Throws on the first wrong element.
template <transport C> void staged_collectives(C& inner, const std::vector<std::size_t>& counts) {
  using staged_detail::x;
  const int p = inner.size(), r = inner.rank();
  auto m = counting_copier::all_device();
  staged dev(inner, m);
  device_host ex;
  for (const std::size_t n : counts) {
    const std::string at = " (rank " + std::to_string(r) + " of " + std::to_string(p) + ", count " +
                           std::to_string(n) + ")";
    for (const algorithm a : {algorithm::automatic, algorithm::ring, algorithm::tree, algorithm::dbtree, algorithm::rd,
                              algorithm::rabenseifner, algorithm::hier}) {
      options o;
      o.algo = a;
      if (a == algorithm::hier) o.group_size = 2;
      const std::string name = std::string("allreduce ") + std::string(algorithm_name(a)) + at;
      std::vector<float> in(n), out(n + 1, -7.0f);
      for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(x(r, i));
      allreduce(dev, ex, std::span<const float>(in), std::span(out), op::sum{}, o);
      staged_detail::expect(out, n, staged_detail::sum_of, p, 0, name + " sum");
      if (out[n] != -7.0f) throw std::runtime_error(name + ": the element past the output was written");
      std::vector<float> d(n); // in place (one element type throughout: staging moves bytes, and
      for (std::size_t i = 0; i < n; ++i) d[i] = static_cast<float>(x(r, i)); // each more costs build time)
      allreduce(dev, ex, std::span(d), op::max{}, o);
      staged_detail::expect(d, n, staged_detail::max_of, p, 0, name + " max in place");
    }
    {
      options o;
      o.algo = algorithm::ring;
      // p blocks of n: block b of rank r holds x(r, b * n + i); rank r keeps block r's sum.
      std::vector<float> in(n * static_cast<std::size_t>(p)), out(n);
      for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(x(r, i));
      reduce_scatter(dev, ex, std::span<const float>(in), std::span(out), op::sum{}, o);
      for (std::size_t i = 0; i < n; ++i)
        if (out[i] != static_cast<float>(staged_detail::sum_of(static_cast<std::size_t>(r) * n + i, p, 0)))
          throw std::runtime_error("reduce_scatter" + at + ": element " + std::to_string(i) + " is wrong");
    }
    for (const algorithm a : {algorithm::ring, algorithm::rd, algorithm::bruck}) {
      options o;
      o.algo = a;
      // Exact in float: rank q's element i is q * 2^17 + (i mod 2^17) (q < 2^6).
      const auto tagged = [](int q, std::size_t i) { return static_cast<float>(q * 131072 + static_cast<int>(i % 131072)); };
      std::vector<float> mine(n), all(n * static_cast<std::size_t>(p), -1.0f);
      for (std::size_t i = 0; i < n; ++i) mine[i] = tagged(r, i);
      allgather(dev, ex, std::span<const float>(mine), std::span(all), o);
      for (int q = 0; q < p; ++q)
        for (std::size_t i = 0; i < n; ++i)
          if (all[static_cast<std::size_t>(q) * n + i] != tagged(q, i))
            throw std::runtime_error("allgather " + std::string(algorithm_name(a)) + at + ": rank " +
                                     std::to_string(q) + "'s element " + std::to_string(i) + " is wrong");
    }
    for (int root = 0; root < p; ++root) {
      for (const algorithm a : {algorithm::tree, algorithm::ring, algorithm::scatter_allgather}) {
        options o;
        o.algo = a;
        std::vector<float> b(n);
        for (std::size_t i = 0; i < n; ++i) b[i] = r == root ? static_cast<float>(x(root, i)) : -1.0f;
        broadcast(dev, ex, std::span(b), root, o);
        for (std::size_t i = 0; i < n; ++i)
          if (b[i] != static_cast<float>(x(root, i)))
            throw std::runtime_error("broadcast " + std::string(algorithm_name(a)) + " from " + std::to_string(root) +
                                     at + ": element " + std::to_string(i) + " is wrong");
      }
      for (const algorithm a : {algorithm::tree, algorithm::ring}) {
        options o;
        o.algo = a;
        std::vector<float> in(n), out(n, -1.0f);
        for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<float>(x(r, i));
        reduce(dev, ex, std::span<const float>(in), std::span(out), root, op::sum{}, o);
        if (r == root) staged_detail::expect(out, n, staged_detail::sum_of, p, 0, "reduce to " + std::to_string(root) + at);
      }
    }
  }
  // Every message was staged both ways (p > 1 and something to move).
  bool moved = false;
  for (const std::size_t n : counts) moved = moved || n > 0;
  if (p > 1 && moved && (m.n->to_host.load() == 0 || m.n->to_device.load() == 0))
    throw std::runtime_error("staged" + std::string(" rank ") + std::to_string(r) + ": nothing was staged");
}

} // namespace gradsync::test
