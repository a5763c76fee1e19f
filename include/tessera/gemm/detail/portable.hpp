#pragma once
/// \file gemm/detail/portable.hpp
/// gemm_algo::portable (placeholder: runs the direct path until the team-tiled kernel lands).

#include <tessera/gemm/detail/reference.hpp>

namespace tessera::detail {

template <class Exec, class Prob>
float gemm_portable(const Exec& exec, const Prob& pr) {
  return gemm_direct(exec, pr);
}

} // namespace tessera::detail
