// gradsync: device path of the block-scaled quantisers (blockwise.hpp: int8,
// int4, qsgd, terngrad, sign). One kernel for the whole family, specialised by
// the codec's Rule exactly as the host loop is.
//
// Encode: one CUDA block per codec block (grid-stride over codec blocks)
// reduces the block's statistic with cub::BlockReduce (max |x|, and the sum of
// |x| or x^2 in double, plus a non-finite flag), finishes the scale as the host
// does, then writes codes a whole byte per thread (8 / bits elements), so no
// two threads share a byte. When a codec block does not end on a byte
// boundary, the codes go in a second grid-stride pass that reads the scales
// back. Per-element math: Rule::code / fraction, the host's functions.
//
// Feedback form of a stochastic rule (rule.unbiased = false, blockwise.hpp):
// after the scale s, a second pass over the codec block sums rule.moment of
// x / s (integers: exact in any order) and thread 0 stores
// feedback_scale(s, sum x^2, moments), the host's function; the codes are
// still computed against s, which the unaligned code pass reads from the
// workspace (the payload holds the stored scales).
//
// Determinism: absmax scales and every code are bit-identical to the host.
// Sum-based scales (sign: mean |x|, qsgd: l2, and the sum x^2 of a feedback
// form) add in double in CUB's tree order rather than the host's lane order,
// so they can differ in the last bit of the double sum; they match bitwise
// whenever those double sums are exact (e.g. inputs on a 2^-12 grid, as the
// GPU test uses). Build with
// nvcc -fmad=false for bit-identity: nvcc's default contracts a*b-c in the
// per-element math (qsgd) into an FMA, which rounds once where the host
// rounds twice.
//
// Decode: validation (parameters, body length, every scale, every code, the
// padding bits) into the status word, then one thread per element.
#pragma once

#include <cfloat>

#include <cub/block/block_reduce.cuh>

#include "../blockwise.hpp"
#include "common.cuh"

namespace gradsync::compress::gpu {

/// Device twin of Rule::from_wire: builds the rule a payload's (arg, bits)
/// describe, false when the host would reject them. The primary template
/// serves rules without an argument (fixed code width); rules with one
/// specialise it.
template <class Rule> struct wire_rule {
  std::uint16_t arg;  // Rule{}.arg(), from the host
  std::uint8_t bits;  // Rule{}.bits()
  static wire_rule make() { return {Rule{}.arg(), static_cast<std::uint8_t>(Rule{}.bits())}; }
  GRADSYNC_HD bool operator()(std::uint16_t a, std::uint8_t b, Rule* r) const {
    *r = Rule{};
    return a == arg && b == bits;
  }
};
} // namespace gradsync::compress::gpu

#if __has_include("../qsgd.hpp")
#include "../qsgd.hpp"
namespace gradsync::compress::gpu {
/// QSGD: the argument is the level count (1 .. 127), which fixes the width.
template <> struct wire_rule<qsgd_rule> {
  static wire_rule make() { return {}; }
  GRADSYNC_HD bool operator()(std::uint16_t a, std::uint8_t b, qsgd_rule* r) const {
    r->levels = a;
    return a >= 1 && a <= 127 && b == qsgd_bits(a);
  }
};
} // namespace gradsync::compress::gpu
#endif

namespace gradsync::compress::gpu {
namespace detail {

/// Partial statistic of a block: max |x|, sum of |x| or x^2, any non-finite.
struct block_stat {
  float amax;
  double sum;
  int bad;
};
struct combine_stat {
  __device__ block_stat operator()(const block_stat& a, const block_stat& b) const {
    return {a.amax > b.amax ? a.amax : b.amax, a.sum + b.sum, a.bad | b.bad};
  }
};

/// The scale from a block's statistic: compress::detail::block_scale's finish.
__device__ inline float finish_scale(scale_kind k, const block_stat& s, std::size_t len) {
  if (s.bad) return __int_as_float(0x7fc00000); // quiet NaN: poisoned block
  switch (k) {
  case scale_kind::absmax: return s.amax;
  case scale_kind::mean_abs:
    return len == 0 ? 0.0f : static_cast<float>(__ddiv_rn(s.sum, static_cast<double>(len)));
  case scale_kind::l2: {
    const double n2 = sqrt(s.sum);
    const float f = n2 >= static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(n2);
    return f > s.amax ? f : s.amax;
  }
  }
  return s.amax;
}

/// Byte j of the packed codes: elements [j * 8 / bits, ...) below n, each
/// coded against scale_of(i) (0 when the scale is not > 0: zero or poisoned).
template <class Rule, class T, class ScaleOf>
__device__ inline std::uint8_t code_byte(const Rule& rule, const T* x, std::size_t n,
                                         unsigned bits, std::size_t j, const philox_stream& noise,
                                         ScaleOf scale_of) {
  const unsigned per = 8 / bits;
  const std::size_t lo = j * per;
  std::uint32_t byte = 0;
  for (unsigned e = 0; e < per && lo + e < n; ++e) {
    const std::size_t i = lo + e;
    const float s = scale_of(i);
    if (!(s > 0.0f)) continue;
    float u = 0.0f;
    if constexpr (Rule::stochastic) u = noise.uniform(i);
    byte |= rule.code(__fdiv_rn(to_float(x[i]), s), u) << (e * bits);
  }
  return static_cast<std::uint8_t>(byte);
}

struct encode_geometry {
  std::size_t n, nb, code_bytes;
  std::uint32_t block;
  unsigned bits;
  bool fused; // every codec block ends on a byte boundary
};

/// Whether `rule` runs in the feedback form (stochastic rules only).
template <class Rule> GRADSYNC_HD inline bool feedback_form_of(const Rule& rule) {
  if constexpr (Rule::stochastic) return !rule.unbiased;
  else return false;
}

/// `divisors`: where the scales the codes are computed against go when they
/// differ from the stored ones (feedback form; nb floats), else nullptr.
template <class Rule, class T, unsigned Threads>
__global__ void __launch_bounds__(Threads)
    blockwise_encode_kernel(Rule rule, const T* x, encode_geometry g, philox_stream noise,
                            float* scales, float* divisors, std::uint8_t* codes) {
  using reduce_t = cub::BlockReduce<block_stat, Threads>;
  using moments_t = cub::BlockReduce<unsigned long long, Threads>;
  __shared__ typename reduce_t::TempStorage temp;
  __shared__ typename moments_t::TempStorage moments_temp;
  __shared__ float block_scale;
  const bool feedback = feedback_form_of(rule);
  for (std::size_t b = blockIdx.x; b < g.nb; b += gridDim.x) {
    const std::size_t lo = b * g.block;
    const std::size_t hi = lo + g.block < g.n ? lo + g.block : g.n;
    block_stat s{0.0f, 0.0, 0};
    for (std::size_t i = lo + threadIdx.x; i < hi; i += Threads) {
      const float v = to_float(x[i]);
      const float a = fabsf(v);
      s.bad |= finite(v) ? 0 : 1;
      s.amax = a > s.amax ? a : s.amax;
      if constexpr (Rule::scale == scale_kind::mean_abs) s.sum += static_cast<double>(a);
      if (Rule::scale == scale_kind::l2 || feedback) // sum x^2: l2's statistic, the feedback numerator
        s.sum = __dadd_rn(s.sum, __dmul_rn(static_cast<double>(a), static_cast<double>(a)));
    }
    const block_stat total = reduce_t(temp).Reduce(s, combine_stat{});
    if (threadIdx.x == 0) {
      block_scale = finish_scale(Rule::scale, total, hi - lo);
      if (!feedback) scales[b] = block_scale;
    }
    __syncthreads();
    if constexpr (Rule::stochastic) {
      if (feedback) { // the stored scale: s lambda (feedback_scale), from the exact level moments
        const float sc = block_scale;
        unsigned long long m = 0;
        if (sc > 0.0f)
          for (std::size_t i = lo + threadIdx.x; i < hi; i += Threads) m += rule.moment(__fdiv_rn(to_float(x[i]), sc));
        const unsigned long long moments = moments_t(moments_temp).Sum(m);
        if (threadIdx.x == 0) {
          scales[b] = compress::detail::feedback_scale(sc, total.sum, moments, rule.max_level());
          if (divisors != nullptr) divisors[b] = sc;
        }
      }
    }
    if (g.fused) {
      const float sc = block_scale;
      const std::size_t first = lo * g.bits / 8;
      const std::size_t last = (hi * g.bits + 7) / 8;
      for (std::size_t j = first + threadIdx.x; j < last; j += Threads)
        codes[j] = code_byte(rule, x, g.n, g.bits, j, noise, [sc](std::size_t) { return sc; });
    }
    __syncthreads(); // temp and block_scale are reused by the next codec block
  }
}

template <class Rule, class T> struct code_pass_fn {
  Rule rule;
  const T* x;
  encode_geometry g;
  philox_stream noise;
  const float* scales;
  std::uint8_t* codes;
  __device__ void operator()(std::size_t j) const {
    const float* sc = scales;
    const std::uint32_t block = g.block;
    codes[j] = code_byte(rule, x, g.n, g.bits, j, noise,
                         [sc, block](std::size_t i) { return sc[i / block]; });
  }
};

/// Code i of a packed stream of `bits`-bit codes (blockwise.hpp's get_code
/// with the width known only on the device, read from the payload).
__device__ inline std::uint32_t code_at(const std::byte* codes, std::size_t i, unsigned bits) {
  const std::size_t bit = i * bits;
  return (static_cast<std::uint32_t>(codes[bit / 8]) >> (bit % 8)) & ((1u << bits) - 1u);
}

/// The parameter block as the device reads it.
struct wire_params {
  std::uint32_t block;
  std::uint16_t arg;
  std::uint8_t bits, zero;
};
GRADSYNC_HD inline wire_params read_params(const std::byte* params) {
  return {wire::load<std::uint32_t>(params), wire::load<std::uint16_t>(params + 4),
          static_cast<std::uint8_t>(params[6]), static_cast<std::uint8_t>(params[7])};
}

/// Parameter and body-length rule of the family (check_block, the reserved
/// byte, Rule::from_wire, check_body).
template <class Rule> struct blockwise_body_rule {
  wire_rule<Rule> wr;
  GRADSYNC_HD bool operator()(const std::byte* params, std::uint64_t count,
                              std::uint64_t* body) const {
    const wire_params p = read_params(params);
    Rule r;
    if (p.block < 1 || p.block > max_block || p.zero != 0 || !wr(p.arg, p.bits, &r)) return false;
    *body = 4 * ((count + p.block - 1) / p.block) + (count * p.bits + 7) / 8;
    return true;
  }
};

/// A validated-layout blockwise payload as a device thread reads it.
template <class Rule> struct blockwise_view {
  wire_params p;
  Rule rule;
  const float* scales;
  const std::byte* codes;
  __device__ blockwise_view(const std::byte* payload, std::uint64_t n, const wire_rule<Rule>& wr)
      : p(read_params(payload + wire::header_bytes)) {
    wr(p.arg, p.bits, &rule);
    const std::size_t nb = (n + p.block - 1) / p.block;
    scales = reinterpret_cast<const float*>(payload + wire::header_bytes + 8);
    codes = payload + wire::header_bytes + 8 + 4 * nb;
  }
  __device__ std::uint32_t code(std::size_t i) const { return code_at(codes, i, p.bits); }
  __device__ float scale_of(std::size_t i) const { return scales[i / p.block]; }
};

/// Content validation: item b < nb checks scale b, item i < n checks code i,
/// the last item also checks the padding bits.
template <class Rule> struct blockwise_check_fn {
  const std::byte* payload;
  std::uint64_t n;
  wire_rule<Rule> wr;
  std::uint32_t* status;
  __device__ void operator()(std::size_t t) const {
    if (*status != 0) return;
    const blockwise_view<Rule> v(payload, n, wr);
    const std::size_t nb = (n + v.p.block - 1) / v.p.block;
    bool ok = true;
    if (t < nb) {
      const float s = v.scales[t];
      ok = s != s || (s >= 0.0f && finite(s));
    }
    if (t < n) {
      const std::uint32_t c = v.code(t);
      const float s = v.scale_of(t);
      ok = ok && v.rule.valid(c) && !(s != s && c != 0);
    }
    if (t == 0) {
      const std::uint64_t used = n * v.p.bits;
      if (used % 8 != 0)
        ok = ok && (static_cast<std::uint32_t>(v.codes[used / 8]) >> (used % 8)) == 0;
    }
    if (!ok) atomicCAS(status, 0u, static_cast<std::uint32_t>(gpu::status::bad_content));
  }
};

template <class Rule, class Sink> struct blockwise_decode_fn {
  const std::byte* payload;
  std::uint64_t n;
  wire_rule<Rule> wr;
  Sink sink;
  __device__ void operator()(std::size_t i) const {
    const blockwise_view<Rule> v(payload, n, wr);
    sink(i, __fmul_rn(v.rule.fraction(v.code(i)), v.scale_of(i)));
  }
};

template <class Rule, class T, class Sink>
void blockwise_decode(std::span<const std::byte> payload, std::size_t n, Sink sink,
                      std::uint32_t* d_status, std::span<std::byte> ws, cudaStream_t stream) {
  const char* op = Rule::decode_op;
  const auto wr = wire_rule<Rule>::make();
  const expectation<blockwise_body_rule<Rule>> e{Rule::id, dtype_traits<T>::id, 8, n, {wr}};
  validate(payload.data(), payload.size(), e, d_status, ws, stream, op);
  // n elements and at most n scales (block >= 1): n items cover both.
  for_each(n, blockwise_check_fn<Rule>{payload.data(), n, wr, d_status}, stream, op);
  for_each(n, if_valid<blockwise_decode_fn<Rule, Sink>>{d_status, {payload.data(), n, wr, sink}},
           stream, op);
}

} // namespace detail

/// Device workspace of encode for n elements (the feedback form of a
/// stochastic rule also keeps one float per codec block).
template <class Rule, float_element T>
std::size_t encode_workspace_bytes(const blockwise<Rule, T>& c, std::size_t n) {
  const std::size_t divisors = detail::feedback_form_of(c.rule) ? workspace_piece<float>((n + c.block - 1) / c.block) : 0;
  return seal_workspace_bytes(c.max_encoded_bytes(n)) + divisors;
}

/// Device encode of any blockwise codec; stochastic rules draw from `st`
/// (advanced by one step, on the host) exactly like the host encode.
template <class Rule, float_element T>
std::size_t encode(const blockwise<Rule, T>& c, std::span<const T> in,
                   typename blockwise<Rule, T>::state& st, std::span<std::byte> ws,
                   std::span<std::byte> out, cudaStream_t stream) {
  const char* op = Rule::encode_op;
  compress::detail::check_block(c.block, op, errc::invalid_argument);
  c.rule.validate(op);
  const std::size_t n = in.size();
  check_encode(op, in.data(), n * sizeof(T), out, c.max_encoded_bytes(n), ws,
               encode_workspace_bytes(c, n));
  philox_stream noise{};
  if constexpr (Rule::stochastic) noise = st.next();
  else (void)st;

  const unsigned bits = c.rule.bits();
  const std::uint16_t arg = c.rule.arg();
  const std::uint32_t block = c.block;
  const std::size_t body = blockwise_body_bytes(n, block, bits);
  const header_image img = make_header(
      Rule::id, dtype_traits<T>::id, n, 8, body, op, [&](std::span<std::byte> p) {
        wire::param_writer(p).u32(block).u16(arg).u8(static_cast<std::uint8_t>(bits));
      });
  const std::size_t nb = (n + block - 1) / block;
  auto* scales = reinterpret_cast<float*>(out.data() + img.size);
  auto* codes = reinterpret_cast<std::uint8_t*>(out.data() + img.size + 4 * nb);
  const detail::encode_geometry g{n, nb, (n * bits + 7) / 8, block, bits,
                                  (std::size_t{block} * bits) % 8 == 0};
  // The feedback form stores other scales than the codes use: the unaligned
  // code pass reads those from the workspace, after seal()'s share.
  float* divisors = nullptr;
  if (detail::feedback_form_of(c.rule) && !g.fused && nb > 0) {
    workspace_cursor cur(ws.subspan(seal_workspace_bytes(c.max_encoded_bytes(n))), op);
    divisors = cur.take<float>(nb).data();
  }
  if (nb > 0) {
    // Small codec blocks get a warp each, so threads are not left idle.
    if (block <= 64) {
      detail::blockwise_encode_kernel<Rule, T, 32>
          <<<grid_for(nb, 32, op), 32, 0, stream>>>(c.rule, in.data(), g, noise, scales, divisors, codes);
    } else {
      constexpr unsigned threads = policy::cuda_block_threads;
      detail::blockwise_encode_kernel<Rule, T, threads>
          <<<grid_for(nb, threads, op), threads, 0, stream>>>(c.rule, in.data(), g, noise, scales, divisors, codes);
    }
    check_launch(op);
    if (!g.fused)
      for_each(g.code_bytes,
               detail::code_pass_fn<Rule, T>{c.rule, in.data(), g, noise, divisors ? divisors : scales, codes},
               stream, op);
  }
  seal(img, out.data(), nullptr, ws, stream, op);
  return img.size + body;
}

/// Decoding: see device_decoder in common.cuh (gpu::decode, gpu::decode_accumulate).
template <class Rule, float_element T> struct device_decoder<blockwise<Rule, T>> {
  static constexpr bool enabled = true;
  template <class Sink>
  static void run(const blockwise<Rule, T>&, std::span<const std::byte> payload, std::size_t n,
                  Sink sink, T*, std::uint32_t* d_status, std::span<std::byte> ws,
                  cudaStream_t stream) {
    detail::blockwise_decode<Rule, T>(payload, n, sink, d_status, ws, stream);
  }
};

} // namespace gradsync::compress::gpu
