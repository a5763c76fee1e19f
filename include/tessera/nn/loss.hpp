#pragma once
/// \file nn/loss.hpp
/// nn::SoftmaxCrossEntropy: the mean over the batch of -log softmax(logits)[label], and its
/// gradient, in one pass (torch.nn.CrossEntropyLoss with the default mean reduction). Logits
/// are (B, C) with labels a rank-1 Kokkos::View (B), or a batch of sequences (B, t, C) with
/// labels a rank-2 Kokkos::View (B, t): then the mean is over all B t positions (a language
/// model's loss; PyTorch's cross_entropy of logits.view(-1, C) and targets.view(-1)).
///
///   tessera::nn::SoftmaxCrossEntropy loss;
///   auto [l, dlogits] = loss.forward_backward(exec, logits, labels); // labels: Kokkos::View
///   model.backward(exec, dlogits);
///
/// Numerically stable: each row is shifted by its maximum before exp, and log-sum-exp is
/// formed from the shifted values, so no exp overflows and the loss of a confident correct
/// prediction is not lost to cancellation. dlogits = (softmax(logits) - onehot(label)) *
/// grad_scale / B, where grad_scale is a loss scale (1 unless a loss scaler asks for more); it
/// has the logits' precision (divided by B t for sequences). All arithmetic is fp32 per row, the
/// batch sum double. On host spaces each row is processed in chunks of 256 logits widened to
/// fp32 with xsimd's max and exp (nn/detail/row_math.hpp: the sum of a row in per-lane partial
/// sums); elsewhere a scalar loop per row.

#include <tessera/config/kokkos_compat.hpp>
#include <tessera/nn/detail/common.hpp>
#include <tessera/nn/detail/row_math.hpp>
#include <tessera/precision/vector_convert.hpp>

#include <cstdint>
#include <string>

namespace tessera::nn {

/// The loss (mean over the batch) and dL/dlogits (times the gradient scale).
template <class P, class Ext>
struct loss_result {
  float loss;
  Tensor<P, Ext> dlogits;
};

class SoftmaxCrossEntropy {
  using M = detail::default_memory_space;

public:
  SoftmaxCrossEntropy() : d_("softmax_cross_entropy.dlogits") {}

  /// logits (B, C) of any precision, labels a Kokkos::View of B integers in [0, C) in the same
  /// memory space; or logits (B, t, C) and labels a Kokkos::View (B, t). Throws shape_error for
  /// B (or t) mismatches and value_error for a label out of range (before writing anything).
  template <class Exec, class P, class E, class Labels>
  loss_result<P, E> forward_backward(const Exec& exec, const Tensor<P, E, layout_right, M>& logits,
                                     const Labels& labels, float grad_scale = 1.f) {
    auto d = d_.template get<P>(logits.extents());
    const float l = run<true>(exec, logits, labels, grad_scale, d.data());
    return {l, d};
  }

  /// The loss alone (for evaluation): nothing is written.
  template <class Exec, class P, class E, class Labels>
  float forward(const Exec& exec, const Tensor<P, E, layout_right, M>& logits,
                const Labels& labels) {
    return run<false>(exec, logits, labels, 1.f, static_cast<storage_t<P>*>(nullptr));
  }

private:
  template <bool Grad, class Exec, class P, class E, class Labels>
  static float run(const Exec& exec, const Tensor<P, E, layout_right, M>& logits,
                   const Labels& labels, float grad_scale, storage_t<P>* dl) {
    static_assert(E::rank == 2 || E::rank == 3,
                  "tessera::nn::SoftmaxCrossEntropy: logits must be (B, C) or (B, t, C).");
    static_assert(Labels::rank == E::rank - 1,
                  "tessera::nn::SoftmaxCrossEntropy: labels must be a Kokkos::View of rank 1 for "
                  "logits (B, C), of rank 2 (B, t) for logits (B, t, C).");
    const char* op = "tessera::nn::SoftmaxCrossEntropy";
    constexpr std::size_t r = E::rank;
    const index_t C = logits.extent(r - 1);
    const index_t t = r == 3 ? logits.extent(1) : 1;
    const index_t B = logits.size() / (C > 0 ? C : 1); // rows: B, or B t
    bool fits = static_cast<index_t>(labels.extent(0)) == logits.extent(0);
    if constexpr (r == 3) fits = fits && static_cast<index_t>(labels.extent(1)) == t;
    if (!fits) {
      std::string ls = "(" + std::to_string(labels.extent(0));
      if constexpr (r == 3) ls += ", " + std::to_string(labels.extent(1));
      throw shape_error(std::string(op) + ": logits " + shape_string(logits.extents()) +
                        " but labels " + ls + "); one label per row (B, t) needed");
    }
    if (B == 0 || C == 0)
      throw shape_error(std::string(op) + ": logits " + shape_string(logits.extents()) +
                        ": an empty batch has no mean loss");
    // Label of row i (b = i / t, position i % t).
    const auto label = KOKKOS_LAMBDA(const index_t i) {
      if constexpr (r == 3) {
        return static_cast<index_t>(labels(i / t, i % t));
      } else {
        return static_cast<index_t>(labels(i));
      }
    };
    index_t bad = 0;
    Kokkos::parallel_reduce(
        "tessera::nn::SoftmaxCrossEntropy[check]", Kokkos::RangePolicy<Exec>(exec, 0, B),
        KOKKOS_LAMBDA(const index_t i, index_t& n) {
          const auto y = label(i);
          n += (y < 0 || y >= C) ? 1 : 0;
        },
        bad);
    if (bad)
      throw value_error(std::string(op) + ": " + std::to_string(bad) + " labels are outside [0, " +
                        std::to_string(C) + ")");
    const auto* in = logits.data();
    const float g = grad_scale / static_cast<float>(B);
    double total = 0;
#if !TESSERA_DEVICE_PASS
    if constexpr (tessera::detail::is_host_exec_v<Exec> && tessera::detail::simd::available) {
      Kokkos::parallel_reduce(
          "tessera::nn::SoftmaxCrossEntropy", Kokkos::RangePolicy<Exec>(exec, 0, B),
          [=](const index_t i, double& sum) {
            const auto* row = in + i * C;
            constexpr index_t chunk = 256;
            alignas(64) float buf[chunk];
            // The chunk of logits at j0 as fp32 in buf (n of them).
            const auto widen = [&](index_t j0, index_t n) {
              convert_n<fp32>(row + j0, buf, static_cast<std::size_t>(n));
            };
            // A row of at most one chunk is widened and exponentiated once: buf keeps it
            // between the passes. Longer rows widen each chunk again per pass.
            const bool one_chunk = C <= chunk;
            float m = to_float(row[0]);
            for (index_t j0 = 0; j0 < C; j0 += chunk) {
              const index_t n = C - j0 < chunk ? C - j0 : chunk;
              widen(j0, n);
              const float cm = detail::row_max(buf, n);
              m = cm > m ? cm : m;
            }
            float s = 0.f;
            for (index_t j0 = 0; j0 < C; j0 += chunk) {
              const index_t n = C - j0 < chunk ? C - j0 : chunk;
              if (!one_chunk) widen(j0, n);
              s += detail::exp_shifted(buf, n, m);
            }
            const auto y = label(i);
            sum += static_cast<double>(std::log(s) - (to_float(row[y]) - m));
            if constexpr (Grad) {
              const float inv = 1.f / s;
              for (index_t j0 = 0; j0 < C; j0 += chunk) {
                const index_t n = C - j0 < chunk ? C - j0 : chunk;
                if (!one_chunk) {
                  widen(j0, n);
                  detail::exp_shifted(buf, n, m);
                }
                // (p - onehot(y)) g, p = exp(l - m) / s, as the scalar path.
                for (index_t k = 0; k < n; ++k) buf[k] *= inv;
                if (y >= j0 && y < j0 + n) buf[y - j0] -= 1.f;
                for (index_t k = 0; k < n; ++k) buf[k] *= g;
                convert_n<P>(buf, dl + i * C + j0, static_cast<std::size_t>(n));
              }
            }
          },
          total);
      exec.fence();
      return static_cast<float>(total / static_cast<double>(B));
    }
#endif
    Kokkos::parallel_reduce(
        "tessera::nn::SoftmaxCrossEntropy", Kokkos::RangePolicy<Exec>(exec, 0, B),
        KOKKOS_LAMBDA(const index_t i, double& sum) {
          const auto* row = in + i * C;
          float m = to_float(row[0]);
          for (index_t j = 1; j < C; ++j) m = to_float(row[j]) > m ? to_float(row[j]) : m;
          float s = 0.f;
          for (index_t j = 0; j < C; ++j) s += detail::kmath::exp(to_float(row[j]) - m);
          const auto y = label(i);
          // -log softmax_y = log sum exp(l - m) - (l_y - m)
          sum += static_cast<double>(detail::kmath::log(s) - (to_float(row[y]) - m));
          if constexpr (Grad) {
            const float inv = 1.f / s;
            for (index_t j = 0; j < C; ++j) {
              const float p = detail::kmath::exp(to_float(row[j]) - m) * inv;
              dl[i * C + j] = from_float<P>((p - (j == y ? 1.f : 0.f)) * g);
            }
          }
        },
        total);
    exec.fence();
    return static_cast<float>(total / static_cast<double>(B));
  }

  detail::any_buffer d_;
};

} // namespace tessera::nn
