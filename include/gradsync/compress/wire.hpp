// gradsync: the self-describing wire format of every compressed payload.
//
// Layout (all integers little-endian, no padding beyond what is listed):
//
//   offset size field
//   0      4    magic: the bytes 'G' 'S' 'C' 'Z'
//   4      1    format version (format_version)
//   5      1    codec id (codec_id)
//   6      1    element dtype of the tensor that was encoded (core/dtype.hpp values)
//   7      1    P: bytes of codec parameters; a multiple of 8, at most max_param_bytes
//   8      8    element count of the tensor (u64)
//   16     8    B: bytes of the codec body (u64)
//   24     8    checksum (u64) over the whole payload with this field read as zero
//   32     P    codec parameters (layout owned by each codec, documented in its header)
//   32+P   B    codec body
//
// A payload is exactly 32 + P + B bytes: shorter or longer input is rejected.
// The body starts 8-byte aligned relative to the payload start, so device
// kernels can use aligned vector loads when the buffer itself is aligned.
//
// The checksum is sum_i mix64(w_i ^ (i * K)) over the payload read as u64
// words (the last one zero-padded), finished as mix64(sum ^ total_bytes);
// mix64 is the SplitMix64 finaliser (a bijection), so any change to one word
// always changes the checksum, and independent changes collide with
// probability ~2^-64. A sum of per-word terms is a plain parallel reduction on
// a GPU. It detects transport corruption; it is not a MAC.
//
// Decoders call open(): it checks size, magic, version, codec, dtype, the
// parameter length and the checksum, and throws gradsync::error (op such as
// "decode.int8", rank -1, kind errc::corrupt_payload) before anything is
// written. Every rejection of a payload's content is errc::corrupt_payload,
// including an intact payload of another codec, dtype or element count than
// the decoder was given; bad arguments of the caller (encode parameters, a
// workspace too small) are errc::invalid_argument. Each codec then checks
// its parameters, the count against the output, the exact body length for
// that count, and the body content, still before writing. See docs/wire-format.md.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>

#include "../core/config.hpp"
#include "../core/dtype.hpp"
#include "../core/error.hpp"
#include "../core/host_simd.hpp"

namespace gradsync::compress {

static_assert(std::endian::native == std::endian::little,
              "gradsync payloads are little-endian; big-endian hosts need byte swaps here");

/// Stable identifier of a codec in the wire format. Values never change;
/// applications may use 128..255 for their own codecs.
enum class codec_id : std::uint8_t {
  fp16 = 1,
  bf16 = 2,
  int8 = 3,
  int4 = 4,
  qsgd = 5,
  terngrad = 6,
  sign = 7,
  topk = 16,
  approx_topk = 17,
  randomk = 18,
  threshold = 19,
  powersgd = 20,
};

/// Short name of a codec id ("int8", ...); "?" when unknown.
constexpr std::string_view codec_name(codec_id c) {
  switch (c) {
  case codec_id::fp16: return "fp16";
  case codec_id::bf16: return "bf16";
  case codec_id::int8: return "int8";
  case codec_id::int4: return "int4";
  case codec_id::qsgd: return "qsgd";
  case codec_id::terngrad: return "terngrad";
  case codec_id::sign: return "sign";
  case codec_id::topk: return "topk";
  case codec_id::approx_topk: return "approx_topk";
  case codec_id::randomk: return "randomk";
  case codec_id::threshold: return "threshold";
  case codec_id::powersgd: return "powersgd";
  }
  return "?";
}

namespace wire {

inline constexpr std::byte magic[4] = {std::byte{'G'}, std::byte{'S'}, std::byte{'C'},
                                       std::byte{'Z'}};
/// Version written by this build and the only one it reads.
inline constexpr std::uint8_t format_version = 1;
/// Size of the fixed header.
inline constexpr std::size_t header_bytes = 32;
/// Largest parameter block (P is one byte and a multiple of 8).
inline constexpr std::size_t max_param_bytes = 248;
/// Offset of the checksum field.
inline constexpr std::size_t checksum_offset = 24;

/// Little-endian load of a trivially copyable value from unaligned bytes.
template <class V> GRADSYNC_HD inline V load(const std::byte* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
/// Little-endian store of a trivially copyable value to unaligned bytes.
template <class V> GRADSYNC_HD inline void store(std::byte* p, V v) {
  std::memcpy(p, &v, sizeof v);
}

/// SplitMix64 finaliser: a bijection on 64-bit words with full avalanche.
GRADSYNC_HD inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// The checksum term of 64-bit word `w` at word index `i`.
GRADSYNC_HD inline std::uint64_t checksum_term(std::uint64_t w, std::uint64_t i) {
  return mix64(w ^ (i * 0x9e3779b97f4a7c15ull));
}

namespace detail {

/// Sum of the checksum terms of the whole words [first, last) of `p`.
inline std::uint64_t checksum_words(const std::byte* p, std::size_t first, std::size_t last) {
  std::uint64_t sum = 0;
  for (std::size_t i = first; i < last; ++i) sum += checksum_term(load<std::uint64_t>(p + 8 * i), i);
  return sum;
}

#if GRADSYNC_HOST_AVX2
/// The same loop with 64-bit lane multiplies (AVX-512DQ): 4x faster (32 MiB:
/// 1.2 ms vs 4.9 ms on the CI machine), so sealing and checking stay far
/// below a memcpy of the payload. Integer only, so the result is identical.
[[gnu::target("avx512f,avx512dq,avx512vl"), gnu::flatten]] inline std::uint64_t
checksum_words_avx512(const std::byte* p, std::size_t first, std::size_t last) {
  return checksum_words(p, first, last);
}
#endif

} // namespace detail

/// Checksum of a whole payload, reading its checksum field as zero.
/// `wide`: false forces the baseline loop (tests compare the two).
inline std::uint64_t checksum(std::span<const std::byte> p, bool wide = true) {
  const std::size_t full = p.size() / 8, skip = checksum_offset / 8;
  // The words before the checksum field, then everything after it.
  std::uint64_t sum = detail::checksum_words(p.data(), 0, std::min(full, skip));
  if (full > skip) sum += checksum_term(0, skip);
  const std::size_t rest = std::min(full, skip + 1);
#if GRADSYNC_HOST_AVX2
  if (wide && gradsync::detail::host_has_avx512dq())
    sum += detail::checksum_words_avx512(p.data(), rest, full);
  else
#endif
    sum += detail::checksum_words(p.data(), rest, full);
  (void)wide;
  if (const std::size_t tail = p.size() % 8; tail != 0) {
    std::uint64_t w = 0;
    std::memcpy(&w, p.data() + 8 * full, tail); // little-endian: zero-padded high bytes
    sum += checksum_term(w, full);
  }
  return mix64(sum ^ static_cast<std::uint64_t>(p.size()));
}

/// Writes the checksum of a finished payload into its header.
inline void seal(std::span<std::byte> p) {
  store<std::uint64_t>(p.data() + checksum_offset, checksum(p));
}

/// Throws the codec error for `op` (e.g. "encode.int8"); codecs run on no
/// rank. `kind`: invalid_argument for the caller's arguments, corrupt_payload
/// (see corrupt()) for a payload that fails validation.
[[noreturn]] inline void fail(const char* op, const std::string& reason,
                              errc kind = errc::invalid_argument) {
  throw error(op, -1, -1, reason, kind);
}
/// fail() unless `cond` holds.
inline void check(bool cond, const char* op, const std::string& reason,
                  errc kind = errc::invalid_argument) {
  if (!cond) fail(op, reason, kind);
}
/// Rejects a payload (e.g. op "decode.int8"): errc::corrupt_payload.
[[noreturn]] inline void corrupt(const char* op, const std::string& reason) {
  fail(op, reason, errc::corrupt_payload);
}
/// corrupt() unless `cond` holds: every check of a payload's content.
inline void check_payload(bool cond, const char* op, const std::string& reason) {
  if (!cond) corrupt(op, reason);
}

/// a * b + c with overflow detection. Sizes read from untrusted headers fail
/// as corrupt payloads; an encoder passing its caller's sizes says
/// errc::invalid_argument.
inline std::uint64_t checked_mad(std::uint64_t a, std::uint64_t b, std::uint64_t c,
                                 const char* op, errc kind = errc::corrupt_payload) {
  std::uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r) || __builtin_add_overflow(r, c, &r))
    fail(op, "size computation overflows 64 bits (count or parameters too large)", kind);
  return r;
}

/// The fixed header fields.
struct header {
  codec_id codec{};
  dtype type{};
  std::uint8_t param_bytes = 0;
  std::uint64_t count = 0;
  std::uint64_t body_bytes = 0;
};

/// A structurally valid payload: its header, parameter block and body.
struct view {
  header h;
  std::span<const std::byte> params;
  std::span<const std::byte> body;
};

/// Validates everything codec-independent: length, magic, version, known
/// dtype, parameter length rules, exact total length and checksum.
inline view open_any(std::span<const std::byte> p, const char* op) {
  check_payload(p.size() >= header_bytes, op,
                "payload truncated: " + std::to_string(p.size()) + " bytes, the header alone is " +
                    std::to_string(header_bytes));
  check_payload(std::memcmp(p.data(), magic, 4) == 0, op, "bad magic (not a gradsync payload)");
  const auto version = static_cast<std::uint8_t>(p[4]);
  check_payload(version == format_version, op,
                "unsupported format version " + std::to_string(version) + " (this build reads " +
                    std::to_string(format_version) + ")");
  view v;
  v.h.codec = static_cast<codec_id>(p[5]);
  v.h.type = static_cast<dtype>(p[6]);
  check_payload(dtype_size(v.h.type) != 0, op,
                "unknown element dtype code " + std::to_string(static_cast<int>(p[6])));
  v.h.param_bytes = static_cast<std::uint8_t>(p[7]);
  check_payload(v.h.param_bytes % 8 == 0 && v.h.param_bytes <= max_param_bytes, op,
                "parameter block of " + std::to_string(v.h.param_bytes) +
                    " bytes (must be a multiple of 8, at most " + std::to_string(max_param_bytes) + ")");
  v.h.count = load<std::uint64_t>(p.data() + 8);
  v.h.body_bytes = load<std::uint64_t>(p.data() + 16);
  const std::uint64_t avail = p.size() - header_bytes; // size >= header checked above
  check_payload(v.h.param_bytes <= avail && v.h.body_bytes == avail - v.h.param_bytes, op,
                "length mismatch: header announces " + std::to_string(header_bytes) + " + " +
                    std::to_string(v.h.param_bytes) + " + " + std::to_string(v.h.body_bytes) +
                    " bytes, payload has " + std::to_string(p.size()));
  check_payload(load<std::uint64_t>(p.data() + checksum_offset) == checksum(p), op,
                "checksum mismatch (payload corrupted in transit)");
  v.params = p.subspan(header_bytes, v.h.param_bytes);
  v.body = p.subspan(header_bytes + v.h.param_bytes);
  return v;
}

/// open_any() plus the codec's expectations: its id, the decoder's element
/// dtype and its exact parameter block length.
inline view open(std::span<const std::byte> p, codec_id codec, dtype type,
                 std::size_t param_bytes, const char* op) {
  view v = open_any(p, op);
  check_payload(v.h.codec == codec, op,
                "codec mismatch: payload is " + std::string(codec_name(v.h.codec)) + " (id " +
                    std::to_string(static_cast<int>(v.h.codec)) + "), decoder is " +
                    std::string(codec_name(codec)));
  check_payload(v.h.type == type, op,
                "dtype mismatch: payload was encoded from " + std::string(dtype_name(v.h.type)) +
                    ", decoder element type is " + std::string(dtype_name(type)));
  check_payload(v.h.param_bytes == param_bytes, op,
                "parameter block is " + std::to_string(v.h.param_bytes) + " bytes, " +
                    std::string(codec_name(codec)) + " expects " + std::to_string(param_bytes));
  return v;
}

/// Rejects a decode whose output does not hold exactly the encoded count.
inline void check_count(const view& v, std::size_t out_count, const char* op) {
  check_payload(v.h.count == out_count, op,
                "output holds " + std::to_string(out_count) + " elements, payload carries " +
                    std::to_string(v.h.count));
}

/// Rejects a body whose length is not exactly what the codec computed.
inline void check_body(const view& v, std::uint64_t expected, const char* op) {
  check_payload(v.h.body_bytes == expected, op,
                "body is " + std::to_string(v.h.body_bytes) + " bytes, " + std::to_string(v.h.count) +
                    " elements with these parameters need " + std::to_string(expected));
}

/// Sequential little-endian reader of a parameter block.
class param_reader {
public:
  explicit param_reader(std::span<const std::byte> p) : p_(p) {}
  template <class V> V get() {
    V v = load<V>(p_.data() + pos_); // open() guaranteed the exact block length
    pos_ += sizeof(V);
    return v;
  }

private:
  std::span<const std::byte> p_;
  std::size_t pos_ = 0;
};

/// Sequential little-endian writer of a parameter block (zero-filled first).
class param_writer {
public:
  explicit param_writer(std::span<std::byte> p) : p_(p) {
    std::memset(p_.data(), 0, p_.size());
  }
  template <class V> param_writer& put(V v) {
    store<V>(p_.data() + pos_, v);
    pos_ += sizeof(V);
    return *this;
  }
  // Named by type, for chains: nvcc with a clang++ host compiler parses a
  // second explicit put<V>( in a chain as a comparison.
  param_writer& u8(std::uint8_t v) { return put(v); }
  param_writer& u16(std::uint16_t v) { return put(v); }
  param_writer& u32(std::uint32_t v) { return put(v); }
  param_writer& u64(std::uint64_t v) { return put(v); }
  param_writer& f32(float v) { return put(v); }
  param_writer& f64(double v) { return put(v); }

private:
  std::span<std::byte> p_;
  std::size_t pos_ = 0;
};

/// Writes a payload: header first, then the codec fills params() and body(),
/// then finish(body_bytes) fixes the length and seals the checksum.
class writer {
public:
  writer(std::span<std::byte> out, codec_id codec, dtype type, std::uint64_t count,
         std::size_t param_bytes, const char* op)
      : out_(out), param_bytes_(param_bytes) {
    check(param_bytes % 8 == 0 && param_bytes <= max_param_bytes, op,
          "codec parameter block must be a multiple of 8 bytes, at most 248");
    check(out.size() >= header_bytes + param_bytes, op,
          "output holds " + std::to_string(out.size()) + " bytes, the header needs " +
              std::to_string(header_bytes + param_bytes));
    std::memcpy(out.data(), magic, 4);
    out[4] = std::byte{format_version};
    out[5] = static_cast<std::byte>(codec);
    out[6] = static_cast<std::byte>(type);
    out[7] = static_cast<std::byte>(param_bytes);
    store<std::uint64_t>(out.data() + 8, count);
    store<std::uint64_t>(out.data() + 16, 0);
    store<std::uint64_t>(out.data() + checksum_offset, 0);
  }
  std::span<std::byte> params() const { return out_.subspan(header_bytes, param_bytes_); }
  std::span<std::byte> body() const { return out_.subspan(header_bytes + param_bytes_); }
  /// Records the body length, seals the checksum, returns the payload size.
  std::size_t finish(std::size_t body_bytes) {
    store<std::uint64_t>(out_.data() + 16, body_bytes);
    const std::size_t total = header_bytes + param_bytes_ + body_bytes;
    seal(out_.first(total));
    return total;
  }

private:
  std::span<std::byte> out_;
  std::size_t param_bytes_;
};

/// Element count of a payload, after full structural validation: size the
/// decode output with it.
inline std::uint64_t count_of(std::span<const std::byte> p) {
  return open_any(p, "decode.header").h.count;
}
/// Codec id of a payload, after full structural validation.
inline codec_id codec_of(std::span<const std::byte> p) {
  return open_any(p, "decode.header").h.codec;
}

} // namespace wire
} // namespace gradsync::compress
