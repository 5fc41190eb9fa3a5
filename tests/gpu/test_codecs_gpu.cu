// tests/gpu: every codec's device path against its host path, plus a bench.
//
//   test_codecs_gpu                 correctness (suite 'gpu'); exit 77 without a GPU
//   test_codecs_gpu --bench [MiB]   instead: GB/s of device encode/decode at MiB
//                                   of float input (default 256) and the device
//                                   copy bandwidth as the reference
//
// Checks, per codec, element type and size (host = the reference):
// - device encode writes exactly the host payload, byte for byte (inputs lie
//   on a 2^-12 grid so sum-based scales are exact in double on both sides;
//   see cuda/blockwise.cuh), with the same seeded Philox noise;
// - device decode and decode_accumulate of the host payload equal the host's
//   results bit for bit (outputs poisoned first, so unwritten elements show);
// - a corrupted payload (flipped body byte) is rejected with status
//   bad_checksum, a wrong count with bad_count, content the host rejects
//   (re-sealed so only the content is wrong) with bad_content, and in every
//   rejected case the output is left untouched.
// PowerSGD (check_powersgd*): factors within the tolerance cuda/powersgd.cuh
// states (its orthonormalisation sums in another order), everything else as
// above, plus its step functions and special inputs.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include <gradsync/compress/cuda/approx_topk.cuh>
#include <gradsync/compress/cuda/blockwise.cuh>
#include <gradsync/compress/cuda/cast.cuh>
#include <gradsync/compress/cuda/powersgd.cuh>
#include <gradsync/compress/cuda/randk.cuh>
#include <gradsync/compress/cuda/threshold.cuh>
#include <gradsync/compress/cuda/topk.cuh>
#include <gradsync/compress/int4.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/sign.hpp>
#include <gradsync/compress/terngrad.hpp>

#include "gpu_test.hpp"

namespace gs = gradsync;
namespace gc = gradsync::compress;

namespace {

int failures = 0;
int checks = 0;

void expect(bool ok, const std::string& what) {
  ++checks;
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::printf("CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Owning device buffer of bytes, with typed copies on the legacy stream.
struct dbuf : gpu_test::device_buffer<std::byte> {
  using device_buffer::device_buffer;
  template <class V> void upload(const std::vector<V>& v) {
    cuda_ok(cudaMemcpy(p, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice), "upload");
  }
  template <class V> std::vector<V> download(std::size_t count) const {
    std::vector<V> v(count);
    cuda_ok(cudaMemcpy(v.data(), p, count * sizeof(V), cudaMemcpyDeviceToHost), "download");
    return v;
  }
};

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Values k / 4096, |k| <= 4096, with runs of equal magnitudes (ties) and a
/// zero stretch: exact double sums on host and device, and real tie-breaking.
template <class T> std::vector<T> make_input(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  std::uint64_t s = seed;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t r = splitmix(s);
    int k = static_cast<int>(r % 8193) - 4096;
    if (r % 97 == 0) k = 1024; // many ties
    if (i >= n / 3 && i < n / 3 + 300) k = 0; // a zero stretch (zero-scale blocks)
    v[i] = T(static_cast<float>(k) / 4096.0f);
  }
  return v;
}

template <class C> auto make_state() {
  if constexpr (std::is_same_v<typename C::state, gc::stream_state>)
    return gc::stream_state{0x5eedull, 3, 1};
  else if constexpr (std::is_same_v<typename C::state, gc::approx_topk_state>)
    return gc::approx_topk_state{0x5eedull, 3, 1};
  else
    return typename C::state{};
}

template <class V> bool same_bits(const std::vector<V>& a, const std::vector<V>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(V)) == 0;
}

/// Device payload size: the header's body length (data-dependent codecs).
std::size_t device_payload_bytes(dbuf& out, std::size_t params) {
  const auto h = out.download<std::byte>(gc::wire::header_bytes);
  return gc::wire::header_bytes + params + gc::wire::load<std::uint64_t>(h.data() + 16);
}

template <class C> std::size_t param_bytes_of(const std::vector<std::byte>& payload) {
  return static_cast<std::size_t>(static_cast<std::uint8_t>(payload[7]));
}

/// Runs a device decode (store or accumulate) of `payload` into `out_count`
/// elements poisoned with 0x7b bytes; returns the status and the output.
template <class C, class Out>
std::pair<std::uint32_t, std::vector<Out>> device_decode(const C& c,
                                                         const std::vector<std::byte>& payload,
                                                         std::size_t out_count, bool accumulate,
                                                         const std::vector<Out>& init) {
  dbuf dp(payload.size()), dout(out_count * sizeof(Out)), dstatus(4);
  dp.upload(payload);
  dout.upload(init);
  cuda_ok(cudaMemset(dstatus.p, 0xee, 4), "memset");
  dbuf ws(gc::gpu::decode_workspace_bytes(c, payload.size()));
  const std::span<const std::byte> p(dp.p, payload.size());
  if (accumulate) {
    if constexpr (std::is_same_v<Out, gs::accum_t<typename C::value_type>>)
      gc::gpu::decode_accumulate(c, p, std::span<Out>(dout.as<Out>(), out_count),
                                 dstatus.as<std::uint32_t>(), ws.span(), nullptr);
  } else {
    if constexpr (std::is_same_v<Out, typename C::value_type>)
      gc::gpu::decode(c, p, std::span<Out>(dout.as<Out>(), out_count), dstatus.as<std::uint32_t>(),
                      ws.span(), nullptr);
  }
  cuda_ok(cudaDeviceSynchronize(), "decode");
  return {dstatus.download<std::uint32_t>(1)[0], dout.download<Out>(out_count)};
}

template <class V> std::vector<V> poison(std::size_t n) {
  std::vector<V> v(n);
  std::memset(static_cast<void*>(v.data()), 0x7b, n * sizeof(V));
  return v;
}

/// Device decodes of defective versions of the valid payload `host` (n
/// elements) are rejected with the expected status and leave the output
/// untouched: a flipped body byte, a wrong count, a truncated payload and,
/// when given, content the host rejects (break_content, then re-sealed).
template <class C>
void check_rejections(const std::string& tag, const C& c, const std::vector<std::byte>& host,
                      std::size_t n,
                      const std::function<void(std::vector<std::byte>&)>& break_content = {}) {
  using T = typename C::value_type;
  const auto rejected = [&](const std::vector<std::byte>& bad, std::size_t count,
                            gc::gpu::status want, const char* what) {
    const auto [st, o] = device_decode<C, T>(c, bad, count, false, poison<T>(count));
    expect(st == static_cast<std::uint32_t>(want),
           tag + ": " + what + ": status " + std::to_string(st) + ", expected " +
               std::to_string(static_cast<unsigned>(want)));
    expect(same_bits(o, poison<T>(count)), tag + ": " + what + ": output was written");
  };
  if (host.size() > gc::wire::header_bytes + param_bytes_of<C>(host)) {
    std::vector<std::byte> bad = host;
    bad.back() ^= std::byte{0x10};
    rejected(bad, n, gc::gpu::status::bad_checksum, "flipped body byte");
  }
  rejected(host, n + 1, gc::gpu::status::bad_count, "wrong count");
  {
    std::vector<std::byte> bad(host.begin(), host.end() - 1);
    rejected(bad, n, gc::gpu::status::bad_length, "truncated payload");
  }
  if (break_content) {
    std::vector<std::byte> bad = host;
    break_content(bad);
    gc::wire::seal(bad);
    bool host_rejects = false;
    try {
      std::vector<T> tmp(n);
      c.decode(bad, std::span<T>(tmp));
    } catch (const gs::error&) {
      host_rejects = true;
    }
    expect(host_rejects, tag + ": host rejects the broken content");
    rejected(bad, n, gc::gpu::status::bad_content, "broken content");
  }
}

/// The host's decode and decode_accumulate of `payload` (n elements); the
/// accumulator starts from `acc_init`.
template <class C> struct host_decodes {
  using T = typename C::value_type;
  using A = gs::accum_t<T>;
  std::vector<T> out;
  std::vector<A> acc_init, acc;
  host_decodes(const C& c, const std::vector<std::byte>& payload, std::size_t n)
      : out(n), acc_init(n) {
    c.decode(payload, std::span<T>(out));
    for (std::size_t i = 0; i < n; ++i) acc_init[i] = static_cast<A>(i % 7) - 3;
    acc = acc_init;
    c.decode_accumulate(payload, std::span<A>(acc));
  }
};

/// The whole check of one codec instance at one size.
template <class C>
void check_codec(const std::string& label, const C& c, std::size_t n,
                 const std::function<void(std::vector<std::byte>&)>& break_content = {}) {
  using T = typename C::value_type;
  using A = gs::accum_t<T>;
  const std::string tag = label + " n=" + std::to_string(n);
  const std::vector<T> in = make_input<T>(n, 0x1234 + n);

  // Host reference.
  auto hst = make_state<C>();
  const std::vector<std::byte> host = gc::encode_to_vector(c, std::span<const T>(in), hst);
  const host_decodes<C> hd(c, host, n);

  // Device encode.
  auto dst = make_state<C>();
  dbuf din(n * sizeof(T)), dout(c.max_encoded_bytes(n)),
      dws(gc::gpu::encode_workspace_bytes(c, n));
  din.upload(in);
  cuda_ok(cudaMemset(dout.p, 0x5a, dout.n), "memset");
  const std::size_t ret =
      gc::gpu::encode(c, std::span<const T>(din.as<T>(), n), dst, dws.span(), dout.span(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "encode");
  const std::size_t bytes = device_payload_bytes(dout, param_bytes_of<C>(host));
  expect(bytes == host.size(), tag + ": device payload size " + std::to_string(bytes) +
                                   " != host " + std::to_string(host.size()));
  expect(ret >= bytes && ret <= c.max_encoded_bytes(n), tag + ": encode's return value");
  if constexpr (!std::is_same_v<typename C::state, gc::no_state>)
    expect(dst.step == hst.step, tag + ": state step advanced like the host's");
  const std::vector<std::byte> dev = dout.download<std::byte>(std::min(bytes, host.size()));
  std::size_t first_diff = dev.size();
  for (std::size_t i = 0; i < dev.size(); ++i)
    if (dev[i] != host[i]) {
      first_diff = i;
      break;
    }
  expect(bytes == host.size() && first_diff == dev.size(),
         tag + ": device payload differs from host at byte " + std::to_string(first_diff));

  // Device decodes of the host payload.
  const auto [s1, out] = device_decode<C, T>(c, host, n, false, poison<T>(n));
  expect(s1 == 0, tag + ": decode status " + std::to_string(s1));
  expect(same_bits(out, hd.out), tag + ": device decode != host decode");
  const auto [s2, acc] = device_decode<C, A>(c, host, n, true, hd.acc_init);
  expect(s2 == 0, tag + ": decode_accumulate status " + std::to_string(s2));
  expect(same_bits(acc, hd.acc), tag + ": device decode_accumulate != host");

  check_rejections(tag, c, host, n, break_content);
}

template <class C>
void check_sizes(const std::string& label, const C& c,
                 const std::function<void(std::vector<std::byte>&)>& break_content = {}) {
  for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{12345},
                        (std::size_t{1} << 20) + 3})
    check_codec(label, c, n, n >= 1000 ? break_content : nullptr);
}

// ---- content breakers: each makes a payload the host decoder rejects ------
/// First code byte of a blockwise payload := the given value.
std::function<void(std::vector<std::byte>&)> set_code(std::uint8_t v, std::uint32_t block) {
  return [v, block](std::vector<std::byte>& p) {
    const std::uint64_t n = gc::wire::load<std::uint64_t>(p.data() + 8);
    const std::size_t nb = (n + block - 1) / block;
    p[gc::wire::header_bytes + 8 + 4 * nb] = std::byte{v};
  };
}
/// Scale of block 0 := -1.
void negative_scale(std::vector<std::byte>& p) {
  gc::wire::store<float>(p.data() + gc::wire::header_bytes + 8, -1.0f);
}
/// Swaps the first two indices of a sparse body (params of P bytes).
std::function<void(std::vector<std::byte>&)> unsort(std::size_t params) {
  return [params](std::vector<std::byte>& p) {
    std::byte* idx = p.data() + gc::wire::header_bytes + params;
    std::byte t[4];
    std::memcpy(t, idx, 4);
    std::memcpy(idx, idx + 4, 4);
    std::memcpy(idx + 4, t, 4);
  };
}

// ---- PowerSGD ------------------------------------------------------------------

/// The state a device encode of C takes, with the device memory it needs
/// (PowerSGD's warm start and replaced-column word; other codecs: none).
template <class C> struct dev_state {
  typename C::state st = make_state<C>();
  explicit dev_state(const C&) {}
};
template <class T> struct dev_state<gc::powersgd<T>> {
  dbuf q, replaced;
  gc::gpu::powersgd_state st;
  explicit dev_state(const gc::powersgd<T>& c, std::uint64_t seed = 0x5eed)
      : q(sizeof(float) * gc::gpu::powersgd_state_floats(c)), replaced(4),
        st(gc::gpu::to_device(gc::powersgd_state{.seed = seed},
                              {q.as<float>(), gc::gpu::powersgd_state_floats(c)}, nullptr)) {
    st.replaced = replaced.as<std::uint32_t>();
  }
  std::uint32_t replaced_count() const { return replaced.download<std::uint32_t>(1)[0]; }
  std::vector<float> warm_start() const { return q.download<float>(st.q.size()); }
};

/// ||a - b||_F / ||b||_F (0 when both are zero).
double rel_diff(const float* a, const float* b, std::size_t n) {
  double d = 0, r = 0;
  for (std::size_t i = 0; i < n; ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    r += static_cast<double>(b[i]) * b[i];
  }
  return r == 0 ? (d == 0 ? 0.0 : INFINITY) : std::sqrt(d / r);
}

/// The factors (P then Q) of a PowerSGD payload.
std::vector<float> factors_of(const std::vector<std::byte>& payload) {
  const std::size_t head = gc::wire::header_bytes + gc::powersgd<float>::param_bytes;
  std::vector<float> f((payload.size() - head) / sizeof(float));
  std::memcpy(f.data(), payload.data() + head, f.size() * sizeof(float));
  return f;
}

/// The tolerance cuda/powersgd.cuh states for P and Q (relative Frobenius).
constexpr double psgd_tol = 1e-4;
int psgd_bitwise_payloads = 0, psgd_payloads = 0;

/// Uniform values in [-1, 1) (not on a grid: real rounding in every sum).
template <class T> std::vector<T> make_matrix(std::size_t n, std::uint64_t seed) {
  std::vector<T> v(n);
  std::uint64_t s = seed;
  for (auto& x : v) x = T(static_cast<float>(splitmix(s) >> 40) * 0x1p-23f - 1.0f);
  return v;
}

/// Device encode of `in` (rows x cols) for one step; returns the payload.
template <class T>
std::vector<std::byte> psgd_device_encode(const gc::powersgd<T>& c, dev_state<gc::powersgd<T>>& ds,
                                          const std::vector<T>& in) {
  const std::size_t n = in.size();
  dbuf din(n * sizeof(T)), dout(c.max_encoded_bytes(n)), dws(gc::gpu::encode_workspace_bytes(c, n));
  din.upload(in);
  cuda_ok(cudaMemset(dout.p, 0x5a, dout.n), "memset");
  const std::size_t bytes = gc::gpu::encode(c, std::span<const T>(din.as<T>(), n), ds.st,
                                            dws.span(), dout.span(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "encode");
  return dout.download<std::byte>(bytes);
}

/// Three warm-started steps on host and device from the same seed: same
/// header and parameters, factors within psgd_tol, same replaced count; each
/// side's decoder accepts the other's payload, device decodes equal host
/// decodes bit for bit; rejections as for every codec.
template <class T> void check_powersgd(std::size_t rows, std::size_t cols, std::size_t rank) {
  using A = gs::accum_t<T>;
  const gc::powersgd<T> c{.rows = rows, .cols = cols, .rank = rank};
  const std::string tag = "powersgd<" + std::string(gs::dtype_name(gs::dtype_traits<T>::id)) +
                          "> " + std::to_string(rows) + "x" + std::to_string(cols) + " rank " +
                          std::to_string(rank);
  const std::size_t n = rows * cols, r = c.used_rank();
  gc::powersgd_state hs{.seed = 0x5eed};
  dev_state<gc::powersgd<T>> ds(c);
  for (int step = 0; step < 3; ++step) {
    const std::string t = tag + " step " + std::to_string(step);
    const std::vector<T> in = make_matrix<T>(n, 0xabc + step + n);
    const auto host = gc::encode_to_vector(c, std::span<const T>(in), hs);
    const auto dev = psgd_device_encode(c, ds, in);
    expect(dev.size() == host.size(), t + ": payload size");
    if (dev.size() != host.size()) return;
    expect(ds.st.step == hs.step, t + ": step advanced like the host's");
    bool head_same = true;
    for (std::size_t b = 0; b < gc::wire::header_bytes + c.param_bytes; ++b)
      if ((b < gc::wire::checksum_offset || b >= gc::wire::checksum_offset + 8) && dev[b] != host[b])
        head_same = false;
    expect(head_same, t + ": header or parameters differ from the host's");
    const auto fd = factors_of(dev), fh = factors_of(host);
    const double dp = rel_diff(fd.data(), fh.data(), rows * r);
    const double dq = rel_diff(fd.data() + rows * r, fh.data() + rows * r, cols * r);
    expect(dp <= psgd_tol && dq <= psgd_tol,
           t + ": factors differ from the host's by " + std::to_string(dp) + " (P), " +
               std::to_string(dq) + " (Q)");
    ++psgd_payloads;
    psgd_bitwise_payloads += same_bits(dev, host) ? 1 : 0;
    expect(ds.replaced_count() == hs.replaced, t + ": replaced column count");
    const auto wq = ds.warm_start();
    expect(rel_diff(wq.data(), hs.q.data(), cols * r) <= psgd_tol, t + ": warm start Q");
    // The host decoder accepts the device payload; the device decodes it alike.
    std::vector<T> host_of_dev(n);
    try {
      c.decode(dev, std::span<T>(host_of_dev));
    } catch (const gs::error& e) {
      expect(false, t + ": host decoder rejects the device payload: " + e.what());
    }
    const auto [s0, dev_of_dev] = device_decode<gc::powersgd<T>, T>(c, dev, n, false, poison<T>(n));
    expect(s0 == 0 && same_bits(dev_of_dev, host_of_dev), t + ": decodes of the device payload");
    // The device decoder accepts the host payload and decodes it bit for bit.
    const host_decodes<gc::powersgd<T>> hd(c, host, n);
    const auto [s1, out] = device_decode<gc::powersgd<T>, T>(c, host, n, false, poison<T>(n));
    expect(s1 == 0 && same_bits(out, hd.out), t + ": device decode of the host payload");
    const auto [s2, acc] = device_decode<gc::powersgd<T>, A>(c, host, n, true, hd.acc_init);
    expect(s2 == 0 && same_bits(acc, hd.acc), t + ": device decode_accumulate");
    if (step == 0 && n > 0)
      check_rejections(t, c, host, n, [](std::vector<std::byte>& p) { // a NaN factor
        gc::wire::store<float>(p.data() + gc::wire::header_bytes + 24, NAN);
      });
  }
}

/// The step functions on their own: the multiplies and reconstruct bitwise,
/// orthonormalize within psgd_tol (same replaced count).
void check_powersgd_steps(std::size_t rows, std::size_t cols, std::size_t r) {
  const std::string tag = "powersgd steps " + std::to_string(rows) + "x" + std::to_string(cols) +
                          " r " + std::to_string(r);
  const std::vector<float> m = make_matrix<float>(rows * cols, 0x51 + rows);
  std::vector<float> q0(cols * r), p(rows * r), q(cols * r);
  gc::powersgd_initial_q(0x77, cols, r, q0.data());
  dbuf dm(m.size() * 4), dq0(q0.size() * 4), dp(p.size() * 4), dq(q.size() * 4),
      dws(gc::gpu::powersgd_orthonormalize_workspace_bytes(rows, r)), drep(4),
      drec(rows * cols * 4);
  dm.upload(m);
  dq0.upload(q0);
  gc::powersgd_multiply(m.data(), rows, cols, q0.data(), r, p.data());
  gc::gpu::powersgd_multiply(dm.as<float>(), rows, cols, dq0.as<float>(), r, dp.as<float>(),
                             nullptr);
  cuda_ok(cudaDeviceSynchronize(), "multiply");
  expect(same_bits(dp.download<float>(p.size()), p), tag + ": multiply != host");
  // Orthonormalise the host P on both sides.
  dp.upload(p);
  const gc::philox_stream rng{0x77, 5, gc::powersgd_key};
  const std::size_t replaced = gc::powersgd_orthonormalize(p.data(), rows, r, rng);
  gc::gpu::powersgd_orthonormalize(dp.as<float>(), rows, r, rng, drep.as<std::uint32_t>(),
                                   dws.span(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "orthonormalize");
  const auto pd = dp.download<float>(p.size());
  expect(rel_diff(pd.data(), p.data(), p.size()) <= psgd_tol, tag + ": orthonormalize");
  expect(drep.download<std::uint32_t>(1)[0] == replaced, tag + ": replaced count");
  // From the host's orthonormal P on both sides.
  dp.upload(p);
  gc::powersgd_multiply_transposed(m.data(), rows, cols, p.data(), r, q.data());
  gc::gpu::powersgd_multiply_transposed(dm.as<float>(), rows, cols, dp.as<float>(), r,
                                        dq.as<float>(), nullptr);
  cuda_ok(cudaDeviceSynchronize(), "multiply_transposed");
  expect(same_bits(dq.download<float>(q.size()), q), tag + ": multiply_transposed != host");
  std::vector<float> rec(rows * cols);
  gc::powersgd_reconstruct(p.data(), q.data(), rows, cols, r,
                           [&](std::size_t i, float v) { rec[i] = v; });
  dq.upload(q);
  gc::gpu::powersgd_reconstruct(dp.as<float>(), dq.as<float>(), rows, cols, r,
                                gc::store_sink<float>{drec.as<float>()}, nullptr);
  cuda_ok(cudaDeviceSynchronize(), "reconstruct");
  expect(same_bits(drec.download<float>(rec.size()), rec), tag + ": reconstruct != host");
}

/// Special inputs: exact recovery of a low-rank matrix, NaN input, factor
/// overflow (both poison, payload equal to the host's, warm start kept) and
/// a zero matrix (finite output, all columns replaced).
void check_powersgd_special() {
  using C = gc::powersgd<float>;
  const auto dev_decode = [](const C& c, const std::vector<std::byte>& payload) {
    const std::size_t n = c.rows * c.cols;
    const auto [st, out] = device_decode<C, float>(c, payload, n, false, poison<float>(n));
    expect(st == 0, "powersgd special: decode status " + std::to_string(st));
    return out;
  };
  { // rank 3 recovered by a rank-4 step (one dependent column replaced)
    const C c{.rows = 300, .cols = 200, .rank = 4};
    const auto a = make_matrix<float>(300 * 3, 1), b = make_matrix<float>(200 * 3, 2);
    std::vector<float> m(300 * 200);
    for (std::size_t i = 0; i < 300; ++i)
      for (std::size_t k = 0; k < 200; ++k)
        for (std::size_t j = 0; j < 3; ++j) m[i * 200 + k] += a[i * 3 + j] * b[k * 3 + j];
    dev_state<C> ds(c);
    const auto out = dev_decode(c, psgd_device_encode(c, ds, m));
    const double err = rel_diff(out.data(), m.data(), m.size());
    expect(err <= 1e-5, "powersgd rank-3 recovery: relative error " + std::to_string(err));
    expect(ds.replaced_count() == 1, "powersgd rank-3 recovery: one column replaced");
  }
  const auto poisoned_case = [&](const char* what, std::vector<float> m, std::size_t rows) {
    const C c{.rows = rows, .cols = m.size() / rows, .rank = 3};
    gc::powersgd_state hs{.seed = 0x5eed};
    dev_state<C> ds(c);
    const auto good = make_matrix<float>(m.size(), 3);
    gc::encode_to_vector(c, std::span<const float>(good), hs); // a warm start to keep
    psgd_device_encode(c, ds, good);
    const auto q_before = ds.warm_start();
    const auto host = gc::encode_to_vector(c, std::span<const float>(m), hs);
    const auto dev = psgd_device_encode(c, ds, m);
    expect(same_bits(dev, host), std::string("powersgd ") + what + ": payload != host");
    expect(gc::wire::load<std::uint32_t>(dev.data() + gc::wire::header_bytes + 20) == 1,
           std::string("powersgd ") + what + ": not poisoned");
    expect(same_bits(ds.warm_start(), q_before), std::string("powersgd ") + what +
                                                     ": warm start changed");
    expect(ds.replaced_count() == 0, std::string("powersgd ") + what + ": replaced count");
    const auto out = dev_decode(c, host);
    expect(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }),
           std::string("powersgd ") + what + ": decode is not NaN everywhere");
  };
  {
    auto m = make_matrix<float>(40 * 30, 4);
    m[77] = NAN;
    m[900] = -INFINITY;
    poisoned_case("NaN/Inf input", m, 40);
  }
  poisoned_case("factor overflow", std::vector<float>(64 * 64, 3e38f), 64);
  { // zero matrix: P = 0, every column replaced by a Philox direction, Q = 0
    const C c{.rows = 50, .cols = 40, .rank = 3};
    const std::vector<float> m(50 * 40, 0.0f);
    gc::powersgd_state hs{.seed = 0x5eed};
    dev_state<C> ds(c);
    const auto host = gc::encode_to_vector(c, std::span<const float>(m), hs);
    const auto dev = psgd_device_encode(c, ds, m);
    const auto fd = factors_of(dev), fh = factors_of(host);
    expect(dev.size() == host.size() && rel_diff(fd.data(), fh.data(), 50 * 3) <= psgd_tol,
           "powersgd zero matrix: P differs from the host's");
    expect(ds.replaced_count() == 3 && hs.replaced == 3, "powersgd zero matrix: replaced count");
    const auto out = dev_decode(c, dev);
    expect(std::all_of(out.begin(), out.end(), [](float v) { return v == 0.0f; }),
           "powersgd zero matrix: decode is not all zero");
  }
}

void run_tests() {
  using gs::bfloat16;
  using gs::half;
  check_sizes("fp16<float>", gc::fp16<float>{});
  check_sizes("bf16<float>", gc::bf16<float>{});
  check_sizes("fp16<double>", gc::fp16<double>{});
  check_sizes("bf16<half>", gc::bf16<half>{});
  check_sizes("int8<float>", gc::int8<float>{}, set_code(0x80, gc::int8<float>{}.block));
  check_sizes("int8<bfloat16> block 1000", gc::int8<bfloat16>{.block = 1000}, negative_scale);
  check_sizes("int4<float>", gc::int4<float>{}, set_code(0x88, gc::int4<float>{}.block));
  check_sizes("int4<half> block 7 (unaligned)", gc::int4<half>{.block = 7});
  check_sizes("sign<float>", gc::sign<float>{}, negative_scale);
  check_sizes("sign<double> block 1001 (unaligned)", gc::sign<double>{.block = 1001});
  check_sizes("terngrad<float>", gc::terngrad<float>{}, set_code(0xff, gc::terngrad<float>{}.block));
  check_sizes("terngrad<half> block 4096", gc::terngrad<half>{.block = 4096});
  check_sizes("qsgd<float> s=7", gc::qsgd<float>{}, set_code(0x08, gc::qsgd<float>{}.block));
  check_sizes("qsgd<float> s=100", gc::qsgd<float>{.block = 2048, .rule = {.levels = 100}});
  // Feedback forms (unbiased = false: scale from the level moments; the
  // unaligned blocks take the code pass that reads the divisors back).
  check_sizes("terngrad<float> feedback form", gc::terngrad<float>{.rule = {.unbiased = false}});
  check_sizes("terngrad<half> block 7 (unaligned) feedback form", gc::terngrad<half>{.block = 7, .rule = {.unbiased = false}});
  check_sizes("qsgd<float> s=7 feedback form", gc::qsgd<float>{.rule = {.unbiased = false}});
  check_sizes("qsgd<float> s=3 block 129 (unaligned) feedback form",
              gc::qsgd<float>{.block = 129, .rule = {.levels = 3, .unbiased = false}});
  check_sizes("qsgd<bfloat16> s=100 block 40 feedback form",
              gc::qsgd<bfloat16>{.block = 40, .rule = {.levels = 100, .unbiased = false}});
  check_sizes("topk<float> k=1000", gc::topk<float>{.k = 1000}, unsort(8));
  check_sizes("topk<double> k=37", gc::topk<double>{.k = 37});
  check_sizes("topk<half> k=5000", gc::topk<half>{.k = 5000});
  check_sizes("approx_topk<float> 1%", gc::approx_topk<float>{.density = 0.01}, unsort(16));
  check_sizes("approx_topk<bfloat16> 0.1%", gc::approx_topk<bfloat16>{.density = 0.001});
  check_sizes("approx_topk<float> 60%", gc::approx_topk<float>{.density = 0.6});
  check_sizes("threshold<float> 0.9", gc::threshold<float>{.tau = 0.9f}, unsort(16));
  check_sizes("threshold<half> 0.25", gc::threshold<half>{.tau = 0.25f});
  check_sizes("randomk<float> k=777", gc::randomk<float>{.k = 777});
  check_sizes("randomk<double> k=50000 per-rank",
              gc::randomk<double>{.k = 50000, .shared_indices = false});
  check_sizes("randomk<float> k=777 unbiased=false", gc::randomk<float>{.k = 777, .unbiased = false});
  check_sizes("randomk<half> k=3000 per-rank unbiased=false",
              gc::randomk<half>{.k = 3000, .shared_indices = false, .unbiased = false});

  // PowerSGD (see check_powersgd): square, tall, flat, rows above the
  // 65536 rows one pass of the orthonormalisation grid covers, rank clipped,
  // a single column, half and bfloat16 input.
  check_powersgd<float>(96, 64, 4);
  check_powersgd<float>(1000, 300, 8);
  check_powersgd<float>(3, 5000, 2);
  check_powersgd<float>(70000, 20, 3);
  check_powersgd<float>(5, 7, 32);
  check_powersgd<float>(37, 1, 1);
  check_powersgd<float>(1, 1, 1);
  check_powersgd<half>(200, 150, 4);
  check_powersgd<bfloat16>(64, 333, 6);
  check_powersgd_steps(96, 64, 4);
  check_powersgd_steps(1000, 300, 8);
  check_powersgd_steps(70000, 20, 3);
  check_powersgd_special();
  std::printf("powersgd: %d of %d device payloads bitwise equal to the host's\n",
              psgd_bitwise_payloads, psgd_payloads);

  // Non-finite inputs: NaN/Inf are poisoned or passed identically on both sides.
  {
    std::vector<float> in = make_input<float>(5000, 9);
    in[17] = std::numeric_limits<float>::quiet_NaN();
    in[4000] = -std::numeric_limits<float>::infinity();
    const auto compare = [&](const auto& c, const char* label) {
      using C = std::decay_t<decltype(c)>;
      auto hs = make_state<C>(), ds = make_state<C>();
      const auto host = gc::encode_to_vector(c, std::span<const float>(in), hs);
      dbuf din(in.size() * 4), dout(c.max_encoded_bytes(in.size())),
          dws(gc::gpu::encode_workspace_bytes(c, in.size()));
      din.upload(in);
      gc::gpu::encode(c, std::span<const float>(din.as<float>(), in.size()), ds, dws.span(),
                      dout.span(), nullptr);
      cuda_ok(cudaDeviceSynchronize(), "encode");
      expect(same_bits(dout.download<std::byte>(host.size()), host),
             std::string(label) + " with NaN/Inf: device payload != host");
    };
    compare(gc::fp16<float>{}, "fp16");
    compare(gc::int8<float>{}, "int8");
    compare(gc::sign<float>{}, "sign");
    compare(gc::qsgd<float>{}, "qsgd");
    compare(gc::qsgd<float>{.rule = {.unbiased = false}}, "qsgd feedback form");
    compare(gc::terngrad<float>{.rule = {.unbiased = false}}, "terngrad feedback form");
    compare(gc::topk<float>{.k = 10}, "topk");
    compare(gc::randomk<float>{.k = 100}, "randomk");
    compare(gc::randomk<float>{.k = 100, .unbiased = false}, "randomk unbiased=false");
    // A poisoned unscaled payload (flags 3) decodes to NaN everywhere on the device too.
    const gc::randomk<float> c{.k = 100, .unbiased = false};
    auto hs = make_state<gc::randomk<float>>();
    const auto host = gc::encode_to_vector(c, std::span<const float>(in), hs);
    std::vector<float> host_out(in.size());
    c.decode(host, std::span<float>(host_out));
    const auto [st, out] = device_decode<gc::randomk<float>, float>(c, host, in.size(), false,
                                                                    poison<float>(in.size()));
    expect(st == 0 && same_bits(out, host_out), "randomk unbiased=false with NaN/Inf: decode");
  }
}

// ---- bench -------------------------------------------------------------------

struct timer {
  cudaEvent_t a, b;
  timer() {
    cuda_ok(cudaEventCreate(&a), "event");
    cuda_ok(cudaEventCreate(&b), "event");
  }
  ~timer() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
  /// Median milliseconds of `reps` runs of f (after two warm-ups).
  template <class F> double median_ms(int reps, F f) {
    f();
    f();
    std::vector<float> t(reps);
    for (int r = 0; r < reps; ++r) {
      cuda_ok(cudaEventRecord(a), "record");
      f();
      cuda_ok(cudaEventRecord(b), "record");
      cuda_ok(cudaEventSynchronize(b), "sync");
      cuda_ok(cudaEventElapsedTime(&t[r], a, b), "elapsed");
    }
    std::sort(t.begin(), t.end());
    return t[reps / 2];
  }
};

template <class C> void bench_codec(const char* label, const C& c, std::size_t n, int reps) {
  using T = typename C::value_type;
  const std::vector<T> in = make_input<T>(n, 77);
  dbuf din(n * sizeof(T)), dout(c.max_encoded_bytes(n)), dws(gc::gpu::encode_workspace_bytes(c, n));
  din.upload(in);
  dev_state<C> ds(c);
  timer tm;
  const double enc = tm.median_ms(reps, [&] {
    gc::gpu::encode(c, std::span<const T>(din.as<T>(), n), ds.st, dws.span(), dout.span(),
                    nullptr);
  });
  cuda_ok(cudaDeviceSynchronize(), "encode");
  const std::size_t bytes = device_payload_bytes(dout, static_cast<std::uint8_t>(
                                                           dout.download<std::byte>(8)[7]));
  dbuf dres(n * sizeof(T)), dstatus(4), dws2(gc::gpu::decode_workspace_bytes(c, bytes));
  const double dec = tm.median_ms(reps, [&] {
    gc::gpu::decode(c, std::span<const std::byte>(dout.p, bytes),
                    std::span<T>(dres.as<T>(), n), dstatus.as<std::uint32_t>(), dws2.span(),
                    nullptr);
  });
  cuda_ok(cudaDeviceSynchronize(), "decode");
  const std::uint32_t status = dstatus.download<std::uint32_t>(1)[0];
  const double gb = static_cast<double>(n * sizeof(T)) / 1e9;
  std::printf("%-24s %10.3f %10.1f %10.3f %10.1f %8.2f%s\n", label, enc, gb / (enc / 1e3), dec,
              gb / (dec / 1e3), static_cast<double>(n * sizeof(T)) / static_cast<double>(bytes),
              status == 0 ? "" : "  DECODE REJECTED");
  if (status != 0) ++failures;
}

void run_bench(std::size_t mib, int reps) {
  const std::size_t bytes = mib << 20;
  cudaDeviceProp prop{};
  cuda_ok(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf("\ndevice: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  {
    dbuf a(bytes), b(bytes);
    cuda_ok(cudaMemset(a.p, 1, bytes), "memset");
    timer tm;
    const double ms = tm.median_ms(reps, [&] {
      cuda_ok(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice), "copy");
    });
    std::printf("device copy %zu MiB: %.3f ms, %.1f GB/s of input (%.1f GB/s read + write)\n",
                mib, ms, static_cast<double>(bytes) / 1e9 / (ms / 1e3),
                2 * static_cast<double>(bytes) / 1e9 / (ms / 1e3));
  }
  std::printf("%-24s %10s %10s %10s %10s %8s\n", "codec (float input)", "enc ms", "enc GB/s",
              "dec ms", "dec GB/s", "ratio");
  const std::size_t n = bytes / sizeof(float);
  bench_codec("fp16", gc::fp16<float>{}, n, reps);
  bench_codec("bf16", gc::bf16<float>{}, n, reps);
  bench_codec("int8", gc::int8<float>{}, n, reps);
  bench_codec("int4", gc::int4<float>{}, n, reps);
  bench_codec("sign", gc::sign<float>{}, n, reps);
  bench_codec("terngrad", gc::terngrad<float>{}, n, reps);
  bench_codec("qsgd s=7", gc::qsgd<float>{}, n, reps);
  bench_codec("topk 1%", gc::topk<float>{.k = n / 100}, n, reps);
  bench_codec("approx_topk 1%", gc::approx_topk<float>{.density = 0.01}, n, reps);
  bench_codec("threshold 0.99", gc::threshold<float>{.tau = 0.99f}, n, reps);
  bench_codec("randomk 1%", gc::randomk<float>{.k = n / 100}, n, reps);
  bench_codec("powersgd r=4 (x1024)",
              gc::powersgd<float>{.rows = n / 1024, .cols = 1024, .rank = 4}, n / 1024 * 1024,
              reps);
}

} // namespace

int main(int argc, char** argv) {
  if (gpu_test::device_count() == 0) return gpu_test::skip_no_device();
  bool bench = false;
  std::size_t mib = 256;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--bench") {
      bench = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::printf("usage: %s [--bench [MiB]] [--reps N]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (bench) {
      run_bench(mib, reps);
    } else {
      run_tests();
      std::printf("%d checks, %d failures\n", checks, failures);
    }
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
