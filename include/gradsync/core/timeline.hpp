// gradsync: the timeline. A communicator that has one (GRADSYNC_TIMELINE=FILE
// when it is made, or one given to it) records every collective call and its
// phases: the call itself, transport sends, receives and waits, reductions,
// codec encodes and decodes, fusion packing. They are written as Chrome trace
// JSON (the Trace Event Format: complete "X" events, timestamps and durations
// in microseconds), which Perfetto (ui.perfetto.dev) and chrome://tracing show
// as one track per rank.
//
// The pieces: a trace_file (one JSON file, shared by the timelines writing to
// it, thread-safe), a timeline (one rank's track in it: pid and tid), and
// scoped_phase, which records the time from its construction to its
// destruction. Nothing is global: the communicator owns its timeline, and
// where it has none a phase is one null-pointer test on entry and one on exit.
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "error.hpp"

namespace gradsync {

namespace detail {

// Appends `s` as a JSON string literal: quotes, backslashes and control
// characters escaped (other bytes pass through as they are).
inline void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += ch;
    } else if (u < 0x20) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += ch;
    }
  }
  out += '"';
}

// Microseconds since the steady clock's epoch, with nanosecond digits. The
// clock is CLOCK_MONOTONIC on Linux, the same in every process of a machine,
// so the files of one machine's ranks line up when merged.
inline void json_micros(std::string& out, std::chrono::steady_clock::duration d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  char b[32];
  const int n = std::snprintf(b, sizeof b, "%lld.%03lld", static_cast<long long>(ns / 1000),
                              static_cast<long long>(ns % 1000));
  out.append(b, static_cast<std::size_t>(n > 0 ? n : 0));
}

} // namespace detail

/// The arguments of one trace event, written as a JSON object; chained:
/// `a("peer", 3)("bytes", n)`.
class trace_args {
public:
  trace_args& operator()(std::string_view key, std::string_view value) {
    next(key);
    detail::json_string(s_, value);
    return *this;
  }
  trace_args& operator()(std::string_view key, const char* value) { return (*this)(key, std::string_view(value)); }
  template <std::integral I> trace_args& operator()(std::string_view key, I value) {
    next(key);
    s_ += std::to_string(value);
    return *this;
  }
  /// `{...}`, or empty when there are none.
  std::string json() const { return s_.empty() ? std::string() : s_ + "}"; }

private:
  void next(std::string_view key) {
    s_ += s_.empty() ? '{' : ',';
    detail::json_string(s_, key);
    s_ += ':';
  }
  std::string s_;
};

/// One Chrome trace file, written as events arrive (buffered) by every
/// timeline that shares it. The file is created by the first event (a trace
/// without events writes nothing) and is valid JSON once close() returned;
/// the destructor closes it. Two trace_files must not name one path.
class trace_file {
public:
  /// A trace to `path` (its directory must exist).
  explicit trace_file(std::filesystem::path path) : path_(std::move(path)) {
    const auto dir = path_.parent_path();
    std::error_code ec;
    GRADSYNC_REQUIRE(dir.empty() || std::filesystem::is_directory(dir, ec), "timeline", -1,
                     "the directory of timeline file " + path_.string() + " does not exist");
  }
  trace_file(const trace_file&) = delete;
  trace_file& operator=(const trace_file&) = delete;
  ~trace_file() {
    try {
      close();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "gradsync: %s\n", e.what()); // a destructor cannot raise it
    }
  }

  const std::filesystem::path& path() const noexcept { return path_; }

  /// Appends one event (a JSON object). Never throws: a failure to write is
  /// kept and raised by close(); later events are dropped.
  void add(std::string_view event) noexcept {
    std::lock_guard g(m_);
    if (closed_ || !error_.empty()) return;
    try {
      buf_ += events_++ ? ",\n" : "{\"traceEvents\":[\n";
      buf_ += event;
      if (buf_.size() >= flush_bytes) write();
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  }

  /// Writes what is buffered (the file stays open for more events).
  void flush() {
    std::lock_guard g(m_);
    write();
    raise();
  }

  /// Writes the rest and ends the JSON document; later events are dropped.
  /// Throws an errc::internal error if any write failed.
  void close() {
    std::lock_guard g(m_);
    if (closed_) return;
    closed_ = true;
    if (events_ != 0 && error_.empty()) {
      buf_ += "\n]}\n";
      write();
      if (out_.is_open()) out_.close();
      if (out_.fail() && error_.empty()) error_ = "cannot write " + path_.string();
    }
    raise();
  }

private:
  static constexpr std::size_t flush_bytes = std::size_t{1} << 20;

  void write() {
    if (buf_.empty() || !error_.empty()) return;
    if (!out_.is_open()) {
      out_.open(path_, std::ios::binary | std::ios::trunc);
      if (!out_) {
        error_ = "cannot open " + path_.string();
        return;
      }
    }
    out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    if (!out_) error_ = "cannot write " + path_.string();
    buf_.clear();
  }
  void raise() const {
    if (!error_.empty()) throw error(errc::internal, "timeline", -1, -1, error_);
  }

  std::mutex m_;
  std::filesystem::path path_;
  std::ofstream out_;
  std::string buf_;
  std::size_t events_ = 0;
  std::string error_;
  bool closed_ = false;
};

/// One rank's track in a trace file: its events carry `pid` and `tid`, and
/// the viewer names the track `name`. Thread-safe (the file serialises).
class timeline {
public:
  using clock = std::chrono::steady_clock;

  timeline(std::shared_ptr<trace_file> file, int pid, int tid, std::string name)
      : file_(std::move(file)), pid_(pid), tid_(tid), name_(std::move(name)) {
    GRADSYNC_REQUIRE(file_ != nullptr, "timeline", tid, "null trace file");
  }

  /// The file `spec` names for rank `rank` of `size` ranks, each its own
  /// process (shm, MPI): `%r` in it becomes the rank; without one, more than
  /// one rank appends `.rank<r>`.
  static std::string path_of(std::string_view spec, int rank, int size) {
    std::string p(spec);
    const std::string r = std::to_string(rank);
    bool any = false;
    for (std::size_t at = p.find("%r"); at != std::string::npos; at = p.find("%r", at + r.size())) {
      p.replace(at, 2, r);
      any = true;
    }
    if (!any && size > 1) p += ".rank" + r;
    return p;
  }
  /// The timeline of such a rank on the file `spec` names (pid: the rank);
  /// null for an empty spec.
  static std::unique_ptr<timeline> open(std::string_view spec, int rank, int size) {
    if (spec.empty()) return nullptr;
    return std::make_unique<timeline>(std::make_shared<trace_file>(path_of(spec, rank, size)), rank, 0,
                                      "rank " + std::to_string(rank));
  }
  /// GRADSYNC_TIMELINE (empty or unset: none), read now.
  static std::string_view env_spec() {
    const char* v = std::getenv("GRADSYNC_TIMELINE");
    return v ? std::string_view(v) : std::string_view();
  }
  /// open(env_spec(), rank, size).
  static std::unique_ptr<timeline> from_env(int rank, int size) { return open(env_spec(), rank, size); }

  /// Records the phase `name` of category `cat` over [start, end).
  void record(std::string_view name, std::string_view cat, clock::time_point start, clock::time_point end,
              const trace_args& args = {}) noexcept {
    try {
      if (!named_.exchange(true)) name_track();
      std::string e = "{\"name\":";
      detail::json_string(e, name);
      e += ",\"cat\":";
      detail::json_string(e, cat);
      e += ",\"ph\":\"X\",\"ts\":";
      detail::json_micros(e, start.time_since_epoch());
      e += ",\"dur\":";
      detail::json_micros(e, end - start);
      ids(e);
      if (const std::string a = args.json(); !a.empty()) e += ",\"args\":" + a;
      e += '}';
      file_->add(e);
    } catch (...) { // out of memory: the event is lost, the program goes on
    }
  }

  trace_file& file() const noexcept { return *file_; }
  int pid() const noexcept { return pid_; }
  int tid() const noexcept { return tid_; }

private:
  void ids(std::string& e) const { e += ",\"pid\":" + std::to_string(pid_) + ",\"tid\":" + std::to_string(tid_); }
  // The viewer's names for this track (metadata events, before its first phase).
  void name_track() {
    for (const auto& [kind, value] : {std::pair<const char*, std::string_view>{"process_name", "gradsync"},
                                      {"thread_name", name_}}) {
      std::string e = "{\"name\":\"" + std::string(kind) + "\",\"ph\":\"M\"";
      ids(e);
      e += ",\"args\":" + trace_args{}("name", value).json() + "}";
      file_->add(e);
    }
  }

  std::shared_ptr<trace_file> file_;
  int pid_, tid_;
  std::string name_;
  std::atomic<bool> named_{false};
};

/// No arguments for a phase.
struct no_trace_args {
  void operator()(trace_args&) const noexcept {}
};

/// Records the time from its construction to its destruction as phase
/// `name` (category `cat`) on timeline `t`; with a null `t` it does nothing
/// at all. `args(a)` fills the event's arguments; it runs only when
/// recording, at the end of the phase. A phase left by an exception says so
/// (argument "unwound").
template <class Args = no_trace_args> class scoped_phase {
public:
  scoped_phase(timeline* t, const char* name, const char* cat, Args args = {}) noexcept(
      std::is_nothrow_move_constructible_v<Args>)
      : t_(t), name_(name), cat_(cat), args_(std::move(args)) {
    if (t_) {
      unwinding_ = std::uncaught_exceptions();
      t0_ = timeline::clock::now();
    }
  }
  scoped_phase(const scoped_phase&) = delete;
  scoped_phase& operator=(const scoped_phase&) = delete;
  ~scoped_phase() {
    if (!t_) return;
    const auto t1 = timeline::clock::now();
    try {
      trace_args a;
      args_(a);
      if (std::uncaught_exceptions() > unwinding_) a("unwound", 1);
      t_->record(name_, cat_, t0_, t1, a);
    } catch (...) { // out of memory: the event is lost
    }
  }

private:
  timeline* t_;
  const char* name_;
  const char* cat_;
  Args args_;
  int unwinding_ = 0;
  timeline::clock::time_point t0_{};
};

/// A phase over `n` elements (its argument "elements").
inline auto element_phase(timeline* t, const char* name, const char* cat, std::size_t n) noexcept {
  return scoped_phase(t, name, cat, [n](trace_args& a) { a("elements", n); });
}

/// The arguments of posting a message: peer, bytes, tag.
inline auto message_args(int peer, std::size_t bytes, int tag) noexcept {
  return [=](trace_args& a) { a("peer", peer)("bytes", bytes)("tag", tag); };
}
/// The arguments of waiting for a posted operation (`op`: "inproc.send", ...).
inline auto wait_args(int peer, const char* op) noexcept {
  return [=](trace_args& a) { a("peer", peer)("for", op); };
}

} // namespace gradsync
