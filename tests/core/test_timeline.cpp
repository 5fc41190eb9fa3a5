// The timeline (core/timeline.hpp): Chrome trace JSON of known calls over
// inproc ranks, parsed back and checked against the schedules' structure.
#include <doctest/doctest.h>

#include <gradsync/compressed.hpp>
#include <gradsync/core/timeline.hpp>
#include <gradsync/fusion/engine.hpp>
#include <gradsync/gradsync.hpp>
#include <gradsync/transport/subgroup.hpp>

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
using gradsync::inproc::communicator;
using json = nlohmann::json;

static_assert(gradsync::traced<communicator> && gradsync::traced<gradsync::subgroup<communicator>>);

// A fresh, empty directory, removed at the end of the test.
struct scratch_dir {
  fs::path path;
  scratch_dir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("gradsync-timeline-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::size_t files() const {
    std::size_t k = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(path)) ++k;
    return k;
  }
};

// Sets or unsets GRADSYNC_TIMELINE for one scope.
struct env_timeline {
  explicit env_timeline(const char* v) {
    if (v) ::setenv("GRADSYNC_TIMELINE", v, 1);
    else ::unsetenv("GRADSYNC_TIMELINE");
  }
  ~env_timeline() { ::unsetenv("GRADSYNC_TIMELINE"); }
};

// An event's time in whole nanoseconds (the writer prints three decimals of µs).
long long ns(const json& v) { return std::llround(v.get<double>() * 1000.0); }

// The parsed trace: every complete event checked for the required fields.
std::vector<json> phases_of(const fs::path& file) {
  std::ifstream f(file);
  REQUIRE(f.good());
  const json doc = json::parse(f); // throws on invalid JSON
  REQUIRE(doc.contains("traceEvents"));
  REQUIRE(doc["traceEvents"].is_array());
  std::vector<json> out;
  for (const json& e : doc["traceEvents"]) {
    REQUIRE(e.contains("ph"));
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    REQUIRE(e["name"].is_string());
    if (e["ph"] == "M") continue; // track names
    CHECK(e["ph"] == "X");
    CHECK(e["cat"].is_string());
    CHECK(e["ts"].is_number());
    CHECK(e["dur"].is_number());
    CHECK(e["dur"].get<double>() >= 0);
    if (e.contains("args")) CHECK(e["args"].is_object());
    out.push_back(e);
  }
  return out;
}

// Runs fn on `p` ranks of a world tracing to a fresh file; returns its events.
template <class Fn> std::vector<json> traced_run(int p, Fn&& fn) {
  const scratch_dir d;
  const fs::path file = d.path / "trace.json";
  {
    auto w = std::make_shared<gradsync::inproc::world>(p);
    w->trace_to(file);
    gradsync::inproc::run(w, fn);
  } // the file is complete once the world is gone
  return phases_of(file);
}

// Rank r's events (tid r), the name -> count map, and its single call event `call`.
struct rank_events {
  std::vector<json> all;
  std::map<std::string, int> count;
  json call;
};
rank_events of_rank(const std::vector<json>& ev, int r, const std::string& call) {
  rank_events x;
  for (const json& e : ev)
    if (e["tid"] == r && e["pid"] == 0) {
      x.all.push_back(e);
      ++x.count[e["name"].get<std::string>()];
      if (e["name"] == call && e["cat"] == "call") x.call = e;
    }
  return x;
}

// Rank r's events, with exactly one call event `call` of `count` elements.
rank_events one_call(const std::vector<json>& ev, int r, const std::string& call, std::size_t count) {
  rank_events x = of_rank(ev, r, call);
  CHECK(x.count[call] == 1);
  REQUIRE(x.call.is_object());
  CHECK(x.call["args"]["count"] == count);
  return x;
}

// Every event of `x` lies inside its call event in time.
void check_nested(const rank_events& x) {
  const long long t0 = ns(x.call["ts"]), t1 = t0 + ns(x.call["dur"]);
  for (const json& e : x.all) {
    INFO(e.dump());
    CHECK(ns(e["ts"]) >= t0);
    CHECK(ns(e["ts"]) + ns(e["dur"]) <= t1);
  }
}

} // namespace

TEST_CASE("timeline: a ring allreduce on 4 ranks, its call, sends, receives, waits and reductions") {
  constexpr int p = 4;
  constexpr std::size_t n = 1000; // one segment per block
  const auto ev = traced_run(p, [&](communicator& c) {
    REQUIRE(c.trace() != nullptr);
    std::vector<float> x(n, static_cast<float>(c.rank() + 1));
    gradsync::allreduce(c, std::span(x), gradsync::op::sum{},
                        {.algo = gradsync::algorithm::ring, .verify = gradsync::verification::never});
    CHECK(x[n - 1] == 10.0f);
  });
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    rank_events x = one_call(ev, r, "allreduce", n);
    CHECK(x.call["args"]["bytes"] == n * sizeof(float));
    CHECK(x.call["args"]["algorithm"] == "ring");
    CHECK(x.call["args"]["call"].get<std::string>().find("allreduce of 1000 f32") == 0);
    // The ring: p-1 steps of reduce-scatter, p-1 of allgather, one send and
    // one receive each; every posted operation is waited for once; a
    // reduction at each reduce-scatter step (recv-reduce-send, then the last
    // recv-reduce-copy).
    CHECK(x.count["send"] == 2 * (p - 1));
    CHECK(x.count["recv"] == 2 * (p - 1));
    CHECK(x.count["wait"] == 4 * (p - 1));
    CHECK(x.count["reduce"] == p - 1);
    CHECK(x.count["verify"] == 0);
    CHECK(x.all.size() == 1 + 9 * (p - 1));
    check_nested(x);
    for (const json& e : x.all)
      if (e["name"] == "send") CHECK(e["args"]["bytes"] == n / p * sizeof(float));
  }
}

TEST_CASE("timeline: a verified tree allreduce has a verify phase; subgroups trace as their parent's rank") {
  constexpr int p = 3;
  const auto ev = traced_run(p, [&](communicator& c) {
    std::vector<double> x(7, 1.0);
    gradsync::allreduce(c, std::span(x), gradsync::op::sum{},
                        {.algo = gradsync::algorithm::tree, .verify = gradsync::verification::always});
    gradsync::subgroup<communicator> g(c, {0, 1, 2}, 1000);
    CHECK(g.trace() == c.trace());
    gradsync::barrier(g);
  });
  for (int r = 0; r < p; ++r) {
    rank_events x = of_rank(ev, r, "allreduce");
    CHECK(x.count["allreduce"] == 1);
    CHECK(x.count["verify"] == 2); // the allreduce's and the subgroup barrier's (every call checks)
    CHECK(x.count["barrier"] == 1);
    CHECK(x.count["wait"] == x.count["send"] + x.count["recv"]);
  }
}

TEST_CASE("timeline: compressed_allreduce with int8 records encodes and decodes inside its call") {
  constexpr int p = 4;
  constexpr std::size_t n = 4096; // one segment per block
  const auto ev = traced_run(p, [&](communicator& c) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i % 17) * 0.25 + c.rank());
    gradsync::compression z{.codec = gradsync::compress::parse_spec("int8"),
                            .algo = gradsync::compressed_algorithm::ring};
    gradsync::compress_state<float> st;
    gradsync::compressed_allreduce(c, std::span(g), z, st, gradsync::op::avg{},
                                   {.verify = gradsync::verification::never});
    CHECK(st.last.path == gradsync::compressed_path::ring);
  });
  for (int r = 0; r < p; ++r) {
    INFO("rank " << r);
    rank_events x = one_call(ev, r, "compressed_allreduce", n);
    // The compressed ring (one segment per block): p encodes (the step-0
    // send, p-2 re-encoded partial sums, the owner's block); decodes: p-1
    // received partial sums, p-1 gathered blocks, and with error feedback
    // one per encode (the owner's feedback pass also decodes its block).
    CHECK(x.count["encode"] == p);
    CHECK(x.count["decode"] == (p - 1) + (p - 1) + p);
    CHECK(x.count["reduce"] == 0);
    CHECK(x.count["wait"] == x.count["send"] + x.count["recv"]);
    check_nested(x);
  }
}

TEST_CASE("timeline: random-k and PowerSGD allreduces trace their codec work around the dense allreduces") {
  constexpr int p = 2;
  constexpr std::size_t n = 4096;
  struct want {
    const char* spec;
    gradsync::compressed_path path;
    int encodes, decodes, inner_calls; // inner: the dense allreduces of values or factors
  };
  // random-k: gather k values (encode), one dense allreduce, scatter (decode).
  // PowerSGD: P = M Q, then orthonormalise and Q = M^T P (two encodes), two
  // factor allreduces, the reconstruction (decode).
  for (const want w : {want{"randk:density=0.05", gradsync::compressed_path::randk, 1, 1, 1},
                       want{"powersgd:rank=2", gradsync::compressed_path::powersgd, 2, 1, 2}}) {
    INFO(w.spec);
    const auto ev = traced_run(p, [&](communicator& c) {
      std::vector<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i % 13) * 0.5 - c.rank());
      gradsync::compression z{.codec = gradsync::compress::parse_spec(w.spec)};
      gradsync::compress_state<float> st;
      gradsync::compressed_allreduce(c, std::span(g), z, st, gradsync::op::avg{},
                                     {.verify = gradsync::verification::never});
      CHECK(st.last.path == w.path);
    });
    for (int r = 0; r < p; ++r) {
      INFO("rank " << r);
      rank_events x = one_call(ev, r, "compressed_allreduce", n);
      CHECK(x.count["encode"] == w.encodes);
      CHECK(x.count["decode"] == w.decodes);
      CHECK(x.count["allreduce"] == w.inner_calls);
      for (const json& e : x.all)
        if (e["name"] == "encode" || e["name"] == "decode") CHECK(e["args"]["elements"].get<std::size_t>() <= n);
      check_nested(x);
    }
  }
}

TEST_CASE("timeline: grouped_allreduce packs and unpacks a bucket") {
  constexpr int p = 2;
  const auto ev = traced_run(p, [&](communicator& c) {
    std::vector<float> a(10, 1.0f), b(20, 2.0f), e(5, 3.0f);
    std::vector<std::span<float>> t{std::span(a), std::span(b), std::span(e)};
    gradsync::fusion::grouped_allreduce(c, t, gradsync::op::sum{}, {}, std::size_t{1} << 20, std::size_t{1} << 20);
    CHECK(b[19] == 4.0f);
  });
  for (int r = 0; r < p; ++r) {
    rank_events x = of_rank(ev, r, "allreduce");
    CHECK(x.count["pack"] == 1);
    CHECK(x.count["unpack"] == 1);
    CHECK(x.count["allreduce"] == 1);
    for (const json& e : x.all)
      if (e["name"] == "pack") {
        CHECK(e["args"]["tensors"] == 3);
        CHECK(ns(e["ts"]) + ns(e["dur"]) <= ns(x.call["ts"])); // before the call
      }
  }
}

TEST_CASE("timeline: names and arguments are escaped; the file is valid JSON") {
  scratch_dir d;
  const fs::path file = d.path / "names.json";
  const std::string odd = "a \"quoted\" back\\slash\nnew line\ttab \x01 end";
  {
    gradsync::timeline t(std::make_shared<gradsync::trace_file>(file), 7, 3, "track " + odd);
    const auto now = gradsync::timeline::clock::now();
    t.record(odd, "c\"at", now, now + std::chrono::microseconds(5), gradsync::trace_args{}(odd, odd)("n", -3));
  }
  std::ifstream f(file);
  const json doc = json::parse(f);
  bool seen = false, named = false;
  for (const json& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") named = e["args"]["name"] == "track " + odd;
    if (e["ph"] != "X") continue;
    seen = true;
    CHECK(e["name"] == odd);
    CHECK(e["cat"] == "c\"at");
    CHECK(e["args"][odd] == odd);
    CHECK(e["args"]["n"] == -3);
    CHECK(e["pid"] == 7);
    CHECK(e["tid"] == 3);
    CHECK(ns(e["dur"]) == 5000);
  }
  CHECK(seen);
  CHECK(named);
}

TEST_CASE("timeline: tracing off writes nothing and costs no timeline") {
  scratch_dir d;
  {
    const env_timeline unset(nullptr);
    auto w = std::make_shared<gradsync::inproc::world>(3);
    CHECK(w->trace() == nullptr);
    gradsync::inproc::run(w, [](communicator& c) {
      CHECK(c.trace() == nullptr);
      std::vector<int> x(100, 1);
      gradsync::allreduce(c, std::span(x));
    });
  }
  { // on from the environment, then switched off before any rank exists
    const env_timeline set((d.path / "off.json").c_str());
    auto w = std::make_shared<gradsync::inproc::world>(2);
    CHECK(w->trace() != nullptr);
    w->trace_to({});
    gradsync::inproc::run(w, [](communicator& c) {
      CHECK(c.trace() == nullptr);
      gradsync::barrier(c);
    });
  }
  { // a trace with no events writes no file
    gradsync::trace_file f(d.path / "empty.json");
    f.close();
  }
  CHECK(d.files() == 0);
}

TEST_CASE("timeline: GRADSYNC_TIMELINE names the file; %r and .rank<r> for processes") {
  scratch_dir d;
  const fs::path file = d.path / "env.json";
  {
    const env_timeline set(file.c_str());
    gradsync::inproc::run(2, [](communicator& c) {
      REQUIRE(c.trace() != nullptr);
      CHECK(c.trace()->tid() == c.rank());
      gradsync::barrier(c);
    });
  }
  const auto ev = phases_of(file);
  CHECK(of_rank(ev, 0, "barrier").count["barrier"] == 1);
  CHECK(of_rank(ev, 1, "barrier").count["barrier"] == 1);

  using gradsync::timeline;
  CHECK(timeline::path_of("t.%r.json", 2, 4) == "t.2.json");
  CHECK(timeline::path_of("t%r-%r", 13, 16) == "t13-13");
  CHECK(timeline::path_of("t.json", 1, 4) == "t.json.rank1");
  CHECK(timeline::path_of("t.json", 0, 1) == "t.json");
  CHECK(timeline::open("", 0, 1) == nullptr);
  const auto t = timeline::open((d.path / "p%r.json").string(), 3, 4);
  REQUIRE(t != nullptr);
  CHECK(t->pid() == 3);
  CHECK(t->file().path() == d.path / "p3.json");
  CHECK_THROWS_AS(gradsync::trace_file(d.path / "no-such-dir" / "x.json"), gradsync::error);
}
