// from_blob (see from_blob.h).
#include "io/from_blob.h"

#include "absl/strings/str_cat.h"
#include "runtime/cuda.h"
#include "runtime/status.h"

namespace kiln {
namespace {

std::string DescribeBlob(IntList shape, IntList strides, DType dtype, Device device) {
  return absl::StrCat(DTypeName(dtype), ShapeString(shape), " with strides ", ShapeString(strides),
                      " on ", device.str());
}

// Elements the view reaches: 1 + sum((size - 1) * stride), or 0 without elements.
int64_t ElementSpan(IntList shape, IntList strides, const std::string& what) {
  int64_t span = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    KILN_CHECK(shape[d] >= 0 && strides[d] >= 0, "from_blob: sizes and strides must be ",
               "non-negative (", what, ")");
    if (shape[d] == 0) return 0;
    int64_t reach = 0;
    KILN_CHECK(!__builtin_mul_overflow(shape[d] - 1, strides[d], &reach) &&
                   !__builtin_add_overflow(span, reach, &span),
               "from_blob: the view's extent overflows (", what, ")");
  }
  return span;
}

// Where `data` lives according to the CUDA runtime, when a GPU is present to ask.
void CheckPointerDevice(const void* data, Device device, const std::string& what) {
  if (!cuda::IsAvailable() || data == nullptr) return;
  const cuda::PointerInfo attr = cuda::DescribePointer(data);
  using Kind = cuda::PointerInfo::Kind;
  if (device.is_cuda()) {
    KILN_CHECK(attr.kind == Kind::kDevice || attr.kind == Kind::kManaged,
               "from_blob: the pointer is not CUDA device memory but the device is ", device.str(),
               " (", what, ")");
    KILN_CHECK(attr.device == device.index,
               "from_blob: the pointer is memory of cuda:", attr.device, " but the device is ",
               device.str(), " (", what, ")");
  } else {
    KILN_CHECK(attr.kind != Kind::kDevice, "from_blob: the pointer is memory of cuda:", attr.device,
               " but the device is ", device.str(), " (", what, ")");
  }
}

}  // namespace

Tensor from_blob(void* data, IntList shape, IntList strides, DType dtype, Device device,
                 BlobDeleter deleter) {
  const std::string what = DescribeBlob(shape, strides, dtype, device);
  KILN_CHECK(shape.size() == strides.size(), "from_blob: ", shape.size(), " sizes but ",
             strides.size(), " strides (", what, ")");
  KILN_CHECK(!device.is_meta(), "from_blob: a meta tensor holds no memory (", what, ")");
  KILN_CHECK(!device.is_cuda() || (device.index >= 0 && device.index < cuda::DeviceCount()),
             "from_blob: device ", device.str(), " is not present (", cuda::DeviceCount(),
             " CUDA devices) (", what, ")");
  const int64_t span = ElementSpan(shape, strides, what);
  KILN_CHECK(data != nullptr || span == 0, "from_blob: a null pointer for ", span, " elements (",
             what, ")");
  KILN_CHECK(reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(DTypeSize(dtype)) == 0,
             "from_blob: the pointer 0x", absl::Hex(reinterpret_cast<uintptr_t>(data)),
             " is not aligned to the ", DTypeSize(dtype), " bytes of a ", DTypeName(dtype),
             " element (", what, ")");
  CheckPointerDevice(data, device, what);
  int64_t nbytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(span, DTypeSize(dtype), &nbytes),
             "from_blob: the view's size in bytes overflows (", what, ")");
  auto storage = Storage::FromBlob(data, static_cast<size_t>(nbytes), device, std::move(deleter));
  return Tensor(std::move(storage), 0, Shape(shape.begin(), shape.end()),
                Strides(strides.begin(), strides.end()), dtype, device);
}

Tensor from_blob(void* data, IntList shape, DType dtype, Device device, BlobDeleter deleter) {
  return from_blob(data, shape, ContiguousStrides(shape), dtype, device, std::move(deleter));
}

}  // namespace kiln
