// gradsync-bench alltoall | alltoallv: times gradsync's exchanges
// (alltoall.hpp) one row per size and schedule (-a auto, pairwise,
// scattered, bruck, hier: two-level over --group-size or the transport's
// nodes; direct: through the shared arena, -t shm only; native:
// MPI_Alltoall / MPI_Alltoallv in the same run, -t mpi only, listed by
// default there) and checks every received element.
//
// Sizes (-b -e -f) are bytes PER PEER: the block a rank sends each
// destination (alltoallv: the largest block; moe: the mean block).
//   algbw = bytes a rank sends in total, its own block included, / time
//           (alltoall: size x ranks; alltoallv: the busiest rank's total)
//   busbw = algbw x (n-1)/n
// alltoallv's count matrix (--pattern; every rank computes all of it, so it
// knows what it receives): uniform (every block the size), skewed (rank r
// sends q a count proportional to 1/(1 + ((q - r) mod n))^1.2, the largest
// block the size), moe (top-k routing: each rank routes size x n / k tokens
// of one element to k distinct ranks drawn by a seeded log-normal expert
// popularity, --expert-skew: the mean block is the size, hot experts get
// more), sparse (rank r sends a block of the size to r+1 and r-1 only).
// --dynamic adds a row per size of alltoallv_dynamic (receive counts learned
// in the call) beside the known-count rows (with native: MPI_Alltoall of
// the counts, then MPI_Alltoallv); --plan rows of an exchange_plan made
// once per size and schedule (untimed) and run (empty blocks skipped,
// exchange_plan::sparse).
//
//   gradsync-bench alltoall -b 8 -e 1M -f 8 -a pairwise,scattered,bruck,auto
//   gradsync-bench alltoallv --pattern moe --dynamic -t shm --ranks 4
//   mpiexec -n 2 gradsync-bench alltoall        (rows auto and native)
//
// The check (-c 1): after the timed calls, one more call on inputs whose
// element i of the block from rank s to rank d is a function of (s, d, i),
// into an output filled with a value no block holds; every element compared
// bit for bit. Wrong elements fail the run (exit 2).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include <gradsync/alltoall.hpp>
#include <gradsync/calibrate.hpp>

#include "common.hpp"
#include "timing.hpp"
#include "subcommands.hpp"
#include "transports.hpp"

namespace gradsync::bench {
namespace a2a_bench {
namespace {

enum class pattern { uniform, skewed, moe, sparse };

constexpr std::string_view pattern_name(pattern p) {
  switch (p) {
  case pattern::skewed: return "skewed";
  case pattern::moe: return "moe";
  case pattern::sparse: return "sparse";
  case pattern::uniform: break;
  }
  return "uniform";
}

/// One entry of -a.
struct algo_choice {
  std::string name;
  bool native = false; ///< MPI_Alltoall / MPI_Alltoallv
  algorithm a = algorithm::automatic;
};

/// Everything the command line decided.
struct config {
  bool v = false; ///< alltoallv
  std::string name, transport, algo_list;
  int ranks = 0;
  int group_size = 0; ///< options::group_size (hier's groups; 0: the transport's nodes)
  std::vector<algo_choice> algos;
  dtype dt = dtype::f32;
  pattern pat = pattern::uniform;
  int topk = 2;
  double skew = 1.0; ///< moe: sigma of the experts' log-normal popularity
  std::uint64_t seed = 1;
  bool dynamic = false;
  bool plan = false; ///< alltoallv: also time an exchange_plan's run per size
  std::vector<std::size_t> sizes;
  int iters = 0, warmup = -1;
  bool check = true;
  bool inject = false;
  std::string json;
};

std::vector<algo_choice> parse_algos(std::string_view list, const config& cfg) {
  // direct: the shared-memory arena's schedule (algo/alltoall_direct.hpp), shm only.
  const bool arena = cfg.transport == "shm";
  const std::string mine = std::string(cfg.v ? "auto, pairwise, scattered, hier" : "auto, pairwise, scattered, bruck, hier") +
                           (arena ? ", direct" : "") + ", native";
  std::vector<algo_choice> out;
  for (const std::string& name : split_commas(list)) {
    if (name.empty()) throw std::invalid_argument("-a '" + std::string(list) + "' has an empty entry");
    algo_choice c{name};
    if (name == "native") {
#if !defined(GRADSYNC_BENCH_MPI)
      throw std::invalid_argument("-a native is the MPI library's own " + cfg.name +
                                  ", but this binary was built without MPI");
#endif
      if (cfg.transport != "mpi")
        throw std::invalid_argument("-a native is the MPI library's own " + cfg.name +
                                    ": it needs -t mpi (run under mpiexec), not -t " + cfg.transport);
      c.native = true;
    } else if (!parse_algorithm(name, c.a) ||
               !(c.a == algorithm::automatic || c.a == algorithm::pairwise || c.a == algorithm::scattered ||
                 c.a == algorithm::hier || (!cfg.v && c.a == algorithm::bruck) ||
                 (arena && c.a == algorithm::direct))) {
      throw std::invalid_argument("-a: '" + name + "' is not a schedule of " + cfg.name + " (known: " + mine +
                                  (cfg.v && name == "bruck" ? "; bruck needs equal blocks: alltoall only" : "") + ")");
    }
    for (const auto& o : out)
      if (o.name == c.name) throw std::invalid_argument("-a lists '" + c.name + "' twice");
    out.push_back(std::move(c));
  }
  return out;
}

// ---- the count matrix of alltoallv -------------------------------------

std::uint64_t mix(std::uint64_t z) { // splitmix64's finaliser
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// counts[r * p + q]: elements rank r sends rank q (and q receives from r);
/// a uniform matrix stores its one value instead (p x p counts are 8 MiB at
/// 1024 ranks, and under SMPI every simulated rank holds its own copy).
struct count_matrix {
  int p = 0;
  std::vector<std::size_t> counts; // empty: every block is `each`
  std::size_t each = 0;
  std::size_t at(int r, int q) const {
    return counts.empty() ? each : counts[static_cast<std::size_t>(r) * static_cast<std::size_t>(p) + static_cast<std::size_t>(q)];
  }
  std::vector<std::size_t> sends(int r) const {
    std::vector<std::size_t> v(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) v[static_cast<std::size_t>(q)] = at(r, q);
    return v;
  }
  std::vector<std::size_t> receives(int r) const {
    std::vector<std::size_t> v(static_cast<std::size_t>(p));
    for (int q = 0; q < p; ++q) v[static_cast<std::size_t>(q)] = at(q, r);
    return v;
  }
  std::size_t largest() const { return counts.empty() ? each : *std::max_element(counts.begin(), counts.end()); }
};

count_matrix make_matrix(pattern pat, int p, std::size_t n, int topk, double skew, std::uint64_t seed) {
  if (pat == pattern::uniform) return count_matrix{p, {}, n};
  count_matrix m{p, std::vector<std::size_t>(static_cast<std::size_t>(p) * static_cast<std::size_t>(p), 0), 0};
  auto cell = [&](int r, int q) -> std::size_t& {
    return m.counts[static_cast<std::size_t>(r) * static_cast<std::size_t>(p) + static_cast<std::size_t>(q)];
  };
  switch (pat) {
  case pattern::uniform: break; // returned above
  case pattern::skewed: // distance 0 (the own block) weighs 1: the largest block is n
    for (int r = 0; r < p; ++r)
      for (int q = 0; q < p; ++q) {
        const int d = ((q - r) % p + p) % p;
        cell(r, q) = static_cast<std::size_t>(std::floor(static_cast<double>(n) / std::pow(1.0 + d, 1.2)));
      }
    break;
  case pattern::sparse:
    for (int r = 0; r < p; ++r) {
      cell(r, (r + 1) % p) = n;
      cell(r, (r + p - 1) % p) = n;
    }
    break;
  case pattern::moe: {
    // Expert (rank) e's popularity: exp(skew x g_e), g_e a normal draw from
    // the seed, the same for every source (a router's hot experts are hot
    // for everyone). Each token goes to k distinct ranks, drawn one after
    // another by popularity among those not drawn yet. Weights are fixed
    // point and the draws integer arithmetic, so processes on machines with
    // another libm still agree on every count.
    const int k = std::min(topk, p);
    const std::size_t tokens = n * static_cast<std::size_t>(p) / static_cast<std::size_t>(k);
    auto uniform01 = [](std::uint64_t h) { return static_cast<double>(h >> 11) * 0x1p-53; };
    std::vector<std::uint64_t> weight(static_cast<std::size_t>(p));
    std::uint64_t sum = 0;
    for (int e = 0; e < p; ++e) {
      const std::uint64_t h = mix(seed ^ 0x5eedull ^ (static_cast<std::uint64_t>(e) << 20));
      const double g = std::sqrt(-2 * std::log(1 - uniform01(h))) * std::cos(2 * 3.141592653589793 * uniform01(mix(h)));
      sum += weight[static_cast<std::size_t>(e)] =
          static_cast<std::uint64_t>(std::llround(std::min(std::exp(skew * g), 1e9) * 1024)) + 1;
    }
    std::vector<char> taken(static_cast<std::size_t>(p), 0);
    std::vector<int> picked(static_cast<std::size_t>(k));
    for (int r = 0; r < p; ++r)
      for (std::size_t t = 0; t < tokens; ++t) {
        std::uint64_t h = mix(seed ^ (static_cast<std::uint64_t>(r) << 40) ^ t), left = sum;
        for (int j = 0; j < k; ++j) {
          h = mix(h);
          std::uint64_t u = h % left;
          int e = 0; // the expert u falls on among those not taken (u < left: one does)
          for (int x = 0; x < p; ++x) {
            const auto ux = static_cast<std::size_t>(x);
            if (taken[ux]) continue;
            e = x;
            if (u < weight[ux]) break;
            u -= weight[ux];
          }
          taken[static_cast<std::size_t>(e)] = 1;
          left -= weight[static_cast<std::size_t>(e)];
          picked[static_cast<std::size_t>(j)] = e;
          ++cell(r, e);
        }
        for (int j = 0; j < k; ++j) taken[static_cast<std::size_t>(picked[static_cast<std::size_t>(j)])] = 0;
      }
    break;
  }
  }
  return m;
}

// The matrix of one (pattern, p, n, k, seed), made once and shared by the
// in-process ranks (moe's routing simulates every rank's tokens). Only the
// two latest are kept (the sweep's size and the largest, which the header
// prints; a rank a size behind holds its own reference): the sweep's sizes
// used to pile up, and under SMPI every simulated rank has its own cache
// (1024 ranks grew by 8 GiB a size).
std::shared_ptr<const count_matrix> matrix_for(pattern pat, int p, std::size_t n, int topk, double skew,
                                               std::uint64_t seed) {
  using key_t = std::tuple<int, int, std::size_t, int, double, std::uint64_t>;
  static std::mutex mu;
  static std::vector<std::pair<key_t, std::shared_ptr<const count_matrix>>> kept; // newest last
  const std::lock_guard lock(mu);
  const key_t key{static_cast<int>(pat), p, n, topk, skew, seed};
  for (const auto& [k, m] : kept)
    if (k == key) return m;
  if (kept.size() == 2) kept.erase(kept.begin()); // before making the next
  kept.emplace_back(key, std::make_shared<const count_matrix>(make_matrix(pat, p, n, topk, skew, seed)));
  return kept.back().second;
}

std::string fixed(double v, int prec) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, v);
  return b;
}

// ---- data and check ----------------------------------------------------

// Element values are integers below 2^bits, exact in T (bf16 holds 8
// significant bits, f16 11, f32 24).
template <element T> constexpr unsigned value_bits() {
  if constexpr (std::is_same_v<T, bfloat16>) return 8;
  else if constexpr (std::is_same_v<T, half>) return 11;
  else if constexpr (std::is_same_v<T, float>) return 24;
  else return 31;
}

template <element T> T from_int(long long v) { return narrow<T>(static_cast<accum_t<T>>(v)); }

/// Element i of the block rank `src` sends rank `dst`: a per-block offset
/// plus i times an odd constant, modulo 2^bits (so consecutive elements
/// differ and a block sent to the wrong rank or at the wrong offset shows).
template <element T> struct block_values {
  std::uint64_t base, mask = (std::uint64_t{1} << value_bits<T>()) - 1;
  block_values(int src, int dst) : base(mix((static_cast<std::uint64_t>(src) << 32) ^ static_cast<std::uint64_t>(dst))) {}
  T operator()(std::size_t i) const {
    return from_int<T>(static_cast<long long>((base + static_cast<std::uint64_t>(i) * 2654435761ull) & mask));
  }
};

template <element T> T sentinel() { return from_int<T>(-1); } // no block holds a negative value

template <element T> bool same_bits(T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }

// in: this rank's blocks (packed in destination order, send[q] elements each).
template <element T> void fill_input(T* in, int r, std::span<const std::size_t> send) {
  std::size_t at = 0;
  for (std::size_t q = 0; q < send.size(); ++q) {
    const block_values<T> v(r, static_cast<int>(q));
    for (std::size_t i = 0; i < send[q]; ++i) in[at + i] = v(i);
    at += send[q];
  }
}

template <element T> long long count_wrong(const T* out, int r, std::span<const std::size_t> recv) {
  long long wrong = 0;
  std::size_t at = 0;
  for (std::size_t q = 0; q < recv.size(); ++q) {
    const block_values<T> v(static_cast<int>(q), r);
    for (std::size_t i = 0; i < recv[q]; ++i) wrong += !same_bits(out[at + i], v(i));
    at += recv[q];
  }
  return wrong;
}

// ---- timing ------------------------------------------------------------


// ---- the MPI library's own exchanges -----------------------------------

#if defined(GRADSYNC_BENCH_MPI)
int int_count(std::size_t n, int rank) {
  require(n <= static_cast<std::size_t>(INT_MAX), "bench.native", rank,
          "MPI counts and displacements are int: " + std::to_string(n) + " elements do not fit");
  return static_cast<int>(n);
}

std::vector<int> int_counts(std::span<const std::size_t> v, int rank) {
  std::vector<int> out;
  for (const std::size_t n : v) out.push_back(int_count(n, rank));
  return out;
}

std::vector<int> int_displs(std::span<const std::size_t> v, int rank) {
  std::vector<int> out;
  std::size_t at = 0;
  for (const std::size_t n : v) {
    out.push_back(int_count(at, rank));
    at += n;
  }
  int_count(at, rank);
  return out;
}

template <element T>
void native_alltoall(mpi::communicator& c, const T* in, T* out, std::size_t block) {
  const int n = int_count(block, c.rank());
  mpi::detail::check(MPI_Alltoall(in, n, mpi::datatype<T>(), out, n, mpi::datatype<T>(), c.native()),
                     "native.alltoall", c.rank());
}

template <element T>
void native_alltoallv(mpi::communicator& c, const T* in, const std::vector<int>& sc, const std::vector<int>& sd, T* out,
                      const std::vector<int>& rc, const std::vector<int>& rd) {
  mpi::detail::check(MPI_Alltoallv(in, sc.data(), sd.data(), mpi::datatype<T>(), out, rc.data(), rd.data(),
                                   mpi::datatype<T>(), c.native()),
                     "native.alltoallv", c.rank());
}

// What an MPI program without known counts does: MPI_Alltoall of the counts,
// then MPI_Alltoallv. Returns the elements received.
template <element T>
std::size_t native_alltoallv_dynamic(mpi::communicator& c, const T* in, std::span<const std::size_t> send, T* out,
                                     std::span<std::size_t> recv) {
  const int r = c.rank();
  std::vector<unsigned long long> mine(send.begin(), send.end()), theirs(send.size());
  mpi::detail::check(MPI_Alltoall(mine.data(), 1, MPI_UNSIGNED_LONG_LONG, theirs.data(), 1, MPI_UNSIGNED_LONG_LONG,
                                  c.native()),
                     "native.alltoall(counts)", r);
  std::size_t total = 0;
  for (std::size_t q = 0; q < recv.size(); ++q) total += recv[q] = static_cast<std::size_t>(theirs[q]);
  native_alltoallv<T>(c, in, int_counts(send, r), int_displs(send, r), out, int_counts(recv, r),
                      int_displs(recv, r));
  return total;
}
#endif

// ---- the sweep ---------------------------------------------------------

/// A row's schedule as the ranks ran it: the name when every rank ran the
/// same, else "LOWEST|HIGHEST" of the enum (alltoallv: each rank picks by
/// its own largest block, and pairwise and scattered interoperate).
template <transport C> std::string agreed_name(C& c, algorithm mine) {
  std::int64_t lo_hi[2] = {static_cast<std::int64_t>(mine), -static_cast<std::int64_t>(mine)};
  allreduce(c, std::span<std::int64_t>(lo_hi, 2), op::min{});
  if (lo_hi[0] == -lo_hi[1]) return std::string(algorithm_name(mine));
  return std::string(algorithm_name(static_cast<algorithm>(lo_hi[0]))) + "|" +
         std::string(algorithm_name(static_cast<algorithm>(-lo_hi[1])));
}

template <transport C, element T>
std::int64_t sweep(C& c, const config& cfg, const selector& sel, report& rep) {
  const int p = c.size(), r = c.rank();
  const auto up = static_cast<std::size_t>(p);
  const std::string dt(dtype_name(cfg.dt));
  std::int64_t total_wrong = 0;
  std::size_t last_n = 0;
  for (const std::size_t bytes : cfg.sizes) {
    const std::size_t n = bytes / sizeof(T); // elements per peer
    if (n == 0 || n == last_n) continue;     // rounded to nothing, or to the previous size
    last_n = n;
    const auto held = cfg.v ? matrix_for(cfg.pat, p, n, cfg.topk, cfg.skew, cfg.seed)
                            : matrix_for(pattern::uniform, p, n, 0, 0, 0);
    const count_matrix& m = *held;
    const std::vector<std::size_t> send = m.sends(r), recv = m.receives(r);
    std::size_t in_n = 0, out_n = 0, largest_mine = 0;
    for (std::size_t q = 0; q < up; ++q) {
      in_n += send[q];
      out_n += recv[q];
      largest_mine = std::max({largest_mine, send[q], recv[q]});
    }
    // The busiest rank: its total sent (own block included; algbw) and its
    // most sent or received to or from others (the model's volume).
    std::size_t sent_max = 0, wire_max = 0, total = 0;
    for (int a = 0; a < p; ++a) {
      std::size_t s = 0, so = 0, ro = 0;
      for (int q = 0; q < p; ++q) {
        s += m.at(a, q);
        if (q != a) so += m.at(a, q), ro += m.at(q, a);
      }
      sent_max = std::max(sent_max, s);
      wire_max = std::max({wire_max, so, ro});
      total += s;
    }
    buffer inb(in_n * sizeof(T)), outb(out_n * sizeof(T));
    T* in = inb.as<T>();
    T* out = outb.as<T>();
    const std::span<const T> cin(in, in_n);
    const std::span<T> cout(out, out_n);
    std::vector<std::size_t> learned(up);

    auto options_for = [&](const algo_choice& a, std::span<std::byte> workspace) {
      return options{.algo = a.a, .workspace = workspace, .select = &sel, .group_size = cfg.group_size};
    };
    std::size_t ws_bytes = 0; // one workspace per size, fitting every schedule
    if (!cfg.v)
      for (const auto& a : cfg.algos)
        if (!a.native) ws_bytes = std::max(ws_bytes, alltoall_workspace_bytes<T>(c, n, options_for(a, {})));
    buffer ws(ws_bytes);
    const iteration_plan plan = plan_iterations(sent_max * sizeof(T), cfg.iters, cfg.warmup);
#if defined(GRADSYNC_BENCH_MPI)
    std::vector<int> nsc, nsd, nrc, nrd; // MPI_Alltoallv's int counts and displacements
    if constexpr (std::is_same_v<C, mpi::communicator>)
      if (cfg.v)
        for (const auto& a : cfg.algos)
          if (a.native) {
            nsc = int_counts(send, r), nsd = int_displs(send, r), nrc = int_counts(recv, r), nrd = int_displs(recv, r);
            break;
          }
#endif

    // One row: `call` times it, then runs once on fresh inputs for the check.
    auto run_row = [&](const std::string& label, const std::string& picked, std::optional<double> model_us,
                       auto&& call, bool dynamic) {
      fill_input<T>(in, r, send);
      const double sec = time_calls(c, call, plan);
      std::int64_t wrong = -1;
      if (cfg.check) {
        fill_input<T>(in, r, send);
        std::fill_n(out, out_n, sentinel<T>());
        std::fill(learned.begin(), learned.end(), std::size_t{0});
        call();
        if (cfg.inject && r == 0 && out_n > 0) out[0] = sentinel<T>(); // proves the checker: one wrong element
        wrong = count_wrong<T>(out, r, recv);
        if (dynamic) // the learned counts must be the matrix's column
          for (std::size_t q = 0; q < up; ++q) wrong += learned[q] != recv[q];
        allreduce(c, std::span<std::int64_t>(&wrong, 1), op::sum{});
        total_wrong += wrong;
      }
      const double algbw = static_cast<double>(sent_max * sizeof(T)) / sec / 1e9;
      row w{cfg.name, cfg.transport, p, label, dt, "none", n * sizeof(T), n, sec * 1e6, algbw,
            algbw * (p - 1) / p, wrong, model_us, picked, {}, {}};
      if (cfg.v) {
        w.text_fields = {{"pattern", std::string(pattern_name(cfg.pat))}, {"counts", dynamic ? "learned" : "known"}};
        w.number_fields = {{"sent_bytes_max", static_cast<double>(sent_max * sizeof(T))},
                           {"offdiag_bytes_max", static_cast<double>(wire_max * sizeof(T))},
                           {"total_bytes", static_cast<double>(total * sizeof(T))},
                           {"block_bytes_max", static_cast<double>(m.largest() * sizeof(T))}};
      }
      rep.add(w);
    };

    // The cost model's time for schedule x: equal blocks of the size
    // (alltoall), or the busiest rank's mean block to or from the others.
    const topology topo = topology_of(c, options{.select = &sel, .group_size = cfg.group_size});
    const double model_block = cfg.v ? (p > 1 ? static_cast<double>(wire_max * sizeof(T)) / (p - 1) : 0.0)
                                     : static_cast<double>(n * sizeof(T));
    auto model_of = [&](algorithm x) -> std::optional<double> {
      const double s = sel.model().exchange(x, model_block, topo);
      return std::isfinite(s) ? std::optional<double>(s * 1e6) : std::nullopt;
    };

    for (const auto& a : cfg.algos) {
      const options o = options_for(a, std::span<std::byte>(ws.data(), ws.size()));
      if (a.native) {
#if defined(GRADSYNC_BENCH_MPI)
        if constexpr (std::is_same_v<C, mpi::communicator>) {
          if (cfg.v) {
            auto call = [&] { native_alltoallv<T>(c, in, nsc, nsd, out, nrc, nrd); };
            run_row(a.name, "", std::nullopt, call, false);
          } else {
            auto call = [&] { native_alltoall<T>(c, in, out, n); };
            run_row(a.name, "", std::nullopt, call, false);
          }
          continue;
        }
#endif
        require(false, "bench", r, "-a native needs the MPI transport");
      }
      if (cfg.v) {
        // Each rank's own pick (as alltoallv makes it) and whether all agree.
        const algorithm mine = alltoallv_algorithm(c, largest_mine * sizeof(T), o);
        const std::string picked = agreed_name(c, mine);
        auto call = [&] { alltoallv<C, T>(c, cin, send, cout, recv, o); };
        run_row(a.name, picked, picked.find('|') == std::string::npos ? model_of(mine) : std::nullopt, call, false);
      } else {
        const algorithm x = alltoall_algorithm<T>(c, n, o);
        auto call = [&] { alltoall<C, T>(c, cin, cout, o); };
        run_row(a.name, std::string(algorithm_name(x)), model_of(x), call, false);
      }
    }
    if (cfg.plan)
      for (const auto& a : cfg.algos) {
        // The counts fixed once (made outside the timing, as a GNN's halo or
        // an MoE step's tokens, indices and weights reuse one plan), one row
        // per schedule listed: "plan:NAME", empty blocks skipped.
        if (a.native) continue;
        const exchange_plan xp(c, send, recv, options_for(a, {}));
        const algorithm x = xp.algorithm_for(c, sizeof(T));
        auto call = [&] { xp.run<C, T>(c, cin, cout); };
        const bool skips = xp.sparse() && (x == algorithm::scattered || x == algorithm::pairwise);
        run_row("plan:" + a.name, std::string(algorithm_name(x)) + (skips ? "+sparse" : ""),
                skips ? std::nullopt : model_of(x), call, false);
      }
    if (cfg.dynamic) {
      // Learned counts: gradsync's alltoallv_dynamic (direct on a shared
      // arena, the counts in its first round's headers; else scattered, the
      // counts beside the data), and with native listed MPI's two calls.
      const options o{.select = &sel};
      auto call = [&] { alltoallv_dynamic<C, T>(c, cin, send, cout, std::span<std::size_t>(learned), o); };
      run_row("dynamic", shared_arena<C> ? "direct" : "scattered", std::nullopt, call, true);
#if defined(GRADSYNC_BENCH_MPI)
      if constexpr (std::is_same_v<C, mpi::communicator>)
        if (std::any_of(cfg.algos.begin(), cfg.algos.end(), [](const algo_choice& a) { return a.native; })) {
          auto ncall = [&] { native_alltoallv_dynamic<T>(c, in, send, out, std::span<std::size_t>(learned)); };
          run_row("native:dynamic", "", std::nullopt, ncall, true);
        }
#endif
    }
  }
  return total_wrong;
}

// The element types -d offers. The exchanges only move bytes, so one type
// per element size (2, 4, 8 bytes) covers them; each type is every exchange
// instantiated once more per transport (about 6 s of this file's -O1 build).
constexpr const char* element_names[] = {"f32", "f64", "bf16"};

template <class F> std::int64_t with_element(dtype dt, F&& f) {
  switch (dt) {
  case dtype::f64: return f(double{});
  case dtype::bf16: return f(bfloat16{});
  default: break;
  }
  return f(float{});
}

template <transport C> std::int64_t run_rank(C& c, const config& cfg) {
  report rep(c.rank() == 0, cfg.json);
  // As collective.cpp: one calibration per run on every rank (auto and the
  // model column use it), then the memcpy limit while the others wait.
  const buffer cal_ws(calibrate_workspace_bytes()); // SMPI shared memory in a simulator's timing runs
  const selector sel = calibrate(c, cfg.group_size, {.workspace = std::span(cal_ws.data(), cal_ws.size())});
  memcpy_limit lim;
  barrier(c);
  if (c.rank() == 0) lim = measure_memcpy();
  barrier(c);
  const auto& sz = cfg.sizes;
  rep.note("gradsync-bench " + cfg.name + "  transport " + cfg.transport + "  ranks " + std::to_string(c.size()) +
           "  dtype " + std::string(dtype_name(cfg.dt)) + "  algos " + cfg.algo_list +
           (cfg.dynamic ? "  +dynamic" : "") + "  check " + (cfg.check ? "on" : "off"));
  rep.note(std::string("size = bytes per peer") +
           (!cfg.v ? "" : cfg.pat == pattern::moe ? " (the mean block)" : " (the largest block)") + "  sizes " +
           human_bytes(sz.front()) + " .. " + human_bytes(sz.back()) + "  iterations " +
           (cfg.iters > 0 ? std::to_string(cfg.iters)
                          : "auto (" + std::to_string(default_max_iters) + ", fewer above " +
                                human_bytes(iteration_budget_bytes / default_max_iters) + " sent, >= " +
                                std::to_string(min_auto_iters) + ")") +
           "  warmup " + (cfg.warmup >= 0 ? std::to_string(cfg.warmup) : "auto (iterations / 5)") +
           "  time = max over ranks of the mean per call");
  rep.note(std::string("algbw = bytes a rank sends (own block included") +
           (cfg.v ? "; the busiest rank" : ": size x ranks") + ") / time; busbw = algbw x (n-1)/n");
  if (cfg.v) {
    std::string what;
    switch (cfg.pat) {
    case pattern::uniform: what = "every block the size"; break;
    case pattern::skewed: what = "r sends q size / (1 + ((q - r) mod n))^1.2"; break;
    case pattern::moe:
      what = "top-" + std::to_string(std::min(cfg.topk, c.size())) +
             " routing of size x n / k one-element tokens per rank (the mean block is the size), expert skew " +
             fixed(cfg.skew, 2) + ", seed " + std::to_string(cfg.seed);
      break;
    case pattern::sparse: what = "r sends the size to r+1 and r-1 only"; break;
    }
    rep.attribute("pattern", "pattern_detail", std::string(pattern_name(cfg.pat)) + " (" + what + ")");
    // The matrix of the largest size, in units of that size.
    const std::size_t esz = dtype_size(cfg.dt), n = sz.back() / esz;
    if (n > 0 && c.size() <= 16) {
      const auto held = matrix_for(cfg.pat, c.size(), n, cfg.topk, cfg.skew, cfg.seed);
      const count_matrix& m = *held;
      rep.note("counts at " + human_bytes(n * esz) + " per peer, row r = what rank r sends, in units of that size:");
      for (int a = 0; a < c.size(); ++a) {
        std::string line = "  ";
        for (int q = 0; q < c.size(); ++q) {
          char b[16];
          std::snprintf(b, sizeof b, " %5.2f", static_cast<double>(m.at(a, q)) / static_cast<double>(n));
          line += b;
        }
        rep.note(line);
      }
    }
  }
  if constexpr (requires { c.single_copy(); })
    rep.attribute("shm copy", "shm_copy", c.single_copy() ? "single (cma)" : "arena");
  rep.calibration(params_of(sel.model()));
  rep.header();
  const std::int64_t wrong = with_element(cfg.dt, [&](auto t) { return sweep<C, decltype(t)>(c, cfg, sel, rep); });
  finish_checked(rep, lim, cfg.name, cfg.transport, c.size(), cfg.check, wrong);
  return wrong;
}

} // namespace
} // namespace a2a_bench

int alltoall_main(std::string_view name, int argc, char** argv) {
  using namespace a2a_bench;
  config cfg;
  cfg.name = std::string(name);
  cfg.v = name == "alltoallv";
  CLI::App app{"Times gradsync's " + cfg.name +
                   " over a range of sizes per peer (nccl-tests style; every received element checked).",
               "gradsync-bench " + cfg.name};
  transport_options tr;
  tr.add_to(app);
  std::string algos, dt = "f32";
  int check = 1;
  app.add_option("-a,--algo", algos,
                 std::string("comma list of schedules, one row each per size: auto pairwise scattered hier ") +
                     (cfg.v ? "" : "bruck ") +
                     "direct native (direct: through the shared arena, -t shm only; native: MPI_" + (cfg.v ? "Alltoallv" : "Alltoall") +
                     ", -t mpi only; default: auto, and auto,native on -t mpi)");
  app.add_option("-d,--datatype", dt, "element type (one per element size: the exchanges move bytes)")
      ->capture_default_str()
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(element_names), std::end(element_names))));
  app.add_option("-c,--check", check, "1: check every received element, count wrong elements")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  std::string pat = "uniform";
  if (cfg.v) {
    app.add_option("--pattern", pat,
                   "count matrix: uniform (every block the size), skewed (r sends q size/(1+((q-r) mod n))^1.2), "
                   "moe (top-k routing of size x n / k tokens per rank, the mean block the size; --topk, --expert-skew, "
                   "--seed), sparse (to r+1 and r-1 only)")
        ->capture_default_str()
        ->check(CLI::IsMember({"uniform", "skewed", "moe", "sparse"}));
    app.add_option("--topk", cfg.topk, "moe: ranks (experts) each token goes to")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    app.add_option("--expert-skew", cfg.skew,
                   "moe: expert e is drawn with weight exp(skew x N(0,1)_e) (0: uniform routing, which at "
                   "large sizes makes every block the size)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 8.0));
    app.add_option("--seed", cfg.seed, "moe: routing and popularity seed")->capture_default_str();
    app.add_flag("--plan", cfg.plan,
                 "also time an exchange_plan of the counts (made once, untimed) per size and schedule of -a, rows "
                 "'plan:NAME' (its schedule; '+sparse': empty blocks send nothing)");
    app.add_flag("--dynamic", cfg.dynamic,
                 "also time alltoallv_dynamic (receive counts learned in the call) per size, row 'dynamic' (with "
                 "native: 'native:dynamic', MPI_Alltoall of the counts then MPI_Alltoallv)");
  }
  app.add_option("--group-size", cfg.group_size,
                 "ranks per group for hier (and the model's topology); 0: the transport's nodes")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  sweep_options sw;
  sw.max = "16M"; // per peer: each rank holds ranks x this twice (64M on 4 ranks would be 2 GiB in all)
  sw.add_to(app);
  app.add_flag("--inject-error", cfg.inject, "corrupt one received element on rank 0 (tests the checker)")->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tr.resolve();
  cfg.transport = tr.name;
  cfg.ranks = tr.ranks;
  if (algos.empty()) algos = cfg.transport == "mpi" ? "auto,native" : "auto";
  cfg.algos = parse_algos(algos, cfg);
  cfg.algo_list = algos;
  cfg.dt = parse_dtype(dt, {dtype::f32, dtype::f64, dtype::bf16});
  cfg.pat = pat == "skewed" ? pattern::skewed : pat == "moe" ? pattern::moe : pat == "sparse" ? pattern::sparse
                                                                                                : pattern::uniform;
  cfg.check = check == 1;
  set_sim_shared_payload(!cfg.check); // simulator timing runs: payloads in SMPI shared memory
  cfg.sizes = sw.sizes();
  cfg.iters = sw.iters;
  cfg.warmup = sw.warmup;
  cfg.json = sw.json;
  if (cfg.inject && !cfg.check) throw std::invalid_argument("--inject-error needs -c 1");

  std::atomic<std::int64_t> wrong{0};
  with_transport(cfg.transport, cfg.ranks, [&](auto& c) {
    wrong.store(run_rank(c, cfg)); // the total over all ranks, on every rank
  });
  return wrong.load() == 0 ? 0 : 2;
}

} // namespace gradsync::bench
