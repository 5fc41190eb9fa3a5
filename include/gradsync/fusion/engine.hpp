// gradsync: the fusion engine, an asynchronous allreduce of many tensors
// (Horovod's tensor fusion, PyTorch DDP's buckets). Callers submit tensors as
// they are produced (backward emits gradients one by one) and get a handle;
// one progress thread per engine packs tensors that reduce alike into
// buckets (fusion/planner.hpp), runs one allreduce or compressed allreduce
// per bucket, and unpacks the results into the callers' tensors in place.
//
//   gradsync::fusion::engine eng(comm);            // comm belongs to the engine now
//   std::vector<gradsync::fusion::handle> hs;
//   for (auto& g : grads) hs.push_back(eng.submit(std::span<float>(g)));   // avg by default
//   eng.flush();                                    // or hs[i].wait()
//
// Agreement. Every rank must run the same buckets with the same members in
// the same order, or the collectives pair up wrongly; when a tensor is ready
// differs from rank to rank, so bucket composition must not follow local
// timing. The progress threads therefore negotiate, with collectives, what
// runs (Horovod's coordinator without a coordinator rank). One cycle:
//   1. allreduce(max) of {pending count, ready}: ready is this rank's wish to
//      run partial buckets now (a flush is waiting, the oldest pending tensor
//      has waited cycle_time, or the engine is stopping);
//   2. allgather of fixed-size blocks (the max count) of (id, descriptor
//      hash) pairs, one pair per pending tensor, in submission order;
//   3. every rank computes the same answer from the same gathered bytes: the
//      tensors pending on ALL ranks, in rank 0's submission order. Those
//      whose descriptor (type, count, op, compression) differs between ranks
//      fail with errc::mismatch on every rank (the others are unaffected);
//      the rest are planned (plan(), the small first bucket at the start of a
//      step) and the complete buckets run, the open ones too when any rank
//      was ready, in plan order, each one collective on every rank.
// Tensors pending on only some ranks wait for a later cycle. A rank with
// nothing pending does not negotiate (its thread sleeps on a condition
// variable, no polling); peers that negotiate meanwhile wait in step 1 until
// it has work, which it will, since ranks submit the same tensors. A rank
// negotiates when it has pending tensors and: the tensors of one key reach a
// bucket's capacity, or it is ready (see 1). A cycle that ran nothing is not
// retried before something changes locally (a submit, a flush) or
// cycle_time passes, so ranks waiting for each other do not spin.
// A "step" (for the small first bucket) starts at engine start and after any
// cycle in which some rank was ready and every rank's reported tensors all
// ran (agreed: derived from the gathered counts).
//
// Identity. A tensor is named by tensor_options::id (below 2^63), or else by
// an automatic id: 2^63 + the number of automatic submissions before it since
// the engine started or flush() was last called. Automatic ids are valid when
// one thread submits the tensors in the same order on every rank and calls
// flush() at the same points; ending each step with flush() gives a tensor
// the same id every step, which error feedback needs (residuals are kept by
// id, and one kept for an id that never comes back is never freed). With
// several submitting threads, give ids.
//
// Results: bitwise identical on all ranks; they equal per-tensor allreduces
// wherever the operator is exact (integers, small-integer floats), but a
// fused floating-point sum may round differently from an unfused one (the
// schedule and its order of operations follow the bucket's size, and the
// buckets follow when tensors arrived). Compressed buckets keep each tensor's
// error-feedback residual by id, assembled into and scattered out of the
// bucket's residual, so feedback stays exact when bucket composition changes.
//
// Errors never leave the progress thread: an exception in a bucket reaches
// wait()/test() of every handle of that bucket. Any failure of a collective
// breaks the engine (the communicator may hold half a collective): pending
// and later tensors fail with the same error, flush() rethrows it, and on an
// abortable transport the engine aborts the communicator so peers blocked in
// the same collective fail at once instead of at their timeout.
//
// Host memory only (the fused buffers and the codecs' host paths).
#pragma once

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "../collectives.hpp"
#include "../compressed.hpp"
#include "../core/error.hpp"
#include "../core/hash.hpp"
#include "../core/policy.hpp"
#include "../transport/capabilities.hpp"
#include "planner.hpp"

namespace gradsync::fusion {

/// Tag of the engine's collectives by default: outside the range
/// [policy::default_tag, + policy::tag_span) the collectives use by default,
/// so the engine's messages never match those of a default collective.
inline constexpr int default_engine_tag = policy::default_tag + 8 * policy::tag_span;

/// Ids at or above this are the engine's automatic ids.
inline constexpr std::uint64_t automatic_id_base = std::uint64_t{1} << 63;

/// How one submitted tensor is reduced.
struct tensor_options {
  /// The reduction; with compression only avg and sum.
  op_kind op = op_kind::avg;
  /// Compress the tensor (float element types only): it is fused only with
  /// tensors of an equal compression (codec text, mode, error feedback,
  /// schedule, seed, segment).
  std::optional<compression> compress = std::nullopt;
  /// The tensor's identity across ranks and steps (below 2^63); none: the
  /// automatic id (see the file comment: counted from the last flush()).
  /// Error-feedback residuals are kept by id, so a gradient should keep its
  /// id across steps.
  std::optional<std::uint64_t> id = std::nullopt;
};

/// Engine settings; every rank must pass equal ones.
struct engine_options {
  /// Bucket capacity in bytes (fused buffer bytes).
  std::size_t bucket_bytes = policy::fusion_bucket_bytes;
  /// Capacity of the first bucket of a step.
  std::size_t first_bucket_bytes = policy::fusion_first_bucket_bytes;
  /// A rank whose oldest pending tensor has waited this long asks for partial buckets to run.
  std::chrono::microseconds cycle_time = policy::fusion_cycle_time;
  /// Planner look-ahead in positions (plan_options::lookahead).
  std::size_t lookahead = policy::fusion_lookahead;
  /// Tensors of at least this many bytes are never packed (each its own
  /// bucket, reduced in place); none: solo_bytes_of(comm, coll), the cost
  /// model's break-even size.
  std::optional<std::size_t> solo_bytes = std::nullopt;
  /// Options of every bucket's collective: algorithm (automatic: the cost
  /// model picks per bucket size), selector, segment, timeout, tag (by
  /// default default_engine_tag). Its workspace is ignored: the engine keeps
  /// its own. The negotiation uses the tag and selector but the
  /// communicator's own timeout, since it waits for peers to submit.
  options coll = {.tag = default_engine_tag};
};

/// Counters of an engine (for tests, benches and logs).
struct engine_stats {
  std::uint64_t cycles = 0;             ///< negotiations run
  std::uint64_t buckets = 0;            ///< buckets run (compressed included)
  std::uint64_t compressed_buckets = 0; ///< of which compressed
  std::uint64_t tensors = 0;            ///< tensors completed (failed ones included)
  std::uint64_t mismatched = 0;         ///< tensors failed because ranks disagreed on them
};

/// Smallest size solo_bytes_of returns on two or more ranks. The cost model
/// has no term for a call's software overhead (validation, the plan, the
/// schedule's setup: about 2 us per allreduce on the CI VM, against a
/// modelled 0.3-1 us), so its break-even alone comes out far too small: 1.2
/// KiB over shm and 5.3 KiB over MPI when calibrated. Measured break-even,
/// 128 tensors through the engine at 2 ranks (gradsync-bench fusion -N 128
/// -s SIZE --solo 1G, CI VM): shm 8/16 KiB 1.25x/1.23x faster fused, 32 KiB
/// 0.79x; MPI 16 KiB 1.40x, 32 KiB 1.14x, 64 KiB 0.93x.
inline constexpr std::size_t solo_floor_bytes = std::size_t{32} << 10;

/// The tensor size from which fusing costs more than it saves, by the cost
/// model of `o` (its selector, else the default model): a call's fixed cost
/// (the model's time for an 8-byte allreduce on c) over the cost of packing
/// and unpacking a byte (2 x the model's copy cost per byte), and at least
/// solo_floor_bytes. A slow link (large alpha) raises it: a 50 us alpha and
/// 10 GB/s copies give 250 KB. One rank: never (nothing to save, and the
/// plan stays the one of many ranks). Equal on all ranks given equal
/// selectors.
template <transport C> std::size_t solo_bytes_of(const C& c, const options& o = {}) {
  constexpr std::size_t never = std::numeric_limits<std::size_t>::max();
  if (c.size() <= 1) return never;
  const selector& sel = gradsync::detail::selector_for<C>(o);
  const topology topo = topology_of(c, o);
  const double fixed = sel.model().allreduce(sel.choose(8, topo, o.segment()), 8, topo, o.segment());
  const double copy = sel.model().arena.copy;
  if (!(fixed > 0) || !(copy > 0)) return solo_floor_bytes;
  const double b = fixed / (2 * copy);
  return b < 0x1p62 ? std::max(solo_floor_bytes, static_cast<std::size_t>(b)) : never;
}

namespace detail {
using gradsync::detail::compression_hash; // compressed.hpp
using gradsync::detail::fnv1a;
using gradsync::detail::fnv_basis;

// Completion of one tensor, shared by its handles and the engine.
struct tensor_state {
  std::atomic<std::uint32_t> done{0};
  std::exception_ptr error; // written before `done` is released
  std::uint64_t id = 0;

  void finish(std::exception_ptr e) {
    error = std::move(e);
    done.store(1, std::memory_order_release);
    done.notify_all();
  }
  void wait_done() const {
    while (done.load(std::memory_order_acquire) == 0) done.wait(0, std::memory_order_acquire);
  }
};

// Heap bytes aligned to a cache line (so to every element type and to the
// 16-byte member alignment); grows, never shrinks.
class aligned_buffer {
public:
  std::span<std::byte> get(std::size_t n) {
    if (n > cap_) {
      const std::size_t c = align_up(n, 4096);
      p_.reset(static_cast<std::byte*>(::operator new(c, std::align_val_t{64})));
      cap_ = c;
    }
    return {p_.get(), n};
  }

private:
  struct del {
    void operator()(std::byte* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
  };
  std::unique_ptr<std::byte, del> p_;
  std::size_t cap_ = 0;
};

// pack / unpack (planner.hpp) as phases "pack" / "unpack" of c's timeline
// (arguments: the bucket's bytes and tensors).
inline auto bucket_args(const bucket& b) noexcept {
  return [&b](trace_args& a) { a("bytes", b.bytes)("tensors", b.members.size()); };
}
template <transport C, class Src> void traced_pack(const C& c, const bucket& b, std::span<std::byte> fused, Src&& src) {
  const scoped_phase phase(trace_of(c), "pack", "fusion", bucket_args(b));
  pack(b, fused, std::forward<Src>(src));
}
template <transport C, class Dst>
void traced_unpack(const C& c, const bucket& b, std::span<const std::byte> fused, Dst&& dst) {
  const scoped_phase phase(trace_of(c), "unpack", "fusion", bucket_args(b));
  unpack(b, fused, std::forward<Dst>(dst));
}

// Hash of a bucket key: the engine's maps are keyed by it (no string per submit).
inline std::uint64_t key_hash(dtype dt, op_kind op, memory_space space, const std::string& codec) {
  std::uint64_t h = fnv1a(fnv_basis, dt);
  h = fnv1a(h, op);
  h = fnv1a(h, space);
  return fnv1a(h, codec.data(), codec.size());
}
inline std::uint64_t key_hash(const bucket_key& k) { return key_hash(k.dt, k.op, k.space, k.codec); }

// Hash of what ranks must agree on for one tensor: its key and count.
inline std::uint64_t descriptor_hash(std::uint64_t key, std::size_t count) {
  return fnv1a(key, static_cast<std::uint64_t>(count));
}

inline const char* mode_name(compress_mode m) {
  switch (m) {
  case compress_mode::always: return "always";
  case compress_mode::automatic: return "auto";
  case compress_mode::never: return "never";
  }
  return "?";
}

// The codec with its parameters in a canonical order.
inline std::string codec_text(const compress::spec& s) {
  std::string t = s.name;
  char sep = ':';
  for (const auto& [k, v] : s.params) {
    t += sep + k + "=" + v;
    sep = ',';
  }
  return t;
}

// The whole configuration of a compression as text: tensors fuse only with
// equal ones (a bucket runs one compressed_allreduce with one `compression`).
inline std::string codec_key(const compression& z) {
  return codec_text(z.codec) + ";mode=" + mode_name(z.mode) + ";ef=" + (z.error_feedback ? "1" : "0") +
         ";algo=" + std::to_string(static_cast<int>(z.algo)) + ";seed=" + std::to_string(z.seed) +
         ";seg=" + std::to_string(z.segment());
}


// Seed of bucket `b` of a grouped call: buckets must not share noise streams.
inline std::uint64_t bucket_seed(std::uint64_t seed, std::uint64_t b) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ull * (b + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

} // namespace detail

/// The completion of one submitted tensor. Copies share the state; a
/// default-constructed handle is complete. Rethrows the tensor's error every
/// time it is asked.
class handle {
public:
  handle() = default;
  explicit handle(std::shared_ptr<detail::tensor_state> s) : s_(std::move(s)) {}

  /// Blocks until the tensor holds its reduction; rethrows the bucket's error.
  void wait() const {
    if (!s_) return;
    s_->wait_done();
    if (s_->error) std::rethrow_exception(s_->error);
  }
  /// True once done (never blocks); rethrows the bucket's error once done.
  bool test() const {
    if (!s_) return true;
    if (s_->done.load(std::memory_order_acquire) == 0) return false;
    if (s_->error) std::rethrow_exception(s_->error);
    return true;
  }
  /// The tensor's id (explicit or automatic); 0 for an empty handle.
  std::uint64_t id() const noexcept { return s_ ? s_->id : 0; }

private:
  std::shared_ptr<detail::tensor_state> s_;
};

/// The asynchronous fusion engine over communicator type C (see the file
/// comment). Not copyable or movable: its progress thread refers to it.
template <transport C> class engine {
public:
  /// Starts the progress thread, which owns `comm` from now until the
  /// engine is destroyed: the caller must not use `comm` meanwhile (MPI needs
  /// MPI_THREAD_SERIALIZED or better, mpi::session's default). Every rank
  /// must construct its engine with equal options.
  explicit engine(C& comm, engine_options o = {})
      : comm_(comm), o_(std::move(o)), rank_(comm.rank()), size_(comm.size()) {
    o_.coll.workspace = {};
    solo_ = o_.solo_bytes ? *o_.solo_bytes : solo_bytes_of(comm, o_.coll);
    nego_.tag = o_.coll.tag;
    nego_.select = o_.coll.select;
    thread_ = std::thread([this] { loop(); });
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Flushes, stops and joins the progress thread. Never throws (errors are
  /// on the handles). Pending tensors that some peer never submits keep it
  /// waiting until the communicator's timeout fails the negotiation.
  ~engine() {
    try {
      flush();
    } catch (...) { // already on the handles
    }
    {
      std::lock_guard g(m_);
      stop_ = true;
      ++change_;
    }
    cv_.notify_all();
    thread_.join();
  }

  /// Submits `data` for an in-place allreduce: once the handle completes,
  /// `data` holds the reduction over ranks (t.op; compressed with
  /// t.compress). `data` must stay valid and untouched until then. Every
  /// rank must submit the same tensors (equal id, type, count, op and
  /// compression), in any order when ids are explicit. Thread-safe. Throws
  /// gradsync::error (op "fusion.submit") for invalid arguments: compression
  /// of a non-floating type or with an op other than avg/sum, a bad codec,
  /// an explicit id >= 2^63 or one still pending. After the engine broke,
  /// returns a handle that fails with the engine's error.
  template <element T> handle submit(std::span<T> data, tensor_options t = {}) {
    static_assert(!std::is_const_v<T>, "submit reduces in place: pass a span of mutable elements");
    const char* name = "fusion.submit";
    gradsync::detail::check_span(data, name, rank_, "data");
    entry e;
    e.d.dt = dtype_traits<T>::id;
    e.d.count = data.size();
    e.d.op = t.op;
    e.d.space = memory_space::host;
    e.data = data.data();
    if (t.compress) {
      if constexpr (!compress::float_element<T>) {
        throw error(name, rank_, -1,
                    "compression needs a floating-point element type (f32, f64, f16, bf16), got " +
                        std::string(dtype_name(e.d.dt)));
      } else if constexpr (!upto_receiver<C>) {
        throw error(name, rank_, -1, "compression needs a transport with irecv_upto");
      } else {
        GRADSYNC_REQUIRE(t.op == op_kind::avg || t.op == op_kind::sum, name, rank_,
                         "compressed tensors reduce with avg or sum, not " + std::string(op_name(t.op)));
        const codec_entry& c = codec_for<T>(*t.compress);
        e.d.codec = c.key;
        e.z = c.z;
      }
    }
    if (t.id)
      GRADSYNC_REQUIRE(*t.id < automatic_id_base, name, rank_,
                       "explicit tensor ids must be below 2^63 (above are automatic), got " + std::to_string(*t.id));
    e.kid = detail::key_hash(e.d.dt, e.d.op, e.d.space, e.d.codec);
    e.hash = detail::descriptor_hash(e.kid, e.d.count);
    e.st = std::make_shared<detail::tensor_state>();
    handle h(e.st);
    e.t = clock::now();
    bool wake = false;
    {
      std::lock_guard g(m_);
      const std::uint64_t id = t.id ? *t.id : automatic_id_base + auto_ids_++;
      e.d.id = id;
      e.st->id = id;
      if (broken_) {
        e.st->finish(broken_);
        return h;
      }
      GRADSYNC_REQUIRE(!by_id_.count(id), name, rank_, "tensor id " + std::to_string(id) + " is already pending");
      wake = pending_.empty() || backoff_;
      std::size_t& kb = key_bytes_[e.kid];
      kb += e.d.bytes();
      if (!full_hint_ && kb >= trigger_bytes()) wake = full_hint_ = true;
      const std::uint64_t seq = seq_++;
      by_id_.emplace(id, seq);
      pending_.emplace(seq, std::move(e));
      ++change_;
    }
    if (wake) cv_.notify_one();
    return h;
  }

  /// Runs every tensor submitted so far (partial buckets too) and returns
  /// when all are done, successfully or not (their errors are on their
  /// handles). A step boundary: automatic ids count from 0 again for the
  /// submissions after this call. Rethrows the engine's error if it broke.
  void flush() {
    std::vector<std::shared_ptr<detail::tensor_state>> wait_for;
    {
      std::lock_guard g(m_);
      wait_for.reserve(pending_.size());
      for (auto& [seq, e] : pending_) wait_for.push_back(e.st);
      ++flushers_;
      ++change_;
      auto_ids_ = 0;
    }
    cv_.notify_one();
    for (const auto& s : wait_for) s->wait_done();
    std::exception_ptr b;
    {
      std::lock_guard g(m_);
      --flushers_;
      b = broken_;
    }
    if (b) std::rethrow_exception(b);
  }

  /// The counters so far.
  engine_stats stats() const {
    std::lock_guard g(m_);
    return stats_;
  }

  /// The error-feedback residual kept for tensor `id`: what its compression
  /// has not delivered yet, one value per element (its accumulation type,
  /// widened to double exactly); empty when there is none. Thread-safe (it
  /// waits for a compressed bucket in progress). For tests and checkpoints.
  std::vector<double> residual(std::uint64_t id) const {
    std::lock_guard g(rm_);
    const auto it = residuals_.find(id);
    if (it == residuals_.end()) return {};
    return std::visit([](const auto& v) { return std::vector<double>(v.begin(), v.end()); }, it->second.v);
  }

private:
  using clock = std::chrono::steady_clock;

  struct entry {
    tensor_desc d;
    std::uint64_t kid = 0;  // key_hash of d's key
    std::uint64_t hash = 0; // descriptor_hash(kid, d.count)
    void* data = nullptr;
    std::shared_ptr<const compression> z; // null: uncompressed
    std::shared_ptr<detail::tensor_state> st;
    clock::time_point t;
  };

  // Error-feedback residual of one tensor (accumulation type of its key).
  struct residual_slot {
    std::uint64_t key = 0; // key_hash of the bucket key it was kept for
    std::size_t count = 0;
    std::variant<std::vector<float>, std::vector<double>> v;
  };

  using zstate_t = std::variant<std::monostate, compress_state<float>, compress_state<double>, compress_state<half>,
                                compress_state<bfloat16>>;

  // The engine's copy of a compression and its key text, validated for T
  // once. Found by a hash of the fields (no string built per submit). Each
  // copy is used by the progress thread only (a spec marks parameters read).
  struct codec_entry {
    std::shared_ptr<const compression> z;
    std::string key; // the planner's codec key: the hash as 15 characters, so copies allocate nothing
  };
  template <class T> const codec_entry& codec_for(const compression& z) {
    const std::uint64_t h = detail::fnv1a(detail::compression_hash(z), dtype_traits<T>::id);
    {
      std::lock_guard g(m_);
      if (auto it = codecs_.find(h); it != codecs_.end()) return it->second; // entries are never erased
    }
    compression mine = z;
    compress::with_codec<T>(mine.codec, 1, [](const auto&, auto) {}); // a bad spec fails here, on the caller
    char key[16];
    std::snprintf(key, sizeof key, "z%014llx", static_cast<unsigned long long>(h >> 8));
    codec_entry c{std::make_shared<const compression>(std::move(mine)), key};
    std::lock_guard g(m_);
    return codecs_.emplace(h, std::move(c)).first->second;
  }

  std::size_t trigger_bytes() const { return first_ ? o_.first_bucket_bytes : o_.bucket_bytes; }

  // ---- the progress thread ----

  // Nothing escapes the thread: a failure outside a cycle (memory, say)
  // breaks the engine like a failed collective, and the loop goes on to
  // fail what is pending and wait for the stop.
  void loop() noexcept {
    for (;;) {
      try {
        progress();
        return;
      } catch (...) {
        std::lock_guard g(m_);
        if (!broken_) broken_ = std::current_exception();
      }
    }
  }

  void progress() {
    std::unique_lock lk(m_);
    for (;;) {
      if (broken_) {
        fail_pending(lk, broken_);
        if (stop_) return;
        cv_.wait(lk);
        continue;
      }
      if (pending_.empty()) {
        if (stop_) return;
        cv_.wait(lk);
        continue;
      }
      const auto now = clock::now();
      const auto deadline = pending_.begin()->second.t + o_.cycle_time;
      const bool ready = stop_ || flushers_ > 0 || now >= deadline;
      if (!ready && !full_hint_) {
        cv_.wait_until(lk, deadline);
        continue;
      }
      if (backoff_ && change_ == backoff_change_ && now < backoff_until_) {
        cv_.wait_until(lk, backoff_until_);
        continue;
      }
      backoff_ = false;
      std::vector<entry*> snap;
      snap.reserve(pending_.size());
      for (auto& [seq, e] : pending_) snap.push_back(&e);
      ++stats_.cycles;
      lk.unlock();
      bool progressed = false;
      std::exception_ptr err;
      try {
        progressed = cycle(snap, ready);
      } catch (...) {
        err = std::current_exception();
      }
      lk.lock();
      if (err) {
        broken_ = err;
        lk.unlock();
        abort_peers(err);
        lk.lock();
        continue;
      }
      if (!progressed) {
        backoff_ = true;
        backoff_change_ = change_;
        backoff_until_ = clock::now() + o_.cycle_time;
      }
      full_hint_ = false;
      for (const auto& [k, b] : key_bytes_)
        if (b >= trigger_bytes()) full_hint_ = true;
    }
  }

  // Fails and removes every pending tensor (the lock is held on entry and exit).
  void fail_pending(std::unique_lock<std::mutex>& lk, const std::exception_ptr& e) {
    if (pending_.empty()) return;
    std::vector<std::shared_ptr<detail::tensor_state>> sts;
    for (auto& [seq, x] : pending_) sts.push_back(std::move(x.st));
    stats_.tensors += sts.size();
    pending_.clear();
    by_id_.clear();
    key_bytes_.clear();
    lk.unlock();
    for (auto& s : sts) s->finish(e);
    lk.lock();
  }

  // Peers may be blocked in the collective that failed here: free them.
  void abort_peers(const std::exception_ptr& e) noexcept {
    if constexpr (abortable<C>) {
      std::string why = "fusion engine failed";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        why += std::string(": ") + x.what();
      } catch (...) {
      }
      try {
        comm_.abort(why);
      } catch (...) {
      }
    } else {
      (void)e;
    }
  }

  // Removes finished entries and completes their handles with `e`.
  void complete(const std::vector<entry*>& es, const std::exception_ptr& e, bool mismatch = false) {
    std::vector<std::shared_ptr<detail::tensor_state>> sts;
    sts.reserve(es.size());
    {
      std::lock_guard g(m_);
      for (entry* x : es) {
        sts.push_back(std::move(x->st));
        if (auto it = key_bytes_.find(x->kid); it != key_bytes_.end() && (it->second -= x->d.bytes()) == 0)
          key_bytes_.erase(it);
        const auto seq = by_id_.at(x->d.id);
        by_id_.erase(x->d.id);
        pending_.erase(seq); // x dangles from here
      }
      stats_.tensors += es.size();
      if (mismatch) stats_.mismatched += es.size();
    }
    for (auto& s : sts) s->finish(e);
  }

  // One negotiation and the buckets it agrees on. Returns whether any
  // tensor finished. Throws on a communication failure.
  bool cycle(const std::vector<entry*>& snap, bool ready) {
    if (size_ == 1) return run_agreed(snap, {}, {}, ready, snap.size());
    constexpr std::uint64_t empty = ~std::uint64_t{0}; // never an id
    std::int64_t v[2] = {static_cast<std::int64_t>(snap.size()), ready ? 1 : 0};
    allreduce(comm_, std::span<std::int64_t>(v, 2), op::max{}, nego_);
    const auto most = static_cast<std::size_t>(v[0]);
    const bool any_ready = v[1] != 0;
    std::vector<std::int64_t> mine(2 * most, std::bit_cast<std::int64_t>(empty));
    for (std::size_t k = 0; k < snap.size(); ++k) {
      mine[2 * k] = std::bit_cast<std::int64_t>(snap[k]->d.id);
      mine[2 * k + 1] = std::bit_cast<std::int64_t>(snap[k]->hash);
    }
    std::vector<std::int64_t> all(2 * most * static_cast<std::size_t>(size_));
    allgather(comm_, std::span<const std::int64_t>(mine), std::span<std::int64_t>(all), nego_);
    // The usual case (one submitting thread, ranks in step): every block is
    // rank 0's, so everything runs, in this rank's order.
    const auto block = static_cast<std::ptrdiff_t>(2 * most);
    bool same = true;
    for (int q = 1; q < size_ && same; ++q) same = std::equal(all.begin(), all.begin() + block, all.begin() + block * q);
    if (same) return run_agreed(snap, {}, {}, any_ready, most);
    const auto at = [&](int q, std::size_t k, int field) {
      return std::bit_cast<std::uint64_t>(all[(static_cast<std::size_t>(q) * most + k) * 2 + static_cast<std::size_t>(field)]);
    };
    std::size_t n0 = 0;
    std::unordered_map<std::uint64_t, std::size_t> pos0; // rank 0's id -> position
    pos0.reserve(most);
    for (; n0 < most && at(0, n0, 0) != empty; ++n0) pos0.emplace(at(0, n0, 0), n0);
    std::vector<int> holders(n0, 1), differs(n0, -1);
    for (int q = 1; q < size_; ++q)
      for (std::size_t k = 0; k < most && at(q, k, 0) != empty; ++k)
        if (auto it = pos0.find(at(q, k, 0)); it != pos0.end()) {
          ++holders[it->second];
          if (at(q, k, 1) != at(0, it->second, 1) && differs[it->second] < 0) differs[it->second] = q;
        }
    std::unordered_map<std::uint64_t, entry*> local;
    local.reserve(snap.size());
    for (entry* e : snap) local.emplace(e->d.id, e);
    std::vector<entry*> run, bad;
    std::vector<int> bad_peer;
    for (std::size_t k = 0; k < n0; ++k) {
      if (holders[k] != size_) continue;
      entry* e = local.at(at(0, k, 0)); // pending on every rank, this one included
      if (differs[k] >= 0) {
        bad.push_back(e);
        bad_peer.push_back(differs[k]);
      } else {
        run.push_back(e);
      }
    }
    return run_agreed(run, bad, bad_peer, any_ready, most);
  }

  // What every rank agreed on: fail `bad` (bad_peer[k] differs from rank 0),
  // plan `run` and run its buckets. `most` is the largest pending count any
  // rank reported. Returns whether any tensor finished.
  bool run_agreed(const std::vector<entry*>& run, const std::vector<entry*>& bad, const std::vector<int>& bad_peer,
                  bool any_ready, std::size_t most) {
    for (std::size_t k = 0; k < bad.size(); ++k) {
      const tensor_desc& d = bad[k]->d;
      const int q = bad_peer[k];
      const auto e = std::make_exception_ptr(error(
          errc::mismatch, "fusion", rank_, q,
          "tensor id " + std::to_string(d.id) + " was submitted differently on rank 0 and rank " + std::to_string(q) +
              " (type, count, op or compression; this rank: " + std::string(dtype_name(d.dt)) + " x " +
              std::to_string(d.count) + " " + std::string(op_name(d.op)) + (bad[k]->z ? " " + detail::codec_key(*bad[k]->z) : "") +
              ")"));
      complete({bad[k]}, e, true);
    }
    std::vector<tensor_desc> descs;
    descs.reserve(run.size());
    for (const entry* e : run) descs.push_back(e->d);
    bool first;
    {
      std::lock_guard g(m_);
      first = first_;
    }
    const auto buckets = plan(descs, {.bucket_bytes = o_.bucket_bytes, .first_bucket_bytes = o_.first_bucket_bytes,
                                      .lookahead = o_.lookahead, .first = first, .solo_bytes = solo_});
    std::size_t ran = 0;
    for (std::size_t i = 0; i < buckets.size(); ++i) {
      const bucket& b = buckets[i];
      if (!b.complete && !any_ready) continue;
      std::vector<entry*> members;
      members.reserve(b.members.size());
      for (const std::size_t m : b.members) members.push_back(run[m]);
      try {
        run_bucket(b, members);
      } catch (...) {
        complete(members, std::current_exception());
        throw; // the engine is broken
      }
      {
        std::lock_guard g(m_);
        ++stats_.buckets;
        if (members.front()->z) ++stats_.compressed_buckets;
        if (i == 0) first_ = false;
      }
      complete(members, nullptr);
      ran += members.size();
    }
    if (any_ready && most == ran + bad.size()) { // every rank's tensors all ran: the next step starts
      std::lock_guard g(m_);
      first_ = true;
    }
    return ran + bad.size() > 0;
  }

  void run_bucket(const bucket& b, const std::vector<entry*>& members) {
    dispatch_dtype(b.key.dt, [&](auto t) {
      using T = decltype(t);
      if (members.front()->z) {
        if constexpr (compress::float_element<T> && upto_receiver<C>)
          run_compressed<T>(b, members, *members.front()->z);
        else
          throw error(errc::internal, "fusion", rank_, -1, "compressed bucket of a type submit() rejects");
      } else {
        run_dense<T>(b, members);
      }
    });
  }

  // The bucket's data as one typed buffer: the member itself when alone
  // (no copies), else the key's fusion buffer, packed.
  template <class T> T* fused_data(const bucket& b, const std::vector<entry*>& members) {
    if (members.size() == 1) return static_cast<T*>(members.front()->data);
    const std::span<std::byte> f = buffers_[detail::key_hash(b.key)].get(b.bytes);
    detail::traced_pack(comm_, b, f, [&](std::size_t k) {
      return std::span<const std::byte>(static_cast<const std::byte*>(members[k]->data), b.sizes[k]);
    });
    return reinterpret_cast<T*>(f.data());
  }
  template <class T> void unfuse(const bucket& b, const std::vector<entry*>& members, const T* fused) {
    if (members.size() == 1) return;
    detail::traced_unpack(comm_, b, std::span<const std::byte>(reinterpret_cast<const std::byte*>(fused), b.bytes),
                          [&](std::size_t k) { return std::span<std::byte>(static_cast<std::byte*>(members[k]->data), b.sizes[k]); });
  }

  template <class T> void run_dense(const bucket& b, const std::vector<entry*>& members) {
    T* data = fused_data<T>(b, members);
    const std::size_t n = b.elements();
    options o = o_.coll;
    o.workspace = workspace_.get(allreduce_workspace_bytes<T>(comm_, n, o));
    dispatch_op(b.key.op, [&](auto op) { allreduce(comm_, std::span<T>(data, n), op, o); });
    unfuse(b, members, data);
  }

  template <class T> void run_compressed(const bucket& b, const std::vector<entry*>& members, const compression& z) {
    using A = accum_t<T>;
    const std::lock_guard residual_guard(rm_); // residual() sees residuals before or after a bucket, never during
    const std::uint64_t key = detail::key_hash(b.key);
    zstate_t& slot = zstates_[key];
    if (!std::holds_alternative<compress_state<T>>(slot)) slot.template emplace<compress_state<T>>();
    compress_state<T>& st = std::get<compress_state<T>>(slot);
    T* data = fused_data<T>(b, members);
    const std::size_t n = b.elements();
    // Each member's residual, at its place in the bucket; padding starts at 0.
    if (z.error_feedback) {
      if (members.size() == 1) {
        residual_slot& r = residuals_[members.front()->d.id];
        if (r.key == key && r.count == n && std::holds_alternative<std::vector<A>>(r.v))
          std::swap(st.residual, std::get<std::vector<A>>(r.v));
        else
          st.residual.assign(n, A(0));
      } else {
        st.residual.assign(n, A(0));
        for (std::size_t k = 0; k < members.size(); ++k) {
          const auto it = residuals_.find(members[k]->d.id);
          if (it == residuals_.end() || it->second.key != key || it->second.count != members[k]->d.count ||
              !std::holds_alternative<std::vector<A>>(it->second.v))
            continue;
          const auto& src = std::get<std::vector<A>>(it->second.v);
          std::copy(src.begin(), src.end(), st.residual.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k)));
        }
      }
    }
    // PowerSGD's warm start belongs to one matrix, i.e. one composition.
    const bool low_rank = z.codec.family() == compress::codec_family::low_rank;
    std::uint64_t sig = detail::fnv_basis;
    if (low_rank) {
      for (const entry* e : members) sig = detail::fnv1a(detail::fnv1a(sig, e->d.id), static_cast<std::uint64_t>(e->d.count));
      const auto it = warm_.find(sig);
      st.powersgd = it != warm_.end() ? std::move(it->second) : compress::powersgd_state{};
    }
    const std::string ckey = detail::codec_text(z.codec) + "/" + std::string(dtype_name(b.key.dt));
    if (!st.costs)
      if (const auto it = costs_.find(ckey); it != costs_.end()) st.costs = it->second;
    st.step = zstep_++; // agreed: every rank runs the same compressed buckets in the same order
    options o = o_.coll;
    o.workspace = {};
    if (b.key.op == op_kind::sum) compressed_allreduce(comm_, std::span<T>(data, n), z, st, op::sum{}, o);
    else compressed_allreduce(comm_, std::span<T>(data, n), z, st, op::avg{}, o);
    if (st.costs) costs_.insert_or_assign(ckey, *st.costs);
    if (low_rank) {
      if (warm_.size() >= max_warm_starts) warm_.clear(); // compositions that keep changing
      warm_.insert_or_assign(sig, std::move(st.powersgd));
    }
    if (z.error_feedback) {
      for (std::size_t k = 0; k < members.size(); ++k) {
        residual_slot& r = residuals_[members[k]->d.id];
        r.key = key;
        r.count = members[k]->d.count;
        if (!std::holds_alternative<std::vector<A>>(r.v)) r.v.template emplace<std::vector<A>>();
        auto& dst = std::get<std::vector<A>>(r.v);
        if (members.size() == 1) {
          std::swap(dst, st.residual);
        } else {
          const auto from = st.residual.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k));
          dst.assign(from, from + static_cast<std::ptrdiff_t>(members[k]->d.count));
        }
      }
    }
    unfuse(b, members, data);
  }

  static constexpr std::size_t max_warm_starts = 4096;

  C& comm_;
  engine_options o_;
  std::size_t solo_ = 0; // resolved engine_options::solo_bytes
  options nego_;
  const int rank_, size_;

  // Shared with submitting threads, under m_.
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::map<std::uint64_t, entry> pending_;            // by local submission sequence
  std::unordered_map<std::uint64_t, std::uint64_t> by_id_; // id -> sequence
  std::unordered_map<std::uint64_t, std::size_t> key_bytes_; // pending bytes per key (by key_hash)
  std::unordered_map<std::uint64_t, codec_entry> codecs_; // by compression_hash and type
  std::uint64_t seq_ = 0, auto_ids_ = 0, change_ = 0, backoff_change_ = 0;
  clock::time_point backoff_until_{};
  int flushers_ = 0;
  bool stop_ = false, full_hint_ = false, backoff_ = false;
  bool first_ = true; // the next plan starts a step (written by the progress thread)
  std::exception_ptr broken_;
  engine_stats stats_;

  // The progress thread's own.
  std::unordered_map<std::uint64_t, detail::aligned_buffer> buffers_; // fusion buffer per key (by key_hash)
  detail::aligned_buffer workspace_;
  mutable std::mutex rm_;                                      // guards residuals_ (residual() reads it)
  std::unordered_map<std::uint64_t, residual_slot> residuals_; // by tensor id
  std::unordered_map<std::uint64_t, zstate_t> zstates_;        // per key: scratch, costs
  std::unordered_map<std::uint64_t, compress::powersgd_state> warm_;
  std::unordered_map<std::string, codec_costs> costs_; // per codec and type
  std::uint64_t zstep_ = 0;

  std::thread thread_; // last: starts after everything above exists
};

namespace detail {
// The fusion buffer of the synchronous calls: one per thread, kept across
// calls (the largest bucket so far), since first-touch page faults of a
// fresh multi-MiB buffer cost about what packing it does.
inline aligned_buffer& grouped_buffer() {
  thread_local aligned_buffer b;
  return b;
}
} // namespace detail

/// Allreduce of a list of tensors of one type, fused: the tensors are
/// planned into buckets of up to `bucket_bytes` (fusion/planner.hpp, no
/// small first bucket, no other keys; tensors of `solo_bytes`, by default
/// solo_bytes_of(comm, o), or more alone), and each bucket is one allreduce
/// (a lone tensor in place, others packed into one buffer, kept per thread
/// across calls). Every rank must pass the same list (counts, in order).
/// Synchronous; no thread.
template <transport C, element T, reduce_op Op = op::sum>
void grouped_allreduce(C& comm, std::span<const std::span<T>> tensors, Op op = {}, const options& o = {},
                       std::size_t bucket_bytes = policy::fusion_bucket_bytes,
                       std::optional<std::size_t> solo_bytes = std::nullopt) {
  std::vector<tensor_desc> d(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    gradsync::detail::check_span(tensors[i], "grouped_allreduce", comm.rank(), "tensor");
    d[i] = {.id = i, .dt = dtype_traits<T>::id, .count = tensors[i].size(), .op = Op::kind};
  }
  detail::aligned_buffer& buf = detail::grouped_buffer();
  const plan_options po{.bucket_bytes = bucket_bytes, .first_bucket_bytes = bucket_bytes, .first = false,
                        .solo_bytes = solo_bytes ? *solo_bytes : solo_bytes_of(comm, o)};
  for (const bucket& b : plan(d, po)) {
    if (b.members.size() == 1) {
      allreduce(comm, tensors[b.members[0]], op, o);
      continue;
    }
    const std::span<std::byte> f = buf.get(b.bytes);
    detail::traced_pack(comm, b, f, [&](std::size_t k) { return std::as_bytes(tensors[b.members[k]]); });
    allreduce(comm, std::span<T>(reinterpret_cast<T*>(f.data()), b.elements()), op, o);
    detail::traced_unpack(comm, b, std::span<const std::byte>(f),
                            [&](std::size_t k) { return std::as_writable_bytes(tensors[b.members[k]]); });
  }
}

/// grouped_allreduce for a vector of spans.
template <transport C, element T, reduce_op Op = op::sum>
void grouped_allreduce(C& comm, const std::vector<std::span<T>>& tensors, Op op = {}, const options& o = {},
                       std::size_t bucket_bytes = policy::fusion_bucket_bytes,
                       std::optional<std::size_t> solo_bytes = std::nullopt) {
  grouped_allreduce(comm, std::span<const std::span<T>>(tensors), op, o, bucket_bytes, solo_bytes);
}

/// Compressed allreduce of a list of tensors of one float type, fused as
/// grouped_allreduce fuses them: one compressed_allreduce per bucket, with
/// `z` (its seed mixed with the bucket's index so buckets draw independent
/// noise). `states` holds one compress_state per tensor, kept across calls:
/// its residual (error feedback, assembled into the bucket's and scattered
/// back), its step and its measured costs (shared by the bucket); the
/// PowerSGD warm start lives in the state of a bucket's first member.
/// Every rank must pass the same list and equal `z`.
template <transport C, compress::float_element T, class Op = op::avg>
void grouped_compressed_allreduce(C& comm, std::span<const std::span<T>> tensors, const compression& z,
                                  std::span<compress_state<T>> states, Op op = {}, const options& o = {},
                                  std::size_t bucket_bytes = policy::fusion_bucket_bytes,
                                  std::optional<std::size_t> solo_bytes = std::nullopt) {
  using A = accum_t<T>;
  const char* name = "grouped_compressed_allreduce";
  GRADSYNC_REQUIRE(states.size() == tensors.size(), name, comm.rank(),
                   std::to_string(tensors.size()) + " tensors but " + std::to_string(states.size()) + " states");
  std::vector<tensor_desc> d(tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    gradsync::detail::check_span(tensors[i], name, comm.rank(), "tensor");
    d[i] = {.id = i, .dt = dtype_traits<T>::id, .count = tensors[i].size(), .op = Op::kind};
  }
  detail::aligned_buffer& buf = detail::grouped_buffer();
  compress_state<T> st;
  const auto buckets = plan(d, {.bucket_bytes = bucket_bytes, .first_bucket_bytes = bucket_bytes, .first = false,
                                .solo_bytes = solo_bytes ? *solo_bytes : solo_bytes_of(comm, o)});
  for (std::size_t bi = 0; bi < buckets.size(); ++bi) {
    const bucket& b = buckets[bi];
    const std::size_t n = b.elements();
    compression zb = z;
    zb.seed = detail::bucket_seed(z.seed, bi);
    T* data = tensors[b.members[0]].data();
    const std::span<std::byte> f = b.members.size() > 1 ? buf.get(b.bytes) : std::span<std::byte>();
    if (b.members.size() > 1) {
      detail::traced_pack(comm, b, f, [&](std::size_t k) { return std::as_bytes(tensors[b.members[k]]); });
      data = reinterpret_cast<T*>(f.data());
    }
    compress_state<T>& lead = states[b.members[0]];
    st.step = 0;
    st.costs.reset();
    for (const std::size_t m : b.members) {
      st.step = std::max(st.step, states[m].step);
      if (!st.costs && states[m].costs) st.costs = states[m].costs;
    }
    st.residual.assign(z.error_feedback ? n : 0, A(0));
    if (z.error_feedback)
      for (std::size_t k = 0; k < b.members.size(); ++k) {
        const auto& r = states[b.members[k]].residual;
        if (r.size() == tensors[b.members[k]].size())
          std::copy(r.begin(), r.end(), st.residual.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k)));
      }
    st.powersgd = std::move(lead.powersgd);
    compressed_allreduce(comm, std::span<T>(data, n), zb, st, op, o);
    lead.powersgd = std::move(st.powersgd);
    for (std::size_t k = 0; k < b.members.size(); ++k) {
      compress_state<T>& s = states[b.members[k]];
      s.step = st.step;
      s.costs = st.costs;
      s.last = st.last;
      if (z.error_feedback) {
        const auto from = st.residual.begin() + static_cast<std::ptrdiff_t>(b.element_offset(k));
        s.residual.assign(from, from + static_cast<std::ptrdiff_t>(tensors[b.members[k]].size()));
      }
    }
    if (b.members.size() > 1)
      detail::traced_unpack(comm, b, std::span<const std::byte>(f),
                            [&](std::size_t k) { return std::as_writable_bytes(tensors[b.members[k]]); });
  }
}

} // namespace gradsync::fusion
