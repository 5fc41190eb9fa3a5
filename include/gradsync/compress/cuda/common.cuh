// gradsync: the CUDA layer every codec's device path is built on.
//
// Layers, each on the ones below (CUB's shape):
//   per-element math   the codecs' GRADSYNC_HD functions (the host loops run them too)
//   kernels            one codec's encode/decode passes, in <codec>.cuh
//   this header        payload sealing and validation on the device, errors, launch shapes
//
// Every device entry point is stream-ordered: it takes a cudaStream_t, only
// enqueues work and never synchronises. Scratch memory is caller-owned device
// memory sized by a *_workspace_bytes query (phase 1), then passed to the call
// (phase 2), as CUB does; a query allocates nothing and launches nothing.
//
// Device decoding cannot throw at the point of failure, so it validates first
// and reports through a caller-owned device word `status`: a validation pass
// (checksum, header, parameters, body length, content) writes 0 or a
// gpu::status code, and every decode kernel reads it first and writes nothing
// when it is not 0, the device twin of "validate everything before writing".
// After synchronising, pass the copied word to gpu::throw_if_failed.
#pragma once

#if !defined(__CUDACC__)
#error "gradsync/compress/cuda/*.cuh are CUDA headers: compile them with nvcc"
#endif

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <utility>

#include <cuda_runtime.h>

#include <cub/device/device_for.cuh>
#include <cub/device/device_reduce.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "../../core/cuda_check.cuh"
#include "../../core/policy.hpp"
#include "../codec.hpp"
#include "../wire.hpp"

namespace gradsync::compress::gpu {

using gradsync::gpu::check;
using gradsync::gpu::check_launch;
using gradsync::gpu::grid_for;

/// Rejects a device pointer that is null while bytes are expected.
inline void check_ptr(const void* p, std::size_t bytes, const char* op, const char* what) {
  wire::check(p != nullptr || bytes == 0, op, std::string(what) + " is a null device pointer");
}

// ---------------------------------------------------------------------------
// Decode status: what a device-side validation found.

/// Device decode outcome codes (0 = valid). Stable values.
enum class status : std::uint32_t {
  ok = 0,
  truncated = 1,      ///< shorter than the header
  bad_magic = 2,      ///< not a gradsync payload
  bad_version = 3,    ///< other wire format version
  bad_codec = 4,      ///< payload of another codec
  bad_dtype = 5,      ///< encoded from another element type
  bad_param_len = 6,  ///< parameter block length differs from the codec's
  bad_length = 7,     ///< header's lengths disagree with the payload size
  bad_checksum = 8,   ///< corrupted in transit
  bad_count = 9,      ///< element count differs from the output's
  bad_params = 10,    ///< parameter values the codec rejects
  bad_body = 11,      ///< body length wrong for count and parameters
  bad_content = 12,   ///< body values the codec rejects (e.g. unsorted indices)
};

/// Readable reason of a status code.
constexpr std::string_view status_reason(std::uint32_t code) {
  switch (static_cast<status>(code)) {
  case status::ok: return "ok";
  case status::truncated: return "payload truncated (shorter than the header)";
  case status::bad_magic: return "bad magic (not a gradsync payload)";
  case status::bad_version: return "unsupported format version";
  case status::bad_codec: return "codec mismatch";
  case status::bad_dtype: return "dtype mismatch";
  case status::bad_param_len: return "parameter block length mismatch";
  case status::bad_length: return "length mismatch between header and payload";
  case status::bad_checksum: return "checksum mismatch (payload corrupted in transit)";
  case status::bad_count: return "element count differs from the output";
  case status::bad_params: return "invalid codec parameters";
  case status::bad_body: return "body length wrong for the count and parameters";
  case status::bad_content: return "invalid body content";
  }
  return "unknown status code";
}

/// Throws gradsync::error(op, errc::corrupt_payload) unless a device decode's
/// status word (copied to the host after the stream synchronised) says ok.
inline void throw_if_failed(std::uint32_t code, const char* op) {
  if (code != 0)
    throw error(op, -1, -1,
                "device decode rejected the payload: " + std::string(status_reason(code)) +
                    " (status " + std::to_string(code) + ")",
                errc::corrupt_payload);
}

// ---------------------------------------------------------------------------
// Payload checksum on the device: a CUB TransformReduce over the payload's
// 64-bit words (sum mod 2^64 is exact, so the result is bit-identical to the
// host's wire::checksum whatever the reduction order).

namespace detail {

/// The checksum term of word i of a payload of `*total` (or `fixed_total`) bytes.
struct checksum_term_op {
  const std::byte* p;
  std::uint64_t fixed_total;
  const std::uint64_t* body_bytes; // when set: total = head + *body_bytes
  std::uint64_t head;

  GRADSYNC_HD std::uint64_t total() const {
    return body_bytes != nullptr ? head + *body_bytes : fixed_total;
  }
  GRADSYNC_HD std::uint64_t operator()(std::uint64_t i) const {
    const std::uint64_t t = total();
    if (8 * i >= t) return 0; // past the end (upper-bound launches)
    std::uint64_t w = 0;
    if (i != wire::checksum_offset / 8) {
      if (8 * i + 8 <= t) {
        w = wire::load<std::uint64_t>(p + 8 * i);
      } else { // little-endian tail, zero-padded
        for (std::uint64_t b = 0; 8 * i + b < t; ++b)
          w |= static_cast<std::uint64_t>(static_cast<std::uint8_t>(p[8 * i + b])) << (8 * b);
      }
    }
    return wire::checksum_term(w, i);
  }
};

struct plus_u64 {
  GRADSYNC_HD std::uint64_t operator()(std::uint64_t a, std::uint64_t b) const { return a + b; }
};

inline std::size_t checksum_temp_bytes(std::uint64_t max_total, const char* op) {
  std::size_t bytes = 0;
  const std::uint64_t words = (max_total + 7) / 8;
  check(cub::DeviceReduce::TransformReduce(nullptr, bytes,
                                           thrust::counting_iterator<std::uint64_t>(0),
                                           static_cast<std::uint64_t*>(nullptr), words,
                                           plus_u64{}, checksum_term_op{}, std::uint64_t{0}),
        op, "cub::DeviceReduce::TransformReduce (size query)");
  return bytes;
}

/// Enqueues d_sum = sum of the checksum terms of a payload.
inline void checksum_sum(const checksum_term_op& term, std::uint64_t max_total,
                         std::uint64_t* d_sum, std::span<std::byte> temp, cudaStream_t stream,
                         const char* op) {
  std::size_t bytes = temp.size();
  const std::uint64_t words = (max_total + 7) / 8;
  check(cub::DeviceReduce::TransformReduce(temp.data(), bytes,
                                           thrust::counting_iterator<std::uint64_t>(0), d_sum,
                                           words, plus_u64{}, term, std::uint64_t{0}, stream),
        op, "cub::DeviceReduce::TransformReduce");
}

} // namespace detail

// ---------------------------------------------------------------------------
// Encoding side: the header and parameter block are built on the host with the
// same wire::writer the host path uses, passed to the device by value, and the
// payload is sealed there.

/// Header plus parameter block of a payload, checksum field zero.
struct header_image {
  std::byte bytes[wire::header_bytes + wire::max_param_bytes];
  std::uint32_t size = 0; // header_bytes + P
};

/// Builds the image of a payload header: codec, dtype, count and the body length
/// (when the body length is only known on the device, pass the upper bound and
/// seal with a device body length). `fill(std::span<std::byte> params)` writes the
/// parameter block exactly as the host encoder does.
template <class Fill>
header_image make_header(codec_id codec, dtype type, std::uint64_t count, std::size_t param_bytes,
                         std::uint64_t body_bytes, const char* op, Fill fill) {
  header_image img{};
  wire::writer w(std::span<std::byte>(img.bytes), codec, type, count, param_bytes, op);
  if (param_bytes != 0) fill(w.params());
  wire::store<std::uint64_t>(img.bytes + 16, body_bytes);
  img.size = static_cast<std::uint32_t>(wire::header_bytes + param_bytes);
  return img;
}

namespace detail {

// Templates so a header can define kernels without ODR clashes across TUs.
template <class = void> __global__ void write_header_kernel(header_image img, std::byte* out) {
  for (std::uint32_t b = threadIdx.x; b < img.size; b += blockDim.x) out[b] = img.bytes[b];
}

/// *dst = *src for a u64 only the device knows (an entry count, a body length).
template <class = void>
__global__ void copy_u64_kernel(std::byte* dst, const std::uint64_t* src) {
  wire::store<std::uint64_t>(dst, *src);
}

template <class = void>
__global__ void store_checksum_kernel(std::byte* out, checksum_term_op term,
                                      const std::uint64_t* sum) {
  wire::store<std::uint64_t>(out + wire::checksum_offset, wire::mix64(*sum ^ term.total()));
}

} // namespace detail

/// Device workspace of seal() for payloads of at most max_total bytes.
inline std::size_t seal_workspace_bytes(std::uint64_t max_total) {
  return workspace_piece<std::uint64_t>(1) +
         workspace_piece<std::byte>(detail::checksum_temp_bytes(max_total, "gpu.seal"));
}

/// Enqueues the store of a device-side u64 into a payload field (e.g. an
/// entry count in the parameter block); use it inside seal_with's patch.
inline void patch_u64(std::byte* field, const std::uint64_t* value, cudaStream_t stream,
                      const char* op) {
  detail::copy_u64_kernel<><<<1, 1, 0, stream>>>(field, value);
  check_launch(op);
}

/// Finishes a device payload whose body is already in place: writes the header
/// image at d_out, runs `patch()` (which may enqueue kernels that fill header
/// or parameter fields only the device knows: they would otherwise be
/// overwritten by the image), stores the body length when it is a device value
/// (`d_body_bytes`, data-dependent bodies; the image holds the upper bound),
/// then writes the checksum.
template <class Patch>
void seal_with(const header_image& img, std::byte* d_out, const std::uint64_t* d_body_bytes,
               std::span<std::byte> ws, cudaStream_t stream, const char* op, Patch patch) {
  const std::uint64_t body_max = wire::load<std::uint64_t>(img.bytes + 16);
  const std::uint64_t max_total = img.size + body_max;
  workspace_cursor cur(ws, op);
  auto sum = cur.take<std::uint64_t>(1);
  auto temp = cur.take<std::byte>(detail::checksum_temp_bytes(max_total, op));
  detail::write_header_kernel<><<<1, 128, 0, stream>>>(img, d_out);
  check_launch(op);
  patch();
  if (d_body_bytes != nullptr) patch_u64(d_out + 16, d_body_bytes, stream, op);
  const detail::checksum_term_op term{d_out, max_total, d_body_bytes, img.size};
  detail::checksum_sum(term, max_total, sum.data(), temp, stream, op);
  detail::store_checksum_kernel<><<<1, 1, 0, stream>>>(d_out, term, sum.data());
  check_launch(op);
}

/// seal_with() with nothing to patch.
inline void seal(const header_image& img, std::byte* d_out, const std::uint64_t* d_body_bytes,
                 std::span<std::byte> ws, cudaStream_t stream, const char* op) {
  seal_with(img, d_out, d_body_bytes, ws, stream, op, [] {});
}

// ---------------------------------------------------------------------------
// Decoding side.

/// What a codec expects of a payload, and how its body length follows from the
/// count and parameters: body_rule(params, count, &expected) returns false for
/// parameter values the codec rejects (device code; mirrors the host checks).
template <class BodyRule> struct expectation {
  codec_id codec;
  dtype type;
  std::uint32_t param_bytes;
  std::uint64_t count; // the output's element count
  BodyRule body_rule;
};

namespace detail {

/// dtype_size(t) != 0, callable on the device.
GRADSYNC_HD constexpr bool known_dtype(std::uint8_t t) {
  return t >= static_cast<std::uint8_t>(dtype::f32) && t <= static_cast<std::uint8_t>(dtype::i64);
}
static_assert(dtype_size(dtype::f32) != 0 && dtype_size(dtype::i64) != 0 &&
              dtype_size(static_cast<dtype>(0)) == 0 && dtype_size(static_cast<dtype>(7)) == 0,
              "known_dtype must match dtype_size");

template <class BodyRule>
__global__ void check_header_kernel(const std::byte* p, std::uint64_t size,
                                    expectation<BodyRule> e, const std::uint64_t* sum,
                                    std::uint32_t* out) {
  // Same order of checks as wire::open_any / wire::open / the codec's decode.
  const auto code = [&]() -> status {
    if (size < wire::header_bytes) return status::truncated;
    if (p[0] != std::byte{'G'} || p[1] != std::byte{'S'} || p[2] != std::byte{'C'} ||
        p[3] != std::byte{'Z'})
      return status::bad_magic; // wire::magic (a host array)
    if (static_cast<std::uint8_t>(p[4]) != wire::format_version) return status::bad_version;
    if (!known_dtype(static_cast<std::uint8_t>(p[6]))) return status::bad_dtype;
    const auto param_bytes = static_cast<std::uint8_t>(p[7]);
    if (param_bytes % 8 != 0 || param_bytes > wire::max_param_bytes) return status::bad_param_len;
    const std::uint64_t body = wire::load<std::uint64_t>(p + 16);
    const std::uint64_t avail = size - wire::header_bytes;
    if (param_bytes > avail || body != avail - param_bytes) return status::bad_length;
    if (wire::load<std::uint64_t>(p + wire::checksum_offset) != wire::mix64(*sum ^ size))
      return status::bad_checksum;
    if (static_cast<codec_id>(p[5]) != e.codec) return status::bad_codec;
    if (static_cast<dtype>(p[6]) != e.type) return status::bad_dtype;
    if (param_bytes != e.param_bytes) return status::bad_param_len;
    const std::uint64_t count = wire::load<std::uint64_t>(p + 8);
    if (count != e.count) return status::bad_count;
    std::uint64_t expected = 0;
    if (!e.body_rule(p + wire::header_bytes, count, &expected)) return status::bad_params;
    if (body != expected) return status::bad_body;
    return status::ok;
  }();
  *out = static_cast<std::uint32_t>(code);
}

} // namespace detail

/// Device workspace of validate() for a payload of `payload_bytes`.
inline std::size_t validate_workspace_bytes(std::uint64_t payload_bytes) {
  return workspace_piece<std::uint64_t>(1) +
         workspace_piece<std::byte>(detail::checksum_temp_bytes(payload_bytes, "gpu.validate"));
}

/// Enqueues the codec-independent validation of a device payload plus the
/// codec's parameter and body-length rule; writes the outcome to *d_status.
template <class BodyRule>
void validate(const std::byte* d_payload, std::uint64_t payload_bytes,
              const expectation<BodyRule>& e, std::uint32_t* d_status, std::span<std::byte> ws,
              cudaStream_t stream, const char* op) {
  check_ptr(d_status, 1, op, "status");
  workspace_cursor cur(ws, op);
  auto sum = cur.take<std::uint64_t>(1);
  auto temp = cur.take<std::byte>(detail::checksum_temp_bytes(payload_bytes, op));
  const detail::checksum_term_op term{d_payload, payload_bytes, nullptr, 0};
  detail::checksum_sum(term, payload_bytes, sum.data(), temp, stream, op);
  detail::check_header_kernel<<<1, 1, 0, stream>>>(d_payload, payload_bytes, e, sum.data(),
                                                  d_status);
  check_launch(op);
}

/// Where a validated payload's parameters and body start.
constexpr std::size_t body_offset(std::size_t param_bytes) {
  return wire::header_bytes + param_bytes;
}

/// Runs f(i) for i in [0, n) on the stream (cub::DeviceFor::Bulk).
template <class F> void for_each(std::size_t n, F f, cudaStream_t stream, const char* op) {
  if (n == 0) return;
  check(cub::DeviceFor::Bulk(n, f, stream), op, "cub::DeviceFor::Bulk");
}

/// Wraps a decode functor so that it does nothing unless validation passed.
template <class F> struct if_valid {
  const std::uint32_t* status;
  F f;
  __device__ void operator()(std::size_t i) const {
    if (*status == 0) f(i);
  }
};

/// Device payloads and tensors must be 16-byte aligned (cudaMalloc gives 256):
/// kernels then use typed and vector accesses on the body, which starts
/// 8-byte aligned within the payload.
inline void check_aligned(const void* p, const char* op, const char* what) {
  wire::check(reinterpret_cast<std::uintptr_t>(p) % workspace_align == 0, op,
              std::string(what) + " must be 16-byte aligned on the device");
}

/// Common entry checks of a device encode.
inline void check_encode(const char* op, const void* in, std::size_t in_bytes,
                         std::span<std::byte> out, std::size_t out_need,
                         std::span<std::byte> ws, std::size_t ws_need) {
  check_encode_buffers(op, out.size(), out_need, ws.size(), ws_need);
  check_ptr(in, in_bytes, op, "input");
  check_ptr(out.data(), out_need, op, "output");
  check_aligned(out.data(), op, "output");
  check_aligned(ws.data(), op, "workspace");
}

/// Common entry checks of a device decode.
inline void check_decode(const char* op, std::span<const std::byte> payload, const void* out,
                         std::size_t out_bytes, std::uint32_t* d_status,
                         std::span<std::byte> ws, std::size_t ws_need) {
  wire::check(ws.size() >= ws_need, op,
              "workspace holds " + std::to_string(ws.size()) +
                  " bytes, decode_workspace_bytes is " + std::to_string(ws_need));
  check_ptr(payload.data(), payload.size(), op, "payload");
  check_ptr(out, out_bytes, op, "output");
  check_ptr(d_status, 4, op, "status");
  check_aligned(payload.data(), op, "payload");
  check_aligned(ws.data(), op, "workspace");
}

/// Each codec's .cuh specialises device_decoder<C> with enabled = true and
///   template <class Sink> static void run(const C&, payload, n, Sink sink,
///       T* zero, d_status, ws, stream)
/// which validates into *d_status and then, for a valid payload only, feeds
/// sink(i, value) (after zeroing `zero`, when given, for sparse codecs).
/// gpu::decode and gpu::decode_accumulate below are the public entry points.
template <class C> struct device_decoder {
  static constexpr bool enabled = false;
};
/// A codec with a device decode path.
template <class C>
concept device_decodable = device_decoder<C>::enabled;

/// The decode op name of a codec ("decode.int8"): a static member, or its
/// rule's (the blockwise family keeps it there).
template <class C> constexpr const char* decode_op_of() {
  if constexpr (requires { C::decode_op; })
    return C::decode_op;
  else
    return decltype(std::declval<const C&>().rule)::decode_op;
}

/// Device workspace of decode / decode_accumulate for a payload of
/// `payload_bytes` (phase 1 of the two-phase call).
template <device_decodable C>
std::size_t decode_workspace_bytes(const C&, std::size_t payload_bytes) {
  return validate_workspace_bytes(payload_bytes);
}

/// Device decode: validates `payload` into *d_status, then out[i] = decoded
/// element; writes nothing unless the payload is valid. `payload`, `out`, `ws`
/// and `d_status` are device memory (payload and ws 16-byte aligned).
template <device_decodable C>
void decode(const C& c, std::span<const std::byte> payload, std::span<typename C::value_type> out,
            std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
  using T = typename C::value_type;
  check_decode(decode_op_of<C>(), payload, out.data(), out.size_bytes(), d_status, ws,
               decode_workspace_bytes(c, payload.size()));
  device_decoder<C>::run(c, payload, out.size(), store_sink<T>{out.data()}, out.data(), d_status,
                         ws, stream);
}

/// Device decode_accumulate: acc[i] += decoded element, for a valid payload only.
template <device_decodable C>
void decode_accumulate(const C& c, std::span<const std::byte> payload,
                       std::span<accum_t<typename C::value_type>> acc, std::uint32_t* d_status,
                       std::span<std::byte> ws, cudaStream_t stream) {
  using T = typename C::value_type;
  check_decode(decode_op_of<C>(), payload, acc.data(), acc.size_bytes(), d_status, ws,
               decode_workspace_bytes(c, payload.size()));
  device_decoder<C>::run(c, payload, acc.size(), accumulate_sink<T>{acc.data()},
                         static_cast<T*>(nullptr), d_status, ws, stream);
}

/// Decode of a codec whose elements decode independently: validate, then
/// f(i) for every element when the payload was valid.
template <class BodyRule, class F>
void decode_elementwise(std::span<const std::byte> payload, const expectation<BodyRule>& e,
                        std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream,
                        const char* op, F f) {
  validate(payload.data(), payload.size(), e, d_status, ws, stream, op);
  for_each(e.count, if_valid<F>{d_status, f}, stream, op);
}

} // namespace gradsync::compress::gpu
