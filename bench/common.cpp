#include "common.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <new>
#include <stdexcept>

#include <nlohmann/json.hpp>

#if defined(GRADSYNC_BENCH_SIM)
#include <mpi.h>
#endif

namespace gradsync::bench {

std::size_t parse_bytes(std::string_view s, std::string_view what) {
  auto bad = [&](const char* why) {
    return std::invalid_argument(std::string(what) + ": '" + std::string(s) + "' " + why +
                                 " (expected e.g. 8, 256K, 64M, 1G)");
  };
  std::size_t i = 0, v = 0;
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0]))) throw bad("is not a byte count");
  for (; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
    const auto d = static_cast<std::size_t>(s[i] - '0');
    if (v > (std::numeric_limits<std::size_t>::max() - d) / 10) throw bad("overflows");
    v = v * 10 + d;
  }
  std::string_view rest = s.substr(i);
  unsigned shift = 0;
  if (!rest.empty()) {
    switch (std::toupper(static_cast<unsigned char>(rest[0]))) {
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'B': break;
    default: throw bad("has an unknown suffix");
    }
    if (shift) rest.remove_prefix(1);
    if (rest == "iB" || rest == "B" || rest == "ib" || rest == "b") rest = {};
    if (!rest.empty()) throw bad("has an unknown suffix");
  }
  if (shift && v > (std::numeric_limits<std::size_t>::max() >> shift)) throw bad("overflows");
  return v << shift;
}

std::string human_bytes(std::size_t b) {
  static constexpr const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char out[32];
  if (v == static_cast<double>(static_cast<std::size_t>(v)))
    std::snprintf(out, sizeof out, "%zu %s", static_cast<std::size_t>(v), unit[u]);
  else
    std::snprintf(out, sizeof out, "%.1f %s", v, unit[u]);
  return out;
}

std::vector<std::string> split_commas(std::string_view list) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= list.size();) {
    const std::size_t comma = std::min(list.find(',', at), list.size());
    out.emplace_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

std::vector<std::size_t> size_sweep(std::size_t min, std::size_t max, std::size_t factor) {
  if (min == 0) throw std::invalid_argument("-b must be at least 1 byte");
  if (min > max)
    throw std::invalid_argument("-b " + std::to_string(min) + " is larger than -e " + std::to_string(max));
  if (min < max && factor < 2)
    throw std::invalid_argument("-f must be >= 2 when -b < -e, got " + std::to_string(factor));
  std::vector<std::size_t> out;
  for (std::size_t s = min;;) {
    out.push_back(s);
    if (s == max) break;
    s = s > max / factor ? max : s * factor; // max itself ends the sweep
  }
  return out;
}

void sweep_options::add_to(CLI::App& app) {
  app.add_option("-b,--minbytes", min, "smallest message in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-e,--maxbytes", max, "largest message in bytes (K/M/G suffixes)")->capture_default_str();
  app.add_option("-f,--stepfactor", factor, "multiply the size by this between steps")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("-n,--iters", iters,
                 "timed iterations per size; 0: auto (" + std::to_string(default_max_iters) +
                     ", fewer for large sizes so that each moves at most " +
                     human_bytes(iteration_budget_bytes) + ", at least " + std::to_string(min_auto_iters) + ")")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-w,--warmup", warmup, "warm-up iterations per size; -1: auto (iters / 5)")
      ->capture_default_str()
      ->check(CLI::Range(-1, std::numeric_limits<int>::max()));
  app.add_option("--json", json, "write one JSON object per result row to this file");
}

std::vector<std::size_t> sweep_options::sizes() const {
  return size_sweep(parse_bytes(min, "-b"), parse_bytes(max, "-e"), factor);
}

iteration_plan plan_iterations(std::size_t bytes, int iters, int warmup) {
  iteration_plan p{iters, warmup};
  if (iters <= 0) {
    const std::size_t fit = iteration_budget_bytes / std::max<std::size_t>(1, bytes);
    p.iters = static_cast<int>(std::clamp<std::size_t>(fit, min_auto_iters, default_max_iters));
  }
  if (warmup < 0) p.warmup = std::max(1, p.iters / 5);
  return p;
}

double now() {
#if defined(GRADSYNC_BENCH_SIM)
  return MPI_Wtime();
#else
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
#endif
}

namespace {
#if defined(GRADSYNC_BENCH_SIM)
// One flag per simulated rank would be the same value on every rank: the
// flag is set from the command line, which every rank parses alike.
bool sim_shared = false;
#endif
} // namespace

void set_sim_shared_payload([[maybe_unused]] bool on) {
#if defined(GRADSYNC_BENCH_SIM)
  sim_shared = on;
#endif
}

buffer::buffer(std::size_t bytes) : n_(bytes) {
  if (!bytes) return;
#if defined(GRADSYNC_BENCH_SIM)
  if (sim_shared) { // SMPI shared memory: contents are not meaningful, so neither filled nor faulted in
    p_ = std::unique_ptr<std::byte[], del>(static_cast<std::byte*>(SMPI_SHARED_MALLOC(bytes)), del{true});
    return;
  }
#endif
  p_.reset(static_cast<std::byte*>(::operator new[](bytes, std::align_val_t{64})));
  std::memset(p_.get(), 0, bytes); // fault the pages in before anything is timed
}

void buffer::del::operator()(std::byte* p) const noexcept {
#if defined(GRADSYNC_BENCH_SIM)
  if (shared) {
    SMPI_SHARED_FREE(p);
    return;
  }
#endif
  ::operator delete[](p, std::align_val_t{64});
}

memcpy_limit measure_memcpy(std::size_t bytes, int reps) {
  buffer src(bytes), dst(bytes);
  std::memset(src.data(), 0x5a, bytes);
  memcpy_limit lim{bytes, 0};
  for (int i = 0; i <= reps; ++i) { // the first copy only warms up
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    asm volatile("" : : "r"(dst.data()) : "memory"); // the copy must happen, and here
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (i > 0 && (lim.seconds == 0 || s < lim.seconds)) lim.seconds = s;
  }
  return lim;
}

namespace {
constexpr const char* row_format = "%12s %12s %6s %6s %18s %12s %12s %12s %12s %8s\n";

std::string fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// The algo column: "auto>ring" when automatic ran something else by name.
std::string algo_label(const row& r) {
  return r.picked.empty() || r.picked == r.algo ? r.algo : r.algo + ">" + r.picked;
}

void print_row(const row& r, const std::string& count, const std::string& wrong) {
  const bool ran = !std::isnan(r.time_us); // NaN: skipped (--skip-slower)
  std::printf(row_format, std::to_string(r.bytes).c_str(), count.c_str(), r.dtype.c_str(), r.op.c_str(),
              algo_label(r).c_str(), ran ? fixed(r.time_us, 2).c_str() : "skipped",
              r.model_us ? fixed(*r.model_us, 2).c_str() : "-", ran ? fixed(r.algbw_gbs, 2).c_str() : "-",
              ran ? fixed(r.busbw_gbs, 2).c_str() : "-", wrong.c_str());
}
} // namespace

report::report(bool active, const std::string& json_path) : active_(active) {
  if (!active_ || json_path.empty()) return;
  json_ = std::fopen(json_path.c_str(), "w");
  if (!json_) throw std::runtime_error("cannot open --json file '" + json_path + "': " + std::strerror(errno));
}

report::~report() {
  if (json_) std::fclose(json_);
}

void report::note(const std::string& text) {
  if (!active_) return;
  std::printf("# %s\n", text.c_str());
  std::fflush(stdout);
}

void report::calibration(const model_params& params) {
  calibration_ = params;
  std::string text = "model (calibrated; seconds, seconds per byte):";
  for (const auto& [k, v] : params) {
    char b[96];
    std::snprintf(b, sizeof b, " %s %.3g", k.c_str(), v);
    text += b;
  }
  note(text);
}

void report::attribute(const std::string& label, const std::string& key, const std::string& value) {
  attributes_.emplace_back(key, value);
  note(label + ": " + value);
}

void report::header() {
  if (!active_) return;
  std::printf("#\n");
  std::printf(row_format, "#       size", "count", "type", "redop", "algo", "time(us)", "model(us)",
              "algbw(GB/s)", "busbw(GB/s)", "#wrong");
  std::fflush(stdout);
}

void report::add(const row& r) {
  if (!active_) return;
  print_row(r, std::to_string(r.count), r.wrong < 0 ? "N/A" : std::to_string(r.wrong));
  std::fflush(stdout);
  if (std::isnan(r.time_us)) return; // a skipped row: printed only, no measurement to keep
  rows_.push_back(r);
  if (json_) {
    nlohmann::json j = {{"collective", r.collective}, {"transport", r.transport}, {"ranks", r.ranks},
                        {"algo", r.algo},             {"dtype", r.dtype},         {"op", r.op},
                        {"bytes", r.bytes},           {"count", r.count},         {"time_us", r.time_us},
                        {"algbw_gbs", r.algbw_gbs},   {"busbw_gbs", r.busbw_gbs}, {"wrong", nullptr}};
    if (r.wrong >= 0) j["wrong"] = r.wrong;
    j["model_us"] = r.model_us ? nlohmann::json(*r.model_us) : nlohmann::json(nullptr);
    j["picked"] = r.picked.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.picked);
    for (const auto& [k, v] : attributes_) j[k] = v;
    for (const auto& [k, v] : r.text_fields) j[k] = v;
    for (const auto& [k, v] : r.number_fields) j[k] = v;
    if (!calibration_.empty()) {
      nlohmann::json cal = nlohmann::json::object();
      for (const auto& [k, v] : calibration_) cal[k] = v;
      j["calibration"] = cal;
    }
    std::fprintf(json_, "%s\n", j.dump().c_str());
    std::fflush(json_);
  }
}

namespace {
row copy_row(const memcpy_limit& lim, const row& like, const char* algo) {
  row l = like;
  l.algo = algo;
  l.dtype = "byte";
  l.op = "none";
  l.bytes = l.count = lim.bytes;
  l.time_us = lim.seconds * 1e6;
  l.algbw_gbs = l.busbw_gbs = lim.gbs();
  l.wrong = -1;
  l.model_us.reset();
  l.picked.clear();
  return l;
}
} // namespace

void report::add_memcpy(const memcpy_limit& lim, const row& like) {
  if (active_) add(copy_row(lim, like, "memcpy"));
}

void report::finish(const memcpy_limit& lim, const row& like) {
  if (!active_) return;
  const row l = copy_row(lim, like, "limit");
  auto rows = std::move(rows_);
  std::erase_if(rows, [](const row& r) { return r.algo == "memcpy"; });
  std::printf("#  limit: single-thread memcpy of %s, best of several copies\n", human_bytes(lim.bytes).c_str());
  add(l);
  rows_.clear();
  // Per algorithm: busbw at the largest size against the limit, and the average.
  std::map<std::string, std::pair<const row*, std::pair<double, int>>> per;
  std::vector<std::string> order;
  for (const auto& r : rows) {
    auto [it, fresh] = per.try_emplace(r.algo, &r, std::pair{0.0, 0});
    if (fresh) order.push_back(r.algo);
    if (r.bytes >= it->second.first->bytes) it->second.first = &r;
    it->second.second.first += r.busbw_gbs;
    it->second.second.second += 1;
  }
  for (const auto& a : order) {
    const auto& [big, avg] = per[a];
    std::printf("# %-14s busbw at %s: %.2f GB/s = %.2f x memcpy limit; avg busbw over %d sizes: %.2f GB/s\n",
                a.c_str(), human_bytes(big->bytes).c_str(), big->busbw_gbs,
                lim.gbs() > 0 ? big->busbw_gbs / lim.gbs() : 0.0, avg.second, avg.first / avg.second);
  }
  std::fflush(stdout);
}

} // namespace gradsync::bench
