#pragma once
/// \file gemm/detail/host.hpp
/// gemm_algo::host_packed (placeholder: runs the direct path until the packed kernels land).

#include <tessera/gemm/detail/reference.hpp>

namespace tessera::detail {

template <class Exec, class Prob>
float gemm_host(const Exec& exec, const Prob& pr) {
  return gemm_direct(exec, pr);
}

} // namespace tessera::detail
