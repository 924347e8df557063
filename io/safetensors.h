// safetensors files (Hugging Face's weight format), read and written by kiln.
//
//   SafetensorsFile f = SafetensorsFile::Open("model.safetensors");   // maps the file, checks it
//   for (const SafetensorsEntry& e : f.entries()) std::cout << e.name << " " << e.dtype;
//   Tensor w = f.Load("h.0.attn.c_attn.weight", CUDA());   // only this tensor is read
//   save_safetensors("out.safetensors", {{"w", w}}, {{"format", "pt"}});
//
// The format: 8 bytes N (little-endian u64), N bytes of UTF-8 JSON header, then the data. The
// header maps each tensor name to {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}
// (byte offsets into the data section) and may hold "__metadata__", a string-to-string map.
//
// Reading maps the file (mmap) and validates the whole header up front, as the reference reader
// does: the header length fits the file (and 100 MB), the JSON is valid with no duplicate keys,
// every dtype is one of the format's, each tensor's offsets span exactly numel * element size,
// and the tensors tile the data section (sorted by offset: no overlap, no hole, nothing after
// the last). Any violation throws kiln::Error naming the file, the tensor and the rule. Tensor
// data is read only when a tensor is loaded (lazily, one at a time). Header key order and
// alignment are free: tensors may sit at any byte offset.
//
// Writing follows the reference writer: tensors sorted by descending dtype (so each one's data
// is aligned to its element size) then by name, "__metadata__" first in the header, the header
// padded with spaces to a multiple of 8 bytes. A written file loads back bit for bit.
//
// A SafetensorsFile is immutable after Open and safe to read from several threads. The mapping
// lives as long as the object (copies share it); changing the file on disk while it is open is
// undefined, as with any mmap.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace kiln {

// Named tensors, in the shape Module::named_parameters() returns them.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the format's name: "F32", "F16", "BF16", "I64", "I32", "BOOL", "F64", ...
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section (after the header)
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
  // kiln's dtype for the file's, if kiln has tensors of it (F32, F16, BF16, I64, I32, BOOL).
  std::optional<DType> kiln_dtype() const;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header; throws kiln::Error naming the path and the problem.
  static SafetensorsFile Open(const std::string& path);
  // The same over a file image in memory (tests, network buffers); `name` is used in errors.
  static SafetensorsFile FromBytes(std::string bytes, std::string name = "<memory>");

  const std::string& name() const { return name_; }  // the path, or FromBytes' name
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensors in data order (by offset).
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  std::vector<std::string> keys() const;
  bool contains(std::string_view key) const;
  // The entry of `key`; throws kiln::Error naming the file and the key when there is none.
  const SafetensorsEntry& entry(std::string_view key) const;

  // Copies the tensor into new contiguous memory on `device` (straight from the mapping to the
  // GPU for CUDA). Throws for a dtype kiln has no tensors of (F64, U8, ...) and for a BOOL tensor
  // holding a byte other than 0 or 1.
  Tensor Load(std::string_view key, Device device = kCPU) const;
  // The raw bytes of the tensor inside the mapping (valid while this object or a copy lives).
  const uint8_t* data(std::string_view key) const;

 private:
  struct Buffer;
  SafetensorsFile() = default;
  static SafetensorsFile Parse(std::shared_ptr<const Buffer> buffer, std::string name);

  std::shared_ptr<const Buffer> buffer_;
  std::string name_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::map<std::string, std::string> metadata_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t, std::less<>> index_;  // name -> position in entries_
};

// Every tensor of a file, loaded to `device`, in data order.
NamedTensors load_safetensors(const std::string& path, Device device = kCPU);

// Writes `tensors` (any device, dtype of kiln's, any layout) and `metadata` to `path` (through a
// temporary file renamed into place). Names must be unique, non-empty and not "__metadata__".
// Throws kiln::Error naming the path or the tensor.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// The same file image in memory.
std::string serialize_safetensors(const NamedTensors& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// The format's name of a kiln dtype ("F32", "BF16", "BOOL", ...).
const char* SafetensorsDTypeName(DType dtype);

}  // namespace kiln
