#pragma once
// The Kokkos command line of the training examples: the program name and, for --threads N > 0,
// Kokkos' thread-count flag, spelt --kokkos-threads=N on 3.x and --kokkos-num-threads=N from
// 4.0 (tessera/config/kokkos_compat.hpp's TESSERA_KOKKOS_4). Shared by
// examples/train_fashion_mnist.cpp and examples/train_char_gpt.cpp:
//
//   examples::kokkos_args kargs(argv[0], o.threads);
//   Kokkos::ScopeGuard kokkos(kargs.argc, kargs.argv());
#include <tessera/config/kokkos_compat.hpp>

#include <string>
#include <vector>

namespace examples {

class kokkos_args {
public:
  /// threads 0: Kokkos' default (no flag).
  kokkos_args(const char* program, int threads) : args_{program ? program : ""} {
    if (threads > 0)
#if TESSERA_KOKKOS_4
      args_.push_back("--kokkos-num-threads=" + std::to_string(threads));
#else
      args_.push_back("--kokkos-threads=" + std::to_string(threads));
#endif
    for (auto& s : args_) ptrs_.push_back(s.data());
    argc = static_cast<int>(ptrs_.size());
  }
  kokkos_args(const kokkos_args&) = delete; // ptrs_ point into args_
  kokkos_args& operator=(const kokkos_args&) = delete;

  /// Kokkos::initialize / ScopeGuard take argc by reference and may rewrite argc / argv.
  int argc = 0;
  char** argv() noexcept {
    return ptrs_.data();
  }

private:
  std::vector<std::string> args_;
  std::vector<char*> ptrs_;
};

} // namespace examples
