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
// Error feedback: the residual is folded into the input first (x =
// narrow(input + residual)), and the new residual is x - decode(own payload),
// the standard form for a sender-side sparsifier.
//
// Cost: a sparse payload is ~1 % of the tensor, so the dense passes over all
// n elements are the time (on the 1 Gbit/s rig, 64 MiB at 1 %: the link
// carries 1.3 MB in ~10 ms, each dense pass costs 5-15 ms). For float
// tensors there are two: the codec's encode_feedback, which folds the
// residual in the same pass that collects its candidates (sparse::
// folded_input), and writing the output, whose zeros a merge of the sorted
// payloads writes in the sweep that stores the sums. (Other types: the fold,
// the encode and a correction at the own entries, separately; past
// policy::sparse_merge_ranks ranks the sum goes through a dense accumulator
// visited at the gathered entries only.)
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
#include "../exec/host.hpp"
#include "../transport/capabilities.hpp"
#include "bruck.hpp"
#include "codec_op.hpp"
#include "schedule.hpp"

namespace gradsync::algo::sparse_allgather {

/// Ring allgather of p byte payloads whose sizes every rank knows: payload q
/// (sizes[q] bytes) lands at out + sum(sizes[0 .. q)); `mine` is this rank's.
/// Every receive is posted first (their places are known), and a payload
/// is forwarded as soon as it has arrived: no step waits for the one
/// before it to be sent, and no large message waits for its receive to be
/// posted (SMPI, 64 ranks, 84 KB payloads: 206 us per step when each step
/// posted its receive and waited for its send, 94 for the dense ring).
/// While a payload is awaited it calls idle() (one short piece of other
/// work; false when there is none left), polling between calls so that the
/// transfer keeps moving.
template <transport C, class Idle>
void gather(C& c, std::span<const std::byte> mine, std::span<const std::size_t> sizes, std::byte* out, int tag,
            Idle&& idle) {
  const int p = c.size(), r = c.rank();
  std::vector<std::size_t> at(static_cast<std::size_t>(p) + 1, 0);
  for (int q = 0; q < p; ++q) at[q + 1] = at[q] + sizes[q];
  if (!mine.empty()) std::memmove(out + at[r], mine.data(), mine.size());
  if (p == 1) return;
  const int next = mod(r + 1, p), prev = mod(r - 1, p);
  // Step s forwards payload r - s and receives payload r - s - 1; a pair's
  // messages of one tag match in order, so the receives line up.
  using rreq = decltype(c.irecv(std::span<std::byte>{}, 0, 0));
  const auto arrive = [&](rreq& rq) {
    bool done = false;
    while (!done && idle()) done = rq.test();
    rq.wait();
  };
  const auto recv = [&](int s) {
    const int got = mod(r - s - 1, p);
    return c.irecv(std::span<std::byte>(out + at[got], sizes[got]), prev, tag);
  };
  if constexpr (stream_ordered<C>) {
    // Requests that complete with the group they were flushed in (NCCL):
    // a receive posted ahead would wait for a send its peer posts only
    // after its own group completed. One step at a time.
    for (int s = 0; s + 1 < p; ++s) {
      auto rq = recv(s);
      const int fwd = mod(r - s, p);
      auto sq = c.isend(std::span<const std::byte>(out + at[fwd], sizes[fwd]), next, tag);
      arrive(rq);
      sq.wait();
    }
    return;
  }
  std::vector<rreq> recvs;
  std::vector<request_t<C>> sends;
  recvs.reserve(static_cast<std::size_t>(p - 1));
  sends.reserve(static_cast<std::size_t>(p - 1));
  for (int s = 0; s + 1 < p; ++s) recvs.push_back(recv(s));
  for (int s = 0; s + 1 < p; ++s) {
    if (s > 0) arrive(recvs[static_cast<std::size_t>(s - 1)]); // payload r - s
    const int fwd = mod(r - s, p);
    sends.push_back(c.isend(std::span<const std::byte>(out + at[fwd], sizes[fwd]), next, tag));
  }
  arrive(recvs.back());
  wait_all(sends);
}

/// gather() with nothing to do meanwhile.
template <transport C>
void gather(C& c, std::span<const std::byte> mine, std::span<const std::size_t> sizes, std::byte* out, int tag) {
  gather(c, mine, sizes, out, tag, [] { return false; });
}

/// The rule itself: sparse while the most a rank receives, `received` bytes,
/// is at most policy::sparse_dense_ratio x what a dense ring receives of a
/// tensor of `tensor_bytes` on p ranks (also the cost model's, compressed.hpp).
inline bool sparse_pays(double received, double tensor_bytes, int p) {
  return p <= 1 || received <= policy::sparse_dense_ratio * 2.0 * (p - 1) / p * tensor_bytes;
}

/// Whether the sparse allgather beats the dense allreduce for payloads of
/// `sizes` bytes on a tensor of n elements of `elem_bytes` (file comment).
inline bool sparse_pays(std::span<const std::size_t> sizes, std::size_t n, std::size_t elem_bytes) {
  if (sizes.size() <= 1) return true;
  std::size_t total = 0, least = SIZE_MAX;
  for (auto s : sizes) {
    total += s;
    least = std::min(least, s);
  }
  return sparse_pays(static_cast<double>(total - least), static_cast<double>(n) * static_cast<double>(elem_bytes),
                     static_cast<int>(sizes.size()));
}

/// Whether p ranks' payloads are summed through n dense accumulators (past
/// policy::sparse_merge_ranks) rather than merged in index order.
constexpr bool sums_densely(int p) { return p > policy::sparse_merge_ranks; }

/// Outcome of one call.
struct result {
  bool sparse = true;       ///< the sparse allgather ran (else the dense fallback)
  std::size_t payload = 0;  ///< this rank's payload bytes
  std::size_t received = 0; ///< payload bytes this rank received (sparse path)
};

/// Sparse allreduce in place on `data` (n elements) with codec `k` and its
/// state `st`. `residual`: n error-feedback accumulators (folded into data
/// first, then set to data - decoded own payload) or nullptr.
/// `payload` must hold k.max_encoded_bytes(n), `ws` workspace_bytes(k, n,
/// c.size()); `gathered` grows to the gathered payloads. `dense(span<T>)`
/// allreduces a dense tensor (same op as this call) on every rank.
template <transport C, compress::codec K, class Dense>
result allreduce(C& c, const K& k, typename K::state& st, typename K::value_type* data, std::size_t n,
                 bool average, accum_t<typename K::value_type>* residual, std::span<std::byte> payload,
                 std::span<std::byte> ws, std::vector<std::byte>& gathered, int tag, Dense&& dense) {
  using T = typename K::value_type;
  using A = accum_t<T>;
  static_assert(requires(std::span<const std::byte> b) { k.open_entries(b, n); },
                "a sparse codec opens its payload's entries (sparse::entries)");
  const int p = c.size();
  compress::workspace_cursor cur(ws, "allreduce.compressed");
  const auto acc = cur.take<A>(sums_densely(p) ? n : 0);
  timeline* const trace = trace_of(c);
  const auto decoding = [&](std::size_t elements) { return element_phase(trace, "decode", "codec", elements); };
  result res;
  constexpr bool one_pass = requires(std::span<T> r) { k.encode_feedback(std::span<const T>(), r, st, ws, payload); };
  if constexpr (one_pass) {
    if (residual) { // fold, encode and correction in the codec's one pass
      const auto phase = element_phase(trace, "feedback+encode", "codec", n);
      res.payload = k.encode_feedback(std::span<const T>(data, n), std::span<T>(residual, n), st, cur.rest(), payload);
    }
  }
  if (!one_pass || !residual) {
    if (residual) {
      const auto phase = element_phase(trace, "feedback", "codec", n);
      // x = narrow(input + residual); residual = (v - x) + (x - 0), the final
      // value for an element not sent (bitwise what adding x - decoded gives
      // with decoded = 0); non-finite parts are left out.
      for (std::size_t i = 0; i < n; ++i) {
        const A v = widen(data[i]) + residual[i];
        const T x = narrow<T>(v);
        data[i] = x;
        const A xw = widen(x), e = v - xw;
        const A kept = finite_acc(e) ? e : A(0);
        residual[i] = finite_acc(xw) ? kept + xw : kept;
      }
    }
    {
      const auto phase = element_phase(trace, "encode", "codec", n);
      res.payload = k.encode(std::span<const T>(data, n), st, cur.rest(), payload);
    }
    if (residual) {
      const auto own = k.open_entries(std::span<const std::byte>(payload.data(), res.payload), n);
      const auto phase = decoding(own.k);
      // At the sent entries: residual = (v - x) + (x - decoded). (residual - x
      // recovers v - x exactly: it was x + (v - x) = v, a float.)
      own.each([&](std::uint32_t i, float value) {
        const A xw = widen(data[i]);
        if (!finite_acc(xw)) return; // the fold kept only v - x
        const A kept = residual[i] - xw, e = xw - (A(0) + static_cast<A>(value));
        residual[i] = finite_acc(e) ? kept + e : kept;
      });
    }
  }
  const auto mine = std::span<const std::byte>(payload.data(), res.payload);
  std::vector<std::size_t> sizes(static_cast<std::size_t>(p), 0);
  {
    // Bruck's ceil(log2 p) rounds, not the payload ring's p - 1 steps: the
    // sizes are 8 bytes, all latency (SMPI, 256 ranks: ~800 us of ring).
    std::vector<std::int64_t> sz(static_cast<std::size_t>(p));
    sz[static_cast<std::size_t>(c.rank())] = static_cast<std::int64_t>(res.payload);
    exec::host host;
    const typed_reduce<std::int64_t, op::sum, exec::host> copies{host, op::sum{}, p}; // copies only
    bruck::allgather(c, copies, sz.data(), partition{static_cast<std::size_t>(p), static_cast<std::size_t>(p)}, tag);
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
  // The input is consumed (the payload holds what is sent), so the output's
  // zeros can be written while the payloads cross the link: data[0, zeroed)
  // is zero when the gather returns. (1 Gbit/s rig, 64 MiB at 1 %: the
  // 1.3 MB payloads take ~11 ms, the zeros ~5 ms of it.)
  std::size_t zeroed = 0;
  gather(c, mine, sizes, gathered.data(), tag + 1, [&] {
    const std::size_t len = std::min(n - zeroed, policy::sparse_zero_piece_bytes / sizeof(T));
    std::memset(static_cast<void*>(data + zeroed), 0, len * sizeof(T)); // +0: all zero bits in every float type
    zeroed += len;
    return zeroed < n;
  });
  res.received = total - res.payload;
  const auto phase = decoding(n * static_cast<std::size_t>(p));
  std::vector<decltype(k.open_entries(mine, n))> got;
  got.reserve(static_cast<std::size_t>(p));
  std::size_t at = 0;
  for (int q = 0; q < p; ++q) { // all validated before anything is written
    got.push_back(k.open_entries(std::span<const std::byte>(gathered.data() + at, sizes[q]), n));
    at += sizes[q];
  }
  // The sum of ranks 0 .. p-1 in that order at every gathered entry, as a
  // zeroed dense accumulator would hold it, and +0 elsewhere.
  const A ranks = static_cast<A>(p);
  if (!sums_densely(p)) {
    // A p-way merge of the index-sorted payloads: each gathered index once,
    // its values summed in rank order, the zeros not written during the
    // gather filled in the same sweep (one write of every line; a memset
    // first and the scattered sums after touched each line twice: 15 ms
    // against 9 at 64 MiB over shared memory).
    std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
    std::size_t done = zeroed; // data[0, done) holds its zeros
    for (;;) {
      std::uint64_t i = UINT64_MAX;
      for (int q = 0; q < p; ++q)
        if (next[q] < got[q].k) i = std::min<std::uint64_t>(i, got[q].index(next[q]));
      if (i == UINT64_MAX) break;
      A sum = A(0);
      for (int q = 0; q < p; ++q)
        if (next[q] < got[q].k && got[q].index(next[q]) == i) sum += static_cast<A>(got[q].value(next[q]++));
      if (i >= done) {
        std::memset(static_cast<void*>(data + done), 0, (i - done) * sizeof(T));
        done = i + 1;
      }
      data[i] = narrow<T>(average ? sum / ranks : sum);
    }
    std::memset(static_cast<void*>(data + done), 0, (n - done) * sizeof(T));
    return res;
  }
  std::memset(static_cast<void*>(data + zeroed), 0, (n - zeroed) * sizeof(T));
  for (const auto& e : got) e.each([&](std::uint32_t i, float) { acc[i] = A(0); });
  for (const auto& e : got) e.each(compress::accumulate_sink<T>{acc.data()});
  for (const auto& e : got)
    e.each([&](std::uint32_t i, float) { data[i] = narrow<T>(average ? acc[i] / ranks : acc[i]); });
  return res;
}

/// Scratch bytes allreduce() needs in `ws` for n elements on p ranks (the
/// accumulators only where the sum goes through them).
template <compress::codec K> std::size_t workspace_bytes(const K& k, std::size_t n, int p) {
  return compress::workspace_piece<accum_t<typename K::value_type>>(sums_densely(p) ? n : 0) +
         k.workspace_bytes(n) + compress::workspace_align;
}

} // namespace gradsync::algo::sparse_allgather
