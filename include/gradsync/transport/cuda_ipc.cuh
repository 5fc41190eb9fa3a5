// gradsync: the CUDA-IPC transport. Processes of one node (one GPU or
// several GPUs of the node: each rank on its current device) run the direct
// collectives on DEVICE memory by reading each other's buffers in place
// through CUDA IPC, with the element work of exec::cuda (exec/cuda.cuh) on
// the communicator's stream. Built over a shm::communicator (the boot
// transport), which carries the small records a call exchanges and its
// host-side barriers; point-to-point messages of device ranges are staged
// through it exactly as staged<shm::communicator, cuda_copier> does (the
// communicator holds one and forwards to it), so it is also an ordinary
// `device_memory` transport for every message schedule of collectives.hpp.
//
//   gradsync::shm::communicator boot(dir, rank, ranks);
//   cudaSetDevice(...);                        // before: the rank's device
//   gradsync::cuda_ipc::communicator ipc(boot, stream);
//   ipc.allreduce(d_in, d_out, n, gradsync::op::avg{});    // direct, in place
//   gradsync::allreduce(ipc, gradsync::exec::cuda(stream),  // or any schedule
//                       std::span<const float>(d_in, n), std::span(d_out, n));
//
// The direct collectives are MEMBER functions (allreduce, reduce_scatter,
// allgather, broadcast): collectives.hpp picks `algorithm::direct` only for
// shared-arena transports, whose direct schedules read host memory. Every
// rank of the group calls the same one with the same count, type, operator
// and root. Protocol of a call:
//   1. cudaStreamSynchronize(stream): the stream's earlier work on the
//      buffers (whoever enqueued it there) is done. Work on other streams
//      must be complete before the call: the caller's to order.
//   2. Every rank sends every rank a record: the call (collective, dtype,
//      operator, count, root) and, for each buffer peers read (allreduce: in
//      and out; reduce_scatter and allgather: in; broadcast: the root's
//      data), the cudaIpcMemHandle_t of the allocation holding it, the
//      pointer's offset in it and the allocation's size. Receiving every
//      record is the first barrier: every rank has entered and its buffers
//      are final. Ranks whose calls differ fail alike on every rank
//      (errc::mismatch naming rank 0's call and the first other one); a
//      rank that cannot take part (host memory, an overlap, a failed CUDA
//      call) says so in its record: it fails with its own error, every other
//      rank with errc::peer_failed naming it.
//   3. Each rank maps what it reads: cudaIpcOpenMemHandle once per (peer,
//      allocation), then from the communicator's cache (opening costs far
//      more than a call: NCCL caches its registrations the same way).
//   4. Kernels on the stream read the peers' buffers through the mappings
//      and write only this rank's own buffers; cudaStreamSynchronize, then a
//      host barrier (a dissemination barrier of empty messages on boot).
//      allreduce has two such phases: rank r reduces share r of every rank's
//      `in` into its own `out`; after the barrier every rank copies every
//      other share q from rank q's `out` (cudaMemcpyAsync device to device).
//      The last barrier ends the call: no rank returns (and frees or
//      rewrites a buffer) while a peer still reads it.
// Peers never write a rank's memory, so a call needs no ordering beyond
// "my buffers are final before I publish them" and "nobody returns before
// every reader is done".
//
// Determinism: every element is reduced as op(...op(x0, x1)..., x(p-1)) in
// rank order (exec::cuda::reduce, pairwise, rank 0's share first), then
// avg's one division by p (exec::cuda::finish), exactly as
// algo/shm_direct.hpp and the host executor do (both executors run
// core/reduce.hpp's combine1/finish1): bitwise the host direct path's
// results, on every rank, whatever the rank count or the grid.
//
// In place (in == out) is safe: until the middle barrier rank r writes only
// share r of its buffer and peers read only the other shares of it; after
// it nobody reads `in`, and peers read only share r of r's `out`, which r
// no longer writes. The one hazard is this rank's own chain: its first
// pairwise reduce writes share r before the chain reads x_r (r >= 2), so
// share r of `in` is first copied to scratch (cudaMallocAsync, private,
// never published). Reduce-scatter (out = in + r * block) and allgather
// (in = out + r * block) are in place the same way.
//
// Buffers: device memory from cudaMalloc (or any allocation the legacy IPC
// API exports: cudaMallocAsync's pools, managed and host memory are not),
// of the device current when the communicator was made, which must still be
// current at each call. Ranks on different GPUs read each other over peer
// access (cudaIpcMemLazyEnablePeerAccess); where the two GPUs cannot reach
// each other, the call fails with cudaIpcOpenMemHandle's error. Ranks in
// one process (threads over one shm::communicator group) share an address
// space: a peer's pointer is used as it is, nothing is mapped.
//
// FREEING A BUFFER: a peer's cached mapping does not reliably keep the
// memory alive or current: a buffer freed and another allocated at the same
// address may come back with the same handle, and a peer would read the old
// mapping. Free (cudaFree) a buffer that took part in a call only after
//   - every rank called forget(p) (collective: each rank names the buffer it
//     is about to free, or nullptr; peers close their mappings of its
//     allocation), or
//   - every rank called release_mappings() (collective: closes all), or
//   - every rank's communicator was destroyed (the destructor closes this
//     rank's mappings; it is not collective).
//
// Errors: a failed CUDA call is gradsync::error(errc::internal,
// "cuda_ipc.<op>", rank, peer, "<the call> failed: ..."), and aborts the
// boot group so that peers waiting in a barrier fail at once (errc::aborted)
// instead of timing out. A dead peer fails the boot transport's waits
// (errc::peer_failed; a hung one errc::timeout after timeout()): they
// propagate. A failed call marks the boot communicator's call record (every
// later call, direct or not, fails with errc::aborted until it is rebuilt),
// as collectives.hpp does. A kernel fault is reported by the next
// cudaStreamSynchronize (every phase has one).
//
// Limits: one thread at a time per communicator (as shm's). p - 1 pairwise
// passes per share (each reads the accumulator and one input, writes the
// accumulator): a fused kernel reading all p inputs once would move about
// 3x fewer bytes at p = 8; the chain keeps exec::cuda's exact arithmetic.
// Three host barriers per allreduce (two for the others): a few us each
// over shm, so small calls are latency-bound; stream-ordered flags in
// mapped memory would remove them (NCCL's way).
//
// Timing it (not built yet): a bench mode next to `gradsync-bench allreduce
// --device gpu -t shm` that forks p ranks on one GPU, builds a
// cuda_ipc::communicator per rank on a non-blocking stream, warms up with 5
// calls on the same buffers (so cudaIpcOpenMemHandle is out of the loop),
// then times R calls with a steady_clock around the loop (each call ends
// synchronised: no events needed) and takes the slowest rank's median,
// reported like nccl-tests (algbw = bytes / t, busbw = algbw * 2(p-1)/p for
// allreduce, (p-1)/p for reduce_scatter/allgather), next to the staged path
// and nccl's over the same sizes (4 KiB .. 1 GiB, powers of 4). Also worth a
// row: the first call on fresh buffers (cost of mapping), and one call
// split into its phases (cudaEventRecord around each kernel group) to see
// the barrier share.
#pragma once

#if !defined(__CUDACC__)
#error "gradsync/transport/cuda_ipc.cuh is a CUDA header: compile it with nvcc"
#endif

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda.h> // types of the driver call reached through the runtime: no -lcuda
#include <cuda_runtime.h>

#include "../algo/dissemination.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../exec/cuda.cuh"
#include "capabilities.hpp"
#include "cuda_staging.cuh"
#include "shm.hpp"
#include "staged.hpp"

namespace gradsync::cuda_ipc {

/// Tag of the records and barriers of the direct calls on the boot transport.
inline constexpr int tag = policy::cuda_ipc_tag;

namespace detail {

enum class call : std::uint8_t { allreduce, reduce_scatter, allgather, broadcast, forget, release };
inline const char* call_name(call k) {
  switch (k) {
  case call::allreduce: return "allreduce";
  case call::reduce_scatter: return "reduce_scatter";
  case call::allgather: return "allgather";
  case call::broadcast: return "broadcast";
  case call::forget: return "forget";
  case call::release: return "release_mappings";
  }
  return "?";
}

/// Where one buffer a call reads lies: enough for a peer to map it.
struct exposed {
  cudaIpcMemHandle_t handle; ///< of the allocation holding it
  std::uint64_t offset;      ///< of the pointer in that allocation
  std::uint64_t alloc_bytes; ///< the allocation's size
  std::uint64_t address;     ///< the pointer in its process (peers in the same process use it)
  std::uint64_t bytes;       ///< the range the call reads
};

/// What a rank sends every rank at the start of a call.
struct record {
  std::uint64_t count = 0; ///< elements (per rank's block for reduce_scatter / allgather)
  std::int64_t pid = 0;
  std::int32_t root = -1;
  std::int32_t device = -1;
  call kind{};
  std::uint8_t dtype = 0, op = 0;
  std::uint8_t flags = 0;   ///< has_in | has_out | unable
  std::uint8_t problem = 0; ///< errc of an `unable` rank's own error
  exposed in{}, out{};

  static constexpr std::uint8_t has_in = 1, has_out = 2, unable = 4;
  bool same_call(const record& o) const {
    return kind == o.kind && dtype == o.dtype && op == o.op && count == o.count && root == o.root;
  }
  std::string describe() const {
    std::string s = std::string(call_name(kind));
    if (kind == call::forget || kind == call::release) return s;
    s += " of " + std::to_string(count) + " " + std::string(dtype_name(static_cast<gradsync::dtype>(dtype)));
    if (kind == call::reduce_scatter || kind == call::allgather) s += " per rank";
    if (kind == call::allreduce || kind == call::reduce_scatter)
      s += " (" + std::string(op_name(static_cast<op_kind>(op))) + ")";
    if (kind == call::broadcast) s += " from rank " + std::to_string(root);
    return s;
  }
};

/// A mapping cache key: the peer and the handle's bytes.
struct map_key {
  int peer;
  std::array<char, sizeof(cudaIpcMemHandle_t)> handle;
  auto operator<=>(const map_key&) const = default;
};
inline map_key key_of(int peer, const cudaIpcMemHandle_t& h) {
  map_key k{peer, {}};
  std::memcpy(k.handle.data(), &h, sizeof h);
  return k;
}

/// cuMemGetAddressRange (the start and size of the allocation holding a
/// pointer: the runtime has no call for it), reached through
/// cudaGetDriverEntryPointByVersion so that nothing links libcuda; null
/// where the driver does not provide it.
using address_range_fn = CUresult(CUDAAPI*)(CUdeviceptr*, std::size_t*, CUdeviceptr);
inline address_range_fn address_range() {
  static const address_range_fn f = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return address_range_fn{};
    }
    return reinterpret_cast<address_range_fn>(p);
  }();
  return f;
}

/// Share q of n elements over p ranks: near-equal parts (core/partition.hpp's
/// split, rounded up to 16-byte multiples so that every share starts where
/// exec::cuda's 16-byte vector path applies); the last ones may be short or
/// empty. Returns {offset, size}.
inline std::pair<std::size_t, std::size_t> share(std::size_t n, int p, int q, std::size_t elem) {
  const auto P = static_cast<std::size_t>(p);
  const std::size_t align = std::max<std::size_t>(1, 16 / elem);
  const std::size_t sh = ((n + P - 1) / P + align - 1) / align * align;
  const std::size_t off = std::min(n, static_cast<std::size_t>(q) * sh);
  return {off, std::min(sh, n - off)};
}

/// Whether byte ranges [a, a + an) and [b, b + bn) overlap.
inline bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

/// An error every rank already knows about (raised after the record
/// exchange): the group is not aborted for it.
struct agreed : error {
  using error::error;
};

} // namespace detail

/// One rank's endpoint (see the file comment). Holds a reference: `boot`
/// must outlive it. Not copyable or movable (peers' mappings are its own).
class communicator {
public:
  static constexpr std::string_view name = "cuda_ipc";
  static constexpr bool device_memory = true;

  /// Over `boot` (processes of one node), on `stream` of the current device
  /// (recorded now: it must be current at every call).
  communicator(shm::communicator& boot, cudaStream_t stream)
      : boot_(&boot), staged_(boot, cuda_copier(stream)), stream_(stream), ex_(stream), pid_(::getpid()) {
    ok(cudaGetDevice(&device_), "cuda_ipc.communicator", -1, "cudaGetDevice");
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  /// Closes this rank's cached mappings (not collective: see the file
  /// comment on freeing).
  ~communicator() {
    for (auto& [k, base] : maps_) (void)cudaIpcCloseMemHandle(base);
  }

  int rank() const noexcept { return boot_->rank(); }
  int size() const noexcept { return boot_->size(); }
  /// The boot transport, the stream and the device of this rank.
  shm::communicator& boot() const noexcept { return *boot_; }
  cudaStream_t stream() const noexcept { return stream_; }
  int device() const noexcept { return device_; }

  // ---- the transport: device ranges staged through boot (staged.hpp) ----
  auto isend(std::span<const std::byte> data, int peer, int t) { return staged_.isend(data, peer, t); }
  auto irecv(std::span<std::byte> data, int peer, int t) { return staged_.irecv(data, peer, t); }
  auto irecv_upto(std::span<std::byte> capacity, int peer, int t) { return staged_.irecv_upto(capacity, peer, t); }
  std::chrono::milliseconds timeout() const { return boot_->timeout(); }
  void set_timeout(std::chrono::milliseconds t) { boot_->set_timeout(t); }
  void abort(const std::string& reason) { boot_->abort(reason); }
  /// boot's call record: calls here and on boot are numbered and failed together.
  call_record& calls() { return boot_->calls(); }
  timeline* trace() const { return boot_->trace(); }

  // ---- the direct collectives on device memory (see the file comment) ----

  /// out = op over ranks of in (n elements each); in == out allowed.
  template <element T, reduce_op Op> void allreduce(const T* in, T* out, std::size_t n, Op op) {
    const char* nm = "cuda_ipc.allreduce";
    run(nm, [&] {
      const std::size_t bytes = n * sizeof(T);
      std::string why;
      if (in != out && detail::overlap(in, bytes, out, bytes)) why = "input and output overlap without being the same buffer";
      const auto all = publish(nm, head<T, Op>(detail::call::allreduce, n), {in, bytes}, {out, bytes}, std::move(why));
      if (n == 0) return;
      const int p = size(), r = rank();
      const auto [off, m] = detail::share(n, p, r, sizeof(T));
      if (m) { // (a rank with an empty share maps no input)
        std::vector<const T*> src(static_cast<std::size_t>(p));
        for (int q = 0; q < p; ++q) src[static_cast<std::size_t>(q)] = peer_in<T>(nm, all, q, in) + off;
        reduce_chain(nm, out + off, src, m, op);
      }
      settle(nm);
      for (int q = 0; q < p; ++q)
        if (q != r) {
          const auto [o, k] = detail::share(n, p, q, sizeof(T));
          if (k) ex_.copy(out + o, peer_out<T>(nm, all, q) + o, k);
        }
      settle(nm);
    });
  }

  /// out (block elements) = op over ranks of block r of their in (p * block
  /// elements); out == in + r * block allowed, any other overlap not.
  template <element T, reduce_op Op> void reduce_scatter(const T* in, T* out, std::size_t block, Op op) {
    const char* nm = "cuda_ipc.reduce_scatter";
    run(nm, [&] {
      const int p = size(), r = rank();
      const std::size_t bytes = block * sizeof(T), r_off = static_cast<std::size_t>(r) * block;
      std::string why;
      if (out != in + r_off && detail::overlap(in, bytes * static_cast<std::size_t>(p), out, bytes))
        why = "the output overlaps the input other than as its block " + std::to_string(r);
      const auto all = publish(nm, head<T, Op>(detail::call::reduce_scatter, block), {in, bytes * static_cast<std::size_t>(p)},
                               {out, bytes, false}, std::move(why));
      if (block == 0) return;
      std::vector<const T*> src(static_cast<std::size_t>(p));
      for (int q = 0; q < p; ++q) src[static_cast<std::size_t>(q)] = peer_in<T>(nm, all, q, in) + r_off;
      reduce_chain(nm, out, src, block, op);
      settle(nm);
    });
  }

  /// Block q of out (p * block elements) = rank q's in (block elements);
  /// in == out + r * block allowed, any other overlap not.
  template <element T> void allgather(const T* in, T* out, std::size_t block) {
    const char* nm = "cuda_ipc.allgather";
    run(nm, [&] {
      const int p = size(), r = rank();
      const std::size_t bytes = block * sizeof(T);
      std::string why;
      if (in != out + static_cast<std::size_t>(r) * block && detail::overlap(in, bytes, out, bytes * static_cast<std::size_t>(p)))
        why = "the input overlaps the output other than as its block " + std::to_string(r);
      const auto all = publish(nm, head<T>(detail::call::allgather, block), {in, bytes},
                               {out, bytes * static_cast<std::size_t>(p), false}, std::move(why));
      if (block == 0) return;
      for (int q = 0; q < p; ++q)
        ex_.copy(out + static_cast<std::size_t>(q) * block, peer_in<T>(nm, all, q, in), block);
      settle(nm);
    });
  }

  /// data (n elements) = root's data on every rank.
  template <element T> void broadcast(T* data, std::size_t n, int root) {
    const char* nm = "cuda_ipc.broadcast";
    run(nm, [&] {
      const int p = size(), r = rank();
      std::string why;
      if (root < 0 || root >= p) why = "root " + std::to_string(root) + " is not a rank of " + std::to_string(p);
      auto h = head<T>(detail::call::broadcast, n);
      h.root = root;
      const auto all = publish(nm, h, {data, n * sizeof(T), r == root}, {}, std::move(why));
      if (n == 0) return;
      if (r != root) ex_.copy(data, peer_in<T>(nm, all, root, data), n);
      settle(nm);
    });
  }

  /// Collective: every rank names a buffer it is about to free (or nullptr);
  /// every peer closes its mapping of that buffer's allocation (other
  /// buffers of the same allocation lose it too, and are mapped again when
  /// they next take part). Returns once every rank has closed: the buffer
  /// may then be freed.
  void forget(const void* p) {
    const char* nm = "cuda_ipc.forget";
    run(nm, [&] {
      detail::record h{};
      h.kind = detail::call::forget;
      const auto all = publish(nm, h, {p, p ? std::size_t{1} : 0}, {}, {});
      for (int q = 0; q < size(); ++q)
        if (q != rank() && (all[static_cast<std::size_t>(q)].flags & detail::record::has_in))
          close(nm, detail::key_of(q, all[static_cast<std::size_t>(q)].in.handle));
      barrier();
    });
  }
  /// Collective: closes every cached mapping; returns once every rank has,
  /// so that any buffer may then be freed. Later calls map again.
  void release_mappings() {
    const char* nm = "cuda_ipc.release_mappings";
    run(nm, [&] {
      detail::record h{};
      h.kind = detail::call::release;
      (void)publish(nm, h, {}, {}, {});
      while (!maps_.empty()) close(nm, maps_.begin()->first);
      // (No barrier is needed before closing: every call ended with one, so
      // no peer reads through these mappings; the one after is what lets
      // the owners free.)
      barrier();
    });
  }

  /// cudaIpcOpenMemHandle calls made so far (mapping cache misses).
  std::uint64_t opened_mappings() const noexcept { return opened_; }
  /// Mappings held now.
  std::size_t cached_mappings() const noexcept { return maps_.size(); }

private:
  // A buffer a call names: the range, and whether peers read it (then it is
  // published: mapped by them).
  struct buffer {
    const void* p = nullptr;
    std::size_t bytes = 0;
    bool shared = true;
  };

  template <element T, class Op = void> detail::record head(detail::call k, std::size_t count) const {
    detail::record h{};
    h.kind = k;
    h.count = count;
    h.dtype = static_cast<std::uint8_t>(dtype_traits<T>::id);
    if constexpr (!std::is_void_v<Op>) h.op = static_cast<std::uint8_t>(Op::kind);
    return h;
  }

  // A failed CUDA call as gradsync::error(errc::internal) of `op`.
  void ok(cudaError_t e, const char* op, int peer, const char* what) const {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError(); // not left to the next launch check
    throw error(errc::internal, op, boot_->rank(), peer,
                std::string(what) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

  // Runs one call: fails fast after an earlier failure, records this one's,
  // names the call in errors from below it, aborts the group when the peers
  // cannot know (a CUDA failure mid-call) so they stop waiting.
  template <class F> void run(const char* nm, F body) {
    const int r = rank();
    if (calls().failed())
      throw error(errc::aborted, nm, r, -1,
                  "the communicator failed in an earlier call and must be rebuilt (" + calls().failure() + ")");
    try {
      body();
    } catch (const detail::agreed& e) {
      calls().fail(e.what());
      throw error(e.kind(), e.op(), e.rank(), e.peer(), e.reason());
    } catch (const error& e) {
      calls().fail(e.what());
      if (e.kind() == errc::internal) boot_->abort(e.what());
      if (e.op() == nm) throw;
      throw error(e.kind(), nm, r, e.peer(), e.op() + ": " + e.reason());
    } catch (const std::exception& e) {
      calls().fail(std::string(nm) + ": " + e.what());
      boot_->abort(e.what());
      throw error(errc::internal, nm, r, -1, e.what());
    }
  }

  // Fills `x` for buffer b; an empty string, or why this rank cannot take
  // part (with the kind of its error in `kind`).
  std::string expose(const char* what, buffer b, detail::exposed& x, errc& kind, const char* nm) const {
    if (b.bytes == 0) return {};
    if (!b.p) return std::string(what) + " is null";
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, b.p) != cudaSuccess) {
      (void)cudaGetLastError();
      a.type = cudaMemoryTypeUnregistered;
    }
    if (a.type != cudaMemoryTypeDevice)
      return std::string(what) + " (" + std::to_string(b.bytes) + " bytes) is " +
             (a.type == cudaMemoryTypeManaged ? "managed" : "host") +
             " memory: cuda_ipc needs device memory from cudaMalloc";
    if (a.device != device_)
      return std::string(what) + " is on device " + std::to_string(a.device) + ", the communicator's is " +
             std::to_string(device_);
    if (!b.shared) return {};
    try {
      const detail::address_range_fn range = detail::address_range();
      if (!range) ok(cudaErrorNotSupported, nm, -1, "cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)");
      CUdeviceptr base = 0;
      std::size_t size = 0;
      const auto ptr = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(b.p));
      const CUresult cr = range(&base, &size, ptr);
      if (cr != CUDA_SUCCESS)
        throw error(errc::internal, nm, rank(), -1, "cuMemGetAddressRange failed: CUresult " + std::to_string(cr));
      x.offset = ptr - base;
      x.alloc_bytes = size;
      x.address = reinterpret_cast<std::uintptr_t>(b.p);
      x.bytes = b.bytes;
      if (x.offset + x.bytes > size)
        return std::string(what) + " (" + std::to_string(b.bytes) + " bytes at offset " + std::to_string(x.offset) +
               ") extends past its allocation of " + std::to_string(size) + " bytes";
      ok(cudaIpcGetMemHandle(&x.handle, reinterpret_cast<void*>(static_cast<std::uintptr_t>(base))), nm, -1,
         "cudaIpcGetMemHandle (stream-ordered and virtual-memory allocations cannot be exported)");
    } catch (const error& e) {
      kind = e.kind();
      return e.reason();
    }
    return {};
  }

  // Steps 1 and 2 of the file comment: synchronises the stream, sends this
  // rank's record (call `h`, buffers `in` and `out`) to every rank, gathers
  // every rank's, and fails every rank alike when calls differ or a rank
  // cannot take part (`why`: this rank's reason, if any).
  std::vector<detail::record> publish(const char* nm, detail::record h, buffer in, buffer out, std::string why) {
    const int p = size(), r = rank();
    errc kind = errc::invalid_argument;
    h.pid = pid_;
    h.device = device_;
    if (why.empty()) {
      int cur = -1;
      ok(cudaGetDevice(&cur), nm, -1, "cudaGetDevice");
      if (cur != device_)
        why = "the current device is " + std::to_string(cur) + ", the communicator's is " + std::to_string(device_);
    }
    if (why.empty()) why = expose("the input", in, h.in, kind, nm);
    if (why.empty()) why = expose("the output", out, h.out, kind, nm);
    if (why.empty()) ok(cudaStreamSynchronize(stream_), nm, -1, "cudaStreamSynchronize");
    if (in.shared && in.bytes) h.flags |= detail::record::has_in;
    if (out.shared && out.bytes) h.flags |= detail::record::has_out;
    if (!why.empty()) {
      h.flags = detail::record::unable;
      h.problem = static_cast<std::uint8_t>(kind);
    }
    std::vector<detail::record> all(static_cast<std::size_t>(p));
    all[static_cast<std::size_t>(r)] = h;
    {
      std::vector<shm::request> reqs;
      reqs.reserve(2 * static_cast<std::size_t>(p));
      const auto mine = std::as_bytes(std::span(&h, 1));
      for (int q = 0; q < p; ++q)
        if (q != r) {
          reqs.push_back(boot_->irecv(std::as_writable_bytes(std::span(&all[static_cast<std::size_t>(q)], 1)), q, tag));
          reqs.push_back(boot_->isend(mine, q, tag));
        }
      for (auto& q : reqs) q.wait();
    }
    for (int q = 1; q < p; ++q)
      if (!all[static_cast<std::size_t>(q)].same_call(all[0]))
        throw detail::agreed(errc::mismatch, nm, r, r == q ? 0 : q,
                             "ranks disagree on the call: rank 0 calls " + all[0].describe() + ", rank " +
                                 std::to_string(q) + " calls " + all[static_cast<std::size_t>(q)].describe());
    if (!why.empty()) throw detail::agreed(kind, nm, r, -1, why);
    for (int q = 0; q < p; ++q)
      if (all[static_cast<std::size_t>(q)].flags & detail::record::unable)
        throw detail::agreed(errc::peer_failed, nm, r, q,
                             "rank " + std::to_string(q) + " cannot take part in the call (" +
                                 errc_name(static_cast<errc>(all[static_cast<std::size_t>(q)].problem)) +
                                 ": see its error)");
    return all;
  }

  // Where this rank reads rank q's published buffer x: mapped (cached), or
  // the address itself for a rank of this process.
  std::byte* mapped(const char* nm, int q, const detail::record& rec, const detail::exposed& x) {
    if (rec.pid == pid_) return reinterpret_cast<std::byte*>(static_cast<std::uintptr_t>(x.address));
    auto it = maps_.find(detail::key_of(q, x.handle));
    if (it == maps_.end()) {
      void* base = nullptr;
      ok(cudaIpcOpenMemHandle(&base, x.handle, cudaIpcMemLazyEnablePeerAccess), nm, q, "cudaIpcOpenMemHandle");
      ++opened_;
      it = maps_.emplace(detail::key_of(q, x.handle), base).first;
    }
    return static_cast<std::byte*>(it->second) + x.offset;
  }
  // Rank q's input (this rank's own: `mine`), and output.
  template <class T> const T* peer_in(const char* nm, const std::vector<detail::record>& all, int q, const T* mine) {
    if (q == rank()) return mine;
    const detail::record& rec = all[static_cast<std::size_t>(q)];
    return reinterpret_cast<const T*>(mapped(nm, q, rec, rec.in));
  }
  template <class T> const T* peer_out(const char* nm, const std::vector<detail::record>& all, int q) {
    const detail::record& rec = all[static_cast<std::size_t>(q)];
    return reinterpret_cast<const T*>(mapped(nm, q, rec, rec.out));
  }
  void close(const char* nm, const detail::map_key& k) {
    const auto it = maps_.find(k);
    if (it == maps_.end()) return;
    void* base = it->second;
    maps_.erase(it);
    ok(cudaIpcCloseMemHandle(base), nm, k.peer, "cudaIpcCloseMemHandle");
  }

  // dst[0, m) = op over q in rank order of src[q][0, m), finished (avg's
  // division), on the stream. dst may be src[0] or src[1] (each element is
  // read before it is written); a later src[q] that is dst would be
  // overwritten by the first step, so it is read from a private copy.
  template <element T, reduce_op Op>
  void reduce_chain(const char* nm, T* dst, std::vector<const T*>& src, std::size_t m, Op op) {
    const int p = size();
    if (m == 0) return;
    std::optional<exec::cuda_scratch<T>> own; // freed on the stream, after the chain
    for (std::size_t q = 2; q < src.size(); ++q)
      if (src[q] == dst) {
        own.emplace(std::span<std::byte>{}, m, nm, rank(), stream_);
        ex_.copy(own->data(), src[q], m);
        src[q] = own->data();
      }
    if (p == 1) ex_.copy(dst, src[0], m);
    else ex_.reduce(dst, src[0], src[1], m, op);
    for (std::size_t q = 2; q < src.size(); ++q) ex_.reduce(dst, static_cast<const T*>(dst), src[q], m, op);
    ex_.finish(dst, m, op, p);
  }

  // Step 4's end: this rank's kernels are done, then every rank's are.
  void settle(const char* nm) {
    ok(cudaStreamSynchronize(stream_), nm, -1, "cudaStreamSynchronize");
    barrier();
  }
  void barrier() { algo::dissemination::barrier(*boot_, tag); }

  shm::communicator* boot_;
  staged<shm::communicator, cuda_copier> staged_;
  cudaStream_t stream_;
  exec::cuda ex_;
  std::int64_t pid_;
  int device_ = -1;
  std::map<detail::map_key, void*> maps_;
  std::uint64_t opened_ = 0;
};

static_assert(transport<communicator> && gradsync::device_memory<communicator> && timed<communicator> &&
              abortable<communicator> && recorded<communicator> && traced<communicator> &&
              upto_receiver<communicator> && !shared_arena<communicator>);

} // namespace gradsync::cuda_ipc
