// gradsync: allreduce of sparse payloads (top-k, approximate top-k/DGC,
// threshold). Encoded (index, value) payloads have data-dependent sizes, and
// sparse sums do not stay sparse, so they are not re-encoded along a ring:
// every rank encodes its whole tensor once, the ranks exchange payload sizes
// (one 8-byte allgather), then either
//   - sparse: a ring allgather of the payloads (exact sizes, forwarded
//     verbatim) and a sparse accumulate of all p in rank order 0 .. p-1, or
//   - dense: when the payloads are too large (density x ranks high), each
//     rank decodes its own payload and the sparsified dense tensor goes
//     through the caller's dense allreduce.
// The rule: sparse while the most any rank receives, sum(sizes) - min(sizes),
// is at most policy::sparse_dense_ratio x the 2 (p-1)/p n element bytes a
// dense ring receives. Sizes are agreed, so every rank takes the same path;
// either way every rank sums the same values in the same order and ends
// bitwise identical.
//
// Error feedback: residual = input - decode(own payload), the standard form
// for a sender-side sparsifier.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "../compress/codec.hpp"
#include "../core/policy.hpp"
#include "../transport/capabilities.hpp"
#include "schedule.hpp"

namespace gradsync::algo::sparse_allgather {

/// Ring allgather of p byte payloads whose sizes every rank knows: payload q
/// (sizes[q] bytes) lands at out + sum(sizes[0 .. q)); `mine` is this rank's.
template <transport C>
void gather(C& c, std::span<const std::byte> mine, std::span<const std::size_t> sizes, std::byte* out, int tag) {
  const int p = c.size(), r = c.rank();
  std::vector<std::size_t> at(static_cast<std::size_t>(p) + 1, 0);
  for (int q = 0; q < p; ++q) at[q + 1] = at[q] + sizes[q];
  if (!mine.empty()) std::memmove(out + at[r], mine.data(), mine.size());
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  for (int s = 0; s + 1 < p; ++s) { // step s: forward payload r - s, receive r - s - 1
    const int fwd = mod(r - s, p), got = mod(r - s - 1, p);
    auto rq = c.irecv(std::span<std::byte>(out + at[got], sizes[got]), prev, tag);
    auto sq = c.isend(std::span<const std::byte>(out + at[fwd], sizes[fwd]), next, tag);
    rq.wait();
    sq.wait();
  }
}

/// Whether the sparse allgather beats the dense allreduce for payloads of
/// `sizes` bytes on a tensor of n elements of `elem_bytes` (file comment).
inline bool sparse_pays(std::span<const std::size_t> sizes, std::size_t n, std::size_t elem_bytes) {
  const auto p = static_cast<double>(sizes.size());
  if (sizes.size() <= 1) return true;
  std::size_t total = 0, least = SIZE_MAX;
  for (auto s : sizes) {
    total += s;
    least = std::min(least, s);
  }
  const double dense = 2.0 * (p - 1) / p * static_cast<double>(n) * static_cast<double>(elem_bytes);
  return static_cast<double>(total - least) <= policy::sparse_dense_ratio * dense;
}

/// Outcome of one call.
struct result {
  bool sparse = true;       ///< the sparse allgather ran (else the dense fallback)
  std::size_t payload = 0;  ///< this rank's payload bytes
  std::size_t received = 0; ///< payload bytes this rank received (sparse path)
};

/// Sparse allreduce in place on `data` (n elements) with codec `k` and its
/// state `st`. `residual`: n accumulators (input - decoded own payload is
/// added) or nullptr (no error feedback).
/// `payload` must hold k.max_encoded_bytes(n), `ws` k.workspace_bytes(n) +
/// n accumulators; `gathered` grows to the gathered payloads. `dense(span<T>)`
/// allreduces a dense tensor (same op as this call) on every rank.
template <transport C, compress::codec K, class Dense>
result allreduce(C& c, const K& k, typename K::state& st, typename K::value_type* data, std::size_t n,
                 bool average, accum_t<typename K::value_type>* residual, std::span<std::byte> payload,
                 std::span<std::byte> ws, std::vector<std::byte>& gathered, int tag, Dense&& dense) {
  using T = typename K::value_type;
  using A = accum_t<T>;
  const int p = c.size();
  compress::workspace_cursor cur(ws, "allreduce.compressed");
  const auto acc = cur.take<A>(n);
  timeline* const trace = trace_of(c);
  result res;
  {
    const auto phase = element_phase(trace, "encode", "codec", n);
    res.payload = k.encode(std::span<const T>(data, n), st, cur.rest(), payload);
  }
  const auto mine = std::span<const std::byte>(payload.data(), res.payload);
  const auto decoding = [&](std::size_t elements) { return element_phase(trace, "decode", "codec", elements); };
  bool acc_zero = false; // acc already zeroed for the sparse sum
  if (residual) {
    const auto phase = decoding(n);
    std::fill(acc.begin(), acc.end(), A(0));
    k.decode_accumulate(mine, acc);
    // Zeroes acc as it reads it: the sparse sum needs it zero, and this
    // saves a write pass over all n (the tensor is large, the payload small).
    for (std::size_t i = 0; i < n; ++i) {
      const A a = acc[i];
      acc[i] = A(0);
      if (const A e = widen(data[i]) - a; std::isfinite(static_cast<double>(e))) residual[i] += e;
    }
    acc_zero = true;
  }
  std::vector<std::size_t> sizes(static_cast<std::size_t>(p), 0);
  {
    std::vector<std::uint64_t> sz(static_cast<std::size_t>(p));
    const std::uint64_t own = res.payload;
    const std::vector<std::size_t> eight(static_cast<std::size_t>(p), sizeof(std::uint64_t));
    gather(c, std::as_bytes(std::span<const std::uint64_t>(&own, 1)), eight,
           reinterpret_cast<std::byte*>(sz.data()), tag);
    for (int q = 0; q < p; ++q) sizes[q] = static_cast<std::size_t>(sz[q]);
  }
  res.sparse = sparse_pays(sizes, n, sizeof(T));
  if (!res.sparse) {
    {
      const auto phase = decoding(n);
      k.decode(mine, std::span<T>(data, n));
    }
    dense(std::span<T>(data, n));
    return res;
  }
  std::size_t total = 0;
  for (auto s : sizes) total += s;
  gathered.resize(std::max(gathered.size(), total));
  gather(c, mine, sizes, gathered.data(), tag + 1);
  res.received = total - res.payload;
  const auto phase = decoding(n * static_cast<std::size_t>(p));
  if (!acc_zero) std::fill(acc.begin(), acc.end(), A(0));
  std::size_t at = 0;
  for (int q = 0; q < p; ++q) {
    k.decode_accumulate(std::span<const std::byte>(gathered.data() + at, sizes[q]), acc);
    at += sizes[q];
  }
  for (std::size_t i = 0; i < n; ++i) data[i] = narrow<T>(average ? acc[i] / static_cast<A>(p) : acc[i]);
  return res;
}

/// Scratch bytes allreduce() needs in `ws` for n elements.
template <compress::codec K> std::size_t workspace_bytes(const K& k, std::size_t n) {
  return compress::workspace_piece<accum_t<typename K::value_type>>(n) + k.workspace_bytes(n) +
         compress::workspace_align;
}

} // namespace gradsync::algo::sparse_allgather
