// torch_gradsync: the engine over any gradsync transport (see engine.hpp);
// engine_shm.cpp and engine_mpi.cpp instantiate it.
#pragma once

#include <gradsync/compressed.hpp>
#include <gradsync/gradsync.hpp>

#include <map>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "engine.hpp"

namespace torch_gradsync::detail {

// Calls f(T{}) with the gradsync type of `t`.
template <class F> decltype(auto) with_elem(elem t, F&& f) {
  switch (t) {
  case elem::f32: return f(float{});
  case elem::f64: return f(double{});
  case elem::f16: return f(gradsync::half{});
  case elem::bf16: return f(gradsync::bfloat16{});
  case elem::i32: return f(std::int32_t{});
  case elem::i64: return f(std::int64_t{});
  }
  throw gradsync::error("torch_gradsync", -1, -1, "unknown element type");
}

template <class F> decltype(auto) with_op(red op, F&& f) {
  switch (op) {
  case red::sum: return f(gradsync::op::sum{});
  case red::prod: return f(gradsync::op::prod{});
  case red::min: return f(gradsync::op::min{});
  case red::max: return f(gradsync::op::max{});
  case red::avg: return f(gradsync::op::avg{});
  }
  throw gradsync::error("torch_gradsync", -1, -1, "unknown reduction");
}

template <class T> std::span<T> span_of(void* p, std::size_t n) { return {static_cast<T*>(p), n}; }
template <class T> std::span<const T> span_of(const void* p, std::size_t n) { return {static_cast<const T*>(p), n}; }

// The codec's main parameter, so that "topk:0.01" reads as "topk:density=0.01".
inline std::string expand_shorthand(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos || text.find('=') != std::string::npos) return text;
  const std::string name = text.substr(0, colon);
  static const std::map<std::string, std::string> main_param = {
      {"topk", "density"}, {"approx_topk", "density"}, {"randk", "density"},
      {"threshold", "tau"}, {"qsgd", "levels"},       {"powersgd", "rank"}};
  const auto it = main_param.find(name);
  if (it == main_param.end()) return text; // parse_spec names the problem
  return name + ":" + it->second + "=" + text.substr(colon + 1);
}

// "automatic[:CODEC]", "none" or a codec spec, as a gradsync::compression.
inline gradsync::compression parse_compression(const std::string& text, int rank) {
  gradsync::compression z;
  std::string codec = text;
  if (text == "automatic" || text.rfind("automatic:", 0) == 0) {
    z.mode = gradsync::compress_mode::automatic;
    codec = text == "automatic" ? "int8" : text.substr(10);
  } else if (text == "none") {
    z.mode = gradsync::compress_mode::never;
    codec = "int8";
  }
  try {
    z.codec = gradsync::compress::parse_spec(expand_shorthand(codec));
    (void)z.codec.family(); // unknown names fail here, not on the first bucket
    gradsync::compress::with_codec<float>(z.codec, 1024, [](const auto&, const auto&) {}); // bad parameters too
  } catch (const gradsync::error& e) {
    throw gradsync::error("comm_hook", rank, -1, "codec '" + text + "': " + e.reason());
  }
  return z;
}

template <class C> class compressor_on final : public compressor {
public:
  compressor_on(C& comm, std::mutex& mu, gradsync::compression z) : comm_(comm), mu_(mu), z_(std::move(z)) {}
  void allreduce_mean(void* data, std::size_t count, elem t, std::size_t key) override {
    const std::lock_guard lock(mu_);
    switch (t) {
    case elem::f32: return run(states32_[key], span_of<float>(data, count));
    case elem::f64: return run(states64_[key], span_of<double>(data, count));
    case elem::f16: return run(states16_[key], span_of<gradsync::half>(data, count));
    case elem::bf16: return run(statesb16_[key], span_of<gradsync::bfloat16>(data, count));
    default: throw gradsync::error("comm_hook", comm_.rank(), -1, "gradient buckets must hold floating-point values");
    }
  }
  std::string last_path() const override {
    const std::lock_guard lock(mu_); // the group's worker writes it
    return path_;
  }

private:
  template <class T> void run(gradsync::compress_state<T>& st, std::span<T> data) {
    gradsync::compressed_allreduce(comm_, data, z_, st, gradsync::op::avg{});
    path_ = std::string(gradsync::compressed_path_name(st.last.path));
  }
  C& comm_;
  std::mutex& mu_;
  gradsync::compression z_;
  std::map<std::size_t, gradsync::compress_state<float>> states32_;
  std::map<std::size_t, gradsync::compress_state<double>> states64_;
  std::map<std::size_t, gradsync::compress_state<gradsync::half>> states16_;
  std::map<std::size_t, gradsync::compress_state<gradsync::bfloat16>> statesb16_;
  std::string path_ = "none";
};

template <class C> class engine_on final : public engine {
public:
  explicit engine_on(C comm) : comm_(std::move(comm)) {}
  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  std::string transport() const override { return std::string(C::name); }

  void allreduce(void* data, std::size_t count, elem t, red op) override {
    const std::lock_guard lock(mu_);
    with_elem(t, [&](auto v) {
      using T = decltype(v);
      with_op(op, [&](auto o) { gradsync::allreduce(comm_, span_of<T>(data, count), o); });
    });
  }
  void reduce_scatter(const void* in, void* out, std::size_t block, elem t, red op) override {
    const std::lock_guard lock(mu_);
    const std::size_t total = block * static_cast<std::size_t>(comm_.size());
    with_elem(t, [&](auto v) {
      using T = decltype(v);
      with_op(op, [&](auto o) {
        gradsync::reduce_scatter(comm_, span_of<T>(in, total), span_of<T>(out, block), o);
      });
    });
  }
  void allgather(const void* in, void* out, std::size_t count, elem t) override {
    const std::lock_guard lock(mu_);
    const std::size_t total = count * static_cast<std::size_t>(comm_.size());
    with_elem(t, [&](auto v) {
      using T = decltype(v);
      gradsync::allgather(comm_, span_of<T>(in, count), span_of<T>(out, total));
    });
  }
  void broadcast(void* data, std::size_t count, elem t, int root) override {
    const std::lock_guard lock(mu_);
    with_elem(t, [&](auto v) {
      using T = decltype(v);
      gradsync::broadcast(comm_, span_of<T>(data, count), root);
    });
  }
  void reduce(const void* in, void* out, std::size_t count, elem t, red op, int root) override {
    const std::lock_guard lock(mu_);
    with_elem(t, [&](auto v) {
      using T = decltype(v);
      const std::size_t n_out = comm_.rank() == root ? count : 0;
      with_op(op, [&](auto o) {
        gradsync::reduce(comm_, span_of<T>(in, count), span_of<T>(out, n_out), root, o);
      });
    });
  }
  void barrier() override {
    const std::lock_guard lock(mu_);
    gradsync::barrier(comm_);
  }
  std::unique_ptr<compressor> make_compressor(const std::string& codec) override {
    return std::make_unique<compressor_on<C>>(comm_, mu_, parse_compression(codec, comm_.rank()));
  }

private:
  C comm_;
  std::mutex mu_;
};

} // namespace torch_gradsync::detail
