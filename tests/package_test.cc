// kiln as its users see it: this file includes only <kiln/kiln.h> and links only kiln::kiln
// (tests/CMakeLists.txt), without kiln's source tree or CUDA's headers on the include path. It
// checks that the umbrella header is complete and CUDA-free, that kiln::Error is reachable, and
// that the examples in the headers' banners compile and do what they say.
#include <gtest/gtest.h>
#include <kiln/kiln.h>

#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace kiln;  // NOLINT: as a user would

// The example at the top of ops/factories.h, on the CPU.
TEST(Package, FactoriesBannerExampleCompilesAndRuns) {
  const int64_t T = 4;
  Generator gen(0);
  Tensor x = randn({64, 128}, gen, DType::kBFloat16, kCPU);
  Tensor m = triu(ones({T, T}, DType::kBool), 1);  // causal mask
  std::vector<float> v = to_vector<float>(x);
  std::ostringstream os;
  os << x;
  EXPECT_EQ(v.size(), 64u * 128u);
  EXPECT_EQ(to_vector<int64_t>(m),
            (std::vector<int64_t>{0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0, 0}));
  EXPECT_NE(os.str().find("dtype=bfloat16, device=cpu"), std::string::npos);
}

TEST(Package, ErrorsAreKilnErrors) {
  try {
    matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL() << "no error";
  } catch (const kiln::Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("matmul"), std::string::npos);
  }
}

// The umbrella's own banner: a module, compiled, its weights saved and loaded, DLPack.
TEST(Package, UmbrellaBannerExample) {
  Generator gen(0);
  GeGLUMLP mlp(64, 256, gen);
  Tensor x = randn({8, 64}, gen);
  CompiledFn f = compile(mlp, x);
  const std::vector<double> eager = to_vector(mlp(x));
  const std::vector<double> compiled = to_vector(f({x})[0]);
  ASSERT_EQ(eager.size(), compiled.size());
  for (size_t i = 0; i < eager.size(); ++i) ASSERT_NEAR(eager[i], compiled[i], 1e-4);
  const std::string path = ::testing::TempDir() + "/kiln_package_test_mlp.safetensors";
  save_state_dict(mlp, path);
  Generator other(1);
  GeGLUMLP copy(64, 256, other);
  EXPECT_EQ(load_state_dict(copy, path).loaded.size(), 3u);
  EXPECT_EQ(to_vector(copy(x)), eager);
  DLManagedTensor* dl = to_dlpack(x);
  EXPECT_EQ(from_dlpack(dl).data_ptr(), x.data_ptr());
  std::remove(path.c_str());
}

}  // namespace
