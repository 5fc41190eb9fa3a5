// The timeline of one forked shm rank (one track per file), grouped by call,
// for tests that check which phases a given call recorded.
#pragma once

#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

namespace trace_test {

/// One call event and the names of the phase events recorded for it.
struct traced_call {
  std::string name;
  std::set<std::string> phases;
};

/// The file's whole text.
inline std::string read_all(const std::string& path) {
  std::ifstream f(path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// The calls of a one-track trace in call order. Events are written as they
/// end, so a call's phases are the events between the previous call's event
/// and its own.
inline std::vector<traced_call> calls_of(const std::string& s) {
  static const std::string start = "{\"name\":\"";
  std::vector<traced_call> out;
  std::set<std::string> pending;
  // the next event's start, not an argument object (`"args":{"name":...`)
  auto event_at = [&](std::size_t from) {
    std::size_t at = s.find(start, from);
    while (at != std::string::npos && at >= 7 && s.compare(at - 7, 7, "\"args\":") == 0) at = s.find(start, at + 1);
    return at;
  };
  for (std::size_t at = event_at(0); at != std::string::npos;) {
    const std::size_t next = event_at(at + 1);
    const std::string ev = s.substr(at, next == std::string::npos ? std::string::npos : next - at);
    const std::string name = ev.substr(start.size(), ev.find('"', start.size()) - start.size());
    if (ev.find("\"ph\":\"M\"") != std::string::npos) { // a track name, not an event
    } else if (ev.find("\"cat\":\"call\"") != std::string::npos) {
      out.push_back({name, std::move(pending)});
      pending.clear();
    } else {
      pending.insert(name);
    }
    at = next;
  }
  return out;
}

/// The calls' names, space-separated (for failure messages).
inline std::string names_of(const std::vector<traced_call>& calls) {
  std::string out;
  for (const auto& c : calls) out += (out.empty() ? "" : " ") + c.name;
  return out;
}

} // namespace trace_test
