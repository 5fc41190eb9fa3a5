// gradsync-bench allreduce | reduce_scatter | allgather | broadcast | reduce:
// times gradsync's collectives (one row per size and algorithm; -a native is
// the MPI library's own collective in the same run) and checks every result
// against a closed form.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <gradsync/calibrate.hpp>
#include <gradsync/collectives.hpp>

#include "collective.hpp"
#include "common.hpp"
#include "subcommands.hpp"
#include "transports.hpp"

namespace gradsync::bench {
namespace coll_bench {
namespace {

coll parse_coll(std::string_view n) {
  if (n == "allreduce") return coll::allreduce;
  if (n == "reduce_scatter") return coll::reduce_scatter;
  if (n == "allgather") return coll::allgather;
  if (n == "broadcast") return coll::broadcast;
  if (n == "reduce") return coll::reduce;
  throw std::invalid_argument("unknown collective '" + std::string(n) + "'");
}

std::string known_algorithms() {
  std::string s;
  for (int i = 0; i < 64; ++i) { // every enumerator has a name; "?" is past the end
    const auto n = algorithm_name(static_cast<algorithm>(i));
    if (n == "?") break;
    s += std::string(n) + " ";
  }
  return s + "native";
}

std::vector<algo_choice> parse_algos(std::string_view list, std::string_view transport) {
  std::vector<algo_choice> out;
  std::size_t start = 0;
  for (;;) {
    const auto comma = list.find(',', start);
    const auto name = list.substr(start, comma == std::string_view::npos ? list.npos : comma - start);
    if (name.empty()) throw std::invalid_argument("-a '" + std::string(list) + "' has an empty entry");
    algo_choice c{std::string(name)};
    if (name == "native") {
#if !defined(GRADSYNC_BENCH_MPI)
      throw std::invalid_argument("-a native is the MPI library's own collective, but this binary was built without MPI");
#endif
      if (transport != "mpi")
        throw std::invalid_argument("-a native is the MPI library's own collective: it needs -t mpi (run under mpiexec), not -t " +
                                    std::string(transport));
      c.native = true;
    } else if (!parse_algorithm(name, c.a)) {
      throw std::invalid_argument("-a: unknown algorithm '" + std::string(name) + "' (known: " + known_algorithms() + ")");
    }
    for (const auto& o : out)
      if (o.name == c.name) throw std::invalid_argument("-a lists '" + c.name + "' twice");
    out.push_back(std::move(c));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

template <transport C> std::int64_t run_rank(C& c, const config& cfg) {
  report rep(c.rank() == 0, cfg.json);
  // One calibration per run, on every rank: `auto` and the model column use
  // it. First, while every rank is busy (a rank that waited long, as the
  // others do for the memcpy limit below, may answer slowly at first).
  const buffer cal_ws(calibrate_workspace_bytes()); // SMPI shared memory in a simulator's timing runs
  const selector sel = calibrate(c, cfg.group_size, {.workspace = std::span(cal_ws.data(), cal_ws.size())});
  // The limit is measured while the other ranks wait, so nothing competes.
  memcpy_limit lim;
  barrier(c);
  if (c.rank() == 0) lim = measure_memcpy();
  barrier(c);
  const auto& sz = cfg.sizes;
  rep.note("gradsync-bench " + cfg.name + "  transport " + cfg.transport + "  ranks " + std::to_string(c.size()) +
           "  dtype " + std::string(dtype_name(cfg.dt)) + "  op " +
           (reduces(cfg.kind) ? std::string(op_name(cfg.op)) : std::string("none")) + "  algos " + cfg.algo_list +
           "  check " + (cfg.check ? "on" : "off") + "  segment " +
           human_bytes(cfg.segment_bytes ? cfg.segment_bytes : policy::ring_segment_bytes) + "  verify " +
           (cfg.verify == verification::always ? "always" : cfg.verify == verification::never ? "never" : "auto"));
  rep.note("sizes " + human_bytes(sz.front()) + " .. " + human_bytes(sz.back()) + "  iterations " +
           (cfg.iters > 0 ? std::to_string(cfg.iters)
                          : "auto (" + std::to_string(default_max_iters) + ", fewer above " +
                                human_bytes(iteration_budget_bytes / default_max_iters) + ", >= " +
                                std::to_string(min_auto_iters) + ")") +
           "  warmup " + (cfg.warmup >= 0 ? std::to_string(cfg.warmup) : "auto (iterations / 5)") +
           "  time = max over ranks of the mean per call" +
           (cfg.group_size > 0 ? "  group size " + std::to_string(cfg.group_size) : std::string()));
  // Over shared memory: how this communicator moves messages, chosen when it
  // joined (single copy by cross-memory attach, or through the arena).
  if constexpr (requires { c.single_copy(); })
    rep.attribute("shm copy", "shm_copy", c.single_copy() ? "single (cma)" : "arena");
  if constexpr (requires { c.alloc_shared(std::size_t{1}); })
    rep.attribute("buffers", "buffers", cfg.shared ? "shared (alloc_shared)" : "private");
  else if (cfg.shared)
    throw std::invalid_argument("--shared-buffers needs a transport with shared buffers (-t shm), not " + cfg.transport);
  rep.calibration(params_of(sel.model()));
  rep.header();
#if defined(GRADSYNC_BENCH_SIM)
  const std::int64_t wrong = sweep<C, float>(c, cfg, sel, rep); // the simulator build has f32 alone
#else
  const std::int64_t wrong =
      dispatch_dtype(cfg.dt, [&](auto t) { return sweep<C, decltype(t)>(c, cfg, sel, rep); });
#endif
  finish_checked(rep, lim, cfg.name, cfg.transport, c.size(), cfg.check, wrong);
  return wrong;
}

#if !defined(GRADSYNC_BENCH_CUDA)
} // namespace
std::int64_t gpu_collective(const config&) {
  throw std::invalid_argument("--device gpu: this gradsync-bench was built without CUDA (nvcc)");
}
namespace {
#endif

op_kind parse_op(std::string_view s) {
  for (auto k : {op_kind::sum, op_kind::prod, op_kind::min, op_kind::max, op_kind::avg})
    if (op_name(k) == s) return k;
  throw std::invalid_argument("-o: unknown op '" + std::string(s) + "'");
}

} // namespace
} // namespace coll_bench

int collective_main(std::string_view name, int argc, char** argv) {
  using namespace coll_bench;
  config cfg;
  cfg.kind = parse_coll(name);
  cfg.name = std::string(name);
  CLI::App app{"Times gradsync's " + cfg.name + " over a range of message sizes (nccl-tests style).",
               "gradsync-bench " + cfg.name};
  transport_options tr;
  tr.add_to(app);
  std::string algos = "auto", dt = "f32", op = "sum";
  int check = 1;
  app.add_option("-a,--algo", algos,
                 "comma list of algorithms, one row each per size: " + known_algorithms() +
                     " (native: the MPI library's own collective, -t mpi only)")
      ->capture_default_str();
  app.add_option("-d,--datatype", dt, "element type")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16", "i32", "i64"}));
  app.add_option("-o,--op", op, "reduction operator (reducing collectives)")
      ->capture_default_str()
      ->check(CLI::IsMember({"sum", "avg", "min", "max", "prod"}));
  app.add_option("-c,--check", check, "1: verify every result against a closed form, count wrong elements")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  std::string segment = "0";
  app.add_option("--segment", segment, "pipeline segment in bytes (K/M suffixes; 0: policy::ring_segment_bytes)")
      ->capture_default_str();
  app.add_option("--group-size", cfg.group_size,
                 "ranks per group: options::group_size (hier's groups, 2d's rows) and calibrate()'s groups "
                 "(0: the transport's nodes)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  std::string verify = "auto";
  app.add_option("--verify", verify,
                 "call agreement check (options::verify): auto and always check every call "
                 "(in band on direct shm calls), never skips it (to measure its cost)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "always", "never"}));
  app.add_flag("--shared-buffers", cfg.shared,
               "-t shm: inputs and outputs in memory every rank maps (communicator::alloc_shared), which "
               "shm_direct reads and writes in place");
  std::vector<std::string> codecs;
  app.add_option("-z,--codec", codecs,
                 "allreduce: also run compressed_allreduce with this codec (repeatable; float dtypes, avg/sum): "
                 "a row always compressed and a row where compress_mode::automatic decides. " +
                     std::string(compress::spec_help));
  app.add_flag("--memcpy-each-size", cfg.memcpy_each_size,
               "a 'memcpy' row per size: rank 0 copies that many bytes while the others wait (the memory's "
               "own speed at that size and moment; bench/cliff_check.py compares busbw with it)");
  app.add_option("--skip-slower", cfg.skip_slower,
                 "do not run a forced schedule (-a NAME, not auto or native) whose model prediction is over this "
                 "many times the best prediction of the size's rows: its row says 'skipped' and stays out of "
                 "the JSON (0: run every row)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  sweep_options sw;
  sw.add_to(app);
  app.add_option("--device", cfg.device,
                 "cpu: host buffers; gpu: device buffers staged through pinned host memory over -t "
                 "(f32, sum; needs a build with nvcc and a GPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "gpu"}));
  app.add_flag("--inject-error", cfg.inject, "corrupt one result element on rank 0 (tests the checker)")
      ->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tr.resolve();
  cfg.transport = tr.name;
  cfg.ranks = tr.ranks;
  cfg.algos = parse_algos(algos, cfg.transport);
  cfg.algo_list = algos;
#if defined(GRADSYNC_BENCH_SIM)
  cfg.dt = parse_dtype(dt, {dtype::f32});
#else
  cfg.dt = parse_dtype(dt, {dtype::f32, dtype::f64, dtype::f16, dtype::bf16, dtype::i32, dtype::i64});
#endif
  cfg.op = parse_op(op);
  cfg.check = check == 1;
  set_sim_shared_payload(!cfg.check); // simulator timing runs: payloads in SMPI shared memory
  cfg.sizes = sw.sizes();
  cfg.iters = sw.iters;
  cfg.warmup = sw.warmup;
  cfg.json = sw.json;
  cfg.segment_bytes = parse_bytes(segment, "--segment");
  cfg.verify = verify == "always" ? verification::always : verify == "never" ? verification::never : verification::automatic;
  if (cfg.inject && !cfg.check) throw std::invalid_argument("--inject-error needs -c 1");
  for (const auto& z : codecs) {
    cfg.codecs.push_back(compress::parse_spec(z));
    compress::with_codec<float>(cfg.codecs.back(), 1024, [](const auto&, const auto&) {}); // fail early
  }
  if (!cfg.codecs.empty()) {
    if (cfg.kind != coll::allreduce) throw std::invalid_argument("-z: compressed rows exist for allreduce only");
    if (cfg.dt != dtype::f32) throw std::invalid_argument("-z: compressed rows are built for -d f32 only");
    if (cfg.op != op_kind::sum && cfg.op != op_kind::avg) throw std::invalid_argument("-z: compressed allreduce reduces with sum or avg");
  }

  if (cfg.device == "gpu") {
    if (!cfg.codecs.empty() || cfg.shared || cfg.memcpy_each_size || cfg.inject)
      throw std::invalid_argument("--device gpu: -z, --shared-buffers, --memcpy-each-size and --inject-error are host-only");
    return gpu_collective(cfg) == 0 ? 0 : 2;
  }
  std::atomic<std::int64_t> wrong{0};
  with_transport(cfg.transport, cfg.ranks, [&](auto& c) { wrong.store(run_rank(c, cfg)); });
  return wrong.load() == 0 ? 0 : 2;
}

} // namespace gradsync::bench
