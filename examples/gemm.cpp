// tessera::gemm in a few calls: fp32 with a transposed view and alpha/beta, bf16 and fp8
// operands (fp32 accumulation), a linear layer with bias + ReLU fused into the store, a scaled
// fp8 output and its amax, and a strided batch.
#include <tessera/gemm.hpp>

#include <cstdio>

// Host tensors: this example runs on the host (printing elements directly), also where Kokkos'
// default memory space is a GPU's.
template <tessera::Precision P, class E>
using host_tensor = tessera::Tensor<P, E, tessera::layout_right, Kokkos::HostSpace>;

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using namespace tessera; // NOLINT: example program
  const Kokkos::DefaultHostExecutionSpace exec;
  const index_t M = 256, N = 128, K = 512;

  // fp32. C = A B, then C = 2 A W^T + C with W stored (N, K) and passed as a transposed view.
  host_tensor<fp32, dextents<2>> a("a", M, K), b("b", K, N), w("w", N, K), c("c", M, N);
  fill_uniform(exec, a, 1, -1.f, 1.f);
  fill_uniform(exec, b, 2, -1.f, 1.f);
  fill_uniform(exec, w, 3, -0.1f, 0.1f);
  gemm(exec, a, b, c);
  gemm(exec, a, transpose(w.view()), c, {.alpha = 2.f, .beta = 1.f});
  std::printf("fp32:      C(0, 0) = %8.4f\n", c(0, 0));

  // bf16 and fp8 operands, any mix (e4m3 x e5m2 too); the products are summed in fp32.
  host_tensor<bf16, dextents<2>> a16("a16", M, K), b16("b16", K, N), w16("w16", N, K);
  host_tensor<fp8_e4m3, dextents<2>> a8("a8", M, K);
  host_tensor<fp8_e5m2, dextents<2>> b8("b8", K, N);
  fill_uniform(exec, a16, 1, -1.f, 1.f);
  fill_uniform(exec, b16, 2, -1.f, 1.f);
  fill_uniform(exec, w16, 3, -0.1f, 0.1f);
  fill_uniform(exec, a8, 1, -1.f, 1.f);
  fill_uniform(exec, b8, 2, -1.f, 1.f);
  gemm(exec, a16, b16, c); // bf16 x bf16
  std::printf("bf16:      C(0, 0) = %8.4f\n", c(0, 0));
  gemm(exec, a8, b8, c);
  std::printf("e4m3xe5m2: C(0, 0) = %8.4f\n", c(0, 0));

  // A linear layer in bf16: y = relu(x W^T + bias), bias and ReLU applied in the store.
  host_tensor<fp32, dextents<1>> bias("bias", N);
  host_tensor<bf16, dextents<2>> y("y", M, N);
  fill_uniform(exec, bias, 4, -0.5f, 0.5f);
  gemm(exec, a16, transpose(w16.view()), y, make_epilogue({}, epi::bias_col{bias}, epi::relu{}));
  std::printf("linear:    y(0, 0..3) = %.4f %.4f %.4f %.4f\n", to_float(y(0, 0)), to_float(y(0, 1)),
              to_float(y(0, 2)), to_float(y(0, 3)));

  // fp8 in and out: x quantized with a per-tensor scale; y8 = saturate(x W^T * s_out), and gemm
  // returns amax |x W^T|, from which the next output scale is chosen.
  const auto xq = quantize<fp8_e4m3>(exec, a);
  host_tensor<fp8_e4m3, dextents<2>> y8("y8", M, N);
  const float amax = gemm(exec, xq, transpose(w.view()), scaled(y8.view(), 1.f));
  std::printf("fp8 out:   amax %.3f, next scale %.1f\n", amax, scale_for_amax<fp8_e4m3>(amax));

  // Strided batch: C[i] = A[i] B for 4 matrices A[i]; B (batch stride 0) is shared.
  host_tensor<fp32, dextents<3>> ab("ab", 4, M, K), cb("cb", 4, M, N);
  fill_uniform(exec, ab, 5, -1.f, 1.f);
  const TensorView<fp32, dextents<3>, layout_stride, Kokkos::HostSpace> bb(
      b.data(), dextents<3>(4, K, N), {0, N, 1});
  gemm_batched(exec, ab, bb, cb);
  std::printf("batched:   C[3](0, 0) = %8.4f\n", cb(3, 0, 0));
}
