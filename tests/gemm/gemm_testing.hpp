#pragma once
// Shared by the gemm tests: matrices of any precision stored in any form (row-major, transposed,
// padded leading dimension, offset into a bigger allocation) in any memory space, together with
// their values as doubles; the configurations every test is instantiated over (execution space x
// algorithm, each space's operands in its own memory: the host spaces, and the device space in a
// device build); host reads of results through host copies; the comparison against the double
// reference with the bound of tests/support/tolerance.hpp; and the random shapes of issue 3.
#include "support/exec_spaces.hpp"
#include "support/host_access.hpp"
#include "support/reference_gemm.hpp"
#include "support/tolerance.hpp"

#include <tessera/gemm.hpp>

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace tessera::testing {

using host_space = Kokkos::HostSpace;

// ---------------------------------------------------------------------------------------------
// Configurations: each test is written once and instantiated over these.

/// A name for each algorithm tag (for failure messages).
template <class Tag>
constexpr const char* algo_name() {
  if constexpr (std::is_same_v<Tag, gemm_algo::automatic>)
    return "automatic";
  else if constexpr (std::is_same_v<Tag, gemm_algo::host_packed>)
    return "host_packed";
  else if constexpr (std::is_same_v<Tag, gemm_algo::portable>)
    return "portable";
  else if constexpr (std::is_same_v<Tag, gemm_algo::direct>)
    return "direct";
  else
    return "reference";
}

/// One execution space and one algorithm tag: run() and run_batched() call tessera::gemm and
/// tessera::gemm_batched with that tag on a default instance of the space, and return what they
/// return (the amax of a scaled output). The operands live in memory_space, the space's own.
template <class Exec, class Algo>
struct gemm_config {
  using exec_space = Exec;
  using memory_space = typename Exec::memory_space;
  using algo = Algo;
  static std::string name() { return std::string(Exec::name()) + "/" + algo_name<Algo>(); }
  template <class A, class B, class C, class O = gemm_options>
  static float run(const A& a, const B& b, const C& c, const O& opts = {}) {
    return tessera::gemm(Algo{}, Exec{}, a, b, c, opts);
  }
  template <class A, class B, class C, class O = gemm_options>
  static float run_batched(const A& a, const B& b, const C& c, const O& opts = {}) {
    return tessera::gemm_batched(Algo{}, Exec{}, a, b, c, opts);
  }
};

/// The memory space a configuration's operands live in: Config::memory_space, or host memory
/// for a runner without one (test_gemm_blocking's, which calls the host GEMM's driver).
template <class Config>
struct config_memory {
  using type = host_space;
};
template <class Config>
requires requires {
  typename Config::memory_space;
}
struct config_memory<Config> {
  using type = typename Config::memory_space;
};
template <class Config>
using memory_of = typename config_memory<Config>::type;

/// gemm_config<S, Algo> for every space S of the tuple Spaces.
template <class Algo, class Spaces>
struct configs_over;
template <class Algo, class... S>
struct configs_over<Algo, std::tuple<S...>> {
  using type = std::tuple<gemm_config<S, Algo>...>;
};
/// The device execution space of a device build (HIP, CUDA, SYCL); none on a host build.
using device_exec_spaces =
    std::conditional_t<is_host_execution_space_v<Kokkos::DefaultExecutionSpace>, std::tuple<>,
                       std::tuple<Kokkos::DefaultExecutionSpace>>;
template <class Algo>
using on_host_spaces = typename configs_over<Algo, host_execution_spaces>::type;
template <class Algo>
using on_device_space = typename configs_over<Algo, device_exec_spaces>::type;
template <class... Tuples>
using cat_t = decltype(std::tuple_cat(std::declval<Tuples>()...));

/// Every enabled Kokkos host backend (Serial, OpenMP, Threads, HPX: whichever this Kokkos has)
/// x the algorithms that matter on a host: automatic (what users get), host_packed forced (also
/// on the small sizes automatic would send to direct) and portable (the any-space algorithm,
/// tested here on the host); and, in a device build, automatic on the device space (which is
/// the portable algorithm there), its operands in device memory.
using main_configs =
    cat_t<on_host_spaces<gemm_algo::automatic>, on_host_spaces<gemm_algo::host_packed>,
          on_host_spaces<gemm_algo::portable>, on_device_space<gemm_algo::automatic>>;

/// main_configs plus direct forced (also on large sizes) and the reference baseline, on the
/// threaded host backend and on the device space (direct's generic loop, the one a device runs).
using all_configs =
    cat_t<main_configs,
          std::tuple<gemm_config<threaded_host_space, gemm_algo::direct>,
                     gemm_config<threaded_host_space, gemm_algo::reference>>,
          on_device_space<gemm_algo::direct>, on_device_space<gemm_algo::reference>>;

/// The host algorithms (automatic, host_packed, direct) and the portable one, separately: the
/// low-precision tests instantiate 16 precision pairs per configuration, so they are split into
/// one program per group to keep each translation unit's build time modest. The portable group
/// runs on every enabled space, the device space included.
using host_configs =
    cat_t<on_host_spaces<gemm_algo::automatic>, on_host_spaces<gemm_algo::host_packed>,
          std::tuple<gemm_config<threaded_host_space, gemm_algo::direct>>>;
using portable_configs =
    cat_t<on_host_spaces<gemm_algo::portable>, on_device_space<gemm_algo::portable>>;

// ---------------------------------------------------------------------------------------------
// Matrices.

/// How an operand is stored and passed.
struct matrix_form {
  bool transposed = false; ///< stored as its transpose and passed as transpose(view)
  index_t pad = 0;         ///< leading dimension = stored row length + pad
  index_t offset = 0;      ///< the view starts this many elements into its allocation

  std::string str() const {
    std::ostringstream s;
    s << (transposed ? "T" : "N") << "(pad " << pad << ", offset " << offset << ")";
    return s.str();
  }
};

template <Precision P, class Mem = host_space>
using strided_matrix_view = TensorView<P, dextents<2>, layout_stride, Mem>;

/// The (rows, cols) matrix stored in the given form in the allocation that starts at base.
template <Precision P, class Mem>
strided_matrix_view<P, Mem> matrix_in(storage_t<P>* base, index_t rows, index_t cols,
                                      const matrix_form& form) {
  const index_t sr = form.transposed ? cols : rows, sc = form.transposed ? rows : cols;
  const strided_matrix_view<P, Mem> stored(base + form.offset, dextents<2>(sr, sc),
                                           {sc + form.pad, 1});
  return form.transposed ? transpose(stored) : stored;
}

/// A (rows, cols) matrix of precision P in memory space Mem: the allocation, a strided view of
/// the matrix inside it, and the matrix's values widened to double (row-major). Every element of
/// the allocation outside the matrix holds NaN, so a kernel that reads outside the operand
/// poisons its result and one that writes outside it is caught by changed_outside().
template <Precision P, class Mem = host_space>
struct test_matrix {
  using memory_space = Mem;
  Tensor<P, dextents<1>, layout_right, Mem> storage;
  strided_matrix_view<P, Mem> view;
  matrix_form form;
  dmatrix values;

  index_t rows() const { return view.extent(0); }
  index_t cols() const { return view.extent(1); }
  /// True if storage element s lies inside the matrix.
  bool covers(index_t s) const {
    const index_t stored_cols = form.transposed ? rows() : cols();
    const index_t ld = stored_cols + form.pad;
    if (s < form.offset) return false;
    const index_t r = (s - form.offset) / ld, c = (s - form.offset) % ld;
    return c < stored_cols && r < (form.transposed ? cols() : rows());
  }
  /// Sets elements on the host: f(v) gets the matrix as a host view (of the allocation itself
  /// when the host can reach it, else of a host copy written back afterwards). values is not
  /// changed.
  template <class F>
  void modify(F&& f) const {
    const auto h = host_mirror_copy(storage);
    f(matrix_in<P, host_space>(h.data(), rows(), cols(), form));
    copy_from_host(storage, h);
  }
};
template <Precision P>
using host_matrix = test_matrix<P, host_space>;

template <Precision P>
storage_t<P> nan_of() {
  return from_float<P, overflow_to_inf_nan>(std::numeric_limits<float>::quiet_NaN());
}

/// A matrix in memory space Mem with elements uniform in [lo, hi) rounded to P (counter-based:
/// element (i, j) depends only on seed, i and j), stored in the given form; filled on the host
/// and copied to Mem. With nan_values, the matrix's own elements are NaN too (a C that beta == 0
/// must ignore).
template <Precision P, class Mem = host_space>
test_matrix<P, Mem> make_matrix(index_t rows, index_t cols, matrix_form form, std::uint64_t seed,
                                float lo = -1.f, float hi = 1.f, bool nan_values = false) {
  const index_t sr = form.transposed ? cols : rows, sc = form.transposed ? rows : cols;
  // 3 trailing elements of margin catch a kernel that writes just past the last row.
  const index_t size = form.offset + sr * (sc + form.pad) + 3;
  test_matrix<P, Mem> m;
  m.form = form;
  m.storage = decltype(m.storage)::uninitialized("matrix", dextents<1>(size));
  m.view = matrix_in<P, Mem>(m.storage.data(), rows, cols, form);
  m.values = dmatrix(rows, cols);
  const auto h = host_mirror(m.storage);
  for (index_t s = 0; s < size; ++s) h.data()[s] = nan_of<P>();
  const auto hv = matrix_in<P, host_space>(h.data(), rows, cols, form);
  const counter_rng rng{seed, 7};
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const float u = rng.uniform01(static_cast<std::uint64_t>(i * cols + j));
      const storage_t<P> x = nan_values ? nan_of<P>() : from_float<P, saturate>(lo + (hi - lo) * u);
      hv(i, j) = x;
      m.values(i, j) = to_float(x);
    }
  copy_from_host(m.storage, h);
  return m;
}

/// A bitwise copy of a matrix's allocation (to check what a call changed).
template <Precision P, class Mem>
std::vector<unsigned char> snapshot(const test_matrix<P, Mem>& m) {
  return bytes_of(m.storage);
}

/// The number of allocation elements outside the matrix whose bits differ from the snapshot.
template <Precision P, class Mem>
index_t changed_outside(const test_matrix<P, Mem>& m, const std::vector<unsigned char>& before) {
  const auto now = bytes_of(m.storage);
  constexpr std::size_t e = sizeof(storage_t<P>);
  index_t changed = 0;
  for (index_t s = 0; s < m.storage.size(); ++s)
    if (!m.covers(s) && std::memcmp(before.data() + s * e, now.data() + s * e, e) != 0) ++changed;
  return changed;
}

/// True if the matrix's allocation is bit-identical to the snapshot (nothing written).
template <Precision P, class Mem>
bool unchanged(const test_matrix<P, Mem>& m, const std::vector<unsigned char>& before) {
  return same_bytes(m.storage, before);
}

/// The elements of a view of rank 1 to 3 in any memory space, in row-major order of its
/// extents, read after every kernel writing them: directly when the host can reach its memory,
/// else gathered by a kernel on the memory's execution space and copied to the host.
template <class V>
std::vector<typename V::storage_type> elements_of(const V& v) {
  using S = typename V::storage_type;
  using M = typename V::memory_space;
  constexpr std::size_t rank = V::extents_type::rank;
  static_assert(rank >= 1 && rank <= 3, "elements_of: views of rank 1 to 3");
  const index_t e1 = rank > 1 ? v.extent(1) : 1, e2 = rank > 2 ? v.extent(2) : 1;
  const index_t n = v.size();
  const auto at = KOKKOS_LAMBDA(const index_t f)->S& {
    if constexpr (rank == 1) {
      return v(f);
    } else if constexpr (rank == 2) {
      return v(f / e1, f % e1);
    } else {
      return v(f / (e1 * e2), f / e2 % e1, f % e2);
    }
  };
  std::vector<S> out(static_cast<std::size_t>(n));
  if constexpr (is_host_accessible_v<M>) {
    Kokkos::fence();
    for (index_t f = 0; f < n; ++f) out[static_cast<std::size_t>(f)] = at(f);
  } else {
    Kokkos::View<S*, M> d("tessera::testing::elements_of", static_cast<std::size_t>(n));
    Kokkos::parallel_for(
        "tessera::testing::elements_of", Kokkos::RangePolicy<typename M::execution_space>(0, n),
        KOKKOS_LAMBDA(const index_t f) { d(f) = at(f); });
    const auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, d);
    for (index_t f = 0; f < n; ++f) out[static_cast<std::size_t>(f)] = h(f);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

/// The elements of any rank-2 tensor or view in any memory space, widened to double.
template <class T>
dmatrix to_dmatrix(const T& t) {
  if constexpr (is_tensor<T>::value) {
    return to_dmatrix(t.view());
  } else {
    const auto e = elements_of(t);
    dmatrix d(t.extent(0), t.extent(1));
    for (std::size_t f = 0; f < e.size(); ++f) d.v[f] = to_float(e[f]);
    return d;
  }
}

/// Checks every element of a result stored in precision PC against the reference with the bound
/// of tests/support/tolerance.hpp for inner dimension k; reports the first few misses. Returns
/// the number of misses.
template <Precision PC>
index_t check_against_reference(const std::string& what, const dmatrix& got,
                                const gemm_reference& ref, index_t k) {
  REQUIRE(got.rows == ref.value.rows);
  REQUIRE(got.cols == ref.value.cols);
  index_t bad = 0;
  for (index_t i = 0; i < got.rows; ++i)
    for (index_t j = 0; j < got.cols; ++j) {
      const double want = saturated<PC>(ref.value(i, j));
      const double tol = gemm_error_bound<PC>(ref.value(i, j), ref.abs(i, j), k);
      const double diff = std::abs(got(i, j) - want);
      if (!(diff <= tol)) {
        if (bad < 5)
          UNSCOPED_INFO(what << ": C(" << i << ", " << j << ") = " << got(i, j) << ", reference "
                             << want << ", |diff| " << diff << " > bound " << tol);
        ++bad;
      }
    }
  if (bad) UNSCOPED_INFO(what << ": " << bad << " of " << got.rows * got.cols << " elements off");
  return bad;
}

// ---------------------------------------------------------------------------------------------
// Shapes.

/// The sizes issue 3 asks for on every axis.
inline const std::vector<index_t>& issue_sizes() {
  static const std::vector<index_t> s = {1,  2,  3,  7,  8,   15,  16,  17,  31,
                                         33, 63, 64, 65, 127, 255, 257, 1000};
  return s;
}

/// A random element of the issue's sizes below `below`.
inline index_t random_size(std::mt19937_64& rng, index_t below = 1000) {
  const auto& s = issue_sizes();
  for (;;) {
    const index_t v = s[std::uniform_int_distribution<std::size_t>(0, s.size() - 1)(rng)];
    if (v < below) return v;
  }
}

/// A random operand form: transposed or not, and (half the time) a padded leading dimension
/// and an offset into the allocation.
inline matrix_form random_form(std::mt19937_64& rng, bool transposed) {
  matrix_form f;
  f.transposed = transposed;
  if (std::uniform_int_distribution<int>(0, 1)(rng)) {
    f.pad = std::uniform_int_distribution<index_t>(1, 9)(rng);
    f.offset = std::uniform_int_distribution<index_t>(0, 5)(rng);
  }
  return f;
}

/// The 16 precision pairs (A, B).
template <class A, class B>
struct precision_pair {
  using a = A;
  using b = B;
};

/// Calls f(precision_pair<A, B>{}) for every A, B of tessera::known_precisions.
template <class F>
void for_each_precision_pair(F&& f) {
  for_each_precision(
      [&]<class A>(A) { for_each_precision([&]<class B>(B) { f(precision_pair<A, B>{}); }); });
}

/// "M 7, N 3, K 1000, A T(pad 2, offset 1), ...": a case's description for failure messages.
inline std::string describe(index_t m, index_t n, index_t k, const matrix_form& fa,
                            const matrix_form& fb, const matrix_form& fc, float alpha, float beta,
                            std::uint64_t seed) {
  std::ostringstream s;
  s << "M " << m << ", N " << n << ", K " << k << ", A " << fa.str() << ", B " << fb.str() << ", C "
    << fc.str() << ", alpha " << alpha << ", beta " << beta << ", seed " << seed;
  return s.str();
}

// ---------------------------------------------------------------------------------------------
// One whole case.

/// One GEMM case: C (M, N) of precision PC = alpha * A (M, K) B (K, N) + beta * C with random
/// operands (uniform in [lo, hi), rounded to their precisions) in the given forms, in Config's
/// memory space, run by Config, checked against the double reference (every element within the
/// bound), and checked to leave A, B and everything around C untouched. With beta == 0, C starts
/// as NaN (which must not leak). Returns true if all checks passed.
template <class Config, Precision PA, Precision PB, Precision PC>
bool check_gemm_case(index_t m, index_t n, index_t k, const matrix_form& fa, const matrix_form& fb,
                     const matrix_form& fc, float alpha, float beta, std::uint64_t seed,
                     float lo = -1.f, float hi = 1.f) {
  const std::string what = Config::name() + " " + precision_traits<PA>::name + " x " +
                           precision_traits<PB>::name + " -> " + precision_traits<PC>::name + ": " +
                           describe(m, n, k, fa, fb, fc, alpha, beta, seed);
  using mem = memory_of<Config>;
  const auto a = make_matrix<PA, mem>(m, k, fa, seed, lo, hi);
  const auto b = make_matrix<PB, mem>(k, n, fb, seed + 1, lo, hi);
  const auto c = make_matrix<PC, mem>(m, n, fc, seed + 2, -1.f, 1.f, beta == 0.f);
  const auto ref = reference_gemm(a.values, b.values, alpha, beta, c.values);
  const auto a0 = snapshot(a), b0 = snapshot(b), c0 = snapshot(c);
  Config::run(a.view, b.view, c.view, gemm_options{alpha, beta});
  const index_t bad = check_against_reference<PC>(what, to_dmatrix(c.view), ref, k);
  const index_t outside = changed_outside(c, c0);
  if (outside) UNSCOPED_INFO(what << ": " << outside << " elements around C were written");
  const bool a_same = unchanged(a, a0), b_same = unchanged(b, b0);
  if (!a_same || !b_same) UNSCOPED_INFO(what << ": A or B was modified");
  const bool ok = bad == 0 && outside == 0 && a_same && b_same;
  CHECK(ok);
  return ok;
}

} // namespace tessera::testing
