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
#include <gradsync/compress/cuda/randk.cuh>
#include <gradsync/compress/cuda/threshold.cuh>
#include <gradsync/compress/cuda/topk.cuh>
#include <gradsync/compress/int4.hpp>
#include <gradsync/compress/int8.hpp>
#include <gradsync/compress/qsgd.hpp>
#include <gradsync/compress/sign.hpp>
#include <gradsync/compress/terngrad.hpp>

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

/// Owning device buffer.
struct dbuf {
  std::byte* p = nullptr;
  std::size_t n = 0;
  explicit dbuf(std::size_t bytes) : n(bytes) {
    cuda_ok(cudaMalloc(&p, bytes == 0 ? 16 : bytes), "cudaMalloc");
  }
  ~dbuf() { cudaFree(p); }
  dbuf(const dbuf&) = delete;
  dbuf& operator=(const dbuf&) = delete;
  std::span<std::byte> span() { return {p, n}; }
  template <class V> V* as() { return reinterpret_cast<V*>(p); }
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
  std::vector<T> host_out(n);
  c.decode(host, std::span<T>(host_out));
  std::vector<A> host_acc(n);
  for (std::size_t i = 0; i < n; ++i) host_acc[i] = static_cast<A>(i % 7) - 3;
  const std::vector<A> acc_init = host_acc;
  c.decode_accumulate(host, std::span<A>(host_acc));

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
  expect(same_bits(out, host_out), tag + ": device decode != host decode");
  const auto [s2, acc] = device_decode<C, A>(c, host, n, true, acc_init);
  expect(s2 == 0, tag + ": decode_accumulate status " + std::to_string(s2));
  expect(same_bits(acc, host_acc), tag + ": device decode_accumulate != host");

  // Rejections leave the output untouched.
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
    compare(gc::topk<float>{.k = 10}, "topk");
    compare(gc::randomk<float>{.k = 100}, "randomk");
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
  auto st = make_state<C>();
  timer tm;
  const double enc = tm.median_ms(reps, [&] {
    gc::gpu::encode(c, std::span<const T>(din.as<T>(), n), st, dws.span(), dout.span(), nullptr);
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
}

} // namespace

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
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
