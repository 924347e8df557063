// The kernel package builder's example (tools/kiln_package): adds `a` to n floats in place.
extern "C" __global__ void pkg_add(float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += a;
}
