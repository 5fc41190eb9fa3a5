// gradsync-bench: what every subcommand shares: byte-size arguments, the size
// sweep and its iteration plan, aligned buffers, the memcpy bandwidth limit,
// and the report (nccl-tests style table on stdout, JSON lines to a file).
#pragma once

#include <cstddef>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include <gradsync/algo/select.hpp>
#include <gradsync/core/dtype.hpp>

namespace gradsync::bench {

/// Parses a byte count: digits with an optional binary suffix K, M or G
/// (optionally followed by "iB" or "B"): "8", "256K", "64M", "1GiB".
/// Throws std::invalid_argument naming `what` on anything else or overflow.
std::size_t parse_bytes(std::string_view s, std::string_view what);

/// "64 MiB", "8 B", "1.5 KiB": a byte count for humans.
std::string human_bytes(std::size_t b);

/// The entries of a comma-separated list ("a,b,c"), empty entries kept
/// (callers reject them with their own option's name).
std::vector<std::string> split_commas(std::string_view list);

/// Sizes of a sweep: min, min*factor, ... up to max (max itself is included
/// even when the factor steps over it).
std::vector<std::size_t> size_sweep(std::size_t min, std::size_t max, std::size_t factor);

/// The sweep options every subcommand takes (-b -e -f -n -w --json).
struct sweep_options {
  std::string min = "8", max = "64M";
  std::size_t factor = 2;
  int iters = 0;  ///< 0: auto (plan_iterations)
  int warmup = -1; ///< -1: auto
  std::string json;

  /// Registers the options on `app`.
  void add_to(CLI::App& app);
  /// The parsed size list (validated; throws std::invalid_argument).
  std::vector<std::size_t> sizes() const;
};

/// Timed and warm-up iterations for one size.
struct iteration_plan {
  int iters, warmup;
};

/// Data volume one size may move in its timed loop when the iteration count
/// is automatic: large sizes run fewer iterations so a full sweep stays short.
inline constexpr std::size_t iteration_budget_bytes = std::size_t{1} << 30;
/// Iterations of small sizes when the count is automatic (latency needs many).
inline constexpr int default_max_iters = 200;
/// Fewest timed iterations an automatic plan runs, however large the size.
inline constexpr int min_auto_iters = 5;

/// Plan for a message of `bytes`: `iters` > 0 is taken as given; 0 means
/// iteration_budget_bytes / bytes, clamped to [min_auto_iters,
/// default_max_iters]. `warmup` >= 0 is taken as given; -1 means a fifth of
/// the iterations, at least 1.
iteration_plan plan_iterations(std::size_t bytes, int iters, int warmup);

/// Seconds on the clock the bench reports: the simulated one in a SimGrid
/// SMPI build (GRADSYNC_BENCH_SIM: MPI_Wtime; SMPI does not redirect
/// std::chrono), else the steady clock.
double now();

/// In a simulator build, whether payload buffers are SMPI shared memory
/// (set_sim_shared_payload(true) when results are not checked): every rank's
/// buffers then map the same few physical pages, so 1024 ranks x 64 MiB fit
/// in memory and SMPI skips copying their bytes. No effect elsewhere.
void set_sim_shared_payload(bool on);

/// Heap memory aligned to a cache line (and so to every element type).
class buffer {
public:
  buffer() = default;
  explicit buffer(std::size_t bytes);
  std::byte* data() const noexcept { return p_.get(); }
  std::size_t size() const noexcept { return n_; }
  template <class T> T* as() const noexcept { return reinterpret_cast<T*>(p_.get()); }

private:
  struct del {
    bool shared; ///< SMPI shared memory (set_sim_shared_payload)
    del() noexcept : shared(false) {} // not a member initializer: the enclosing class is incomplete here
    explicit del(bool s) noexcept : shared(s) {}
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte[], del> p_;
  std::size_t n_ = 0;
};

/// Single-thread memcpy bandwidth: the best of `reps` copies of `bytes`
/// between two pre-faulted buffers (the ceiling of an in-process transport,
/// which moves every byte with one memcpy).
struct memcpy_limit {
  std::size_t bytes = 0;
  double seconds = 0; ///< best time of one copy
  double gbs() const { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};
memcpy_limit measure_memcpy(std::size_t bytes = std::size_t{64} << 20, int reps = 5);

/// One result line.
struct row {
  std::string collective, transport;
  int ranks = 0;
  std::string algo, dtype, op;
  std::size_t bytes = 0, count = 0;
  double time_us = 0, algbw_gbs = 0, busbw_gbs = 0;
  long long wrong = -1; ///< -1: not checked
  std::optional<double> model_us; ///< the calibrated model's prediction for what ran (none: native, no formula)
  std::string picked;             ///< the schedule that ran (empty: native, limit)
  /// Extra JSON fields of special rows (compressed allreduce: codec, wire bytes, decision).
  std::vector<std::pair<std::string, std::string>> text_fields;
  std::vector<std::pair<std::string, double>> number_fields;
};

/// Named model parameters (the calibration), in the order they are given.
using model_params = std::vector<std::pair<std::string, double>>;

/// A cost model's parameters as the reports print them: both links, their
/// per-size extras (local_extra_1K ... global_extra_512K), their in-flight
/// shares, the NIC share and the arena's costs.
inline model_params params_of(const cost_model& m) {
  model_params v{{"local_alpha", m.local.alpha},     {"local_beta", m.local.beta},       {"local_gamma", m.local.gamma},
                 {"global_alpha", m.global.alpha},   {"global_beta", m.global.beta},     {"global_gamma", m.global.gamma},
                 {"local_latency", m.local.latency}, {"global_latency", m.global.latency}};
  for (const auto& [name, l] : {std::pair<const char*, const link_cost*>{"local", &m.local}, {"global", &m.global}})
    for (std::size_t i = 0; i < policy::calibrate_mid_points; ++i)
      v.emplace_back(std::string(name) + "_extra_" + std::to_string(policy::calibrate_mid_bytes[i] >> 10) + "K",
                     l->extra[i]);
  v.insert(v.end(), {{"local_inflight_share", m.local.inflight_share},
                     {"global_inflight_share", m.global.inflight_share},
                     {"nic_share", m.nic_share}, {"arena_copy", m.arena.copy}, {"arena_sync", m.arena.sync}});
  return v;
}

/// Rank 0's output: the table on stdout and, with a path, one JSON object per
/// row in that file (truncated when opened). Other ranks construct it with
/// `active` false and it does nothing.
class report {
public:
  report(bool active, const std::string& json_path);
  ~report();
  report(const report&) = delete;
  report& operator=(const report&) = delete;

  bool active() const noexcept { return active_; }
  /// A comment line ("# " + text).
  void note(const std::string& text);
  /// The calibrated model: printed as a note, and an object "calibration"
  /// in every JSON line from now on.
  void calibration(const model_params& params);
  /// A property of the whole run: printed as a note ("label: value"), and
  /// `key: value` in every JSON line from now on.
  void attribute(const std::string& label, const std::string& key, const std::string& value);
  /// The column header.
  void header();
  /// A table row (and its JSON line).
  void add(const row& r);
  /// The memcpy limit as a table row (algo "limit", JSON too), then, per
  /// algorithm, its busbw at the largest size as a fraction of the limit and
  /// its average busbw over all sizes.
  void finish(const memcpy_limit& lim, const row& like);
  /// A memcpy of one size as a row (algo "memcpy", busbw its GB/s), for
  /// bench/cliff_check.py; finish() leaves these rows out of its summary.
  void add_memcpy(const memcpy_limit& lim, const row& like);

private:
  bool active_;
  std::FILE* json_ = nullptr;
  std::vector<row> rows_;
  model_params calibration_;
  std::vector<std::pair<std::string, std::string>> attributes_;
};

/// Closes a checked sweep: finish() for the rows of `collective` on
/// `transport` with `ranks`, then, with `check`, whether every element was right.
inline void finish_checked(report& rep, const memcpy_limit& lim, const std::string& collective,
                           const std::string& transport, int ranks, bool check, long long wrong) {
  row like;
  like.collective = collective;
  like.transport = transport;
  like.ranks = ranks;
  rep.finish(lim, like);
  if (check) rep.note(wrong == 0 ? "all results correct" : "FAILED: " + std::to_string(wrong) + " wrong elements");
}

/// -d's dtype among `offered`, or an error naming it.
inline dtype parse_dtype(std::string_view s, std::initializer_list<dtype> offered) {
  for (auto d : offered)
    if (dtype_name(d) == s) return d;
  throw std::invalid_argument("-d: unknown dtype '" + std::string(s) + "'");
}

} // namespace gradsync::bench
