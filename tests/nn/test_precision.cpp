// bf16, fp16 and fp8 (hybrid, current and delayed scaling) forward passes of nn::Linear and
// nn::Conv2d against the fp32 layer with the same masters, within a bound derived from the
// formats:
//   inputs and weights are rounded to the operand format: x~ = x (1 + d1) + e1, w~ = w (1 + d2) +
//   e2 with |d| <= u_P (the unit roundoff: 2^-8 bf16, 2^-4 E4M3) and |e| <= half the smallest
//   subnormal divided by the tensor's scale (fp8 only: scale = 448 / amax under current
//   scaling), so each product is off by at most (2u + u^2)|x||w| + (1 + u)(|e1||w| + |e2||x|)
//   + |e1||e2|; summed over the k products, with A = sum |x||w| + |b| (computed by the fp32
//   layer on |x|, |w|, |b|) and k max|x|, k max|w| bounding the sums of |x| and |w|;
//   both results accumulate in fp32: 2 gamma_k A (1 + 2u);
//   the output is rounded to the activation precision (bf16 for bf16 and fp8 layers, fp16 for
//   fp16): u of its magnitude plus half its smallest subnormal.
#include "nn_testing.hpp"

#include <algorithm>

using namespace tessera;          // NOLINT: test file
using namespace tessera::testing; // NOLINT

namespace {

template <class Prec>
struct format {
  using op = typename nn::detail::operand_precision<Prec, false>::type;
  static constexpr double u = precision_traits<op>::unit_roundoff;
  static constexpr bool fp8 = Fp8Precision<op>;
  /// Half the smallest subnormal over the current-scaling scale of a tensor with this amax
  /// (fp8); half the smallest subnormal otherwise (what rounding into fp16's subnormals can
  /// lose; negligible for bf16).
  static double abs_err(double amax) {
    if constexpr (fp8) {
      return precision_traits<op>::min_subnormal / 2.0 * amax / precision_traits<op>::max_finite;
    } else {
      return precision_traits<op>::min_subnormal / 2.0;
    }
  }
};

double amax_of(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::abs(e));
  return m;
}

template <class T>
void set_abs(const T& t) {
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = std::abs(t.data()[i]);
}

/// Checks yp against y32 with the bound of the file comment; A = sum |terms| per output.
template <class Prec>
void check_close(const char* what, const std::vector<double>& yp, const std::vector<double>& y32,
                 const std::vector<double>& A, double k, double xmax, double wmax) {
  using f = format<Prec>;
  const double u = f::u, ex = f::abs_err(xmax), ew = f::abs_err(wmax);
  // The output is rounded once to the activation precision (bf16 for bf16 and fp8, fp16 for
  // fp16): relative ub, or half its smallest subnormal below its normal range.
  using act = nn::activation_t<Prec>;
  const double gamma = k * u32 / (1 - k * u32), ub = precision_traits<act>::unit_roundoff,
               sub = precision_traits<act>::min_subnormal / 2.0;
  int misses = 0;
  double worst = 0;
  for (std::size_t i = 0; i < yp.size(); ++i) {
    const double prod =
        (2 * u + u * u) * A[i] + (1 + u) * (ex * k * wmax + ew * k * xmax) + k * ex * ew;
    const double acc = 2 * gamma * A[i] * (1 + 2 * u);
    const double bound = prod + acc + ub * (std::abs(y32[i]) + prod + acc) + sub;
    const double err = std::abs(yp[i] - y32[i]);
    worst = std::max(worst, err / bound);
    if (err > bound && misses++ < 5)
      FAIL_CHECK(what << "[" << i << "]: " << yp[i] << " vs fp32 " << y32[i] << ", bound "
                      << bound);
  }
  INFO(what << ": worst error / bound " << worst);
  CHECK(misses == 0);
  // The bound is not vacuous: the low-precision result differs from fp32 somewhere.
  CHECK(worst > 0);
}

template <class Prec, index_t In, index_t Out>
void linear_case(index_t B, double xscale, std::uint64_t seed, int forwards = 1) {
  INFO("Linear<" << In << ", " << Out << ">, batch " << B << ", |x| <= " << xscale);
  nn::Linear<In, Out> f32(seed), absl(seed);
  nn::Linear<In, Out, Prec> lp(seed);
  set_abs(absl.weight().value), set_abs(absl.bias().value);
  auto xv = uniform_values(static_cast<std::size_t>(B * In), seed + 1, -xscale, xscale);
  auto x = tensor_from<fp32>(xv, extents<dyn, In>(B));
  const auto y32 = to_doubles(f32.forward(exec_space(), x));
  std::vector<double> yp;
  for (int i = 0; i < forwards; ++i) yp = to_doubles(lp.forward(exec_space(), x));
  for (auto& e : xv) e = std::abs(e);
  const auto A = to_doubles(absl.forward(exec_space(), tensor_from<fp32>(xv, extents<dyn, In>(B))));
  check_close<Prec>("Linear y", yp, y32, A, In + 1, amax_of(xv),
                    amax_of(to_doubles(f32.weight().value)));
}

template <class Prec, index_t C, index_t K, index_t R, nn::conv_options O>
void conv_case(index_t B, index_t H, index_t W, std::uint64_t seed) {
  INFO("Conv2d<" << C << ", " << K << ", " << R << ">, x (" << B << ", " << C << ", " << H << ", "
                 << W << ")");
  nn::Conv2d<C, K, R, O> f32(seed), absl(seed);
  nn::Conv2d<C, K, R, O, Prec> lp(seed);
  set_abs(absl.weight().value), set_abs(absl.bias().value);
  auto xv = uniform_values(static_cast<std::size_t>(B * C * H * W), seed + 1);
  auto x = tensor_from<fp32>(xv, dextents<4>(B, C, H, W));
  const auto y32 = to_doubles(f32.forward(exec_space(), x));
  const auto yp = to_doubles(lp.forward(exec_space(), x));
  for (auto& e : xv) e = std::abs(e);
  const auto A =
      to_doubles(absl.forward(exec_space(), tensor_from<fp32>(xv, dextents<4>(B, C, H, W))));
  check_close<Prec>("Conv2d y", yp, y32, A, double(C / O.groups * R * R + 1), amax_of(xv),
                    amax_of(to_doubles(f32.weight().value)));
}

template <class Prec>
void all_cases() {
  std::mt19937_64 g(31);
  for (int rep = 0; rep < 3; ++rep) {
    const index_t B = 1 + index_t(g() % 40);
    const double xs = rep == 2 ? 300.0 : rep == 1 ? 1e-3 : 1.0; // scaling makes fp8 range-free
    linear_case<Prec, 13, 7>(B, xs, g() % 1000);
    linear_case<Prec, 128, 10>(B, xs, g() % 1000);
    conv_case<Prec, 3, 8, 3, nn::conv_options{.pad = 1}>(1 + index_t(g() % 3), 5 + index_t(g() % 9),
                                                         5 + index_t(g() % 9), g() % 1000);
    conv_case<Prec, 4, 6, 3, nn::conv_options{.stride = 2, .groups = 2}>(
        2, 7 + index_t(g() % 5), 6 + index_t(g() % 5), g() % 1000);
  }
}

} // namespace

TEST_CASE("nn bf16 layers: forward within the bf16 rounding bound of fp32", "[nn][bf16]") {
  all_cases<bf16>();
}

TEST_CASE("nn fp16 layers: forward within the fp16 rounding bound of fp32", "[nn][fp16]") {
  all_cases<fp16>();
}

TEST_CASE("nn fp8 layers (current scaling): forward within the E4M3 bound of fp32", "[nn][fp8]") {
  all_cases<nn::fp8<train::current_scaling>>();
}

TEST_CASE("nn fp8 layers (delayed scaling): from the second forward, within the same bound",
          "[nn][fp8]") {
  // The first forward has no amax history (scale 1); it records amax(x) and amax(W), so the
  // second uses exactly the current-scaling scales for the same x.
  linear_case<nn::fp8<train::delayed_scaling>, 64, 16>(9, 1.0, 5, 2);
}
