// Kernel packages (io/kernel_package.h): SHA-256 against the standard's vectors; the manifest's
// round trip and its refusals, one broken field each; version pins; which binary a GPU takes;
// a package built here with NVRTC, then broken one way at a time (checksum, missing binary, pin,
// manifest), each refused with the rule named and nothing loaded. On a GPU: the package loads
// and its kernel runs, a package without the GPU's architecture and a manifest whose parameters
// do not match its binary are refused. Without a GPU: a sound package is refused saying so.
#include "io/kernel_package.h"

#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/cuda.h"
#include "runtime/sha256.h"
#include "runtime/status.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

TEST(Sha256, MatchesTheStandardsVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // The padding's edges: 55 bytes fill one block with the length, 56 need a second; 63, 64, 119,
  // 120 around whole blocks (digests from Python's hashlib).
  const std::pair<int, const char*> edges[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
      {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
  };
  for (const auto& [n, digest] : edges) EXPECT_EQ(Sha256Hex(std::string(n, 'a')), digest) << n;
}

KernelPackageManifest SampleManifest() {
  return {"geglu",
          "1.2.0",
          {{"geglu",
            "geglu_bf16",
            {8, 8, 4},
            {{"sm_90a", "geglu.sm_90a.cubin", std::string(64, 'a')},
             {"compute_80", "geglu.compute_80.ptx", std::string(64, 'b')}}}}};
}

TEST(KernelPackageManifest, RoundTrips) {
  const KernelPackageManifest m = SampleManifest();
  const KernelPackageManifest back =
      ValueOrThrow(ParseKernelPackageManifest(KernelPackageManifestJson(m)));
  EXPECT_EQ(back.name, "geglu");
  EXPECT_EQ(back.version, "1.2.0");
  ASSERT_EQ(back.kernels.size(), 1u);
  EXPECT_EQ(back.kernels[0].entry, "geglu_bf16");
  EXPECT_EQ(back.kernels[0].param_bytes, (std::vector<int>{8, 8, 4}));
  ASSERT_EQ(back.kernels[0].binaries.size(), 2u);
  EXPECT_EQ(back.kernels[0].binaries[1].arch, "compute_80");
  EXPECT_EQ(back.kernels[0].binaries[1].sha256, std::string(64, 'b'));
}

// Each case breaks one thing in the sample's JSON text; the error names the field and the rule.
TEST(KernelPackageManifest, RefusesWhatIsMalformedNamingTheField) {
  const std::string good = KernelPackageManifestJson(SampleManifest());
  struct Case {
    std::string from, to, words;
  };
  const Case cases[] = {
      {"{", "[", "the text is not valid JSON"},
      {"\"format\": 1", "\"format\": 1, \"format\": 1", "holds the key 'format' twice"},
      {"\"format\": 1", "\"format\": 2", "format must be 1"},
      {"\"name\": \"geglu\",\n  \"version\"", "\"name\": \"../x\",\n  \"version\"", "name must be"},
      {"\"1.2.0\"", "\"one\"", "version must be a version"},
      {"\"entry\": \"geglu_bf16\"", "\"entry\": \"geglu-bf16\"", "kernels[0].entry"},
      {"8,\n", "0,\n", "sizes are integers in 1..4096"},
      {"\"sm_90a\"", "\"sm90\"", "kernels[0].binaries[0].arch"},
      {"\"geglu.sm_90a.cubin\"", "\"../geglu.cubin\"", "binaries[0].file"},
      {std::string(64, 'b'), std::string(63, 'b'), "binaries[1].sha256 must be 64"},
      {"\"compute_80\"", "\"sm_90a\"", "two for sm_90a"},
  };
  for (const Case& c : cases) {
    ASSERT_NE(good.find(c.from), std::string::npos) << c.from;
    const std::string broken = absl::StrReplaceAll(good, {{c.from, c.to}});
    const absl::StatusOr<KernelPackageManifest> m = ParseKernelPackageManifest(broken);
    ASSERT_FALSE(m.ok()) << broken;
    EXPECT_NE(std::string(m.status().message()).find(c.words), std::string::npos)
        << m.status().message();
  }
  const absl::StatusOr<KernelPackageManifest> not_object = ParseKernelPackageManifest(
      absl::StrReplaceAll(good, {{"\"binaries\": [\n        {", "\"binaries\": [\n        7, {"}}));
  ASSERT_FALSE(not_object.ok());
  EXPECT_NE(
      std::string(not_object.status().message()).find("kernels[0].binaries[0] must be an object"),
      std::string::npos)
      << not_object.status().message();
  const absl::StatusOr<KernelPackageManifest> huge = ParseKernelPackageManifest(
      absl::StrReplaceAll(good, {{"\"1.2.0\"", "\"1" + std::string(300000, '0') + "\""}}));
  ASSERT_FALSE(huge.ok());  // refused by length, never handed to the regex
  EXPECT_NE(std::string(huge.status().message()).find("version must be"), std::string::npos);
  EXPECT_FALSE(ParseKernelPackageManifest(
                   absl::StrReplaceAll(good, {{"\"format\": 1", "\"format\": 4294967297"}}))
                   .ok());  // not truncated to 1
  EXPECT_FALSE(ParseKernelPackageManifest("").ok());
  EXPECT_FALSE(ParseKernelPackageManifest("{\"format\": 1, \"name\": \"x\", \"version\": \"1\", "
                                          "\"kernels\": []}")
                   .ok());
}

TEST(KernelPackageVersion, PinsMatchLeadingComponents) {
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", ""));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", "*"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", "1"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", "1.2"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", "1.2.7"));
  EXPECT_FALSE(KernelPackageVersionMatches("1.20.0", "1.2"));
  EXPECT_FALSE(KernelPackageVersionMatches("1.3.0", "1.2"));
  EXPECT_FALSE(KernelPackageVersionMatches("1.2", "1.2.0"));
  EXPECT_FALSE(KernelPackageVersionMatches("2.0.0", "1"));
  // Build metadata has no say (SemVer); a pre-release is not its release.
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7+cu13.0", "1.2.7"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7", "1.2.7+cu13"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7-rc.1+b5", "1.2.7-rc.1"));
  EXPECT_TRUE(KernelPackageVersionMatches("1.2.7-rc1", "1.2"));
  EXPECT_FALSE(KernelPackageVersionMatches("1.2.7-rc1", "1.2.7"));
  EXPECT_FALSE(KernelPackageVersionMatches("1.2.8+cu13", "1.2.7"));
  for (const char* bad : {"^", "1.x", "1.", ".", " 1.2", "**", ">=1.2.3", "1.2+", "1.2+a+b"}) {
    EXPECT_NE(ErrorOf([&] { KernelPackageVersionMatches("1.2.7", bad); }).find("is malformed"),
              std::string::npos)
        << bad;
  }
}

TEST(KernelPackageBinary, EachGpuTakesWhatRunsThere) {
  KernelSpec k{"k", "k", {}, {}};
  auto with = [&](std::vector<std::string> archs) {
    k.binaries.clear();
    for (const std::string& a : archs) k.binaries.push_back({a, a + ".bin", std::string(64, '0')});
  };
  auto chosen = [&](int major, int minor) {
    const KernelBinary* b = ChooseKernelBinary(k, major, minor);
    return b == nullptr ? std::string("none") : b->arch;
  };
  with({"compute_80", "sm_90", "sm_90a", "sm_80"});
  EXPECT_EQ(chosen(9, 0), "sm_90a");       // the arch-specific CUBIN of exactly this GPU
  EXPECT_EQ(chosen(8, 6), "sm_80");        // a CUBIN runs on later minors of its major
  EXPECT_EQ(chosen(10, 0), "compute_80");  // no CUBIN of this major: the PTX
  EXPECT_EQ(chosen(7, 5), "none");         // nothing this old
  with({"sm_90a"});
  EXPECT_EQ(chosen(9, 0), "sm_90a");
  EXPECT_EQ(chosen(10, 0), "none");  // arch-specific code runs nowhere else
  with({"compute_70", "compute_86"});
  EXPECT_EQ(chosen(9, 0), "compute_86");  // the newest PTX not newer than the GPU
  EXPECT_EQ(chosen(8, 0), "compute_70");
  EXPECT_EQ(chosen(INT_MAX, 0), "none");  // no device: no overflow, nothing chosen
  EXPECT_EQ(chosen(9, -1), "none");
  EXPECT_EQ(chosen(0, INT_MAX), "none");
}

// A kernel that adds `a` to n floats in place: (float* x, float a, int n), 8 + 4 + 4 bytes.
constexpr char kAddSource[] = R"(
extern "C" __global__ void pkg_add(float* x, float a, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += a;
}
)";

std::string BuildSample(const std::string& name, const std::vector<std::string>& archs) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  BuildKernelPackage(dir, "adder", "1.4.2", {{"add", "pkg_add", kAddSource, {8, 4, 4}}}, archs);
  return dir;
}

TEST(KernelPackage, BuildsAPackageWithNvrtcThatParses) {
  KILN_SKIP_WITHOUT_NVRTC();
  const std::string dir = BuildSample("built", {"sm_90a", "sm_80", "compute_80"});
  const KernelPackageManifest m =
      ValueOrThrow(ParseKernelPackageManifest(ReadText(dir + "/manifest.json")));
  EXPECT_EQ(m.name, "adder");
  ASSERT_EQ(m.kernels.size(), 1u);
  ASSERT_EQ(m.kernels[0].binaries.size(), 3u);
  for (const KernelBinary& b : m.kernels[0].binaries) {
    EXPECT_EQ(Sha256Hex(ReadText(dir + "/" + b.file)), b.sha256) << b.file;
  }
  EXPECT_NE(ReadText(dir + "/add.compute_80.ptx").find(".entry pkg_add"), std::string::npos);
}

// Broken one way at a time, each refused with the rule named (before any GPU is needed).
TEST(KernelPackage, RefusesABrokenPackageNamingWhatIsWrong) {
  KILN_SKIP_WITHOUT_NVRTC();
  {
    const std::string dir = BuildSample("corrupt", {"sm_90a", "compute_80"});
    std::string ptx = ReadText(dir + "/add.compute_80.ptx");
    ptx[ptx.size() / 2] ^= 1;  // one flipped bit
    WriteText(dir + "/add.compute_80.ptx", ptx);
    ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "'adder' 1.4.2",
                     "add.compute_80.ptx fails its checksum");
  }
  {
    const std::string dir = BuildSample("missing", {"sm_90a"});
    std::filesystem::remove(dir + "/add.sm_90a.cubin");
    ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "add.sm_90a.cubin is missing");
  }
  {
    const std::string dir = BuildSample("pinned", {"compute_80"});
    ExpectThrowsWith([&] { KernelPackage::Load(dir, "1.5"); }, "'adder' 1.4.2",
                     "does not match the pin \"1.5\"");
    ExpectThrowsWith([&] { KernelPackage::Load(dir, "1.4.20"); }, "the pin \"1.4.20\"");
  }
  {
    const std::string dir = BuildSample("garbled", {"compute_80"});
    WriteText(dir + "/manifest.json", "{\"format\": 1, \"name\": ");
    ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "the text is not valid JSON");
    WriteText(dir + "/manifest.json", "[1]");
    ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "not a JSON object");
    std::filesystem::remove(dir + "/manifest.json");
    ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "no readable manifest.json");
  }
}

// What the builder would write is checked before it compiles or writes anything: a kernel name
// that would leave the folder, a bad version, a size, a repeated target.
TEST(KernelPackage, BuilderRefusesBadInputBeforeWritingAnything) {
  const std::string dir = TempPath("refused");
  std::filesystem::remove_all(dir);
  const KernelSource add{"add", "pkg_add", kAddSource, {8, 4, 4}};
  KernelSource escape = add;
  escape.name = "../../escape";
  ExpectThrowsWith([&] { BuildKernelPackage(dir, "adder", "1.0", {escape}, {"compute_80"}); },
                   "not built", "kernels[0].name");
  ExpectThrowsWith([&] { BuildKernelPackage(dir, "adder", "one", {add}, {"compute_80"}); },
                   "version must be");
  KernelSource zero = add;
  zero.param_bytes = {8, 0};
  ExpectThrowsWith([&] { BuildKernelPackage(dir, "adder", "1.0", {zero}, {"compute_80"}); },
                   "1..4096");
  ExpectThrowsWith(
      [&] {
        BuildKernelPackage(dir, "adder", "1.0", {add}, {"compute_80", "compute_80"});
      },
      "two for compute_80");
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(KernelPackage, WithoutAGpuASoundPackageIsRefusedSayingSo) {
  KILN_SKIP_WITHOUT_NVRTC();
  if (cuda::IsAvailable()) GTEST_SKIP() << "a GPU is present (the GPU tests load the package)";
  const std::string dir = BuildSample("nogpu", {"sm_90a", "compute_80"});
  ExpectThrowsWith([&] { KernelPackage::Load(dir, "1.4"); }, "'adder' 1.4.2", "no CUDA GPU");
}

// ---- on a GPU ---------------------------------------------------------------------------

std::string ArchOfThisGpu() {
  const cuda::DeviceProps& p = cuda::Props();
  return absl::StrCat("sm_", p.major, p.minor);
}

TEST(KernelPackageOnGpu, LoadsAndRunsItsKernel) {
  KILN_SKIP_WITHOUT_GPU();
  for (const std::string& arch : {ArchOfThisGpu(), std::string("compute_80")}) {
    const std::string dir = BuildSample("runs_" + arch, {arch});
    const KernelPackage pkg = KernelPackage::Load(dir, "1.4");
    EXPECT_EQ(pkg.version(), "1.4.2");
    const PackagedKernel& add = pkg.kernel("add");
    EXPECT_EQ(add.arch, arch);
    Tensor x = to(arange(0, 1000, 1, DType::kFloat32), CUDA(0));
    void* data = x.data_ptr();
    float a = 0.5f;
    int n = 1000;
    add.Launch({4}, {256}, 0, {&data, &a, &n});
    const std::vector<double> got = to_vector(x);
    for (int i = 0; i < n; ++i) ASSERT_EQ(got[i], i + 0.5) << i;
    ExpectThrowsWith([&] { add.Launch({4}, {256}, 0, {&data, &a}); }, "takes 3 arguments, got 2");
    ExpectThrowsWith([&] { pkg.kernel("mul"); }, "has no kernel 'mul'; it has add");
  }
}

// A package another machine built (KILN_TEST_PACKAGE: the folder tools/kiln_package wrote for
// its example kernel, e.g. on the development machine, which has no GPU) loads and runs here.
TEST(KernelPackageOnGpu, LoadsAPackageBuiltElsewhere) {
  KILN_SKIP_WITHOUT_GPU();
  const char* dir = std::getenv("KILN_TEST_PACKAGE");
  if (dir == nullptr) GTEST_SKIP() << "KILN_TEST_PACKAGE names no package built elsewhere";
  const PackagedKernel& add = KernelPackage::Load(dir, "1").kernel("add");
  Tensor x = to(full({300}, 2.0, DType::kFloat32), CUDA(0));
  void* data = x.data_ptr();
  float a = 1.25f;
  int n = 300;
  add.Launch({2}, {256}, 0, {&data, &a, &n});
  for (double v : to_vector(x)) ASSERT_EQ(v, 3.25);
}

TEST(KernelPackageOnGpu, RefusesAPackageWithoutThisGpusArchitecture) {
  KILN_SKIP_WITHOUT_GPU();
  const cuda::DeviceProps& p = cuda::Props();
  const std::string other = p.major == 8 ? "sm_90a" : "sm_80";  // a CUBIN of another major
  const std::string dir = BuildSample("other_arch", {other});
  ExpectThrowsWith([&] { KernelPackage::Load(dir); }, "kernel 'add' has no binary for this GPU",
                   other);
}

TEST(KernelPackageOnGpu, RefusesParametersThatDoNotMatchTheBinary) {
  KILN_SKIP_WITHOUT_GPU();
  const std::string dir = BuildSample("params", {"compute_80"});
  KernelPackageManifest m =
      ValueOrThrow(ParseKernelPackageManifest(ReadText(dir + "/manifest.json")));
  m.kernels[0].param_bytes = {8, 8};
  WriteText(dir + "/manifest.json", KernelPackageManifestJson(m));
  ExpectThrowsWith([&] { KernelPackage::Load(dir); },
                   "the manifest says 2 parameters of [8, 8] bytes", "has 3 of [8, 4, 4]");
}

}  // namespace
}  // namespace kiln
