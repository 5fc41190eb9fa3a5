// gradsync: tensor fusion planning. Many small tensors cost one collective
// each (latency-bound: a 4 KiB allreduce is almost all per-message cost), so
// tensors that reduce alike are packed into one buffer and reduced together.
// This header is the pure part: which tensors share a bucket, where each
// lies in the bucket's buffer, and the copies in and out. It knows nothing
// of transports or threads; fusion/engine.hpp runs what it plans, and
// grouped_allreduce there uses it on a plain list.
//
// The rule (plan()):
//  - A bucket holds tensors of one key: element type, operator, codec key
//    (the whole compression configuration as text, "" for none) and memory
//    space. Tensors of different keys never share a buffer.
//  - Buckets are opened in submission order: each starts at the first tensor
//    not yet in a bucket, and takes later tensors of its key, in order, while
//    they fit its capacity. The first same-key tensor that does not fit
//    closes it (members of one key stay in submission order across buckets).
//  - Look-ahead: interleaved keys (f32, f16, f32, ...) must not shatter
//    buckets, so a bucket skips tensors of other keys, but only up to
//    `lookahead` positions past the first such tensor; positions are indices
//    in the input sequence. Past that window the bucket is closed, so a key
//    that appears rarely cannot hold a bucket open over the whole sequence.
//  - Capacity counts the fused buffer's bytes (members plus alignment
//    padding). The first bucket of a plan that starts a step (`first`) has
//    capacity first_bucket_bytes, all others bucket_bytes: as PyTorch DDP's
//    small first bucket, the first gradients of a step start moving before
//    the rest exist.
//  - A tensor larger than the capacity is its own bucket (it is not split:
//    the collective pipelines one large buffer anyway). So is every tensor
//    of at least solo_bytes: packing it would cost more (a copy in and one
//    out) than the call it saves; the engine derives that size from the cost
//    model. For bucket membership such a tensor counts as another key.
//  - A bucket is `complete` when no tensor added to the end of the input
//    could join it: it filled (the next same-key tensor did not fit, or it
//    is exactly at capacity), or its look-ahead window ends inside the input.
//    Otherwise it is open: an engine runs an open bucket only when it must
//    (cycle time, flush), hoping more tensors of its key arrive first.
//
// The layout (bucket::offsets): members back to back in submission order,
// each starting at a multiple of member_align = 16 bytes, padding zeroed.
// Why 16: every member then starts on a 16-byte vector boundary (SSE/NEON
// registers, CUDA's 16-byte packs), so the copies in and out, and any
// kernel run on a member inside the buffer (a view of it, a per-tensor
// scale), take the vector path with no scalar head; and every element type
// (2, 4, 8 bytes) divides 16, so offsets are whole elements of the bucket's
// type and the buffer is one typed array. It costs at most 14 bytes per
// member, nothing for the usual gradient sizes (multiples of 4 elements);
// only tensors of a few elements pay relatively more, and those are latency-
// bound, not bandwidth-bound. Zero padding is harmless to every reduction
// the engine fuses (sum/avg of zeros; min/max/prod padding is discarded).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/ops.hpp"
#include "../core/policy.hpp"
#include "../exec/executor.hpp"

namespace gradsync::fusion {

/// Alignment of each member's offset in a fused buffer (see the file comment).
inline constexpr std::size_t member_align = 16;

/// `n` rounded up to a multiple of `a` (a power of two).
constexpr std::size_t align_up(std::size_t n, std::size_t a = member_align) { return (n + a - 1) & ~(a - 1); }

/// What the planner knows of one tensor.
struct tensor_desc {
  std::uint64_t id = 0;        ///< the tensor's identity (not used by the rule; carried for callers)
  dtype dt = dtype::f32;
  std::size_t count = 0;       ///< elements
  op_kind op = op_kind::avg;
  std::string codec = {};      ///< "" uncompressed, else the compression's configuration as text
  memory_space space = memory_space::host;

  std::size_t bytes() const noexcept { return count * dtype_size(dt); }
};

/// What tensors must share to share a bucket.
struct bucket_key {
  dtype dt = dtype::f32;
  op_kind op = op_kind::avg;
  std::string codec = {};
  memory_space space = memory_space::host;

  friend bool operator==(const bucket_key&, const bucket_key&) = default;
  /// A printable, unique text of the key ("f32/avg/host/int8;...").
  std::string str() const {
    return std::string(dtype_name(dt)) + "/" + std::string(op_name(op)) + "/" +
           (space == memory_space::host ? "host" : "device") + "/" + codec;
  }
};

inline bucket_key key_of(const tensor_desc& t) { return {t.dt, t.op, t.codec, t.space}; }

/// Whether two tensors may share a bucket.
inline bool same_key(const tensor_desc& a, const tensor_desc& b) {
  return a.dt == b.dt && a.op == b.op && a.space == b.space && a.codec == b.codec;
}

/// One planned bucket.
struct bucket {
  bucket_key key;
  std::vector<std::size_t> members; ///< indices into the planned sequence, ascending (submission order)
  std::vector<std::size_t> offsets; ///< byte offset of each member in the fused buffer (multiples of member_align)
  std::vector<std::size_t> sizes;   ///< bytes of each member
  std::size_t bytes = 0;            ///< fused buffer bytes: last offset + last size (no tail padding)
  bool complete = false;            ///< no later tensor could join (see the file comment)

  /// Elements of the bucket's type in the fused buffer (padding included).
  std::size_t elements() const noexcept { return bytes / dtype_size(key.dt); }
  /// Element offset of member k (k-th of `members`) in the typed fused buffer.
  std::size_t element_offset(std::size_t k) const noexcept { return offsets[k] / dtype_size(key.dt); }
};

/// The thresholds of plan().
struct plan_options {
  std::size_t bucket_bytes = policy::fusion_bucket_bytes;
  std::size_t first_bucket_bytes = policy::fusion_first_bucket_bytes;
  std::size_t lookahead = policy::fusion_lookahead;
  /// The plan starts a step: its first bucket has capacity first_bucket_bytes.
  bool first = true;
  /// Tensors of at least this many bytes are never fused (their own bucket).
  std::size_t solo_bytes = std::numeric_limits<std::size_t>::max();
};

/// Splits `t` (in submission order) into buckets by the rule of the file
/// comment. Every tensor is in exactly one bucket; buckets come in the order
/// they were opened (by their first member). Pure and deterministic: equal
/// inputs give equal plans on every rank.
inline std::vector<bucket> plan(std::span<const tensor_desc> t, const plan_options& o = {}) {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  const std::size_t n = t.size();
  std::vector<char> taken(n, 0);
  std::vector<bucket> out;
  std::size_t start = 0; // the first tensor not yet in a bucket
  while (true) {
    while (start < n && taken[start]) ++start;
    if (start == n) break;
    const std::size_t cap = out.empty() && o.first ? o.first_bucket_bytes : o.bucket_bytes;
    bucket b;
    b.key = key_of(t[start]);
    b.members.push_back(start);
    b.offsets.push_back(0);
    b.sizes.push_back(t[start].bytes());
    b.bytes = t[start].bytes();
    taken[start] = 1;
    if (b.bytes >= cap || b.bytes >= o.solo_bytes) {
      b.complete = true; // oversized or solo (its own bucket), or exactly full
    } else {
      std::size_t miss = none; // first position holding a free tensor of another key
      std::size_t j = start + 1;
      for (; j < n; ++j) {
        if (miss != none && j - miss > o.lookahead) {
          b.complete = true; // the window ended inside the input
          break;
        }
        if (taken[j]) continue; // in an earlier bucket: neither a member nor a miss
        if (!same_key(t[j], t[start]) || t[j].bytes() >= o.solo_bytes) {
          if (miss == none) miss = j;
          continue;
        }
        const std::size_t at = align_up(b.bytes), end = at + t[j].bytes();
        if (end > cap) {
          b.complete = true; // the next tensor of this key does not fit
          break;
        }
        b.members.push_back(j);
        b.offsets.push_back(at);
        b.sizes.push_back(t[j].bytes());
        b.bytes = end;
        taken[j] = 1;
        if (end == cap) {
          b.complete = true;
          break;
        }
      }
    }
    out.push_back(std::move(b));
  }
  return out;
}

/// Packs bucket `b` into `fused` (at least b.bytes): one pass front to back,
/// member k's bytes (`src(k)`, a span of exactly b.sizes[k] bytes, k indexing
/// b.members) at its offset and zeros in the gaps.
template <class Src> void pack(const bucket& b, std::span<std::byte> fused, Src&& src) {
  GRADSYNC_REQUIRE(fused.size() >= b.bytes, "fusion.pack", -1,
                   "fused buffer holds " + std::to_string(fused.size()) + " bytes, the bucket " + std::to_string(b.bytes));
  std::size_t at = 0;
  for (std::size_t k = 0; k < b.members.size(); ++k) {
    const std::span<const std::byte> s = src(k);
    GRADSYNC_REQUIRE(s.size() == b.sizes[k], "fusion.pack", -1,
                     "member " + std::to_string(k) + " holds " + std::to_string(s.size()) + " bytes, planned " +
                         std::to_string(b.sizes[k]));
    if (b.offsets[k] > at) std::memset(fused.data() + at, 0, b.offsets[k] - at);
    if (!s.empty()) std::memcpy(fused.data() + b.offsets[k], s.data(), s.size());
    at = b.offsets[k] + s.size();
  }
}

/// Copies each member of bucket `b` out of `fused` into `dst(k)` (a span of
/// exactly b.sizes[k] bytes), in one pass.
template <class Dst> void unpack(const bucket& b, std::span<const std::byte> fused, Dst&& dst) {
  GRADSYNC_REQUIRE(fused.size() >= b.bytes, "fusion.unpack", -1,
                   "fused buffer holds " + std::to_string(fused.size()) + " bytes, the bucket " + std::to_string(b.bytes));
  for (std::size_t k = 0; k < b.members.size(); ++k) {
    const std::span<std::byte> d = dst(k);
    GRADSYNC_REQUIRE(d.size() == b.sizes[k], "fusion.unpack", -1,
                     "member " + std::to_string(k) + " holds " + std::to_string(d.size()) + " bytes, planned " +
                         std::to_string(b.sizes[k]));
    if (!d.empty()) std::memcpy(d.data(), fused.data() + b.offsets[k], d.size());
  }
}

} // namespace gradsync::fusion
