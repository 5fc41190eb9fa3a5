// gradsync: the shared-memory transport. Ranks are processes of one node that
// map one POSIX shared-memory segment; no MPI needed.
//
// Every ordered pair of ranks (i -> j, including i -> i) owns a single-producer
// single-consumer byte ring in the segment: a `tail` written only by i and a
// `head` written only by j, each on its own cache line, published with
// release stores and read with acquire loads. Everything travels as 64-byte
// aligned frames: a header cell (kind, tag, sequence number, sizes, up to
// 32 bytes of inline payload) optionally followed by payload. A small message
// is one cell; a large one is cut into frames of at most
// policy::shm_frame_bytes, so the receiver copies frame k out while the sender
// copies frame k+1 in (two copies, pipelined, through a ring that stays in
// cache). Receivers acknowledge each message when they match it (or reject it
// on a size mismatch) with a control frame on the reverse ring, so a send
// completes once its bytes are in the ring and the receive was matched, which
// is what gives both sides the size-mismatch error. Messages above
// policy::shm_eager_bytes go by rendezvous: a one-cell announcement first,
// the payload only after the ack, straight into the matched receive's buffer
// (no private copy of an early large message; see engine.hpp).
//
// Matching is per (peer, tag) in order. A message that arrives before its
// receive is posted is drained into a private buffer (so one unposted tag can
// never block another behind it) and handed over, or redirected mid-stream,
// when the receive is posted.
//
// Waiting spins briefly, then yields, then sleeps on a futex in the segment
// (the producer wakes a sleeping consumer), so oversubscribed runs progress.
// While waiting, a rank checks that its peers are alive (kill(pid, 0) and the
// zombie state): a rank that died fails every other rank's pending operations
// with an error naming it instead of hanging them.
//
// The segment is created 0600 under an unpredictable name and unlinked as soon
// as every rank has attached, so nothing is left in /dev/shm once setup is
// over, whatever happens afterwards.
//
// A communicator is used by one thread at a time (progress is made by whoever
// calls isend/irecv/wait/test).
#pragma once

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>

#include "../../core/cross_memory.hpp"
#include "../../core/error.hpp"
#include "../../core/policy.hpp"
#include "../../core/process.hpp"
#include "../../core/random_name.hpp"
#include "../../core/timed_choice.hpp"
#include "../../core/timeline.hpp"
#include "../capabilities.hpp"
#include "../transport.hpp"
#include "arena.hpp"
#include "engine.hpp"
#include "segment.hpp"
#include "shared_buffer.hpp"

namespace gradsync::shm {

/// Completion handle of a shared-memory send or receive.
class request {
public:
  request() = default;
  request(std::shared_ptr<detail::engine> e, detail::op_ptr s, timeline* trace)
      : e_(std::move(e)), s_(std::move(s)), trace_(trace) {}
  request(request&& o) noexcept
      : e_(std::move(o.e_)), s_(std::move(o.s_)), received_(o.received_), trace_(o.trace_) {}
  request& operator=(request&& o) noexcept {
    if (this != &o) {
      abandon();
      e_ = std::move(o.e_);
      s_ = std::move(o.s_);
      received_ = o.received_;
      trace_ = o.trace_;
    }
    return *this;
  }
  request(const request&) = delete;
  request& operator=(const request&) = delete;
  /// An abandoned request is withdrawn: its buffer is never touched again.
  ~request() { abandon(); }

  /// True once complete; throws gradsync::error if the operation failed.
  bool test() {
    if (!s_) return true;
    if (!s_->done) e_->progress();
    if (!s_->done) return false;
    finish();
    return true;
  }
  /// Blocks until complete; throws gradsync::error if the operation failed
  /// (errc::mismatch, errc::aborted), its peer died or left
  /// (errc::peer_failed), or it was not matched within the timeout
  /// (errc::timeout).
  void wait() {
    if (!s_) return;
    const scoped_phase phase(trace_, "wait", "transport", wait_args(s_->peer, s_->is_send ? "shm.send" : "shm.recv"));
    e_->wait(*s_);
    finish();
  }
  /// Bytes received (a receive, once wait() returned or test() returned true;
  /// for a send, 0).
  std::size_t received() const noexcept { return received_; }

private:
  void abandon() noexcept {
    if (s_ && !s_->done) e_->abandon(s_);
    s_.reset();
    e_.reset();
  }
  void finish() {
    auto s = std::move(s_);
    auto e = std::move(e_);
    if (!s->error.empty())
      throw error(s->error_kind, s->is_send ? "shm.send" : "shm.recv", e->rank(), s->peer, s->error);
    received_ = s->received;
  }
  std::shared_ptr<detail::engine> e_;
  detail::op_ptr s_;
  std::size_t received_ = 0;
  timeline* trace_ = nullptr;
};

/// One rank's endpoint of a shared-memory group.
class communicator {
public:
  static constexpr std::string_view name = "shm";

  /// Joins the group of `size` ranks that rendezvous in directory `dir` (which
  /// every rank can reach; one group per directory at a time). Rank 0 creates
  /// the segment and publishes its name in `dir` atomically; the others wait
  /// for it (up to policy::shm_attach_timeout) and attach.
  communicator(const std::filesystem::path& dir, int rank, int size) {
    check_args(rank, size);
    const int stores = stores_setting(rank);
    const std::uint64_t single_copy = cma::min_bytes_setting("shm.communicator", rank); // (before the group forms)
    std::error_code ec;
    GRADSYNC_REQUIRE(std::filesystem::is_directory(dir, ec), "shm.communicator", rank,
            "rendezvous directory " + dir.string() + " does not exist");
    const auto file = dir / "gradsync-shm.rendezvous";
    auto cleanup = [file] {
      std::error_code ec;
      std::filesystem::remove(file, ec);
    };
    auto seg = std::make_unique<detail::segment>();
    if (rank == 0) {
      remove_stale(file); // a crashed run's file, and its segment if the creator is gone
      // The name goes into an intent file (.gradsync-shm.<name>.tmp) before
      // the segment exists; renaming it publishes the segment. A creator
      // killed in between leaves the intent file, which the next join here
      // (or a rank that gives up waiting) turns into an unlinked segment.
      std::filesystem::path tmp;
      try {
        seg->create(size, detail::ring_bytes_for(size), policy::shm_arena_bytes, [&](const std::string& nm) {
          if (!tmp.empty()) std::filesystem::remove(tmp, ec); // a name that was taken
          tmp = dir / (".gradsync-shm." + nm.substr(10) + ".tmp");
          std::ofstream f(tmp, std::ios::trunc);
          f << nm << ' ' << size << ' ' << ::getpid() << '\n';
          f.close();
          if (!f)
            throw error(errc::internal, "shm.communicator", rank, -1, "cannot write rendezvous file in " + dir.string());
        });
      } catch (...) { // create unlinked its segment, if any
        if (!tmp.empty()) std::filesystem::remove(tmp, ec);
        throw;
      }
      std::filesystem::rename(tmp, file, ec); // atomic publication
      if (ec) {
        ::shm_unlink(seg->name().c_str());
        std::filesystem::remove(tmp, ec);
        throw error(errc::internal, "shm.communicator", rank, -1, "cannot publish rendezvous file " + file.string());
      }
    } else {
      attach_from_file(*seg, file, rank, size);
    }
    detail::join(*seg, rank, size, cleanup);
    start(std::move(seg), rank, size, stores, single_copy);
  }

  /// Joins a group bootstrapped by any out-of-band channel: `share(name)` is
  /// called on every rank; rank 0 passes the segment name it created and every
  /// other rank receives it as the return value (e.g. an MPI broadcast).
  communicator(int rank, int size, const std::function<std::string(const std::string&)>& share) {
    check_args(rank, size);
    const int stores = stores_setting(rank);
    const std::uint64_t single_copy = cma::min_bytes_setting("shm.communicator", rank); // (before the group forms)
    auto seg = std::make_unique<detail::segment>();
    if (rank == 0) {
      try {
        seg->create(size, detail::ring_bytes_for(size), policy::shm_arena_bytes);
      } catch (...) {
        try { // an empty name tells the other ranks to fail instead of waiting
          share(std::string());
        } catch (...) {
        }
        throw;
      }
      try {
        share(seg->name());
      } catch (...) {
        ::shm_unlink(seg->name().c_str());
        throw;
      }
    } else {
      const std::string nm = share(std::string());
      const auto r = seg->attach(nm, size, rank);
      if (!r.ok()) throw error(r.kind, "shm.communicator", rank, -1, "cannot attach: " + r.why);
    }
    detail::join(*seg, rank, size, nullptr);
    start(std::move(seg), rank, size, stores, single_copy);
  }

  communicator(communicator&&) noexcept = default;
  communicator& operator=(communicator&&) noexcept = default;

  int rank() const noexcept { return e_->rank(); }
  int size() const noexcept { return e_->size(); }
  /// How long a wait blocks for its peer before failing (default
  /// policy::default_timeout). Dead peers are detected much sooner.
  void set_timeout(std::chrono::milliseconds t) noexcept { e_->timeout = t; }
  std::chrono::milliseconds timeout() const noexcept { return e_->timeout; }
  /// Name the segment had in /dev/shm (unlinked once every rank attached).
  const std::string& segment_name() const noexcept { return e_->segment_name(); }
  /// The record of collective calls on this communicator (sequence numbers,
  /// first failure: see core/call_record.hpp).
  call_record& calls() noexcept { return calls_; }
  /// This rank's timeline (core/timeline.hpp): GRADSYNC_TIMELINE's when the
  /// communicator was made, or set_trace's; nullptr for none.
  timeline* trace() const noexcept { return trace_.get(); }
  void set_trace(std::unique_ptr<timeline> t) noexcept { trace_ = std::move(t); }

  /// Posts a send of `data` to `peer`; complete once the bytes are in shared
  /// memory and the receiver has matched it.
  request isend(std::span<const std::byte> data, int peer, int tag) {
    const scoped_phase phase(trace(), "send", "transport", message_args(peer, data.size(), tag));
    return request(e_, e_->post_send(data.data(), data.size(), peer, tag), trace());
  }
  /// Posts a receive of exactly `data.size()` bytes from `peer`.
  request irecv(std::span<std::byte> data, int peer, int tag) { return post_recv(data, peer, tag, false); }
  /// Posts a receive of at most `capacity.size()` bytes from `peer`; the
  /// request's received() says how many arrived. A larger message fails
  /// both sides with errc::mismatch.
  request irecv_upto(std::span<std::byte> capacity, int peer, int tag) { return post_recv(capacity, peer, tag, true); }

  /// Fails every pending and future operation of every rank of the group
  /// with `reason` (e.g. after ranks disagreed on a collective call).
  void abort(const std::string& reason) { e_->abort(reason); }

  // ---- collective arena: the low-level interface of algo/shm_direct.hpp ----
  // Each rank owns arena_bytes() of shared staging that only it writes, and
  // monotonic counters it publishes (release) and every rank reads (acquire);
  // collectives built on them read peers' data in place.

  /// Rank `q`'s staging (arena_bytes() bytes, page aligned).
  std::byte* arena(int q) const { return arena_.base(q); }
  std::size_t arena_bytes() const noexcept { return arena_.bytes(); }
  /// Publishes this rank's counter `k` (< 4) as `v` and wakes sleeping peers.
  void arena_post(int k, std::uint64_t v) { arena_.post(k, v); }
  /// Blocks until counter `k` of every rank reaches `v` (with the same dead
  /// peer detection and timeout as a receive); throws naming `op`. Traced
  /// as a "wait" for every peer (peer -1).
  void arena_await(int k, std::uint64_t v, const char* op) {
    const scoped_phase phase(trace(), "wait", "transport", wait_args(-1, "shm.arena"));
    arena_.await(k, v, op);
  }
  /// Copies `n` bytes from private memory into this rank's arena (streaming
  /// stores: the fast way into lines peers have read).
  static void arena_copy(std::byte* dst, const std::byte* src, std::size_t n) {
    detail::collective_arena::copy(dst, src, n);
  }
  /// Whether arena writes use arena_copy (0) or ordinary stores (1), per
  /// kind of call: measured as calls run (core/timed_choice.hpp), or fixed
  /// by GRADSYNC_SHM_STORES=stream|plain when the communicator is created.
  gradsync::detail::timed_choice& arena_stores() noexcept { return arena_.stores(); }
  /// Rank `q`'s description of the call using arena half `h` (0 or 1).
  std::atomic<std::uint64_t>& arena_signature(int q, int h) const { return arena_.signature(q, h); }
  /// Rank `q`'s note on the call using half `h`: shm::detail::arena_note_bytes
  /// that only q writes, before it posts `copied` (the call's fingerprint).
  std::byte* arena_note(int q, int h) const { return arena_.note(q, h); }
  /// Arena rounds this rank has run (the same on every rank between calls).
  std::uint64_t& arena_epoch() noexcept { return arena_.epoch(); }

  /// Whether collectives of at least single_copy_min_bytes() read peers'
  /// buffers straight from their memory (cross-memory attach) instead of
  /// copying through the arena. Settled when the group formed, the same on
  /// every rank: every rank could read every peer, and none set
  /// GRADSYNC_SHM_SINGLE_COPY=off.
  bool single_copy() const noexcept { return arena_.single_copy_min() != cma::never; }
  /// Smallest such call in bytes (cma::never without single copy): the
  /// largest any rank asked for with GRADSYNC_SHM_SINGLE_COPY=<bytes>, else
  /// policy::shm_single_copy_min_bytes.
  std::uint64_t single_copy_min_bytes() const noexcept { return arena_.single_copy_min(); }
  /// Allocates `bytes` that every rank of the group maps (see
  /// shared_buffer.hpp): a collective call, the same size on every rank
  /// (else every rank fails with errc::mismatch naming both sizes).
  /// Collectives whose buffers all lie in such memory read and write the
  /// peers' buffers in place (algo/shm_direct.hpp).
  shared_buffer alloc_shared(std::size_t bytes) {
    const char* op = "shm.alloc_shared";
    const int r = rank(), p = size();
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t mapped = std::max(page, (bytes + page - 1) / page * page);
    struct announce {
      char name[64];
      std::uint64_t bytes, id;
    };
    announce mine{};
    const std::string nm = gradsync::detail::random_name("/gradsync-buf-", op, r);
    nm.copy(mine.name, sizeof mine.name - 1);
    mine.bytes = bytes;
    mine.id = registry_->next_id();
    detail::registry::entry e{mine.id, bytes, std::vector<detail::mapping>(static_cast<std::size_t>(p))};
    e.of[static_cast<std::size_t>(r)] = detail::map_object(nm, mapped, true, op, r);
    struct unlink_guard {
      const std::string& n;
      ~unlink_guard() { ::shm_unlink(n.c_str()); }
    } unlink_mine{nm}; // once every peer has mapped it, or on failure
    std::vector<announce> theirs(static_cast<std::size_t>(p));
    exchange(std::as_bytes(std::span(&mine, 1)), std::as_writable_bytes(std::span(theirs)), sizeof(announce));
    // Every rank sees every announcement, so all of them agree on a mismatch
    // and fail alike, without another message.
    for (int q = 1; q < p; ++q) {
      const announce &a = theirs[static_cast<std::size_t>(q)], &z = theirs[0];
      if (a.bytes != z.bytes || a.id != z.id)
        throw error(errc::mismatch, op, r, q == r ? 0 : q,
                    "rank 0 allocates " + std::to_string(z.bytes) + " bytes (shared buffer " + std::to_string(z.id) +
                        "), rank " + std::to_string(q) + " " + std::to_string(a.bytes) + " (shared buffer " +
                        std::to_string(a.id) + "): every rank must allocate alike");
    }
    try {
      for (int q = 0; q < p; ++q)
        if (q != r) {
          const announce& a = theirs[static_cast<std::size_t>(q)];
          e.of[static_cast<std::size_t>(q)] =
              detail::map_object(std::string(a.name, strnlen(a.name, sizeof a.name)), mapped, false, op, r);
        }
    } catch (const error& x) {
      abort(x.what()); // the peers would otherwise wait for this rank's barrier
      throw;
    }
    std::vector<char> none(static_cast<std::size_t>(p));
    exchange(std::as_bytes(std::span(none).first(1)), std::as_writable_bytes(std::span(none)), 1); // all mapped
    std::byte* base = e.of[static_cast<std::size_t>(r)].data();
    registry_->add(std::move(e));
    return shared_buffer(registry_, mine.id, base, bytes);
  }
  /// The shared buffer of this rank holding all of [p, p + n), if any.
  std::optional<shared_view> find_shared(const void* p, std::size_t n) const { return registry_->find(rank(), p, n); }
  /// Rank q's part of shared buffer `id` at byte `offset`, mapped in this
  /// process, or nullptr if this rank has no such buffer of `n` bytes there.
  std::byte* shared_at(int q, std::uint64_t id, std::size_t offset, std::size_t n) const {
    return registry_->at(q, id, offset, n);
  }

  /// How large collectives move data, for reports: "cma" or "arena".
  std::string_view copy_mode() const noexcept { return single_copy() ? "cma" : "arena"; }

private:
  request post_recv(std::span<std::byte> data, int peer, int tag, bool upto) {
    const scoped_phase phase(trace(), "recv", "transport", message_args(peer, data.size(), tag));
    return request(e_, e_->post_recv(data.data(), data.size(), peer, tag, upto), trace());
  }
  // Sends `mine` (`each` bytes) to every peer and gathers every rank's
  // into `all` (rank q's at q * each; this rank's copied), on shm_alloc_tag.
  void exchange(std::span<const std::byte> mine, std::span<std::byte> all, std::size_t each) {
    const int r = rank(), p = size();
    std::memcpy(all.data() + static_cast<std::size_t>(r) * each, mine.data(), each);
    std::vector<request> reqs;
    for (int q = 0; q < p; ++q)
      if (q != r) {
        reqs.push_back(irecv(all.subspan(static_cast<std::size_t>(q) * each, each), q, policy::shm_alloc_tag));
        reqs.push_back(isend(mine.first(each), q, policy::shm_alloc_tag));
      }
    for (auto& q : reqs) q.wait();
  }

  // GRADSYNC_SHM_STORES: auto (default), stream or plain; checked before the
  // group forms, so a bad value fails every rank alike instead of one.
  static int stores_setting(int rank) {
    const char* v = std::getenv("GRADSYNC_SHM_STORES");
    return gradsync::detail::timed_choice::parse(v ? v : "", "stream", "plain", "shm.communicator", rank,
                                                 "GRADSYNC_SHM_STORES");
  }

  static void check_args(int rank, int size) {
    GRADSYNC_REQUIRE(size >= 1, "shm.communicator", rank, "rank count must be >= 1, got " + std::to_string(size));
    GRADSYNC_REQUIRE(rank >= 0 && rank < size, "shm.communicator", rank,
            "rank out of range [0, " + std::to_string(size) + ")");
  }

  // A rendezvous file left by a run whose creator died: its segment is
  // unlinked too (a kill -9 before every rank attached would leave it in
  // /dev/shm), then the file goes.
  static void remove_stale(const std::filesystem::path& file) {
    {
      std::ifstream f(file);
      std::string nm;
      int n = 0, pid = 0;
      if (f >> nm >> n >> pid && !gradsync::detail::process_alive(pid) && nm.rfind("/gradsync-", 0) == 0)
        ::shm_unlink(nm.c_str());
    }
    std::error_code ec;
    std::filesystem::remove(file, ec);
    remove_stale_intents(file.parent_path());
  }
  // Intent files (see the constructor) of creators that died before
  // publishing: their segments are unlinked, then the files go. Intents of
  // live creators (another group starting here) are left alone.
  static void remove_stale_intents(const std::filesystem::path& dir) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string fn = it->path().filename().string();
      if (fn.rfind(".gradsync-shm.", 0) != 0 || fn.size() < 4 || fn.substr(fn.size() - 4) != ".tmp") continue;
      std::ifstream f(it->path());
      std::string nm;
      int n = 0, pid = 0;
      if (!(f >> nm >> n >> pid) || gradsync::detail::process_alive(pid)) continue;
      if (nm.rfind("/gradsync-", 0) == 0) ::shm_unlink(nm.c_str());
      std::error_code rm;
      std::filesystem::remove(it->path(), rm);
    }
  }
  static void attach_from_file(detail::segment& seg, const std::filesystem::path& file, int rank, int size) {
    const auto deadline = std::chrono::steady_clock::now() + detail::join_timeout(rank);
    std::string why = "no rendezvous file " + file.string() + " (is rank 0 running?)";
    errc kind = errc::timeout; // mismatch once the group found disagrees with this rank
    for (;;) {
      std::ifstream f(file);
      std::string nm;
      int n = 0, pid = 0;
      if (f >> nm >> n >> pid) {
        // A file of a crashed run names a dead creator or a vanished segment.
        kind = errc::timeout;
        if (n != size) {
          why = "rendezvous file names a group of " + std::to_string(n) + " ranks, not " + std::to_string(size);
          kind = errc::mismatch;
        } else if (!gradsync::detail::process_alive(pid)) {
          why = "rendezvous file is stale (creator pid " + std::to_string(pid) + " is gone)";
          if (nm.rfind("/gradsync-", 0) == 0) ::shm_unlink(nm.c_str()); // its segment would stay in /dev/shm
        } else if (auto r = seg.attach(nm, size, rank); !r.ok()) {
          why = r.why;
          if (r.kind == errc::mismatch) kind = r.kind;
        } else if (seg.hdr().creator_pid != pid) {
          why = "rendezvous file and segment disagree on the creator";
          seg.release();
        } else {
          return;
        }
      }
      if (std::chrono::steady_clock::now() > deadline) {
        remove_stale_intents(file.parent_path()); // a creator killed before it published
        throw error(kind, "shm.communicator", rank, -1,
                    "rendezvous in " + file.parent_path().string() + " failed: " + why);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void start(std::unique_ptr<detail::segment> seg, int rank, int size, int stores, std::uint64_t single_copy) {
    e_ = std::make_shared<detail::engine>(std::move(seg), rank, size);
    arena_ = detail::collective_arena(e_, stores);
    arena_.agree_single_copy(single_copy);
    registry_ = std::make_shared<detail::registry>();
    trace_ = timeline::from_env(rank, size);
  }

  std::shared_ptr<detail::engine> e_;
  detail::collective_arena arena_;
  std::shared_ptr<detail::registry> registry_;
  call_record calls_;
  std::unique_ptr<timeline> trace_;
};

static_assert(transport<communicator>);
static_assert(upto_receiver<communicator> && shared_arena<communicator> && abortable<communicator> &&
              timed<communicator> && shared_buffers<communicator> && recorded<communicator> && traced<communicator>);
static_assert(!node_map<communicator> && !device_memory<communicator> && !stream_ordered<communicator>);

} // namespace gradsync::shm
