// gradsync: the shared-memory transport's segment layout (see
// transport/shm.hpp): the header, per-rank slots, the frames of the byte
// rings, the ring control lines and each rank's collective-arena control
// block, and where each lies in the segment.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../../core/policy.hpp"

namespace gradsync::shm::detail {

inline constexpr std::uint64_t magic = 0x6772616473796e04ull; // "gradsyn" + layout version 4
inline constexpr std::size_t cell = 64;          // frame granularity (one cache line)
inline constexpr std::size_t inline_bytes = 32;  // payload carried inside a header cell
inline constexpr std::size_t page = 4096;

inline constexpr std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Frames. `first` opens a message (and carries it entirely if it is small),
// `more` continues the open message, `ack`/`nack` answer a message's `seq`.
// Messages above policy::shm_eager_bytes go by rendezvous: `rts` announces
// one (a header cell, no payload); once the receiver matched it and acked,
// its payload follows in `data` frames that name it by `seq` (they may
// interleave with other messages' frames); `stop` (receiver -> sender) says
// a matched receive was withdrawn, so the rest of that payload is not sent.
enum kind : std::uint32_t { first = 1, more = 2, ack = 3, nack = 4, rts = 5, data = 6, stop = 7 };

struct frame {
  std::uint32_t kind;
  std::int32_t tag;
  std::uint64_t seq;
  std::uint64_t total; // message size; for nack: the size the receiver posted
  std::uint32_t len;   // payload bytes in this frame
  std::uint32_t flags; // nack: upto_receive when the receive took up to `total`
  std::byte payload[inline_bytes]; // used when total <= inline_bytes
};
static_assert(sizeof(frame) == cell);
inline constexpr std::uint32_t upto_receive = 1;

// Bytes a frame occupies in the ring.
inline std::size_t frame_span(std::uint64_t total, std::size_t len) {
  return total <= inline_bytes ? cell : cell + round_up(len, cell);
}
// Whether a message of `total` bytes goes by rendezvous (rts, ack, data).
inline constexpr bool rendezvous(std::uint64_t total) { return total > policy::shm_eager_bytes; }

using a32 = std::atomic<std::uint32_t>;
using a64 = std::atomic<std::uint64_t>;
static_assert(a32::is_always_lock_free && a64::is_always_lock_free &&
              sizeof(a32) == sizeof(std::uint32_t));

// Per-rank shared state.
struct rank_slot {
  alignas(cell) std::atomic<std::int32_t> pid{0};
  a32 state{0}; // 0 not attached, 1 attached, 2 left
  // Single copy (core/cross_memory.hpp, agreed in arena.hpp): where this
  // process keeps cma::probe_word (published before it counts as attached),
  // and the smallest call it will read in place (cma::never: it cannot or
  // will not), published before it posts counter `joined`.
  a64 probe_word{0};
  a64 single_copy_min{0};
  alignas(cell) a32 bell{0};     // futex word: bumped to wake this rank
  a32 sleeping{0};               // this rank may be blocked on `bell`
};
enum : std::uint32_t { absent = 0, attached = 1, left = 2 };

struct header {
  std::uint64_t magic;
  std::int32_t size;
  std::int32_t creator_pid;
  std::uint64_t ring_bytes;
  std::uint64_t arena_bytes;
  std::uint64_t total_bytes;
  alignas(cell) std::atomic<std::int32_t> attached{0};
  a32 unlinked{0};
  a32 ready{0};
  alignas(cell) a32 aborted{0}; // 0 no, 1 reason being written, 2 reason valid
  std::uint32_t abort_kind;     // a gradsync::errc, valid with the reason
  char reason[476];
};

struct ring_ctl {
  alignas(cell) a64 tail{0}; // written by the producer only
  alignas(cell) a64 head{0}; // written by the consumer only
};

// Progress counters and call signatures of one rank's collective arena.
inline constexpr int arena_counters = 4;
inline constexpr std::size_t arena_note_bytes = 64; // a call's fingerprint (algo/verify.hpp) and room to spare
struct arena_ctl {
  struct alignas(cell) line { a64 v{0}; };
  line counter[arena_counters]; // written by the owner only, monotonic
  alignas(cell) a64 sig[2]{};     // per arena half: what the current call is
  // Per arena half: the call's full fingerprint when sig is its hash, written
  // by the owner before it posts `copied` (read by peers after awaiting it).
  alignas(cell) std::byte note[2][arena_note_bytes]{};
};

struct layout {
  std::size_t ranks_off, chans_off, chan_stride, arenas_off, arena_stride, total;
  layout(int p, std::size_t ring, std::size_t arena) {
    const auto P = static_cast<std::size_t>(p);
    ranks_off = round_up(sizeof(header), page);
    chans_off = ranks_off + round_up(sizeof(rank_slot) * P, page);
    chan_stride = page + ring; // control lines, then page-aligned data
    arenas_off = chans_off + chan_stride * P * P;
    arena_stride = round_up(sizeof(arena_ctl), page) + arena;
    total = arenas_off + arena_stride * P;
  }
};

/// Ring bytes per ordered pair for `p` ranks: policy::shm_ring_bytes while the
/// p*p rings fit policy::shm_rings_budget, smaller (a power of two, at least
/// policy::shm_min_ring_bytes) beyond.
inline std::size_t ring_bytes_for(int p) {
  const auto pairs = static_cast<std::size_t>(p) * static_cast<std::size_t>(p);
  std::size_t ring = policy::shm_ring_bytes;
  while (ring > policy::shm_min_ring_bytes && ring * pairs > policy::shm_rings_budget) ring /= 2;
  return ring;
}

} // namespace gradsync::shm::detail
