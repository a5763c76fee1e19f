// What the training examples instantiate: the whole set by default, a reduced set in a build
// configured with -DTESSERA_EXAMPLES_REDUCED=ON (scripts/portability.sh quick uses it for its
// clang and HIP proof builds, which only prove that the examples compile; scripts/test.sh and
// the "full" portability run build the whole set). Reduced, the examples still compile every
// precision and every code path of their plans (a tensor and a pipeline degree of 1 and of 2),
// but leave out the repetitions of the same code for other constants:
//   - plan degrees: 1 and 2 (not 4) for --plan tensor=T,pipeline=P (4 plans instead of 9);
//   - train_char_gpt: the default model size (width 128, heads 4) and the vocabulary bound
//     128 only (the fortunes corpus has 114 distinct bytes).
// What a reduced build leaves out is refused at run time with a message naming the option.
#pragma once

#include <tessera/config/error.hpp>

#include <string>
#include <type_traits>

namespace examples {

#if defined(TESSERA_EXAMPLES_REDUCED)
inline constexpr bool reduced_build = true;
#else
inline constexpr bool reduced_build = false;
#endif

/// The refusal of something a reduced build does not compile: "<what>: not compiled in this
/// build (configured with TESSERA_EXAMPLES_REDUCED=ON, ...)".
inline tessera::value_error not_in_reduced_build(const std::string& what) {
  return tessera::value_error(what +
                              ": not compiled in this build (configured with "
                              "TESSERA_EXAMPLES_REDUCED=ON, which compiles plan degrees 1 and 2 "
                              "and train_char_gpt's default size and vocabulary bound 128 only)");
}

/// f(std::integral_constant<int, T>{}, std::integral_constant<int, P>{}) for the run-time
/// tensor degree T and pipeline degree P, each one of 1, 2, 4 (the parser's plan_degrees); a
/// reduced build instantiates 1 and 2 only and refuses 4 (`who` names the program).
template <class F>
decltype(auto) with_plan_degrees(const char* who, int tensor, int pipeline, F&& f) {
  const auto one = [&](int v, auto&& g) -> decltype(auto) {
    if constexpr (!reduced_build)
      if (v == 4) return g(std::integral_constant<int, 4>{});
    if (v == 4)
      throw not_in_reduced_build(std::string(who) +
                                 " --plan with a tensor or pipeline degree of 4");
    if (v == 2) return g(std::integral_constant<int, 2>{});
    return g(std::integral_constant<int, 1>{});
  };
  return one(tensor, [&](auto t) -> decltype(auto) {
    return one(pipeline, [&](auto p) -> decltype(auto) { return f(t, p); });
  });
}

} // namespace examples
