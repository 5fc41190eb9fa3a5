// gradsync: the optional capabilities of a transport, each a named concept
// refining the base `transport` (transport.hpp). Algorithms and collectives
// test these instead of a transport's name; every transport states next to
// its definition which ones it models (static_asserts), so a change that
// drops one fails to compile where the transport is defined.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>
#include <string>
#include <utility>

#include "../core/call_record.hpp"
#include "../core/error.hpp"
#include "../core/timed_choice.hpp"
#include "../core/timeline.hpp"
#include "transport.hpp"

namespace gradsync {

/// A completion that also reports how many bytes arrived: `received()` is
/// valid once wait() returned or test() returned true.
template <class R>
concept sized_completion = completion<R> && requires(const R& r) {
  { r.received() } -> std::convertible_to<std::size_t>;
};

/// A transport that can receive a message of any size up to a capacity:
/// `irecv_upto(capacity, peer, tag)` matches like irecv (FIFO per pair and
/// tag, mixed freely with exact receives) and accepts 0..capacity.size()
/// bytes; a larger message fails with errc::mismatch naming both sizes (on
/// both sides where the transport can tell the sender).
template <class C>
concept upto_receiver = transport<C> && requires(C& c, std::span<std::byte> d, int peer, int tag) {
  { c.irecv_upto(d, peer, tag) } -> sized_completion;
};

/// A transport that can send synchronously: `issend(data, peer, tag)`
/// matches like isend, but completes only once the receiver has taken the
/// message (MPI_Issend), where an isend of a few KiB may complete as soon as
/// the transport buffered it (MPI's eager protocol). A rank that sends to
/// several peers in turn (algo/schedule.hpp send_in_turn) needs it: buffered
/// sends made one after another all cross its link at once.
template <class C>
concept synchronous_sender = transport<C> && requires(C& c, std::span<const std::byte> s, int peer, int tag) {
  { c.issend(s, peer, tag) } -> completion;
};

/// A transport that knows which node (host) each rank runs on: node_of(r);
/// hierarchical schedules group ranks by it.
template <class C>
concept node_map = transport<C> && requires(const C& c, int r) {
  { c.node_of(r) } -> std::convertible_to<int>;
};

/// The former name of node_map (algo code uses it).
template <class C>
concept node_aware = node_map<C>;

/// A transport whose ranks share memory through a collective arena (the
/// low-level interface of algo/shm_direct.hpp): per-rank staging only its
/// owner writes, monotonic progress counters, per-half call signatures.
template <class C>
concept shared_arena = transport<C> && requires(C& c, int q, int k, std::uint64_t v) {
  { c.arena(q) } -> std::same_as<std::byte*>;
  { c.arena_bytes() } -> std::convertible_to<std::size_t>;
  c.arena_post(k, v);
  c.arena_await(k, v, "");
  { c.arena_epoch() } -> std::same_as<std::uint64_t&>;
  { c.arena_signature(q, k) } -> std::same_as<std::atomic<std::uint64_t>&>;
  { c.arena_note(q, k) } -> std::same_as<std::byte*>;
  c.arena_copy(static_cast<std::byte*>(nullptr), static_cast<const std::byte*>(nullptr), std::size_t{0});
  { c.arena_stores() } -> std::same_as<gradsync::detail::timed_choice&>;
  c.abort(std::string());
};

/// A shared arena whose ranks can also read each other's private memory
/// (cross-memory attach): single_copy() says whether they can, and
/// single_copy_min_bytes() from which call size on algo/shm_direct.hpp does;
/// both are the same on every rank.
template <class C>
concept single_copy_arena = shared_arena<C> && requires(const C& c) {
  { c.single_copy() } -> std::convertible_to<bool>;
  { c.single_copy_min_bytes() } -> std::convertible_to<std::uint64_t>;
};

/// A shared arena whose ranks can also map buffers every rank allocated
/// together (shm::communicator::alloc_shared): find_shared(p, n) says where
/// this rank's range lies in one (an id and offset, the same for that
/// buffer on every rank), shared_at(q, id, offset, n) where rank q's part
/// of it is mapped here (nullptr when it is not).
template <class C>
concept shared_buffers = shared_arena<C> && requires(const C& c, const void* p, std::size_t n, int q, std::uint64_t id) {
  { c.find_shared(p, n)->offset } -> std::convertible_to<std::size_t>;
  { c.find_shared(p, n)->id } -> std::convertible_to<std::uint64_t>;
  { c.shared_at(q, id, n, n) } -> std::same_as<std::byte*>;
};

/// A rank's entry in a record board (record_board): which call it was, and
/// whether every rank had posted when this one did (it arrived last).
struct board_ticket {
  void* where = nullptr;   ///< the transport's board slot set
  std::uint64_t call = 0;  ///< this rank's call number on the tag, from 1
  std::size_t bytes = 0;   ///< record size
  int tag = 0;
  bool complete = false;   ///< all ranks had posted: collect() needs no wait
};

/// The largest record a board carries.
inline constexpr std::size_t board_record_bytes = 64;

/// A transport whose ranks share one address space and exchange a small
/// record per call without a message. board_post(tag, mine, name) publishes
/// this rank's record (at most board_record_bytes, the same size on every
/// rank) for its next call on `tag` (calls on one tag are numbered like
/// messages) and returns at once; board_collect(ticket, all, wait, name)
/// copies every rank's record of that call into `all` (size() x record
/// bytes, rank order) and returns true once all have posted, or false at
/// once when `wait` is false and some have not. A wait is bounded by the
/// timeout (errc::timeout naming the ranks that did not post) and woken by
/// abort. The call check (algo/verify.hpp) posts before the schedule and
/// collects after it: the schedule's own messages are the synchronisation.
template <class C>
concept record_board = transport<C> && requires(C& c, int tag, std::span<const std::byte> mine,
                                                std::span<std::byte> all, const board_ticket& t, const char* name) {
  { c.board_post(tag, mine, name) } -> std::same_as<board_ticket>;
  { c.board_collect(t, all, true, name) } -> std::same_as<bool>;
};

/// A transport that runs a call's agreement check itself (MPI), driven by
/// collectives.hpp's run_call. check_begin(hash, seq, tag, framed) starts
/// the check of this thread's call (`hash`: the fingerprint's hash,
/// algo/verify.hpp; `seq`: its sequence number; `tag`: the call's first
/// agreement tag, three in all) and returns 1, or 0 when this thread's call
/// is already checked (a call a schedule makes of its own: covered), or -1
/// when another thread's is (this call then checks alone, by
/// algo/verify.hpp's round); check_end() ends a started check. Framed, every
/// message this thread sends or receives until then carries its sender's
/// hash (8 bytes before the payload); a message with another hash, of
/// another size, or on the agreement tags (a rank in another call) marks
/// the call disagreed and fails the wait (errc::mismatch); check_agreed()
/// says after the schedule that nothing did (for schedules that carry every
/// rank's messages to every rank, each rank's causal past holds every rank,
/// so every hop's equal hashes make all equal). Not framed, check_round()
/// runs a round of its own (ceil(log2 p) steps of 16 bytes) and returns
/// whether all agree. On any disagreement, check_fingerprints(mine)
/// exchanges the fingerprints' wire forms: every rank gets there, and all
/// get every rank's (rank order).
template <class C>
concept inband_checked = transport<C> && requires(C& c, std::uint64_t h, std::span<const std::byte> w, int tag) {
  { c.check_begin(h, h, tag, true) } -> std::same_as<int>;
  c.check_end();
  { c.check_agreed() } -> std::same_as<bool>;
  { c.check_round() } -> std::same_as<bool>;
  { c.check_disagreed() } -> std::same_as<bool>;
  { c.check_fingerprints(w) } -> std::same_as<std::vector<std::byte>>;
};

/// A transport on which any rank can call abort(reason), from any thread:
/// every pending and later operation of every rank of the group fails with
/// errc::aborted instead of blocking (a blocked wait is woken, not left to
/// time out). MPI's reaches this rank only (peers time out: see
/// mpi::communicator::abort).
template <class C>
concept abortable = transport<C> && requires(C& c, const std::string& why) { c.abort(why); };

/// A transport whose waits give up after a timeout the caller can set:
/// timeout() / set_timeout(ms), per communicator. A wait that exceeds it
/// fails with errc::timeout.
template <class C>
concept timed = transport<C> && requires(C& c, std::chrono::milliseconds t) {
  { std::as_const(c).timeout() } -> std::convertible_to<std::chrono::milliseconds>;
  c.set_timeout(t);
};

/// A transport with its own clock: wtime() is seconds on the clock its
/// messages take time by. MPI's is MPI_Wtime, which under SimGrid SMPI is
/// the simulated time (std::chrono keeps the host's, which a simulation does
/// not advance), so calibration measures a simulated platform as it does a
/// real one.
template <class C>
concept clocked = transport<C> && requires(const C& c) {
  { c.wtime() } -> std::convertible_to<double>;
};

/// Whether c's clock gives the same time to the same work every time (a
/// simulator's: `wtime_repeats()` where the transport has it), so one timed
/// repetition measures what many would. Calibration then times each step
/// once: at 1024 simulated ranks its 20 repetitions took most of a run.
template <transport C> bool clock_repeats(const C& c) {
  if constexpr (requires { { c.wtime_repeats() } -> std::convertible_to<bool>; }) return c.wtime_repeats();
  else return false;
}

/// Seconds on c's clock: its wtime() where it is `clocked`, else the steady clock.
template <transport C> double seconds_now(const C& c) {
  if constexpr (clocked<C>) return c.wtime();
  else return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// A transport that keeps a call_record (core/call_record.hpp): the per-tag
/// sequence numbers of call fingerprints and the first failure, after which
/// its collectives fail fast.
template <class C>
concept recorded = transport<C> && requires(C& c) {
  { c.calls() } -> std::same_as<call_record&>;
};

/// A transport that can record a timeline (core/timeline.hpp): trace() is
/// this rank's, or nullptr while it records none. Its sends, receives and
/// waits record themselves; collectives, reductions, codecs and the fusion
/// engine take the timeline from the communicator (trace_of).
template <class C>
concept traced = transport<C> && requires(const C& c) {
  { c.trace() } -> std::same_as<timeline*>;
};

/// The timeline of `c`, or nullptr (always, for a transport that is not traced).
template <transport C> timeline* trace_of(const C& c) noexcept {
  if constexpr (traced<C>) return c.trace();
  else return nullptr;
}

/// A transport whose buffers may live in device (GPU) memory; it declares
/// `static constexpr bool device_memory = true`.
template <class C>
concept device_memory = transport<C> && requires {
  requires C::device_memory == true;
};

/// A transport whose operations are enqueued on a device stream and complete
/// in stream order (NCCL): schedules must not wait on the host between
/// dependent steps. It declares `static constexpr bool stream_ordered = true`
/// and a stream() member (the stream it enqueues on).
template <class C>
concept stream_ordered = transport<C> && requires(C& c) {
  requires C::stream_ordered == true;
  c.stream();
};

/// Sets a communicator's timeout for one scope (e.g. options::timeout of one
/// collective call) and restores the previous value when the scope ends,
/// however it ends. A zero timeout leaves the communicator as it is, and on a
/// transport that is not `timed` the guard does nothing.
template <class C> class scoped_timeout {
public:
  scoped_timeout(C& c, std::chrono::milliseconds t) {
    GRADSYNC_REQUIRE(t.count() >= 0, "scoped_timeout", c.rank(),
                     "timeout must be >= 0 ms (0: keep the communicator's), got " + std::to_string(t.count()));
    if constexpr (timed<C>) {
      if (t.count() == 0) return;
      saved_ = c.timeout();
      c.set_timeout(t);
      c_ = &c;
    } else {
      (void)c;
      (void)t;
    }
  }
  scoped_timeout(const scoped_timeout&) = delete;
  scoped_timeout& operator=(const scoped_timeout&) = delete;
  ~scoped_timeout() {
    if constexpr (timed<C>)
      if (c_) c_->set_timeout(saved_);
  }

private:
  C* c_ = nullptr;
  std::chrono::milliseconds saved_{0};
};

} // namespace gradsync
