// gradsync data-parallel training: N ranks train one MLP (64 -> H -> ... ->
// H -> 10, ReLU, softmax cross-entropy, SGD with momentum and a cosine-decayed
// learning rate) on a seeded synthetic 10-class task. Each rank computes
// gradients on its slice of the global batch; gradsync averages them,
// optionally compressed, so every rank applies the same update and all ranks
// keep bitwise identical weights.
//
//   ./data_parallel                                            # 4 ranks as threads of this process
//   ./data_parallel --ranks 8 --codec int8 --ef on
//   ./data_parallel --codec topk:density=0.01 --ef on --check-against-baseline
//   ./data_parallel --overlap off --depth 4 --compute-repeat 4  # compare the time split with --overlap on
//   mpiexec -n 4 ./data_parallel --codec int8                  # one process per rank (MPI builds)
//
// Prints the loss per step (mean over the global batch), then the final loss
// (mean of the last 10 steps), accuracy on a held-out set, and the time split:
// compute alone, gradient sync alone and the training step as run. With
// --overlap on, each layer's gradient is handed to the network as soon as the
// backward pass has computed it (last layer first), so the sync of late layers
// runs while earlier layers are still being differentiated (large layers are
// handed over in pieces of --chunk-kb as backward finishes their rows, and
// each piece's optimizer step runs as soon as its average is in); with
// --overlap off one fused call averages all gradients after the backward pass.
// --check-against-baseline also trains uncompressed from the same seed and
// fails unless the final losses agree within --tolerance (relative). Exits
// non-zero if the ranks' weights differ, if the final loss is not below half
// the first step's, or if the baseline check fails.
#include <gradsync/compressed.hpp>
#include <gradsync/fusion/engine.hpp>
#include <gradsync/gradsync.hpp>
#if GRADSYNC_EXAMPLE_MPI
#include <gradsync/transport/mpi.hpp>
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

struct config {
  std::string transport = "auto";
  int ranks = 4;
  int steps = 1000;
  int batch = 256; // global: split evenly over the ranks
  int hidden = 256;
  int depth = 2; // hidden layers
  float lr = 0.03f;
  float momentum = 0.9f;
  std::uint64_t seed = 1;
  std::string codec = "none";
  bool ef = true;
  std::string mode = "always";
  bool overlap = true;
  int bucket_kb = 0; // engine bucket capacity; 0: one bucket per piece
  int chunk_kb = 1024; // pieces of a layer's gradient handed over as they are done; 0: whole layers
  int compute_repeat = 1;
  int train_samples = 0; // 0: steps * batch (at most 2^18)
  int eval_samples = 4096;
  int timing_iters = 20;
  bool json = false;
  bool check_baseline = false;
  double tolerance = 0.02;
};

// ---------------------------------------------------------------------------
// Seeded randomness: counter based, so sample i is the same whoever makes it.

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct rng {
  std::uint64_t s;
  explicit rng(std::uint64_t seed) : s(seed * 0xd1342543de82ef95ull + 1) {}
  double uniform() { return static_cast<double>(splitmix(s) >> 11) * 0x1p-53; }
  float normal() { // Box-Muller; libstdc++'s distributions are not specified bit for bit
    const double u = 1 - uniform(), v = uniform();
    return static_cast<float>(std::sqrt(-2 * std::log(u)) * std::cos(6.283185307179586 * v));
  }
};

// ---------------------------------------------------------------------------
// The task: each class is a mixture of a few Gaussian clusters in a 16-dim
// latent space (so no linear boundary separates the classes), mapped to the
// 64 inputs by a fixed random layer with a tanh, plus a little input noise.
// The within-cluster noise is as large as the spread of the centers, so
// classes overlap (about 86% accuracy is the best this model reaches): the
// loss has a floor near 0.4 that every run approaches, which is what makes
// comparing compressed with uncompressed final losses meaningful.

constexpr int n_in = 64, n_latent = 16, n_classes = 10, n_clusters = 3;

struct task {
  std::vector<float> centers; // [class][cluster][latent]
  std::vector<float> mix;     // [in][latent]
  explicit task(std::uint64_t seed) {
    rng g(seed ^ 0x7a5c);
    centers.resize(std::size_t{n_classes} * n_clusters * n_latent);
    for (auto& c : centers) c = g.normal();
    mix.resize(std::size_t{n_in} * n_latent);
    for (auto& m : mix) m = 1.5f * g.normal() / std::sqrt(static_cast<float>(n_latent)); // tanh inputs ~ N(0, 3.4)
  }
  // Sample `index` of stream `stream` (train, eval): fills x[n_in], returns its class.
  int sample(std::uint64_t seed, std::uint64_t stream, std::uint64_t index, float* x) const {
    rng g(seed ^ (stream << 56) ^ (index * 0x9e3779b97f4a7c15ull));
    const int label = static_cast<int>(g.uniform() * n_classes);
    const int cluster = static_cast<int>(g.uniform() * n_clusters);
    const float* c = &centers[(static_cast<std::size_t>(label) * n_clusters + cluster) * n_latent];
    float z[n_latent];
    for (int k = 0; k < n_latent; ++k) z[k] = c[k] + g.normal();
    for (int i = 0; i < n_in; ++i) {
      float s = 0;
      for (int k = 0; k < n_latent; ++k) s += mix[static_cast<std::size_t>(i) * n_latent + k] * z[k];
      x[i] = std::tanh(s) + 0.05f * g.normal();
    }
    return label;
  }
};

struct dataset {
  std::vector<float> x; // [n][n_in]
  std::vector<int> y;
  std::size_t size() const { return y.size(); }
  const float* row(std::size_t i) const { return &x[i * n_in]; }
};

// The samples of `count` whose global index satisfies `mine`, in order.
template <class Mine> dataset make_dataset(const task& t, std::uint64_t seed, std::uint64_t stream, std::size_t count,
                                           Mine mine) {
  dataset d;
  for (std::size_t i = 0; i < count; ++i) {
    if (!mine(i)) continue;
    d.x.resize(d.x.size() + n_in);
    d.y.push_back(t.sample(seed, stream, i, &d.x[d.x.size() - n_in]));
  }
  return d;
}

// ---------------------------------------------------------------------------
// The model. All parameters live in one flat vector, layer after layer (W then
// b), and the gradients in another with the same layout, so a layer's
// gradient is one contiguous span and all of them together are one span too.

class mlp {
public:
  mlp(std::vector<int> dims, std::uint64_t seed) : dims_(std::move(dims)) {
    std::size_t off = 0;
    for (std::size_t l = 0; l + 1 < dims_.size(); ++l) {
      offset_.push_back(off);
      off += static_cast<std::size_t>(dims_[l] + 1) * dims_[l + 1];
    }
    offset_.push_back(off);
    params_.assign(off, 0.0f);
    grads_.assign(off, 0.0f);
    velocity_.assign(off, 0.0f);
    rng g(seed ^ 0x3141); // the same seed on every rank: identical initial weights
    for (std::size_t l = 0; l < layers(); ++l) {
      const float scale = std::sqrt(2.0f / static_cast<float>(dims_[l])); // He init for ReLU
      for (float& w : weight(l)) w = scale * g.normal();
    }
  }
  std::size_t layers() const { return dims_.size() - 1; }
  // Rows of layer l's weight gradient per piece handed to ready (backward).
  int block_rows(std::size_t l, std::size_t chunk_elems) const {
    const int m = dims_[l], n = dims_[l + 1];
    return chunk_elems == 0 ? m : static_cast<int>(std::clamp<std::size_t>(chunk_elems / n, 1, m));
  }
  // The ready(first, count) calls of backward, in its order, with no arithmetic.
  template <class Ready> void backward_pieces(Ready&& ready, std::size_t chunk_elems) const {
    for (std::size_t l = layers(); l-- > 0;) {
      const std::size_t n = dims_[l + 1], block = block_rows(l, chunk_elems) * n;
      const std::size_t end = offset_[l] + dims_[l] * n; // the weights' end; the bias follows
      std::size_t a = offset_[l];
      for (; a + block < end; a += block) ready(a, block);
      ready(a, offset_[l + 1] - a);
    }
  }
  std::size_t parameters() const { return params_.size(); }
  std::span<float> params() { return params_; }
  std::span<float> grads() { return grads_; }
  std::span<float> layer_grad(std::size_t l) { return span_of(grads_, l); }

  // Forward pass over `rows` samples; returns the mean cross-entropy loss
  // and, if `correct` is set, counts the right predictions.
  double forward(const float* x, const int* y, int rows, long* correct = nullptr) {
    resize(rows);
    std::copy(x, x + static_cast<std::size_t>(rows) * n_in, act_[0].begin());
    for (std::size_t l = 0; l < layers(); ++l) {
      const int m = dims_[l], n = dims_[l + 1];
      float* out = act_[l + 1].data();
      linear(act_[l].data(), weight(l).data(), bias(l).data(), out, rows, m, n);
      if (l + 1 < layers())
        for (std::size_t i = 0; i < static_cast<std::size_t>(rows) * n; ++i) out[i] = std::max(out[i], 0.0f);
    }
    // Softmax cross-entropy; delta_ keeps d(loss)/d(logits) for backward.
    const int k = dims_.back();
    double loss = 0;
    for (int i = 0; i < rows; ++i) {
      const float* z = &act_.back()[static_cast<std::size_t>(i) * k];
      float* d = &delta_.back()[static_cast<std::size_t>(i) * k];
      const float top = *std::max_element(z, z + k);
      double sum = 0;
      for (int j = 0; j < k; ++j) sum += std::exp(static_cast<double>(z[j] - top));
      for (int j = 0; j < k; ++j)
        d[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - top)) / sum) / static_cast<float>(rows);
      d[y[i]] -= 1.0f / static_cast<float>(rows);
      loss += std::log(sum) - static_cast<double>(z[y[i]] - top);
      if (correct) *correct += std::max_element(z, z + k) - z == y[i];
    }
    return loss / rows;
  }

  // Backward pass of the last forward, last layer first; `ready(l)` is
  // called as soon as layer l's gradient is final. `repeat` > 1 redoes each
  // layer's arithmetic (same result) to emulate a heavier model.
  // ready(first, count) hands over grads()[first, first + count) as soon as
  // it is final: layers last to first, and a layer's weight gradient in
  // blocks of rows of about chunk_elems (0: whole layers), so a large
  // layer's communication starts before its whole gradient exists. The
  // blocks change no arithmetic: every dW element sums over the batch rows in
  // the same order.
  template <class Ready> void backward(Ready&& ready, int repeat = 1, std::size_t chunk_elems = 0) {
    const int rows = rows_;
    for (std::size_t l = layers(); l-- > 0;) {
      const int m = dims_[l], n = dims_[l + 1];
      const float* in = act_[l].data();
      const float* d = delta_[l + 1].data();
      const int block = block_rows(l, chunk_elems);
      for (int rep = 0; rep < repeat; ++rep) {
        const bool last = rep == repeat - 1;
        // dW = in^T d, db = column sums of d.
        float* dw = layer_grad(l).data();
        float* db = dw + static_cast<std::size_t>(m) * n;
        std::fill(dw, dw + static_cast<std::size_t>(m + 1) * n, 0.0f);
        int a0 = 0;
        for (;;) {
          const int a1 = std::min(m, a0 + block);
          for (int i = 0; i < rows; ++i) {
            const float* di = d + static_cast<std::size_t>(i) * n;
            for (int a = a0; a < a1; ++a) {
              const float v = in[static_cast<std::size_t>(i) * m + a];
              if (v == 0) continue; // ReLU zeros: skip the row
              float* dwa = dw + static_cast<std::size_t>(a) * n;
              for (int j = 0; j < n; ++j) dwa[j] += v * di[j];
            }
          }
          if (a1 == m) break;
          if (last) ready(offset_[l] + static_cast<std::size_t>(a0) * n, static_cast<std::size_t>(a1 - a0) * n);
          a0 = a1;
        }
        for (int i = 0; i < rows; ++i) {
          const float* di = d + static_cast<std::size_t>(i) * n;
          for (int j = 0; j < n; ++j) db[j] += di[j];
        }
      }
      // The last block of rows goes with the bias, which follows it.
      const std::size_t tail = offset_[l] + static_cast<std::size_t>((m - 1) / block * block) * n;
      ready(tail, offset_[l + 1] - tail);
      if (l == 0) break;
      // d(loss)/d(input) through W and the previous layer's ReLU.
      for (int rep = 0; rep < repeat; ++rep) {
        const float* w = weight(l).data();
        float* dp = delta_[l].data();
        for (int i = 0; i < rows; ++i) {
          const float* di = d + static_cast<std::size_t>(i) * n;
          for (int a = 0; a < m; ++a) {
            const std::size_t ia = static_cast<std::size_t>(i) * m + a;
            dp[ia] = in[ia] > 0 ? dot(di, w + static_cast<std::size_t>(a) * n, n) : 0.0f;
          }
        }
      }
    }
  }

  // SGD with momentum on the (averaged) gradients.
  void step(float lr, float momentum) { step_range(0, params_.size(), lr, momentum); }
  // SGD with momentum on parameters [first, first + count) alone (the same
  // arithmetic per element as step(), so updating piece by piece gives the
  // same weights).
  void step_range(std::size_t first, std::size_t count, float lr, float momentum) {
    for (std::size_t i = first; i < first + count; ++i) {
      velocity_[i] = momentum * velocity_[i] + grads_[i];
      params_[i] -= lr * velocity_[i];
    }
  }

private:
  std::span<float> span_of(std::vector<float>& v, std::size_t l) {
    return std::span(v).subspan(offset_[l], offset_[l + 1] - offset_[l]);
  }
  std::span<float> weight(std::size_t l) {
    return span_of(params_, l).first(static_cast<std::size_t>(dims_[l]) * dims_[l + 1]);
  }
  std::span<float> bias(std::size_t l) { return span_of(params_, l).last(static_cast<std::size_t>(dims_[l + 1])); }
  void resize(int rows) {
    rows_ = rows;
    act_.resize(dims_.size());
    delta_.resize(dims_.size());
    for (std::size_t l = 0; l < dims_.size(); ++l) {
      act_[l].resize(static_cast<std::size_t>(rows) * dims_[l]);
      delta_[l].resize(static_cast<std::size_t>(rows) * dims_[l]);
    }
  }
  // out[rows][n] = in[rows][m] W[m][n] + b: the inner loop runs along a row of W (vectorizes).
  static void linear(const float* in, const float* w, const float* b, float* out, int rows, int m, int n) {
    for (int i = 0; i < rows; ++i) {
      float* o = out + static_cast<std::size_t>(i) * n;
      std::copy(b, b + n, o);
      for (int a = 0; a < m; ++a) {
        const float v = in[static_cast<std::size_t>(i) * m + a];
        if (v == 0) continue;
        const float* wa = w + static_cast<std::size_t>(a) * n;
        for (int j = 0; j < n; ++j) o[j] += v * wa[j];
      }
    }
  }
  // Eight partial sums: the compiler may not reorder a float sum itself.
  static float dot(const float* a, const float* b, int n) {
    float s[8] = {};
    int j = 0;
    for (; j + 8 <= n; j += 8)
      for (int u = 0; u < 8; ++u) s[u] += a[j + u] * b[j + u];
    float t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; j < n; ++j) t += a[j] * b[j];
    return t;
  }

  std::vector<int> dims_;
  std::vector<std::size_t> offset_;
  std::vector<float> params_, grads_, velocity_;
  std::vector<std::vector<float>> act_, delta_;
  int rows_ = 0;
};

std::vector<int> layer_sizes(const config& cfg) {
  std::vector<int> dims{n_in};
  dims.insert(dims.end(), static_cast<std::size_t>(cfg.depth), cfg.hidden);
  dims.push_back(n_classes);
  return dims;
}

// Cosine decay to 0: compressed runs settle where the uncompressed one does
// instead of hovering at a noise level that depends on the codec.
float learning_rate(const config& cfg, int step) {
  return cfg.lr * 0.5f * (1 + std::cos(3.14159265f * static_cast<float>(step) / static_cast<float>(cfg.steps)));
}

// ---------------------------------------------------------------------------
// Gradient synchronization as the training loop sees it: ready(l) when layer
// l's gradient is final (called last layer first), wait() before the
// optimizer reads the gradients, which are then the average over ranks.

class grad_sync {
public:
  virtual ~grad_sync() = default;
  // grads()[first, first + count) is final (backward's ready).
  virtual void ready(std::size_t first, std::size_t count) = 0;
  // Waits for every piece's average and calls update(first, count) for each
  // piece once its average is in place (the optimizer step of that piece).
  virtual void wait(const std::function<void(std::size_t, std::size_t)>& update) = 0;
  // Collective calls so far and how many of them compressed (automatic mode
  // may choose the dense allreduce).
  virtual std::pair<std::uint64_t, std::uint64_t> calls() const = 0;
};

// The codec settings of a run; nullopt for uncompressed.
std::optional<gradsync::compression> compression_of(const config& cfg) {
  if (cfg.codec == "none") return std::nullopt;
  gradsync::compression z{.codec = gradsync::compress::parse_spec(cfg.codec)};
  z.error_feedback = cfg.ef;
  z.mode = cfg.mode == "automatic" ? gradsync::compress_mode::automatic : gradsync::compress_mode::always;
  return z;
}

// Elements per piece of a layer's gradient that backward hands over early.
std::size_t chunk_elems(const config& cfg) {
  return cfg.overlap ? static_cast<std::size_t>(cfg.chunk_kb) * 1024 / sizeof(float) : 0;
}

// One tensor's average over ranks, compressed or not.
template <class C>
void average(C& comm, std::span<float> g, const std::optional<gradsync::compression>& z,
             gradsync::compress_state<float>& st) {
  if (z) gradsync::compressed_allreduce(comm, g, *z, st, gradsync::op::avg{});
  else gradsync::allreduce(comm, g, gradsync::op::avg{});
}

// Synchronous: one call over all gradients once the backward pass is done.
template <class C> class fused_sync final : public grad_sync {
public:
  fused_sync(C& comm, mlp& model, std::optional<gradsync::compression> z)
      : comm_(comm), model_(model), z_(std::move(z)) {}
  void ready(std::size_t, std::size_t) override {}
  void wait(const std::function<void(std::size_t, std::size_t)>& update) override {
    average(comm_, model_.grads(), z_, state_);
    ++calls_;
    compressed_ += z_ && state_.last.path != gradsync::compressed_path::dense;
    update(0, model_.grads().size());
  }
  std::pair<std::uint64_t, std::uint64_t> calls() const override { return {calls_, compressed_}; }

private:
  C& comm_;
  mlp& model_;
  std::optional<gradsync::compression> z_;
  gradsync::compress_state<float> state_; // error feedback residual, kept across steps
  std::uint64_t calls_ = 0, compressed_ = 0;
};

// Overlapped: each layer's gradient goes to the fusion engine as soon as it
// exists, and the engine's progress thread reduces it while the backward pass
// goes on with the layers below. The engine owns the communicator meanwhile.
template <class C> class engine_sync final : public grad_sync {
public:
  engine_sync(C& comm, mlp& model, std::optional<gradsync::compression> z, const config& cfg)
      : model_(model), engine_(comm, options_for(cfg)) {
    t_.compress = std::move(z);
  }
  void ready(std::size_t first, std::size_t count) override {
    gradsync::fusion::tensor_options t = t_;
    t.id = first; // a stable id (the pieces are the same every step): the engine keeps each tensor's
                  // error-feedback residual by id
    pending_.push_back({engine_.submit(model_.grads().subspan(first, count), t), first, count});
  }
  // In submission order: each piece's update runs while the pieces submitted
  // after it are still on the wire, so only the last piece's update (the
  // first layer's) is left after the communication.
  void wait(const std::function<void(std::size_t, std::size_t)>& update) override {
    engine_.flush(); // runs the open buckets now instead of after the engine's cycle time
    for (const auto& p : pending_) {
      p.h.wait();
      update(p.first, p.count);
    }
    pending_.clear();
  }
  std::pair<std::uint64_t, std::uint64_t> calls() const override {
    const auto s = engine_.stats();
    return {s.buckets, s.compressed_buckets};
  }

private:
  static gradsync::fusion::engine_options options_for(const config& cfg) {
    // Capacity 1 byte: every layer is larger, so each is its own bucket and
    // starts as soon as it is submitted (the default 25 MiB would fuse the
    // whole model into one bucket that waits for the last layer).
    const std::size_t cap = cfg.bucket_kb > 0 ? std::size_t(cfg.bucket_kb) << 10 : 1;
    return {.bucket_bytes = cap, .first_bucket_bytes = cap};
  }
  mlp& model_;
  gradsync::fusion::engine<C> engine_;
  gradsync::fusion::tensor_options t_;
  struct piece {
    gradsync::fusion::handle h;
    std::size_t first, count;
  };
  std::vector<piece> pending_; // this step's pieces in the order ready() saw them
};

template <class C> std::unique_ptr<grad_sync> make_sync(C& comm, mlp& model, const config& cfg) {
  if (cfg.overlap) return std::make_unique<engine_sync<C>>(comm, model, compression_of(cfg), cfg);
  return std::make_unique<fused_sync<C>>(comm, model, compression_of(cfg));
}

// ---------------------------------------------------------------------------
// Training.

struct result {
  std::vector<double> loss; // per step, mean over the global batch
  double final_loss = 0;    // mean of the last 10 steps
  double accuracy = 0;      // on the held-out set
  double step_s = 0, compute_s = 0, comm_s = 0; // slowest rank's mean per step
  std::uint64_t calls = 0, compressed = 0;        // the training's collective calls
  bool identical = false;
};

template <class T, class C> T reduce_one(C& comm, T v, auto op) {
  gradsync::allreduce(comm, std::span<T>(&v, 1), op);
  return v;
}

// FNV-1a over the weights' bytes: equal on all ranks iff (practically) the weights are.
std::int64_t weight_hash(std::span<const float> w) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::byte b : std::as_bytes(w)) h = (h ^ static_cast<std::uint64_t>(b)) * 0x100000001b3ull;
  return static_cast<std::int64_t>(h);
}

template <class C> result train(C& comm, const config& cfg) {
  const int p = comm.size(), r = comm.rank();
  const int local = cfg.batch / p;
  const task t(cfg.seed);
  // Global batch s is samples [s*batch, (s+1)*batch) of the epoch; rank r owns
  // the r-th slice of every batch, so its shard holds only those samples.
  // By default every step sees fresh samples (up to 2^18, then the set repeats),
  // so the loss curve measures learning, not memorization.
  const std::size_t samples = cfg.train_samples > 0 ? static_cast<std::size_t>(cfg.train_samples)
                                                    : std::min(static_cast<std::size_t>(cfg.steps) * cfg.batch,
                                                               std::size_t{1} << 18);
  const std::size_t batches = std::max<std::size_t>(1, samples / cfg.batch);
  const dataset shard = make_dataset(t, cfg.seed, 1, batches * cfg.batch, [&](std::size_t i) {
    return static_cast<int>(i % cfg.batch) / local == r;
  });
  const dataset eval = make_dataset(t, cfg.seed, 2, static_cast<std::size_t>(cfg.eval_samples),
                                    [&](std::size_t i) { return static_cast<int>(i % p) == r; });
  mlp model(layer_sizes(cfg), cfg.seed);
  result res;
  std::vector<double> step_time;

  gradsync::barrier(comm);
  {
    const auto sync = make_sync(comm, model, cfg);
    for (int s = 0; s < cfg.steps; ++s) {
      const auto t0 = clock_type::now();
      const std::size_t first = (static_cast<std::size_t>(s) % batches) * local;
      res.loss.push_back(model.forward(shard.row(first), &shard.y[first], local));
      model.backward([&](std::size_t first, std::size_t count) { sync->ready(first, count); },
                     cfg.compute_repeat, chunk_elems(cfg));
      const float lr = learning_rate(cfg, s);
      sync->wait([&](std::size_t first, std::size_t count) { model.step_range(first, count, lr, cfg.momentum); });
      step_time.push_back(seconds_since(t0));
    }
    std::tie(res.calls, res.compressed) = sync->calls();
  }
  // Losses of every step averaged over ranks in one call after training, so
  // the timed steps carry no extra synchronization.
  gradsync::allreduce(comm, std::span(res.loss), gradsync::op::avg{});
  const std::size_t tail = std::min<std::size_t>(10, res.loss.size());
  for (std::size_t i = res.loss.size() - tail; i < res.loss.size(); ++i) res.final_loss += res.loss[i] / tail;

  long correct = 0;
  if (eval.size()) model.forward(eval.x.data(), eval.y.data(), static_cast<int>(eval.size()), &correct);
  res.accuracy = static_cast<double>(reduce_one<std::int64_t>(comm, correct, gradsync::op::sum{})) / cfg.eval_samples;

  const std::int64_t h = weight_hash(model.params());
  res.identical = reduce_one(comm, h, gradsync::op::min{}) == reduce_one(comm, h, gradsync::op::max{});

  // Time split. The steps' mean skips the first tenth (warm-up: allocation,
  // codec calibration). Compute alone: a step with no sync (its update at
  // learning rate 0 leaves the weights as they are). Sync alone: the same
  // synchronizer over the last step's gradients, back to back.
  const std::size_t skip = step_time.size() / 10;
  for (std::size_t i = skip; i < step_time.size(); ++i) res.step_s += step_time[i] / (step_time.size() - skip);
  const int iters = std::max(1, cfg.timing_iters);
  const std::size_t first = 0; // any batch: the cost does not depend on the values
  const std::vector<float> grads(model.grads().begin(), model.grads().end());
  gradsync::barrier(comm);
  auto t0 = clock_type::now();
  for (int i = 0; i < iters; ++i) {
    model.forward(shard.row(first), &shard.y[first], local);
    model.backward([](std::size_t, std::size_t) {}, cfg.compute_repeat, chunk_elems(cfg));
    model.step(0.0f, cfg.momentum);
  }
  res.compute_s = seconds_since(t0) / iters;
  gradsync::barrier(comm);
  {
    const auto sync = make_sync(comm, model, cfg);
    const auto once = [&] {
      std::copy(grads.begin(), grads.end(), model.grads().begin());
      model.backward_pieces([&](std::size_t first, std::size_t count) { sync->ready(first, count); },
                            chunk_elems(cfg));
      sync->wait([](std::size_t, std::size_t) {});
    };
    once(); // warm-up (automatic mode measures the codec here)
    t0 = clock_type::now();
    for (int i = 0; i < iters; ++i) once();
    res.comm_s = seconds_since(t0) / iters;
  }
  double times[3] = {res.step_s, res.compute_s, res.comm_s};
  gradsync::allreduce(comm, std::span<double>(times, 3), gradsync::op::max{});
  res.step_s = times[0];
  res.compute_s = times[1];
  res.comm_s = times[2];
  return res;
}

void print_text(const config& cfg, int p, const result& r, std::size_t params) {
  std::printf("# data_parallel: %d ranks, %zu parameters, batch %d, codec %s, ef %s, mode %s, sync %s\n", p,
              params, cfg.batch, cfg.codec.c_str(), cfg.ef ? "on" : "off", cfg.mode.c_str(),
              cfg.overlap ? "overlapped (fusion engine, per layer)" : "one fused call after backward");
  for (std::size_t s = 0; s < r.loss.size(); ++s) std::printf("step %4zu  loss %.5f\n", s, r.loss[s]);
  std::printf("final loss (mean of last 10 steps): %.5f\n", r.final_loss);
  std::printf("eval accuracy: %.4f\n", r.accuracy);
  // The engine counts the buckets given a codec, not whether automatic mode then chose dense.
  std::printf("gradient syncs: %llu collective calls, %llu compressed%s\n", static_cast<unsigned long long>(r.calls),
              static_cast<unsigned long long>(r.compressed),
              cfg.overlap && cfg.mode == "automatic" ? " (or left dense by automatic mode)" : "");
  const double worst = std::max(r.compute_s, r.comm_s);
  std::printf("time per step: %.3f ms (compute alone %.3f ms, sync alone %.3f ms, step / max = %.2f)\n",
              r.step_s * 1e3, r.compute_s * 1e3, r.comm_s * 1e3, worst > 0 ? r.step_s / worst : 0.0);
  std::printf("weights identical on all ranks: %s\n", r.identical ? "yes" : "NO");
}

void print_json_result(const result& r) {
  std::printf("{\"final_loss\": %.6f, \"eval_accuracy\": %.6f, \"step_ms\": %.4f, \"compute_ms\": %.4f, "
              "\"comm_ms\": %.4f, \"calls\": %llu, \"compressed_calls\": %llu, \"weights_identical\": %s, "
              "\"loss\": [",
              r.final_loss, r.accuracy, r.step_s * 1e3, r.compute_s * 1e3, r.comm_s * 1e3,
              static_cast<unsigned long long>(r.calls), static_cast<unsigned long long>(r.compressed),
              r.identical ? "true" : "false");
  for (std::size_t s = 0; s < r.loss.size(); ++s) std::printf("%s%.6f", s ? ", " : "", r.loss[s]);
  std::printf("]}");
}

// Trains (and the baseline, if asked) on `comm`; rank 0 prints. Returns the
// exit status (the same on every rank: every input of it is agreed).
template <class C> int run_rank(C& comm, const config& cfg) {
  const int p = comm.size();
  if (cfg.batch % p != 0)
    throw gradsync::error("data_parallel", comm.rank(), -1,
                          "--batch " + std::to_string(cfg.batch) + " is not a multiple of " + std::to_string(p) +
                              " ranks");
  const bool print = comm.rank() == 0;
  std::optional<result> base;
  if (cfg.check_baseline) {
    config b = cfg;
    b.codec = "none";
    base = train(comm, b);
  }
  const result res = train(comm, cfg);
  const std::size_t params = mlp(layer_sizes(cfg), 0).parameters();

  bool ok = res.identical && (!base || base->identical);
  // Training must have learnt something for the comparison to mean anything.
  const bool learnt = res.final_loss < 0.5 * res.loss.front();
  ok = ok && learnt;
  double rel = 0;
  if (base) {
    rel = std::abs(res.final_loss - base->final_loss) / base->final_loss;
    ok = ok && rel <= cfg.tolerance;
  }
  if (!print) return ok ? 0 : 1;
  if (cfg.json) {
    std::printf("{\"ranks\": %d, \"parameters\": %zu, \"codec\": \"%s\", \"ef\": %s, \"mode\": \"%s\", "
                "\"overlap\": %s, \"compute_repeat\": %d, \"result\": ",
                p, params, cfg.codec.c_str(), cfg.ef ? "true" : "false", cfg.mode.c_str(),
                cfg.overlap ? "true" : "false", cfg.compute_repeat);
    print_json_result(res);
    if (base) {
      std::printf(", \"baseline\": ");
      print_json_result(*base);
      std::printf(", \"relative_difference\": %.6f", rel);
    }
    std::printf(", \"ok\": %s}\n", ok ? "true" : "false");
    return ok ? 0 : 1;
  }
  print_text(cfg, p, res, params);
  if (!learnt)
    std::printf("FAIL: final loss %.5f is not below half the first step's %.5f\n", res.final_loss, res.loss.front());
  if (base) {
    std::printf("baseline (uncompressed, same seed): final loss %.5f, eval accuracy %.4f, weights identical: %s\n",
                base->final_loss, base->accuracy, base->identical ? "yes" : "NO");
    std::printf("final loss vs baseline: %+.2f%% (tolerance %.2f%%): %s\n",
                100 * (res.final_loss - base->final_loss) / base->final_loss, 100 * cfg.tolerance,
                rel <= cfg.tolerance ? "ok" : "FAIL");
  }
  return ok ? 0 : 1;
}

} // namespace

int main(int argc, char** argv) {
  config cfg;
  CLI::App app{"Data-parallel MLP training over gradsync (see the comment at the top of data_parallel.cpp)."};
  const auto on_off = CLI::IsMember({"on", "off"});
  std::string ef = "on", overlap = "on";
  app.add_option("--transport", cfg.transport, "inproc (ranks as threads), mpi (under mpiexec), auto")
      ->check(CLI::IsMember({"auto", "inproc", "mpi"}))
      ->capture_default_str();
  app.add_option("--ranks", cfg.ranks, "inproc ranks")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_option("--steps", cfg.steps, "training steps")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  app.add_option("--batch", cfg.batch, "global batch (a multiple of the ranks)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--hidden", cfg.hidden, "hidden layer width")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--depth", cfg.depth, "hidden layers")->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--lr", cfg.lr, "peak learning rate (cosine decay to 0 over the steps)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--momentum", cfg.momentum, "SGD momentum")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  app.add_option("--seed", cfg.seed, "seed of the data and the initial weights")->capture_default_str();
  app.add_option("--codec", cfg.codec, std::string("none, or a codec spec: ") + gradsync::compress::spec_help)
      ->capture_default_str();
  app.add_option("--ef", ef, "error feedback")->check(on_off)->capture_default_str();
  app.add_option("--mode", cfg.mode, "always compress, or only where the cost model predicts a gain")
      ->check(CLI::IsMember({"always", "automatic"}))
      ->capture_default_str();
  app.add_option("--overlap", overlap, "sync each layer during the backward pass (on) or all after it (off)")
      ->check(on_off)
      ->capture_default_str();
  app.add_option("--bucket-kb", cfg.bucket_kb, "fusion engine bucket capacity in KiB (0: one bucket per layer)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--chunk-kb", cfg.chunk_kb,
                 "with --overlap on, hand a layer's gradient over in pieces of about this many KiB as backward "
                 "finishes them (0: whole layers)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--compute-repeat", cfg.compute_repeat, "redo the backward arithmetic K times (a heavier model)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--train-samples", cfg.train_samples,
                 "training set size, cycled through (0: steps * batch, at most 2^18)")
      ->check(CLI::Range(0, 1 << 30))
      ->capture_default_str();
  app.add_option("--eval-samples", cfg.eval_samples, "held-out set size")
      ->check(CLI::Range(1, 1 << 26))
      ->capture_default_str();
  app.add_option("--timing-iters", cfg.timing_iters, "iterations of the compute-alone and sync-alone timings")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_flag("--json", cfg.json, "print one JSON object instead of text");
  app.add_flag("--check-against-baseline", cfg.check_baseline,
               "also train uncompressed from the same seed; fail unless final losses agree within --tolerance");
  app.add_option("--tolerance", cfg.tolerance, "relative final-loss tolerance of --check-against-baseline")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  cfg.ef = ef == "on";
  cfg.overlap = overlap == "on";

  try {
    if (const auto z = compression_of(cfg)) { // a bad spec fails here, before any rank starts
      z->codec.family();
      gradsync::compress::with_codec<float>(z->codec, std::size_t{1} << 16, [](const auto&, auto) {});
    }
#if GRADSYNC_EXAMPLE_MPI
    if (cfg.transport == "mpi" || (cfg.transport == "auto" && gradsync::mpi::launched_by_mpiexec())) {
      gradsync::mpi::session s(argc, argv);
      auto comm = s.world();
      return run_rank(comm, cfg);
    }
#else
    if (cfg.transport == "mpi") {
      std::fprintf(stderr, "data_parallel: built without MPI (--transport mpi unavailable)\n");
      return 2;
    }
#endif
    int status = 0;
    gradsync::inproc::run(cfg.ranks, [&](gradsync::inproc::communicator& comm) {
      const int rc = run_rank(comm, cfg);
      if (comm.rank() == 0) status = rc;
    });
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_parallel: %s\n", e.what());
    return 1;
  }
}
