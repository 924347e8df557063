// DLPack and from_blob: zero-copy round trips (pointer equality) of contiguous tensors, strided
// views and views with offsets, lifetimes (deleters run exactly once, after the last view),
// dtype and device mapping, and clear errors for what kiln cannot represent. The same tests run
// on CPU and CUDA (the CUDA instances skip without a GPU; the GPU machine runs them).
#include "io/dlpack.h"

#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "io/from_blob.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

class DlpackTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    device_ = ParseDevice(GetParam());
    if (device_.is_cuda()) KILN_SKIP_WITHOUT_GPU();
  }
  Tensor Random(IntList shape, DType dtype, uint32_t seed) const {
    return to(RandomBits(shape, dtype, seed), device_);
  }
  Device device_;
};

// The views a consumer sees most: contiguous, transposed, sliced with an offset, a column.
std::vector<std::pair<std::string, Tensor>> Views(const Tensor& base) {
  return {{"contiguous", base},
          {"transposed", transpose(base, 0, 1)},
          {"sliced", slice(slice(base, 0, 1, 4), 1, 2, 6, 2)},
          {"column", squeeze(slice(base, 1, 3, 4), 1)}};
}

TEST_P(DlpackTest, RoundTripKeepsPointerStridesAndOffset) {
  const Tensor base = Random({4, 6}, DType::kFloat32, 1);
  for (const auto& [what, v] : Views(base)) {
    DLManagedTensor* m = to_dlpack(v);
    const DLTensor& dl = m->dl_tensor;
    EXPECT_EQ(dl.data, base.storage()->data()) << what;
    EXPECT_EQ(dl.byte_offset, static_cast<uint64_t>(v.offset() * 4)) << what;
    EXPECT_EQ(dl.device.device_type, device_.is_cuda() ? kDLCUDA : kDLCPU);
    EXPECT_EQ(dl.device.device_id, device_.index);
    ASSERT_EQ(dl.ndim, v.dim());
    for (int d = 0; d < dl.ndim; ++d) {
      EXPECT_EQ(dl.shape[d], v.size(d)) << what;
      EXPECT_EQ(dl.strides[d], v.stride(d)) << what;
    }
    const Tensor back = from_dlpack(m);
    EXPECT_EQ(back.data_ptr(), v.data_ptr()) << what << ": a copy was made";
    EXPECT_EQ(back.strides(), v.strides()) << what;
    EXPECT_EQ(back.offset(), v.offset()) << what;
    EXPECT_EQ(back.device(), device_);
    EXPECT_EQ(Bytes(back), Bytes(v)) << what;
  }
}

TEST_P(DlpackTest, EveryDTypeMapsAndRoundTrips) {
  const std::pair<DType, DLDataType> table[] = {
      {DType::kFloat32, {kDLFloat, 32, 1}},   {DType::kFloat16, {kDLFloat, 16, 1}},
      {DType::kBFloat16, {kDLBfloat, 16, 1}}, {DType::kInt32, {kDLInt, 32, 1}},
      {DType::kInt64, {kDLInt, 64, 1}},       {DType::kBool, {6, 8, 1}}};
  for (const auto& [dtype, dl] : table) {
    const Tensor t = Random({3, 2}, dtype, 2);
    DLManagedTensor* m = to_dlpack(t);
    EXPECT_EQ(m->dl_tensor.dtype.code, dl.code) << DTypeName(dtype);
    EXPECT_EQ(m->dl_tensor.dtype.bits, dl.bits) << DTypeName(dtype);
    EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
    const Tensor back = from_dlpack(m);
    EXPECT_EQ(back.dtype(), dtype);
    EXPECT_EQ(Bytes(back), Bytes(t));
  }
}

TEST_P(DlpackTest, ExportKeepsTheStorageAliveUntilTheDeleter) {
  Tensor t = Random({5}, DType::kFloat32, 3);
  const std::string want = Bytes(t);
  const std::weak_ptr<Storage> storage = t.storage();
  DLManagedTensor* m = to_dlpack(slice(t, 0, 1, 5));
  t = Tensor();
  ASSERT_FALSE(storage.expired()) << "the export holds the storage";
  Tensor back = from_dlpack(m);
  EXPECT_EQ(Bytes(back), want.substr(4));
  back = Tensor();
  EXPECT_TRUE(storage.expired()) << "the last view gone, the deleter released the storage";
}

// A DLManagedTensor from "another library" whose deleter counts its calls.
struct Foreign {
  std::vector<int64_t> shape, strides;
  DLManagedTensor managed{};
  int* deletes = nullptr;
};

DLManagedTensor* MakeForeign(const Tensor& memory, std::vector<int64_t> shape,
                             std::vector<int64_t> strides, DLDataType dtype, int* deletes) {
  auto* f = new Foreign{std::move(shape), std::move(strides), {}, deletes};
  DLTensor& dl = f->managed.dl_tensor;
  dl.data = memory.data_ptr();
  dl.device = memory.device().is_cuda() ? DLDevice{kDLCUDA, 0} : DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(f->shape.size());
  dl.dtype = dtype;
  dl.shape = f->shape.data();
  dl.strides = f->strides.empty() ? nullptr : f->strides.data();
  f->managed.manager_ctx = f;
  f->managed.deleter = [](DLManagedTensor* self) {
    auto* foreign = static_cast<Foreign*>(self->manager_ctx);
    ++*foreign->deletes;
    delete foreign;
  };
  return &f->managed;
}

TEST_P(DlpackTest, ImportsForeignTensorsAndDeletesThemOnce) {
  const Tensor memory = Random({12}, DType::kFloat32, 4);
  int deletes = 0;
  {
    Tensor a = from_dlpack(MakeForeign(memory, {3, 4}, {}, {kDLFloat, 32, 1}, &deletes));
    EXPECT_EQ(a.data_ptr(), memory.data_ptr());
    EXPECT_TRUE(a.is_contiguous()) << "null strides mean row-major";
    Tensor view = transpose(a, 0, 1);
    a = Tensor();
    EXPECT_EQ(deletes, 0) << "a view is still alive";
    EXPECT_EQ(Bytes(view), Bytes(transpose(reshape(memory, {3, 4}), 0, 1)));
  }
  EXPECT_EQ(deletes, 1);
  // A byte offset that is not a whole number of elements: the storage starts at data + offset.
  DLManagedTensor* m = MakeForeign(memory, {2}, {1}, {kDLFloat, 32, 1}, &deletes);
  m->dl_tensor.data = static_cast<char*>(memory.data_ptr()) + 2;
  m->dl_tensor.byte_offset = 2;
  const Tensor b = from_dlpack(m);
  EXPECT_EQ(b.data_ptr(), static_cast<char*>(memory.data_ptr()) + 4);
  EXPECT_EQ(Bytes(b), Bytes(memory).substr(4, 8));
}

TEST_P(DlpackTest, RejectsWhatKilnCannotRepresentAndLeavesOwnershipToTheCaller) {
  const Tensor memory = Random({8}, DType::kFloat32, 5);
  struct Case {
    std::vector<int64_t> shape, strides;
    DLDataType dtype;
    const char* message;
  };
  const Case cases[] = {
      {{2}, {1}, {kDLFloat, 64, 1}, "unsupported dtype (code 2, 64 bits, 1 lanes)"},
      {{2}, {1}, {kDLUInt, 8, 1}, "unsupported dtype (code 1, 8 bits"},
      {{2}, {1}, {kDLFloat, 32, 4}, "4 lanes"},
      {{2}, {-1}, {kDLFloat, 32, 1}, "sizes and strides must be non-negative"},
      {{-2}, {1}, {kDLFloat, 32, 1}, "from_dlpack: from_blob: sizes and strides must be"},
  };
  int deletes = 0;
  for (const Case& c : cases) {
    DLManagedTensor* m = MakeForeign(memory, c.shape, c.strides, c.dtype, &deletes);
    EXPECT_NE(ErrorOf([&] { from_dlpack(m); }).find(c.message), std::string::npos) << c.message;
    EXPECT_EQ(deletes, 0) << "not consumed: the caller still owns it";
    m->deleter(m);
    deletes = 0;
  }
  DLManagedTensor* m = MakeForeign(memory, {2}, {1}, {kDLFloat, 32, 1}, &deletes);
  m->dl_tensor.byte_offset = 2;  // not a whole float32: the first element is misaligned
  EXPECT_NE(ErrorOf([&] {
              from_dlpack(m);
            }).find("from_dlpack: data + byte_offset 2 is not aligned to the 4 bytes of a float32"),
            std::string::npos);
  EXPECT_EQ(deletes, 0);
  m->dl_tensor.byte_offset = 0;
  m->dl_tensor.device = {kDLOpenCL, 0};
  EXPECT_NE(ErrorOf([&] { from_dlpack(m); }).find("unsupported device type 4"), std::string::npos);
  m->deleter(m);
  EXPECT_NE(ErrorOf([] { from_dlpack(nullptr); }).find("null DLManagedTensor"), std::string::npos);
}

TEST_P(DlpackTest, FromBlobWrapsMemoryAndRunsTheDeleterOnce) {
  const Tensor memory = Random({6}, DType::kFloat32, 6);
  int deletes = 0;
  void* seen = nullptr;
  {
    Tensor t = from_blob(memory.data_ptr(), {3, 2}, {1, 3}, DType::kFloat32, device_,
                         [&](void* p) { ++deletes, seen = p; });
    EXPECT_EQ(t.data_ptr(), memory.data_ptr());
    EXPECT_EQ(t.storage()->nbytes(), 24u);
    EXPECT_EQ(Bytes(t), Bytes(transpose(reshape(memory, {2, 3}), 0, 1)));
    Tensor row = slice(t, 0, 1, 2);
    t = Tensor();
    EXPECT_EQ(deletes, 0);
  }
  EXPECT_EQ(deletes, 1);
  EXPECT_EQ(seen, memory.data_ptr());
  const Tensor c = from_blob(memory.data_ptr(), {2, 3}, DType::kFloat32, device_);
  EXPECT_EQ(Bytes(c), Bytes(memory));  // no deleter: the caller keeps the memory
}

INSTANTIATE_TEST_SUITE_P(Devices, DlpackTest, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return std::string(info.param); });

TEST(FromBlob, BadInputIsAClearError) {
  float buf[4] = {};
  EXPECT_NE(ErrorOf([&] {
              from_blob(buf, {2, 2}, {1}, DType::kFloat32);
            }).find("2 sizes but 1 strides (float32[2, 2] with strides [1] on cpu)"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              from_blob(nullptr, {2}, DType::kFloat32);
            }).find("a null pointer for 2 elements"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              from_blob(buf, {2}, DType::kFloat32, kMeta);
            }).find("a meta tensor holds no memory"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              from_blob(buf, {2}, DType::kFloat32, CUDA(64));
            }).find("device cuda:64 is not present"),
            std::string::npos);
  EXPECT_EQ(from_blob(nullptr, {0, 3}, DType::kFloat32).numel(), 0);
  alignas(8) char bytes[32] = {};
  EXPECT_NE(ErrorOf([&] {
              from_blob(bytes + 1, {4}, DType::kFloat32);
            }).find("is not aligned to the 4 bytes of a float32 element"),
            std::string::npos);
}

// DLPack byte offsets: the first element aligned, never past the address space (checked before
// any pointer arithmetic); the deleter stays the caller's on every refusal.
TEST(Dlpack, ByteOffsetsAreWholeElementsInRange) {
  alignas(8) float data[4] = {1, 2, 3, 4};
  int64_t shape[1] = {2};
  int deleted = 0;
  DLManagedTensor m{};
  m.dl_tensor.data = data;
  m.dl_tensor.device = {kDLCPU, 0};
  m.dl_tensor.ndim = 1;
  m.dl_tensor.dtype = {kDLFloat, 32, 1};
  m.dl_tensor.shape = shape;
  m.manager_ctx = &deleted;
  m.deleter = [](DLManagedTensor* self) { ++*static_cast<int*>(self->manager_ctx); };
  for (uint64_t bad : {(uint64_t{1} << 63) + 4, UINT64_MAX - 3}) {
    m.dl_tensor.byte_offset = bad;
    EXPECT_NE(ErrorOf([&] { from_dlpack(&m); }).find("from_dlpack: byte_offset"), std::string::npos)
        << bad;
  }
  m.dl_tensor.byte_offset = 2;  // the first element at data + 2: not aligned for float32
  EXPECT_NE(ErrorOf([&] { from_dlpack(&m); }).find("is not aligned to the 4 bytes"),
            std::string::npos);
  EXPECT_EQ(deleted, 0);
  m.dl_tensor.byte_offset = 8;
  {
    const Tensor t = from_dlpack(&m);
    EXPECT_EQ(to_vector(t), (std::vector<double>{3, 4}));
  }
  EXPECT_EQ(deleted, 1);
}

TEST(FromBlob, PointerOnAnotherDeviceIsAnError) {
  KILN_SKIP_WITHOUT_GPU();
  const Tensor gpu = zeros({4}, DType::kFloat32, CUDA());
  EXPECT_NE(ErrorOf([&] {
              from_blob(gpu.data_ptr(), {4}, DType::kFloat32, kCPU);
            }).find("the pointer is memory of cuda:0 but the device is cpu"),
            std::string::npos);
  std::vector<float> host(4);
  EXPECT_NE(ErrorOf([&] {
              from_blob(host.data(), {4}, DType::kFloat32, CUDA());
            }).find("the pointer is not CUDA device memory"),
            std::string::npos);
}

TEST(Dlpack, RefusesTensorsWithoutMemory) {
  EXPECT_NE(ErrorOf([] { to_dlpack(Tensor()); }).find("undefined"), std::string::npos);
  EXPECT_NE(ErrorOf([] {
              to_dlpack(empty({2}, DType::kFloat32, kMeta));
            }).find("float32[2] on meta holds no memory to share"),
            std::string::npos);
}

}  // namespace
}  // namespace kiln
