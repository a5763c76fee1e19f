// A 3x3 convolution layer by hand: forward, a squared-error loss, and both backward passes,
// then one SGD step that lowers the loss. The same calls work for bf16 / fp8 tensors.
#include <tessera/conv.hpp>

#include <cstdio>

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  using namespace tessera; // NOLINT: example program
  // Host tensors and a host space: the loss and the SGD step below read and write elements
  // directly (also where Kokkos' default memory space is a GPU's).
  using tensor4 = Tensor<fp32, dextents<4>, layout_right, Kokkos::HostSpace>;
  const Kokkos::DefaultHostExecutionSpace exec;

  const index_t N = 8, C = 3, H = 32, W = 32, K = 16; // a batch of small RGB images
  const conv2d_params p{.pad_top = 1, .pad_bottom = 1, .pad_left = 1, .pad_right = 1};
  const auto [P, Q] = p.output_hw(H, W, 3, 3); // 32 x 32: "same" padding

  tensor4 x("x", N, C, H, W); // (N, C, H, W) input
  tensor4 w("w", K, C, 3, 3); // (K, C, R, S) weights
  Tensor<fp32, dextents<1>, layout_right, Kokkos::HostSpace> b("b", K), db("db", K);
  tensor4 target("target", N, K, P, Q), y("y", N, K, P, Q), dy("dy", N, K, P, Q);
  tensor4 dx("dx", N, C, H, W), dw("dw", K, C, 3, 3);
  fill_normal(x, 1);
  fill_normal(w, 2, 0.f, 0.2f);
  fill_normal(target, 3);

  conv2d_workspace<Kokkos::HostSpace> ws; // scratch memory, reused by every call below
  // L = 1/2 sum (y - target)^2 and dy = dL/dy = y - target, on the host.
  const auto loss = [&] {
    conv2d_forward(exec, x, w, b, y, p, ws);
    double l = 0;
    for (index_t i = 0; i < y.size(); ++i) {
      const float d = y.data()[i] - target.data()[i];
      dy.data()[i] = d;
      l += 0.5 * d * d;
    }
    return l;
  };

  const double before = loss();
  conv2d_backward_data(exec, dy, w, dx, p, ws);       // dL/dx: what a previous layer needs
  conv2d_backward_weight(exec, x, dy, dw, db, p, ws); // dL/dw and dL/db
  const float lr = 1e-5f;
  for (index_t i = 0; i < w.size(); ++i) w.data()[i] -= lr * dw.data()[i];
  for (index_t i = 0; i < b.size(); ++i) b.data()[i] -= lr * db.data()[i];
  const double after = loss();

  std::printf("conv 3x3: x (%ld, %ld, %ld, %ld) -> y (%ld, %ld, %ld, %ld)\n", long(N), long(C),
              long(H), long(W), long(N), long(K), long(P), long(Q));
  std::printf("|dL/dx|max = %.3f, |dL/dw|max = %.1f\n", amax(dx), amax(dw));
  std::printf("loss %.1f -> %.1f after one SGD step (lr %g)\n", before, after, lr);
  return after < before ? 0 : 1;
}
