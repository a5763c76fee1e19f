#pragma once
// What a call throws, for tests of tessera's error messages.

#include <catch2/catch.hpp>

#include <exception>
#include <initializer_list>
#include <string>
#include <vector>

namespace tessera::testing {

/// The message of the E that f throws, or a text saying what happened instead (which no
/// expected message contains): another exception, or none.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<another exception: ") + e.what() + ">";
  }
  return "<no exception>";
}

/// Matches an exception whose what() contains every one of the strings.
struct what_contains : Catch::MatcherBase<std::exception> {
  std::vector<std::string> parts;
  what_contains(std::initializer_list<std::string> p) : parts(p) {}
  bool match(const std::exception& e) const override {
    const std::string w = e.what();
    for (const auto& s : parts)
      if (w.find(s) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string d = "has a message containing";
    for (const auto& s : parts) d += " \"" + s + "\"";
    return d;
  }
};

} // namespace tessera::testing
