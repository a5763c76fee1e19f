#pragma once
// Shared by the gemm tests: host matrices of any precision stored in any form (row-major,
// transposed, padded leading dimension, offset into a bigger allocation) together with their
// values as doubles; the configurations every test is instantiated over (execution space x
// algorithm); the comparison against the double reference with the bound of
// tests/support/tolerance.hpp; and the random shapes of issue 3.
#include "support/exec_spaces.hpp"
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
/// return (the amax of a scaled output).
template <class Exec, class Algo>
struct gemm_config {
  using exec_space = Exec;
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

/// gemm_config<S, Algo> for every space S of the tuple Spaces.
template <class Algo, class Spaces>
struct configs_over;
template <class Algo, class... S>
struct configs_over<Algo, std::tuple<S...>> {
  using type = std::tuple<gemm_config<S, Algo>...>;
};
template <class Algo>
using on_host_spaces = typename configs_over<Algo, host_execution_spaces>::type;
template <class... Tuples>
using cat_t = decltype(std::tuple_cat(std::declval<Tuples>()...));

/// Every enabled Kokkos host backend (Serial, OpenMP, Threads, HPX: whichever this Kokkos has)
/// x the algorithms that matter on a host: automatic (what users get), host_packed forced (also
/// on the small sizes automatic would send to direct) and portable (the any-space algorithm,
/// tested here on the host).
using main_configs =
    cat_t<on_host_spaces<gemm_algo::automatic>, on_host_spaces<gemm_algo::host_packed>,
          on_host_spaces<gemm_algo::portable>>;

/// main_configs plus direct forced (also on large sizes) and the reference baseline, on the
/// threaded backend.
using all_configs =
    cat_t<main_configs, std::tuple<gemm_config<threaded_host_space, gemm_algo::direct>,
                                   gemm_config<threaded_host_space, gemm_algo::reference>>>;

/// The host algorithms (automatic, host_packed, direct) and the portable one, separately: the
/// low-precision tests instantiate 16 precision pairs per configuration, so they are split into
/// one program per group to keep each translation unit's build time modest.
using host_configs =
    cat_t<on_host_spaces<gemm_algo::automatic>, on_host_spaces<gemm_algo::host_packed>,
          std::tuple<gemm_config<threaded_host_space, gemm_algo::direct>>>;
using portable_configs = on_host_spaces<gemm_algo::portable>;

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

template <Precision P>
using strided_matrix_view = TensorView<P, dextents<2>, layout_stride, host_space>;

/// A (rows, cols) matrix of precision P: the allocation, a strided view of the matrix inside
/// it, and the matrix's values widened to double (row-major). Every element of the allocation
/// outside the matrix holds NaN, so a kernel that reads outside the operand poisons its result
/// and one that writes outside it is caught by unchanged_outside().
template <Precision P>
struct host_matrix {
  Tensor<P, dextents<1>, layout_right, host_space> storage;
  strided_matrix_view<P> view;
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
};

template <Precision P>
storage_t<P> nan_of() {
  return from_float<P, overflow_to_inf_nan>(std::numeric_limits<float>::quiet_NaN());
}

/// A matrix with elements uniform in [lo, hi) rounded to P (counter-based: element (i, j)
/// depends only on seed, i and j), stored in the given form. With nan_values, the matrix's own
/// elements are NaN too (a C that beta == 0 must ignore).
template <Precision P>
host_matrix<P> make_matrix(index_t rows, index_t cols, matrix_form form, std::uint64_t seed,
                           float lo = -1.f, float hi = 1.f, bool nan_values = false) {
  const index_t sr = form.transposed ? cols : rows, sc = form.transposed ? rows : cols;
  const index_t ld = sc + form.pad;
  // 3 trailing elements of margin catch a kernel that writes just past the last row.
  const index_t size = form.offset + sr * ld + 3;
  host_matrix<P> m;
  m.form = form;
  m.storage = decltype(m.storage)::uninitialized("matrix", dextents<1>(size));
  for (index_t s = 0; s < size; ++s) m.storage.data()[s] = nan_of<P>();
  const strided_matrix_view<P> stored(m.storage.data() + form.offset, dextents<2>(sr, sc), {ld, 1});
  m.view = form.transposed ? transpose(stored) : stored;
  m.values = dmatrix(rows, cols);
  const counter_rng rng{seed, 7};
  for (index_t i = 0; i < rows; ++i)
    for (index_t j = 0; j < cols; ++j) {
      const float u = rng.uniform01(static_cast<std::uint64_t>(i * cols + j));
      const storage_t<P> x = nan_values ? nan_of<P>() : from_float<P, saturate>(lo + (hi - lo) * u);
      m.view(i, j) = x;
      m.values(i, j) = to_float(x);
    }
  return m;
}

/// A bitwise copy of a matrix's allocation (to check what a call changed).
template <Precision P>
std::vector<unsigned char> snapshot(const host_matrix<P>& m) {
  std::vector<unsigned char> b(static_cast<std::size_t>(m.storage.size()) * sizeof(storage_t<P>));
  std::memcpy(b.data(), m.storage.data(), b.size());
  return b;
}

/// The number of allocation elements outside the matrix whose bits differ from the snapshot.
template <Precision P>
index_t changed_outside(const host_matrix<P>& m, const std::vector<unsigned char>& before) {
  index_t changed = 0;
  for (index_t s = 0; s < m.storage.size(); ++s)
    if (!m.covers(s) && std::memcmp(before.data() + s * sizeof(storage_t<P>), m.storage.data() + s,
                                    sizeof(storage_t<P>)) != 0)
      ++changed;
  return changed;
}

/// True if the matrix's allocation is bit-identical to the snapshot (nothing written).
template <Precision P>
bool unchanged(const host_matrix<P>& m, const std::vector<unsigned char>& before) {
  return std::memcmp(before.data(), m.storage.data(), before.size()) == 0;
}

// ---------------------------------------------------------------------------------------------
// Comparison.

/// The elements of any host rank-2 tensor or view, widened to double.
template <class T>
dmatrix to_dmatrix(const T& t) {
  dmatrix d(t.extent(0), t.extent(1));
  for (index_t i = 0; i < d.rows; ++i)
    for (index_t j = 0; j < d.cols; ++j) d(i, j) = to_float(t(i, j));
  return d;
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
/// operands (uniform in [lo, hi), rounded to their precisions) in the given forms, run by Config,
/// checked against the double reference (every element within the bound), and checked to leave A, B
/// and everything around C untouched. With beta == 0, C starts as NaN (which must not leak).
/// Returns true if all checks passed.
template <class Config, Precision PA, Precision PB, Precision PC>
bool check_gemm_case(index_t m, index_t n, index_t k, const matrix_form& fa, const matrix_form& fb,
                     const matrix_form& fc, float alpha, float beta, std::uint64_t seed,
                     float lo = -1.f, float hi = 1.f) {
  const std::string what = Config::name() + " " + precision_traits<PA>::name + " x " +
                           precision_traits<PB>::name + " -> " + precision_traits<PC>::name + ": " +
                           describe(m, n, k, fa, fb, fc, alpha, beta, seed);
  const auto a = make_matrix<PA>(m, k, fa, seed, lo, hi);
  const auto b = make_matrix<PB>(k, n, fb, seed + 1, lo, hi);
  const auto c = make_matrix<PC>(m, n, fc, seed + 2, -1.f, 1.f, beta == 0.f);
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
