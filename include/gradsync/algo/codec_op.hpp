// gradsync: the segment operation of compressed reductions. A segment travels
// as one codec payload (wire.hpp); a rank that receives a partial sum decodes
// it, accumulates its own elements in float (accum_t) and re-encodes the
// running sum for the next rank (compressed_ring.hpp). The owner of a block
// encodes the finished block once and keeps that payload; the allgather then
// forwards those bytes verbatim and every rank decodes the same payload, so
// all ranks hold bitwise identical results.
//
// Error feedback over a reduction (any number of encodes per element): every
// rank adds the error of each encode it performs, x - decode(encode(x)), to
// its residual at those elements (the owner's final encode of an average
// counted p times, in sum units). The residuals of all ranks then sum to
// exactly the mass the reduction lost, so feeding them into the next step's
// input makes the running sum of outputs track the running sum of exact
// averages, off by the (bounded) current residuals over p.
//
// Stochastic codecs draw their noise from a stream keyed by (tensor seed
// mixed with the segment's first element, tensor step, encoding rank): every
// encode of a step draws independent noise, reproducible by a reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "../compress/codec.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/timeline.hpp"

namespace gradsync::algo {

/// Seed of the noise stream of the segment starting at element `first`.
constexpr std::uint64_t segment_seed(std::uint64_t seed, std::size_t first) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (static_cast<std::uint64_t>(first) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The codec state of one encode: keyed streams for stochastic codecs,
/// nothing for deterministic ones.
template <class St> St segment_state(std::uint64_t seed, std::uint64_t step, int rank, std::size_t first) {
  if constexpr (std::same_as<St, compress::stream_state>)
    return St{segment_seed(seed, first), step, static_cast<std::uint32_t>(rank)};
  else
    return St{};
}

/// Payload slot bytes of a segment of n elements (16-byte aligned strides).
template <compress::codec K> std::size_t payload_slot_bytes(const K& k, std::size_t n) {
  return (k.max_encoded_bytes(n) + 15) / 16 * 16;
}

/// Whether an accumulator value is finite (a bit test for float: it
/// vectorises inside a decode loop, std::isfinite of a double does not).
template <class A> inline bool finite_acc(A e) {
  if constexpr (std::same_as<A, float>) return compress::finite(e);
  else return std::isfinite(static_cast<double>(e));
}

/// Error feedback's fold of the previous step's residual into n input
/// elements, in place: v = widen(data) + res, data = narrow(v), and the
/// residual restarts as that rounding (0 where T is its own accumulator: the
/// sum is exact, and a non-finite one's rounding is dropped). One definition
/// for the fold before a call (compressed.hpp) and the segment op's fold at
/// an element's first read.
template <class T> void fold_residual(T* data, accum_t<T>* res, std::size_t n) {
  using A = accum_t<T>;
  if constexpr (std::same_as<A, T>) {
    for (std::size_t i = 0; i < n; ++i) { // (one vectorised pass: 37 -> 23 ms for 64 MiB, 2 ranks)
      data[i] += res[i];
      res[i] = A(0);
    }
  } else {
    for (std::size_t i = 0; i < n; ++i) {
      const A v = widen(data[i]) + res[i];
      data[i] = narrow<T>(v);
      const A e = v - widen(data[i]);
      res[i] = finite_acc(e) ? e : A(0);
    }
  }
}

/// decode_each sink of error feedback: res[i] += weight (x[i] - decoded),
/// the decoded value taken as 0 + v exactly as decode_accumulate into a
/// zeroed scratch gives it; with Store, out[i] = the decoded element too.
template <class T, bool Store> struct feedback_sink {
  using A = accum_t<T>;
  const A* x;
  A* res;
  A weight;
  T* out;
  void operator()(std::size_t i, float v) const {
    if constexpr (Store) out[i] = narrow<T>(static_cast<A>(v));
    const A d = A(0) + static_cast<A>(v);
    // A non-finite value is the receiver's to see (the codecs poison it);
    // keeping it out of the residual keeps one bad step from poisoning the next.
    if (const A e = weight * (x[i] - d); finite_acc(e)) res[i] += e;
  }
};

/// decode_each sink of a reduction step: acc[i] = widen(mine[i]) + v, the
/// sum decode_accumulate onto a copy of mine gives; with Narrow, also
/// out[i] = narrow(acc[i]).
template <class T, bool Narrow> struct sum_sink {
  using A = accum_t<T>;
  const T* mine;
  A* acc;
  T* out;
  void operator()(std::size_t i, float v) const {
    const A a = widen(mine[i]) + static_cast<A>(v);
    if constexpr (Narrow) out[i] = narrow<T>(a);
    else acc[i] = a;
  }
};

/// Encodes (and accounts the error of) segments of codec K for one rank of
/// one compressed reduction. Holds only pointers into caller-owned memory.
template <compress::codec K> struct codec_encoder {
  using T = typename K::value_type;
  using A = accum_t<T>;

  const K* codec = nullptr;
  std::uint64_t seed = 0, step = 0;
  int rank = 0;
  A* residual = nullptr;    ///< n accumulators, global offsets; nullptr: no error feedback
  T* narrowed = nullptr;    ///< max_seg elements (A != T only)
  A* decoded = nullptr;     ///< max_seg accumulators (error feedback only)
  std::span<std::byte> ws{}; ///< the codec's workspace for max_seg elements
  std::size_t* encoded_bytes = nullptr; ///< running total of payload bytes produced
  timeline* trace = nullptr; ///< where encodes and decodes are phases, or nullptr

  /// Scratch bytes of an encoder for segments of up to `max_seg` elements.
  static std::size_t scratch_bytes(const K& k, std::size_t max_seg, bool feedback) {
    const std::size_t narrow = std::same_as<A, T> ? 0 : compress::workspace_piece<T>(max_seg);
    return narrow + (feedback ? compress::workspace_piece<A>(max_seg) : 0) + k.workspace_bytes(max_seg) +
           compress::workspace_align;
  }
  /// Carves its scratch out of `mem` (scratch_bytes long).
  void carve(std::span<std::byte> mem, std::size_t max_seg, bool feedback, const char* op) {
    compress::workspace_cursor cur(mem, op);
    if constexpr (!std::same_as<A, T>) narrowed = cur.template take<T>(max_seg).data();
    if (feedback) decoded = cur.template take<A>(max_seg).data();
    ws = cur.rest();
  }

  /// Encodes x[0, n) (elements first .. first+n of the tensor) into `out`;
  /// with error feedback adds weight * (x - decoded) to the residual; with
  /// `decoded_out`, also decodes the payload there (one pass for both where
  /// the codec has decode_each).
  std::span<const std::byte> encode(const A* x, std::size_t n, std::size_t first, std::byte* out,
                                    A weight, T* decoded_out = nullptr) const {
    std::size_t bytes = 0;
    {
      const auto phase = element_phase(trace, "encode", "codec", n);
      const T* src;
      if constexpr (std::same_as<A, T>) {
        src = x;
      } else {
        for (std::size_t i = 0; i < n; ++i) narrowed[i] = narrow<T>(x[i]);
        src = narrowed;
      }
      auto st = segment_state<typename K::state>(seed, step, rank, first);
      bytes = codec->encode(std::span<const T>(src, n), st, ws, std::span<std::byte>(out, payload_slot_bytes(*codec, n)));
    }
    if (encoded_bytes) *encoded_bytes += bytes;
    const std::span<const std::byte> payload(out, bytes);
    if (residual) {
      const auto phase = decoding(n);
      A* const res = residual + first;
      if constexpr (compress::decodes_each<K, feedback_sink<T, true>>) {
        // One pass instead of four (zero, decode, read back, store): int8's
        // error feedback fell from ~3/4 of the codec work on the rig.
        if (decoded_out) codec->decode_each(payload, n, feedback_sink<T, true>{x, res, weight, decoded_out});
        else codec->decode_each(payload, n, feedback_sink<T, false>{x, res, weight, nullptr});
      } else {
        std::fill(decoded, decoded + n, A(0));
        codec->decode_accumulate(payload, std::span<A>(decoded, n));
        for (std::size_t i = 0; i < n; ++i)
          if (const A e = weight * (x[i] - decoded[i]); finite_acc(e)) res[i] += e;
        if (decoded_out) codec->decode(payload, std::span<T>(decoded_out, n));
      }
    } else if (decoded_out) {
      const auto phase = decoding(n);
      codec->decode(payload, std::span<T>(decoded_out, n));
    }
    return payload;
  }
  /// A phase "decode" of n elements.
  auto decoding(std::size_t n) const noexcept { return element_phase(trace, "decode", "codec", n); }
};

/// The segment operation of a compressed ring (segment_op.hpp): value_type
/// is the tensor's element type; one instance serves the reduce-scatter
/// (gather = false: encode, decode-accumulate-re-encode, keep the owner's
/// payloads) and then the allgather (gather = true: send the kept payloads,
/// decode what arrives). `in_base`/`out_base` map segment pointers to tensor
/// offsets; `kept` has one slot per segment of the own block.
template <compress::codec K> struct codec_segment_op {
  using value_type = typename K::value_type;
  using T = value_type;
  using A = accum_t<T>;
  static constexpr bool exact = false;
  static constexpr bool in_place_copy = false;
  static constexpr bool staged_send = true;

  codec_encoder<K> enc;
  int ranks = 1;
  bool average = false;
  bool gather = false;
  const T* in_base = nullptr;
  const T* out_base = nullptr;
  A* acc = nullptr; ///< max_seg accumulators
  /// Payloads of the own block's segments: first element, bytes.
  struct kept_payload {
    std::size_t first = 0;
    std::span<const std::byte> bytes;
  };
  std::byte* kept_mem = nullptr;
  std::size_t kept_stride = 0;
  std::vector<kept_payload>* kept = nullptr;
  /// Error feedback's residual (tensor offsets) still to fold into the own
  /// elements, each at its first read (fold_residual), so that the fold runs
  /// a segment at a time inside the pipeline instead of as a pass over the
  /// whole tensor before the first byte is sent (on the 1 Gbit/s rig, int8
  /// 64 MiB: 37-94 ms before the first encode). nullptr: folded already.
  /// The schedules running this op (compressed ring, two-step) read every
  /// own element once, before anything writes it.
  A* fold = nullptr;
  T* data = nullptr; ///< the tensor at in_base, writable (for the fold)

  std::size_t slot_bytes(std::size_t n) const { return payload_slot_bytes(*enc.codec, n); }

  std::span<const std::byte> wire(const T* mine, std::size_t n, std::byte* slot) const {
    if (gather) return find_kept(static_cast<std::size_t>(mine - out_base), n);
    return enc.encode(widened(mine, n), n, static_cast<std::size_t>(mine - in_base), slot, A(1));
  }
  std::span<const std::byte> reduce(std::span<std::byte> got, const T* mine, std::size_t n, std::byte* slot) const {
    accumulate(got, mine, n);
    return enc.encode(acc, n, static_cast<std::size_t>(mine - in_base), slot, A(1));
  }
  /// The owner's last step: finish, encode once, keep the payload and decode
  /// it into dst (so the owner holds exactly what every other rank decodes).
  std::span<const std::byte> reduce_copy(std::span<std::byte> got, const T* mine, T* dst, std::size_t n) const {
    accumulate(got, mine, n);
    return keep(dst, n);
  }
  std::span<std::byte> recv_target(T*, std::size_t n, std::byte* slot) const { return {slot, slot_bytes(n)}; }
  void copy(std::span<std::byte> got, T* dst, std::size_t n) const {
    const auto phase = enc.decoding(n);
    enc.codec->decode(got, std::span<T>(dst, n));
  }
  void combine(std::span<std::byte> got, const T* mine, T* out, std::size_t n, bool) const {
    fold_in(mine, n);
    // float sums commute: the order flag changes nothing
    if constexpr (compress::decodes_each<K, sum_sink<T, true>>) {
      const auto phase = enc.decoding(n);
      enc.codec->decode_each(got, n, sum_sink<T, true>{mine, nullptr, out});
    } else {
      accumulate(got, mine, n);
      for (std::size_t i = 0; i < n; ++i) out[i] = narrow<T>(acc[i]);
    }
  }
  void finish(T* dst, std::size_t n) const {
    if (average)
      for (std::size_t i = 0; i < n; ++i) dst[i] = narrow<T>(widen(dst[i]) / static_cast<A>(ranks));
  }
  void assign(T* dst, const T* src, std::size_t n) const {
    if (dst != src) std::copy(src, src + n, dst);
  }
  /// One rank: the result is still the codec's round trip of the input.
  void local(const T* mine, T* dst, std::size_t n) const {
    fold_in(mine, n);
    for (std::size_t i = 0; i < n; ++i) acc[i] = widen(mine[i]);
    keep(dst, n);
  }
  void fence() const {}

  /// `acc` holds the sum of the own block's segment at `dst`: finish it (avg),
  /// encode it once, keep the payload for the allgather and decode it into
  /// dst, so the owner holds exactly what every other rank will decode.
  std::span<const std::byte> keep(T* dst, std::size_t n) const {
    const auto first = static_cast<std::size_t>(dst - out_base);
    if (average)
      for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] / static_cast<A>(ranks);
    std::byte* slot = kept_mem + kept->size() * kept_stride;
    const auto payload = enc.encode(acc, n, first, slot, average ? static_cast<A>(ranks) : A(1), dst);
    kept->push_back({first, payload});
    return payload;
  }

  /// `mine` as accumulators (a view when T is its own accumulator type).
  const A* widened(const T* mine, std::size_t n) const {
    fold_in(mine, n);
    if constexpr (std::same_as<A, T>) {
      return mine;
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = widen(mine[i]);
      return acc;
    }
  }

private:
  void fold_in(const T* mine, std::size_t n) const {
    if (!fold) return;
    const auto first = static_cast<std::size_t>(mine - in_base);
    fold_residual(data + first, fold + first, n);
  }
  void accumulate(std::span<std::byte> got, const T* mine, std::size_t n) const {
    fold_in(mine, n);
    const auto phase = enc.decoding(n);
    if constexpr (compress::decodes_each<K, sum_sink<T, false>>) {
      enc.codec->decode_each(got, n, sum_sink<T, false>{mine, acc, nullptr});
    } else {
      for (std::size_t i = 0; i < n; ++i) acc[i] = widen(mine[i]);
      enc.codec->decode_accumulate(got, std::span<A>(acc, n));
    }
  }
  std::span<const std::byte> find_kept(std::size_t first, std::size_t n) const {
    for (const auto& k : *kept)
      if (k.first == first) return k.bytes;
    throw error("allreduce.compressed", enc.rank, -1,
                "internal: no kept payload for the segment at element " + std::to_string(first) + " (" +
                    std::to_string(n) + " elements)");
  }
};

} // namespace gradsync::algo
