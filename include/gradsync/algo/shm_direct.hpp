// gradsync: allreduce, reduce-scatter and allgather straight out of shared
// memory, for transports that expose a collective arena (transport/shm.hpp). No messages: every rank
// stages its input once, reduces its 1/p share reading every peer's staged
// copy in place, and copies the other shares' results out of the owners'
// arenas. Per rank that is one copy in, one pass of reduction and one copy
// out, against 2(p-1)/p copies each way plus p-1 round trips for a ring.
//
// Large buffers go in rounds through two alternating halves of the arena, so
// a rank stages round e+1 while slower peers still read round e. Each round:
//   copy in (all shares but mine) -> post `copied`
//   await `copied`, reduce my share into `out`, finalize, copy it into my
//   arena -> post `reduced`
//   await `reduced`, copy the others' shares out -> post `drained`
// Writes into the arena use streaming stores (arena_copy) or ordinary ones,
// whichever the transport's timed_choice measures faster for this kind of
// call and size: the lines were last read by other cores, and when those
// cores do not share our cache an ordinary store must first fetch each line
// back (3-4x slower), but when they do share it the peers read our writes
// from the cache (2x faster).
// A half is rewritten only after every rank drained it two rounds earlier.
// Small buffers take one round in which every rank reduces the whole buffer
// from all staged copies (one synchronisation instead of two).
//
// Reduce-scatter is the first half of that (one synchronisation per round),
// allgather the second (each rank stages its block, every rank copies all).
//
// Single copy (transports with single_copy(), decided when the group formed:
// Linux cross-memory attach, core/cross_memory.hpp). From the transport's
// single_copy_min_bytes() on, no byte goes through the arena: each
// rank publishes (pid, in, out) at the start of its arena half, then
//   reduce my share reading the peers' parts of `in` straight from their
//   memory (process_vm_readv, a piece into a cache-sized scratch at a time),
//   write it to my `out` -> post `reduced`
//   await `reduced`, read the other shares from their owners' `out` straight
//   into mine -> post `drained`, await `drained` (so no rank returns, and
//   frees or rewrites a buffer, while a peer still reads it).
// In place (in == out) is safe: until `reduced`, rank r writes only share r
// of its buffer, and peers read only the other shares of it; after
// `reduced` nobody reads `in` any more, and peers read only share r, which r
// no longer writes. Reduce-scatter and allgather read the same way (block r
// of rank r's `in` is the only part r writes, and nobody else reads it).
// A read that fails (the peer died) fails this rank with errc::peer_failed
// and aborts the group, so no survivor waits for it. Off by default
// (policy::shm_single_copy_min_bytes): where process_vm_readv pays for each
// 4 KiB page as on the CI VM, the arena's cache-resident copies are faster.
//
// Shared buffers (transports with shared_buffers: buffers from
// shm::communicator::alloc_shared, which every rank maps). From
// policy::shm_shared_min_bytes on, when this rank's `in` and `out` both lie
// in such buffers, no byte goes through the arena either: each rank
// publishes where its buffers lie (buffer id and offset), then
//   reduce my share reading every rank's `in` in place, and write the result
//   into every rank's `out` -> post `drained`, await `drained`.
// Each byte is read once and written once, as by a memcpy. In place is safe:
// only rank r reads or writes share r of any buffer, a piece at a time
// (read, then written). A rank writes into a peer's `out` only after that
// peer entered the call (the round's `copied`), and returns only after
// every rank is done (`drained`). Whether a call runs this way is part of
// its signature: a rank on shared buffers and one on private ones fail
// alike with an error naming both. Reduce-scatter reads block r of every
// `in`; allgather reads every rank's `in` into its block of `out`.
//
// Determinism: every element is reduced as op(...op(x0, x1)..., x(p-1)) in
// rank order, by one rank (large) or identically by all (small), so all ranks
// hold bitwise identical results, the same from run to run, whichever path
// (arena or single copy) a call takes.
#pragma once

#include <unistd.h>

#if defined(__SSE2__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/cross_memory.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../core/reduce.hpp"
#include "../core/timed_choice.hpp"
#include "../exec/host.hpp"
#include "../transport/capabilities.hpp"
#include "verify.hpp"

namespace gradsync::algo::shm_direct {

namespace detail {

enum counter : int { copied = 0, reduced = 1, drained = 2 };

// Which collective a call is (part of its signature).
// (Signatures hold the first four in two bits; small_allreduce only names a
// class of timed store choices.)
// Rooted calls (algo/shm_direct_rooted.hpp) set bit 63 of a signature, with
// broadcast = 0 and reduce = 1 in the two call bits; exchanges
// (algo/alltoall_direct.hpp) bit 63 and 2. `alltoall` only names the
// exchanges' class of timed store choices.)
enum class call : std::uint64_t { allreduce = 0, reduce_scatter = 1, allgather = 2, neighbor = 3, small_allreduce = 4,
                                  broadcast = 5, reduce = 6, alltoall = 7 };
inline const char* call_name(std::uint64_t k) {
  if (k & 8) return (k & 3) == 2 ? "alltoall" : (k & 1) ? "reduce" : "broadcast"; // bit 63: rooted or exchange
  k &= 3; // (bit 62 of a signature: shared buffers)
  return k == 1 ? "reduce_scatter" : k == 2 ? "allgather" : k == 3 ? "neighbor_allreduce" : "allreduce";
}
// Signature bit of a call on shared buffers.
inline constexpr std::uint64_t on_shared = std::uint64_t{1} << 62;

// What a call is, packed so that ranks can compare calls: count (48 bits),
// dtype, operator and collective.
template <element T> std::uint64_t signature(call k, std::size_t count, op_kind o) {
  return (static_cast<std::uint64_t>(count) & ((std::uint64_t{1} << 48) - 1)) |
         static_cast<std::uint64_t>(dtype_traits<T>::id) << 48 | static_cast<std::uint64_t>(o) << 56 |
         static_cast<std::uint64_t>(k) << 60;
}

// The reduction runs on chunks this large (bytes: half of L1), so that all
// p-1 passes over a chunk hit L1.
template <class T> inline constexpr std::size_t chunk_elems = 16384 / sizeof(T);

using exec::combine_wide;

inline std::string describe(std::uint64_t sig) {
  return std::string(call_name(sig >> 60)) + " of count " + std::to_string(sig & ((std::uint64_t{1} << 48) - 1)) +
         ", dtype " + std::to_string((sig >> 48) & 0xff) + ", op " + std::to_string((sig >> 56) & 0xf) +
         ((sig >> 63) ? "" : (sig & on_shared) ? " on shared buffers" : " on private buffers");
}

// The fingerprint (algo/verify.hpp) the running call checks in band, if
// the collective that called us asked for that (detail::run_call), else null.
template <shared_arena C> const call_fingerprint* inband_of(C& c) {
  if constexpr (recorded<C>) return c.calls().inband();
  else return nullptr;
}

// The signature a round publishes: the packed description of the call,
// folded with the call's fingerprint hash when there is one (so the round
// also checks algorithm, root, codec, segment size and sequence number).
inline std::uint64_t signed_as(const call_fingerprint* f, std::uint64_t sig) {
  return f ? gradsync::detail::fnv1a(f->hash(), sig) : sig;
}

// Every rank must run the same call: otherwise fail every rank now (the
// arena rounds would no longer line up). Every rank reads every signature
// after the same `copied`, so all of them see a mismatch. When every rank
// published its fingerprint (note byte 40 set), every rank raises the same
// errc::mismatch (algo/verify.hpp's description of all of them) and none
// needs to abort the others; else the first odd rank is named and the
// group aborted.
template <shared_arena C> void check_signatures(C& c, int h, std::uint64_t mine, const char* name) {
  const int p = c.size();
  int odd = -1;
  for (int q = 0; q < p && odd < 0; ++q)
    if (c.arena_signature(q, h).load(std::memory_order_relaxed) != mine) odd = q;
  if (odd < 0) return;
  std::vector<call_fingerprint> all;
  for (int q = 0; q < p; ++q) {
    const std::byte* note = c.arena_note(q, h);
    if (note[call_fingerprint::wire_bytes] != std::byte{1}) break;
    all.push_back(call_fingerprint::read(note));
  }
  const bool described = static_cast<int>(all.size()) == p &&
      std::any_of(all.begin(), all.end(), [&](const call_fingerprint& f) { return f.hash() != all[0].hash(); });
  if (described) throw error(errc::mismatch, name, c.rank(), -1, algo::verify::describe(all));
  const std::uint64_t theirs = c.arena_signature(odd, h).load(std::memory_order_relaxed);
  const std::string why = "ranks disagree on the call: rank " + std::to_string(c.rank()) + " has " +
                          describe(mine) + ", rank " + std::to_string(odd) + " has " + describe(theirs);
  c.abort(why);
  throw error(call_name(mine >> 60), c.rank(), odd, why);
}

// One arena round shared by every collective here: waits until half e%2 is
// free again, publishes the call's signature (and fingerprint `f`, if any),
// runs `stage_in` (writes this rank's arena), then publishes `copied` and
// waits for every rank's.
template <shared_arena C, class StageIn>
void open_round(C& c, std::uint64_t e, std::uint64_t sig, const char* name, StageIn stage_in,
                const call_fingerprint* f) {
  if (e > 2) c.arena_await(drained, e - 2, name);
  const int h = static_cast<int>(e & 1);
  std::byte* note = c.arena_note(c.rank(), h);
  if (f) f->write(note);
  note[call_fingerprint::wire_bytes] = f ? std::byte{1} : std::byte{0};
  const std::uint64_t signed_sig = signed_as(f, sig);
  c.arena_signature(c.rank(), h).store(signed_sig, std::memory_order_relaxed);
  {
    const scoped_phase phase(trace_of(c), "stage", "transport");
    stage_in();
  }
  c.arena_post(copied, e);
  c.arena_await(copied, e, name);
  check_signatures(c, h, signed_sig, name);
}
template <shared_arena C, class StageIn>
void open_round(C& c, std::uint64_t e, std::uint64_t sig, const char* name, StageIn stage_in) {
  open_round(c, e, sig, name, stage_in, inband_of(c));
}

// Copies n elements with the transport's streaming copy if `stream`, else
// with ordinary stores. Into the arena: as with_stores picks. Results into
// the caller's memory: streaming for outputs of at least
// policy::shm_stream_out_bytes (they would not stay in cache anyway, and
// skip reading lines about to be overwritten).
template <shared_arena C, class T> void put(const C& c, bool stream, T* dst, const T* src, std::size_t n) {
  if (stream) c.arena_copy(reinterpret_cast<std::byte*>(dst), reinterpret_cast<const std::byte*>(src), n * sizeof(T));
  else copy_elems(dst, src, n);
}

// Runs body(stream), stream = whether arena writes use streaming stores, as
// the transport's chooser picks for this collective at this size
// (power-of-two classes), and reports the time the call took (waits for
// peers included: that is what the choice changes).
template <shared_arena C, class Body> void with_stores(C& c, call k, std::size_t bytes, Body body) {
  gradsync::detail::timed_choice& ch = c.arena_stores();
  const std::size_t cls = static_cast<std::size_t>(k) * 64 + static_cast<std::size_t>(std::bit_width(bytes));
  const int w = ch.pick(cls);
  const std::uint64_t t0 = gradsync::detail::timed_choice::ticks();
  body(w == 0);
  ch.record(cls, w, static_cast<double>(gradsync::detail::timed_choice::ticks() - t0));
}

// Half of the arena in bytes (a multiple of the share alignment).
template <shared_arena C> std::size_t half_bytes(const C& c) {
  return c.arena_bytes() / 2 / policy::shm_arena_align * policy::shm_arena_align;
}
// Elements of T an arena half holds: at least one per rank, else the call
// `name` fails.
template <class T, shared_arena C> std::size_t arena_elems(const C& c, const char* name) {
  const std::size_t cap = half_bytes(c) / sizeof(T);
  GRADSYNC_REQUIRE(cap >= static_cast<std::size_t>(c.size()), name, c.rank(), "shm arena too small for this rank count");
  return cap;
}
// Rank q's half e%2 as T.
template <class T, shared_arena C> T* stage(const C& c, int q, std::uint64_t e) {
  return reinterpret_cast<T*>(c.arena(q) + (e & 1) * half_bytes(c));
}
// Largest share <= cap elements for `count` elements over `parts` ranks, a
// multiple of the alignment when it can be.
template <class T> std::size_t share(std::size_t count, std::size_t parts, std::size_t cap) {
  const std::size_t align = std::max<std::size_t>(1, policy::shm_arena_align / sizeof(T));
  const std::size_t per = (count + parts - 1) / parts;
  std::size_t s = std::min(cap / parts, (per + align - 1) / align * align);
  s = std::max<std::size_t>(1, s / align * align);
  return std::min(s, std::max<std::size_t>(1, cap / parts));
}

// acc[0, m) = op over ranks q in order of src(q)[0, m), finalized, handed to
// `sink(acc_offset, acc, len)` an L1-sized piece at a time.
template <element T, reduce_op Op, class Src, class Sink>
void reduce_pieces(int p, std::size_t m, Op op, Src src, Sink sink) {
  for (std::size_t k = 0; k < m; k += chunk_elems<T>) {
    alignas(64) T acc[chunk_elems<T>];
    const std::size_t len = std::min(chunk_elems<T>, m - k);
    combine_wide(acc, src(0) + k, src(1) + k, len, op);
    for (int q = 2; q < p; ++q) combine_wide(acc, static_cast<const T*>(acc), src(q) + k, len, op);
    finalize(acc, len, op, p);
    sink(k, static_cast<const T*>(acc), len);
  }
}

// Share q of `count` elements over the ranks (cache-line multiples).
template <class T> std::size_t share_of(std::size_t count, int p, int q, std::size_t& off) {
  const auto P = static_cast<std::size_t>(p);
  const std::size_t align = std::max<std::size_t>(1, policy::shm_arena_align / sizeof(T));
  const std::size_t sh = ((count + P - 1) / P + align - 1) / align * align;
  off = std::min(count, static_cast<std::size_t>(q) * sh);
  return std::min(sh, count - off);
}

// ---- single copy (cross-memory attach) ------------------------------------

// Whether a call of `bytes` takes the single-copy path: the same answer on
// every rank (single_copy() is agreed when the group forms, and ranks whose
// sizes differ fail on the signature either way).
template <shared_arena C> bool single_copy_for(const C& c, std::size_t bytes) {
  if constexpr (single_copy_arena<C>) return c.single_copy() && bytes >= c.single_copy_min_bytes();
  else return false;
}

// What a rank exposes for one single-copy call, at the start of its arena
// half (written before `copied`, read by peers after awaiting it).
struct exposed {
  std::int64_t pid;
  std::uint64_t in, out; // addresses in that process
};

inline std::uint64_t address(const void* p) { return static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(p)); }

// Opens single-copy round `e`: publishes this rank's buffers and the call's
// signature, waits for every rank's; returns what each rank exposed.
template <shared_arena C>
std::unique_ptr<exposed[]> open_single_copy(C& c, std::uint64_t e, std::uint64_t sig, const char* name, const void* in,
                                            const void* out) {
  const int p = c.size();
  open_round(c, e, sig, name, [&] {
    const exposed mine{static_cast<std::int64_t>(::getpid()), address(in), address(out)};
    std::memcpy(c.arena(c.rank()) + (e & 1) * half_bytes(c), &mine, sizeof mine);
  });
  auto all = std::make_unique<exposed[]>(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) std::memcpy(&all[static_cast<std::size_t>(q)], c.arena(q) + (e & 1) * half_bytes(c), sizeof(exposed));
  return all;
}

// Reads n elements at byte address `remote` of rank q (exposed as x) into
// `local`. A failed read (the peer died or its buffer vanished) aborts the
// group, so that no survivor waits for this rank, and fails this call.
template <shared_arena C, class T>
void fetch(C& c, const exposed& x, int q, T* local, std::uint64_t remote, std::size_t n, const char* name) {
  const int err = cma::read(static_cast<int>(x.pid), local, reinterpret_cast<const void*>(static_cast<std::uintptr_t>(remote)),
                            n * sizeof(T));
  if (err == 0) return;
  error why = cma::read_error(err, name, c.rank(), q, static_cast<int>(x.pid));
  c.abort(why.reason());
  throw why;
}

// Awaits counter `k` of every rank at `e`. A failure that a dead rank caused
// (noticed by the engine, or by a peer that aborted the group) is reported
// as errc::peer_failed naming that rank; anything else as it came.
template <shared_arena C>
void await_peers(C& c, const exposed* x, int k, std::uint64_t e, const char* name) {
  try {
    c.arena_await(k, e, name);
  } catch (const error& ex) {
    for (int q = 0; q < c.size(); ++q)
      if (q != c.rank() && cma::gone(static_cast<int>(x[q].pid), x[q].in))
        throw error(errc::peer_failed, name, c.rank(), q,
                    "rank " + std::to_string(q) + " (pid " + std::to_string(x[q].pid) + ") died: " + ex.reason());
    throw;
  }
}

// out[0, n) = op over ranks q in order of rank q's `in` at element `at`
// (this rank's own part read from `mine`), finalized. Peers' parts come a
// piece at a time into a scratch of policy::shm_single_copy_scratch_bytes
// for all of them together, so the reduction reads them from cache.
template <shared_arena C, element T, reduce_op Op>
void reduce_remote(C& c, const exposed* x, const T* mine, std::size_t at, T* out, std::size_t n, Op op, const char* name) {
  const int p = c.size(), r = c.rank();
  const auto peers = static_cast<std::size_t>(p - 1);
  const std::size_t piece =
      std::max(chunk_elems<T>, policy::shm_single_copy_scratch_bytes / sizeof(T) / peers / chunk_elems<T> * chunk_elems<T>);
  const std::size_t step = std::min(piece, n);
  auto scratch = std::make_unique_for_overwrite<T[]>(step * peers);
  auto slot = [&](int q) { return scratch.get() + static_cast<std::size_t>(q < r ? q : q - 1) * step; };
  const bool stream = n * sizeof(T) >= policy::shm_stream_out_bytes;
  for (std::size_t k = 0; k < n; k += step) {
    const std::size_t m = std::min(step, n - k);
    {
      const scoped_phase phase(trace_of(c), "fetch", "transport");
      for (int q = 0; q < p; ++q)
        if (q != r) fetch(c, x[q], q, slot(q), x[q].in + (at + k) * sizeof(T), m, name);
    }
    const auto phase = element_phase(trace_of(c), "reduce", "compute", m);
    reduce_pieces<T>(
        p, m, op, [&](int q) { return q == r ? mine + k : static_cast<const T*>(slot(q)); },
        [&](std::size_t j, const T* acc, std::size_t len) { put(c, stream, out + k + j, acc, len); });
  }
}

// The final barrier of a single-copy call: nobody returns (and may release
// or rewrite a buffer) while a peer still reads it.
template <shared_arena C> void close_single_copy(C& c, const exposed* x, std::uint64_t e, const char* name) {
  c.arena_post(drained, e);
  await_peers(c, x, drained, e, name);
}

// allreduce() when single_copy_for(): shares of about count/p elements
// (cache-line multiples), each reduced by its rank and read by the others.
template <shared_arena C, element T, reduce_op Op>
void allreduce_single_copy(C& c, const T* in, T* out, std::size_t count, Op op, std::uint64_t sig) {
  const char* name = "allreduce";
  const int p = c.size(), r = c.rank();
  auto part = [&](int q, std::size_t& off) { return share_of<T>(count, p, q, off); };
  const std::uint64_t e = ++c.arena_epoch();
  const auto x = open_single_copy(c, e, sig, name, in, out);
  std::size_t off;
  const std::size_t n = part(r, off);
  reduce_remote(c, x.get(), in + off, off, out + off, n, op, name);
  c.arena_post(reduced, e);
  await_peers(c, x.get(), reduced, e, name);
  {
    const scoped_phase phase(trace_of(c), "fetch", "transport");
    for (int q = 0; q < p; ++q)
      if (q != r)
        if (const std::size_t m = part(q, off)) fetch(c, x[q], q, out + off, x[q].out + off * sizeof(T), m, name);
  }
  close_single_copy(c, x.get(), e, name);
}

// One rank, or nothing to reduce: out = in (avg divides by 1). Returns
// whether that was all.
template <element T, reduce_op Op> bool alone(int p, const T* in, T* out, std::size_t n, Op op) {
  if (p != 1 && n != 0) return false;
  copy_elems(out, in, n);
  finalize(out, n, op, p);
  return true;
}

// ---- shared buffers --------------------------------------------------------

// Where a rank's buffers lie for a call on shared buffers (written at the
// start of its arena half before `copied`, read by peers after it).
struct exposed_shared {
  std::uint64_t in_id, in_off, out_id, out_off;
};

// Whether a call of `bytes` (all ranks' data) on `in` (in_bytes) and `out`
// (out_bytes) runs on shared buffers; if so, fills `x`.
template <shared_arena C>
bool shared_for(const C& c, std::size_t bytes, const void* in, std::size_t in_bytes, const void* out,
                std::size_t out_bytes, exposed_shared& x) {
  if constexpr (shared_buffers<C>) {
    if (bytes < policy::shm_shared_min_bytes) return false;
    const auto a = c.find_shared(in, in_bytes);
    const auto b = a ? c.find_shared(out, out_bytes) : decltype(a){};
    if (!b) return false;
    x = {a->id, a->offset, b->id, b->offset};
    return true;
  } else {
    (void)c, (void)bytes, (void)in, (void)in_bytes, (void)out, (void)out_bytes, (void)x;
    return false;
  }
}

// Every rank's `in` and `out` of a call on shared buffers, mapped here.
struct peer_buffers {
  std::vector<const std::byte*> in;
  std::vector<std::byte*> out;
};

// Opens round `e` of a call on shared buffers: publishes `mine` and the
// signature, waits for every rank's, and resolves where each rank's buffers
// are mapped here (a buffer this rank does not have fails every rank).
template <shared_arena C>
peer_buffers open_shared(C& c, std::uint64_t e, std::uint64_t sig, const char* name, const exposed_shared& mine,
                         std::size_t in_bytes, std::size_t out_bytes) {
  const int p = c.size(), r = c.rank();
  open_round(c, e, sig, name, [&] { std::memcpy(c.arena(r) + (e & 1) * half_bytes(c), &mine, sizeof mine); });
  peer_buffers b{std::vector<const std::byte*>(static_cast<std::size_t>(p)), std::vector<std::byte*>(static_cast<std::size_t>(p))};
  if constexpr (shared_buffers<C>) {
    for (int q = 0; q < p; ++q) {
      exposed_shared x;
      std::memcpy(&x, c.arena(q) + (e & 1) * half_bytes(c), sizeof x);
      const auto Q = static_cast<std::size_t>(q);
      b.in[Q] = c.shared_at(q, x.in_id, x.in_off, in_bytes);
      b.out[Q] = c.shared_at(q, x.out_id, x.out_off, out_bytes);
      if (!b.in[Q] || !b.out[Q]) {
        const std::string why = "rank " + std::to_string(q) + "'s buffers lie in shared buffers " +
                                std::to_string(x.in_id) + "/" + std::to_string(x.out_id) + " that rank " +
                                std::to_string(r) + " has not mapped (freed, or from another communicator)";
        c.abort(why);
        throw error(errc::mismatch, name, r, q, why);
      }
    }
  }
  return b;
}

// The final barrier of a call on shared buffers: nobody returns (and may
// reuse a buffer) while a peer still reads or writes it.
template <shared_arena C> void close_shared(C& c, std::uint64_t e, const char* name) {
  c.arena_post(drained, e);
  c.arena_await(drained, e, name);
}

// dst[d][i] = finished op over q in rank order of src[q][i], for each of
// the `k` destinations, in one pass over 64-byte lines: 16-byte GCC vector
// types (which compute exactly what combine1 does for types reduced in their
// own precision) and SSE2 streaming stores. Fusing matters: reducing a chunk
// into a buffer and then stream-copying it to each destination ran at
// 5-6 GB/s (64 MiB, 2 ranks, shared buffers), this at 8-12 (AVX2 stores:
// 11-14, not worth a second clone). Returns how many leading elements it did
// (0 when T is not such a type or a destination is not 16-byte aligned).
template <element T, reduce_op Op>
std::size_t reduce_stream_lines(int p, const T* const* src, T* const* dst, int k, std::size_t n, Op op) {
#if defined(__GNUC__) && defined(__SSE2__) && !defined(__CUDACC__)
  if constexpr (std::is_same_v<T, accum_t<T>> && std::is_arithmetic_v<T>) {
    for (int d = 0; d < k; ++d)
      if (reinterpret_cast<std::uintptr_t>(dst[d]) % 16 != 0) return 0;
    using vec [[gnu::vector_size(16)]] = T;
    constexpr std::size_t w = 16 / sizeof(T);
    [[maybe_unused]] const T ranks = static_cast<T>(p);
    std::size_t i = 0;
    for (; i + 4 * w <= n; i += 4 * w) {
      vec v[4];
      std::memcpy(v, src[0] + i, sizeof v);
      for (int q = 1; q < p; ++q) {
        vec u[4];
        std::memcpy(u, src[q] + i, sizeof u);
        for (int h = 0; h < 4; ++h) v[h] = op(v[h], u[h]);
      }
      if constexpr (Op::kind == op_kind::avg)
        for (auto& x : v) x = x / ranks;
      for (int d = 0; d < k; ++d)
        for (int h = 0; h < 4; ++h) {
          __m128i bits;
          std::memcpy(&bits, &v[h], 16);
          _mm_stream_si128(reinterpret_cast<__m128i*>(dst[d] + i + static_cast<std::size_t>(h) * w), bits);
        }
    }
    _mm_sfence();
    return i;
  }
#endif
  (void)p, (void)src, (void)dst, (void)k, (void)n, (void)op;
  return 0;
}

// reduce_stream_lines, then the rest the way every other path reduces
// (reduce_pieces), into every destination.
template <shared_arena C, element T, reduce_op Op>
void reduce_to_all(const C& c, int p, const T* const* src, T* const* dst, int k, std::size_t n, Op op) {
  const std::size_t done = reduce_stream_lines(p, src, dst, k, n, op);
  reduce_pieces<T>(
      p, n - done, op, [&](int q) { return src[q] + done; },
      [&](std::size_t j, const T* acc, std::size_t len) {
        for (int d = 0; d < k; ++d) put(c, n * sizeof(T) >= policy::shm_stream_out_bytes, dst[d] + done + j, acc, len);
      });
}

// allreduce() on shared buffers: share r reduced from every rank's `in`,
// written into every rank's `out`.
template <shared_arena C, element T, reduce_op Op>
void allreduce_shared(C& c, const T* in, std::size_t count, Op op, std::uint64_t sig, const exposed_shared& x) {
  const char* name = "allreduce";
  const int p = c.size(), r = c.rank();
  const std::uint64_t e = ++c.arena_epoch();
  const peer_buffers b = open_shared(c, e, sig | on_shared, name, x, count * sizeof(T), count * sizeof(T));
  std::size_t off;
  const std::size_t n = share_of<T>(count, p, r, off);
  std::vector<const T*> src(static_cast<std::size_t>(p));
  std::vector<T*> dst(static_cast<std::size_t>(p));
  for (int q = 0; q < p; ++q) {
    const auto Q = static_cast<std::size_t>(q);
    src[Q] = q == r ? in + off : reinterpret_cast<const T*>(b.in[Q]) + off;
    dst[Q] = reinterpret_cast<T*>(b.out[Q]) + off;
  }
  {
    const auto phase = element_phase(trace_of(c), "reduce", "compute", n);
    reduce_to_all(c, p, src.data(), dst.data(), p, n, op);
  }
  close_shared(c, e, name);
}

} // namespace detail

/// Call agreement through the arena (see algo/verify.hpp): one round in
/// which every rank publishes fingerprint `f` and reads every other's, the
/// synchronisation of a small direct allreduce without its data. Every rank
/// of `c` must call it (or a direct collective carrying `f` in band, whose
/// first round meets this one). Throws the same errc::mismatch, raised by
/// `name`, on every rank when the fingerprints differ.
template <shared_arena C> void agree(C& c, const call_fingerprint& f, const char* name) {
  if (c.size() <= 1) return;
  const std::uint64_t e = ++c.arena_epoch();
  detail::open_round(c, e, 0, name, [] {}, &f);
  c.arena_post(detail::drained, e);
}

/// Allreduce of `count` elements from `in` into `out` (may be equal) through
/// the arena. Every rank must call it with the same count, type and operator
/// (checked: a mismatch fails every rank with an error naming both calls).
template <shared_arena C, element T, reduce_op Op>
void allreduce(C& c, const T* in, T* out, std::size_t count, Op op) {
  using namespace detail;
  const int p = c.size(), r = c.rank();
  if (alone(p, in, out, count, op)) return;
  const char* name = "allreduce";
  const std::size_t cap = arena_elems<T>(c, name);
  const std::uint64_t sig = signature<T>(call::allreduce, count, Op::kind);
  if (exposed_shared x; shared_for(c, count * sizeof(T), in, count * sizeof(T), out, count * sizeof(T), x))
    return allreduce_shared(c, in, count, op, sig, x);
  if (single_copy_for(c, count * sizeof(T))) return allreduce_single_copy(c, in, out, count, op, sig);
  std::uint64_t& epoch = c.arena_epoch();

  if (count * sizeof(T) <= policy::shm_direct_small_bytes && count <= cap) {
    const std::uint64_t e = ++epoch;
    // The peers read these few lines at once, from this core's cache if it
    // shares one with theirs (ordinary stores; streaming ones would send the
    // lines to memory first: 512 B 0.31 us instead of 1.23 on the CI VM), else
    // from memory (streaming stores, which skip fetching the lines back).
    // Everyone reduces everything, in rank order, from the staged copies,
    // but its own part from `in` unless `in` is `out` and would be
    // overwritten before the pass that reads it. Copies written with
    // streaming stores are in memory: one bulk copy into this core's cache
    // first, then the reduction (2 ranks, 2 / 8 KiB, cores sharing no cache:
    // 1.7-2.0 / 3.4-4.0 us -> 1.2-1.4 / 2.5-3.1, now below rd's 1.8 / 2.9;
    // sharing one: 1.23 / 3.2 -> 0.86 / 2.3. Slower for copies in the peers'
    // caches, so not with ordinary stores.)
    const bool own_from_in = in != out || r <= 1;
    auto run = [&](bool streamed) {
      open_round(c, e, sig, name, [&] { put(c, streamed, stage<T>(c, r, e), in, count); });
      alignas(64) T near[2][policy::shm_direct_small_bytes / sizeof(T)]; // the first pass reads two
      unsigned used = 0;
      auto src = [&](int q) {
        if (q == r && own_from_in) return in;
        const T* s = stage<T>(c, q, e);
        if (!streamed || q == r) return s;
        T* d = near[used++ & 1];
        std::memcpy(d, s, count * sizeof(T));
        return static_cast<const T*>(d);
      };
      {
        const auto phase = element_phase(trace_of(c), "reduce", "compute", count);
        combine_wide(out, src(0), src(1), count, op);
        for (int q = 2; q < p; ++q) combine_wide(out, static_cast<const T*>(out), src(q), count, op);
        finalize(out, count, op, p);
      }
      c.arena_post(drained, e);
    };
    // (Below a few lines both ways are the same stores: no timing.)
    if (count * sizeof(T) < policy::shm_timed_stores_min_bytes) run(false);
    else with_stores(c, call::small_allreduce, count * sizeof(T), run);
    return;
  }

  // Rounds of p shares of `sh` elements (the last round's clipped).
  const auto P = static_cast<std::size_t>(p);
  const std::size_t sh = share<T>(count, P, std::min(cap, std::max(P, policy::shm_allreduce_round_bytes / sizeof(T))));
  auto part = [&](std::size_t base, int q, std::size_t& off) {
    off = base + static_cast<std::size_t>(q) * sh;
    return off >= count ? std::size_t{0} : std::min(sh, count - off);
  };
  const bool stream = count * sizeof(T) >= policy::shm_stream_out_bytes;
  std::vector<const T*> srcs(P);
  with_stores(c, call::allreduce, count * sizeof(T), [&](bool streamed) {
    for (std::size_t base = 0; base < count; base += sh * P) {
      const std::uint64_t e = ++epoch;
      T* mine = stage<T>(c, r, e);
      std::size_t off;
      open_round(c, e, sig, name, [&] {
        for (int q = 0; q < p; ++q)
          if (q != r)
            if (const std::size_t n = part(base, q, off)) put(c, streamed, mine + (off - base), in + off, n);
      });
      // My share: into `out` and into my arena, where the peers read it. (In
      // place, each piece of my share of `in` is read before it is overwritten.)
      const std::size_t n = part(base, r, off);
      auto src = [&](int q) { return q == r ? in + off : static_cast<const T*>(stage<T>(c, q, e) + (off - base)); };
      {
        const auto reducing = element_phase(trace_of(c), "reduce", "compute", n);
        if (streamed && stream) { // both stores streaming: one fused pass (see reduce_stream_lines)
          for (int q = 0; q < p; ++q) srcs[static_cast<std::size_t>(q)] = src(q);
          T* const dst[2] = {out + off, mine + (off - base)};
          reduce_to_all(c, p, srcs.data(), dst, 2, n, op);
        } else {
          reduce_pieces<T>(p, n, op, src, [&](std::size_t k, const T* acc, std::size_t len) {
            put(c, stream, out + off + k, acc, len);
            put(c, streamed, mine + (off - base) + k, acc, len);
          });
        }
      }
      c.arena_post(reduced, e);

      c.arena_await(reduced, e, name);
      {
        const scoped_phase phase(trace_of(c), "copy_out", "transport");
        for (int q = 0; q < p; ++q)
          if (q != r)
            if (const std::size_t m = part(base, q, off))
              put(c, stream, out + off, static_cast<const T*>(stage<T>(c, q, e) + (off - base)), m);
      }
      c.arena_post(drained, e);
    }
  });
}

/// One gossip combine through the arena (gossip/neighbor_allreduce.hpp on
/// transports with one): every rank stages its `x` once, then updates it
/// with `combine(x_piece, peers, len)`, where peers[k] is in-neighbour
/// in[k]'s staged copy of the same piece, read in place. No messages: per
/// rank one copy in and one combining pass, where a message exchange adds a
/// copy out and a copy in per neighbour (np=4 one-peer rounds, 4 MiB:
/// docs/benchmarks.md). Rounds of an arena half; every rank of the group
/// calls it with the same count (checked, as every call here).
template <shared_arena C, element T, class Combine>
void neighbor_combine(C& c, T* x, std::size_t count, std::span<const int> in, Combine combine) {
  using namespace detail;
  const char* name = "neighbor_allreduce";
  if (count == 0) return;
  const int r = c.rank();
  const std::size_t cap = arena_elems<T>(c, name);
  const std::uint64_t sig = signature<T>(call::neighbor, count, op_kind::sum);
  std::vector<const T*> peers(in.size());
  std::uint64_t& epoch = c.arena_epoch();
  with_stores(c, call::neighbor, count * sizeof(T), [&](bool streamed) {
    for (std::size_t k = 0; k < count; k += cap) {
      const std::uint64_t e = ++epoch;
      const std::size_t m = std::min(cap, count - k);
      open_round(c, e, sig, name, [&] { put(c, streamed, stage<T>(c, r, e), x + k, m); });
      for (std::size_t j = 0; j < in.size(); ++j) peers[j] = stage<T>(c, in[j], e);
      {
        const auto phase = element_phase(trace_of(c), "reduce", "compute", m);
        combine(x + k, static_cast<const T* const*>(peers.data()), m);
      }
      c.arena_post(drained, e);
    }
  });
}

/// Reduce-scatter through the arena: `in` holds size() blocks of `n`
/// elements; block r of the reduction (in rank order, like allreduce) goes to
/// `out` on rank r, which may alias block r of `in`. One synchronisation per
/// round instead of p-1 ring steps.
template <shared_arena C, element T, reduce_op Op>
void reduce_scatter(C& c, const T* in, T* out, std::size_t n, Op op) {
  using namespace detail;
  const char* name = "reduce_scatter";
  const int p = c.size(), r = c.rank();
  if (alone(p, in, out, n, op)) return;
  const auto P = static_cast<std::size_t>(p), R = static_cast<std::size_t>(r);
  const std::size_t cap = arena_elems<T>(c, name);
  const std::uint64_t sig = signature<T>(call::reduce_scatter, n, Op::kind);
  const std::size_t sh = share<T>(n * P, P, cap); // piece of every block per round
  std::uint64_t& epoch = c.arena_epoch();
  if (exposed_shared x; shared_for(c, n * P * sizeof(T), in, n * P * sizeof(T), out, n * sizeof(T), x)) {
    const std::uint64_t e = ++epoch; // block r of every rank's `in`, in place
    const peer_buffers b = open_shared(c, e, sig | on_shared, name, x, n * P * sizeof(T), n * sizeof(T));
    std::vector<const T*> src(P);
    for (std::size_t q = 0; q < P; ++q) src[q] = q == R ? in + R * n : reinterpret_cast<const T*>(b.in[q]) + R * n;
    {
      const auto phase = element_phase(trace_of(c), "reduce", "compute", n);
      reduce_to_all(c, p, src.data(), &out, 1, n, op);
    }
    return close_shared(c, e, name);
  }
  if (single_copy_for(c, n * P * sizeof(T))) { // block r from every rank's `in`, straight into `out`
    const std::uint64_t e = ++epoch;
    const auto x = open_single_copy(c, e, sig, name, in, out);
    reduce_remote(c, x.get(), in + R * n, R * n, out, n, op, name);
    return close_single_copy(c, x.get(), e, name);
  }
  const bool stream = n * P * sizeof(T) >= policy::shm_stream_out_bytes;
  with_stores(c, call::reduce_scatter, n * P * sizeof(T), [&](bool streamed) {
    for (std::size_t k = 0; k < n; k += sh) {
      const std::uint64_t e = ++epoch;
      const std::size_t m = std::min(sh, n - k);
      T* mine = stage<T>(c, r, e);
      open_round(c, e, sig, name, [&] {
        for (std::size_t q = 0; q < P; ++q)
          if (q != R) put(c, streamed, mine + q * sh, in + q * n + k, m);
      });
      {
        const auto phase = element_phase(trace_of(c), "reduce", "compute", m);
        reduce_pieces<T>(
            p, m, op,
            [&](int q) { return q == r ? in + R * n + k : static_cast<const T*>(stage<T>(c, q, e) + R * sh); },
            [&](std::size_t j, const T* acc, std::size_t len) { put(c, stream, out + k + j, acc, len); });
      }
      c.arena_post(drained, e);
    }
  });
}

/// Allgather through the arena: rank q's `n` elements of `in` land in block q
/// of `out` (size() blocks) on every rank; `in` may alias block r of `out`.
template <shared_arena C, element T> void allgather(C& c, const T* in, T* out, std::size_t n) {
  const int p = c.size(), r = c.rank();
  const auto R = static_cast<std::size_t>(r);
  if (p == 1 || n == 0) {
    copy_elems(out + R * n, in, n);
    return;
  }
  using namespace detail;
  const char* name = "allgather";
  const std::size_t cap = half_bytes(c) / sizeof(T);
  const std::uint64_t sig = signature<T>(call::allgather, n, op_kind::sum);
  const bool stream = n * static_cast<std::size_t>(p) * sizeof(T) >= policy::shm_stream_out_bytes;
  std::uint64_t& epoch = c.arena_epoch();
  if (exposed_shared x; shared_for(c, n * static_cast<std::size_t>(p) * sizeof(T), in, n * sizeof(T), out,
                                   n * static_cast<std::size_t>(p) * sizeof(T), x)) {
    const std::uint64_t e = ++epoch; // every rank's `in` in place, into its block of `out`
    const peer_buffers b = open_shared(c, e, sig | on_shared, name, x, n * sizeof(T), n * static_cast<std::size_t>(p) * sizeof(T));
    {
      const scoped_phase phase(trace_of(c), "copy_out", "transport");
      for (int q = 0; q < p; ++q)
        put(c, stream, out + static_cast<std::size_t>(q) * n, reinterpret_cast<const T*>(b.in[static_cast<std::size_t>(q)]), n);
    }
    return close_shared(c, e, name);
  }
  copy_elems(out + R * n, in, n);
  if (single_copy_for(c, n * static_cast<std::size_t>(p) * sizeof(T))) { // every block straight from its owner's `in`
    const std::uint64_t e = ++epoch;
    const auto x = open_single_copy(c, e, sig, name, in, out);
    {
      const scoped_phase phase(trace_of(c), "fetch", "transport");
      for (int q = 0; q < p; ++q)
        if (q != r) fetch(c, x[q], q, out + static_cast<std::size_t>(q) * n, x[q].in, n, name);
    }
    return close_single_copy(c, x.get(), e, name);
  }
  with_stores(c, call::allgather, n * static_cast<std::size_t>(p) * sizeof(T), [&](bool streamed) {
    for (std::size_t k = 0; k < n; k += cap) {
      const std::uint64_t e = ++epoch;
      const std::size_t m = std::min(cap, n - k);
      open_round(c, e, sig, name, [&] { put(c, streamed, stage<T>(c, r, e), in + k, m); });
      {
        const scoped_phase phase(trace_of(c), "copy_out", "transport");
        for (int q = 0; q < p; ++q)
          if (q != r) put(c, stream, out + static_cast<std::size_t>(q) * n + k, static_cast<const T*>(stage<T>(c, q, e)), m);
      }
      c.arena_post(drained, e);
    }
  });
}

} // namespace gradsync::algo::shm_direct
