// safetensors: exact round trips, the reference writer's layout, a hand-made file from another
// writer, one error per broken rule (each naming the file and the tensor), and a fuzz test of the
// header parser (seeded mutations and truncations of valid files: an error or a valid load,
// never a crash; CI runs it under ASan + UBSan).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "io/safetensors_header.h"
#include "ops/factories.h"
#include "ops/ops.h"
#include "runtime/status.h"
#include "tests/io_test_util.h"
#include "tests/test_util.h"

namespace kiln {
namespace {

NamedTensors EveryDType() {
  return {{"f32", RandomBits({3, 5}, DType::kFloat32, 1)},
          {"f16", RandomBits({7}, DType::kFloat16, 2)},
          {"bf16", RandomBits({2, 3, 3}, DType::kBFloat16, 3)},
          {"i64", RandomBits({4}, DType::kInt64, 4)},
          {"i32", RandomBits({1, 9}, DType::kInt32, 5)},
          {"mask", RandomBits({11}, DType::kBool, 6)},
          {"scalar", RandomBits({}, DType::kFloat32, 7)},
          {"empty", RandomBits({0, 3}, DType::kBFloat16, 8)}};
}

void ExpectSameTensors(const SafetensorsFile& file, const NamedTensors& want, Device device) {
  ASSERT_EQ(file.entries().size(), want.size());
  for (const auto& [name, t] : want) {
    const SafetensorsEntry& e = file.entry(name);
    EXPECT_EQ(e.kiln_dtype(), t.dtype()) << name;
    EXPECT_EQ(e.shape, t.shape()) << name;
    const Tensor got = file.Load(name, device);
    EXPECT_EQ(got.device(), device);
    EXPECT_EQ(got.dtype(), t.dtype()) << name;
    EXPECT_EQ(got.shape(), t.shape()) << name;
    EXPECT_EQ(Bytes(got), Bytes(t)) << name << ": not bit for bit";
  }
}

TEST(Safetensors, RoundTripIsExactForEveryDType) {
  const NamedTensors tensors = EveryDType();
  const std::string path = TempPath("every_dtype.safetensors");
  save_safetensors(path, tensors, {{"format", "pt"}, {"note", "round trip"}});
  const SafetensorsFile file = SafetensorsFile::Open(path);
  EXPECT_EQ(file.name(), path);
  EXPECT_EQ(file.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "round trip"}}));
  ExpectSameTensors(file, tensors, kCPU);
  // The file is the in-memory image, byte for byte.
  std::ifstream in(path, std::ios::binary);
  const std::string on_disk((std::istreambuf_iterator<char>(in)), {});
  EXPECT_EQ(on_disk, serialize_safetensors(tensors, {{"format", "pt"}, {"note", "round trip"}}));
  const NamedTensors all = load_safetensors(path);
  EXPECT_EQ(all.size(), tensors.size());
  std::remove(path.c_str());
}

TEST(Safetensors, WritesViewsAsTheirElements) {
  const Tensor base = RandomBits({4, 6}, DType::kFloat32, 9);
  const NamedTensors tensors = {{"t", transpose(base, 0, 1)},
                                {"s", slice(base, 1, 1, 5, 2)},
                                {"e", expand(RandomBits({1, 3}, DType::kInt32, 10), {4, 3})}};
  const SafetensorsFile file = SafetensorsFile::FromBytes(serialize_safetensors(tensors));
  ExpectSameTensors(file, tensors, kCPU);
}

TEST(Safetensors, WriterLayoutFollowsTheReference) {
  const std::string image = serialize_safetensors(EveryDType(), {{"format", "pt"}});
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  EXPECT_EQ(n % 8, 0u) << "header padded to 8 bytes";
  const std::string header = image.substr(8, n);
  EXPECT_EQ(header.find("{\"__metadata__\":{\"format\":\"pt\"},"), 0u) << header;
  const size_t json_end = header.find_last_not_of(' ') + 1;
  EXPECT_EQ(header[json_end - 1], '}');
  EXPECT_LT(header.size() - json_end, 8u) << "padding is spaces, fewer than 8";
  // Descending dtype (I64, F32, I32, BF16, F16, BOOL), then names; each aligned to its size.
  const SafetensorsFile file = SafetensorsFile::FromBytes(image);
  std::vector<std::string> order;
  for (const SafetensorsEntry& e : file.entries()) {
    order.push_back(e.name);
    EXPECT_EQ((8 + n + e.begin) % DTypeSize(*e.kiln_dtype()), 0u) << e.name << " misaligned";
  }
  EXPECT_EQ(order, (std::vector<std::string>{"i64", "f32", "scalar", "i32", "bf16", "empty", "f16",
                                             "mask"}));
  EXPECT_LT(header.find("\"i64\""), header.find("\"f32\"")) << "header lists tensors in data order";
}

// A file as another writer might lay it out: keys in no particular order, "__metadata__" last,
// a header length that is not a multiple of 8 and tensors at odd byte offsets.
TEST(Safetensors, LoadsAHandMadeFileFromAnotherWriter) {
  std::string data;
  auto put = [&data](const auto& v) { data.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint16_t{0x3f80});  // bf16 1.0        [0, 6)
  put(uint16_t{0xc000});  // bf16 -2.0
  put(uint16_t{0x4040});  // bf16 3.0
  put(1.5f);              // f32 at offset 6  [6, 14)
  put(-0.25f);
  put(int64_t{-7});                        // i64 at offset 14 [14, 22)
  data += std::string("\x01\x00\x01", 3);  // bool [22, 25)
  put(int32_t{123456});                    // i32 at offset 25 [25, 29)
  const std::string header = R"({"z_i32":{"data_offsets":[25,29],"shape":[1],"dtype":"I32"},)"
                             R"( "b" : {"shape":[3],"dtype":"BF16","data_offsets":[0,6]},)"
                             R"("a":{"dtype":"F32","shape":[2],"data_offsets":[6,14]},)"
                             R"("m":{"dtype":"BOOL","shape":[3],"data_offsets":[22,25]},)"
                             R"("i":{"dtype":"I64","shape":[],"data_offsets":[14,22]},)"
                             R"("__metadata__":{"source":"by hand","format":"pt"}})";
  ASSERT_NE(header.size() % 8, 0u);
  const SafetensorsFile f = SafetensorsFile::FromBytes(FileImage(header, data), "fixture");
  EXPECT_EQ(f.metadata().at("source"), "by hand");
  EXPECT_EQ(f.keys(), (std::vector<std::string>{"b", "a", "i", "m", "z_i32"}));
  EXPECT_EQ(to_vector(f.Load("b")), (std::vector<double>{1, -2, 3}));
  EXPECT_EQ(to_vector(f.Load("a")), (std::vector<double>{1.5, -0.25}));
  EXPECT_EQ(to_vector(f.Load("i")), (std::vector<double>{-7}));
  EXPECT_EQ(f.Load("i").dim(), 0);
  EXPECT_EQ(to_vector(f.Load("m")), (std::vector<double>{1, 0, 1}));
  EXPECT_EQ(to_vector(f.Load("z_i32")), (std::vector<double>{123456}));
  EXPECT_EQ(f.Load("a", kMeta).shape(), (Shape{2}));
}

TEST(Safetensors, LoadsToCuda) {
  KILN_SKIP_WITHOUT_GPU();
  const NamedTensors tensors = EveryDType();
  ExpectSameTensors(SafetensorsFile::FromBytes(serialize_safetensors(tensors)), tensors, CUDA());
  const Tensor on_gpu = to(RandomBits({5, 3}, DType::kBFloat16, 11), CUDA());
  const SafetensorsFile f = SafetensorsFile::FromBytes(serialize_safetensors({{"g", on_gpu}}));
  EXPECT_EQ(Bytes(f.Load("g")), Bytes(on_gpu));
}

struct BadFile {
  const char* rule;
  std::string image;
  const char* message;  // a substring of the error
};

std::string Entry(const char* name, const char* dtype, const char* shape, const char* offsets) {
  return absl::StrCat("\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape,
                      ",\"data_offsets\":", offsets, "}");
}

std::vector<BadFile> BadFiles() {
  const std::string d16(16, '\0');
  const std::string a = Entry("a", "F32", "[2]", "[0,8]");
  auto img = [&](const std::string& body, const std::string& data) {
    return FileImage("{" + body + "}", data);
  };
  std::string huge(8, '\0');
  const uint64_t big = 200'000'000;
  std::memcpy(huge.data(), &big, 8);
  std::string longer = FileImage("{}", "");
  longer[0] = 100;  // claims 100 header bytes, the file has 2
  return {
      {"empty file", "", "truncated: 0 bytes"},
      {"shorter than the length", std::string(5, '\0'), "truncated: 5 bytes"},
      {"header longer than the file", longer, "header length 100 is larger than the file"},
      {"header over 100 MB", huge + "{}", "exceeds the format's limit"},
      {"invalid JSON", FileImage("{\"a\":", d16), "not valid JSON"},
      {"JSON not an object", FileImage("[1,2]", ""), "must start with '{' (a JSON object)"},
      {"duplicate key", img(a + "," + a, std::string(8, 'x')), "the key 'a' twice"},
      {"duplicate field",
       img("\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2],"
           "\"data_offsets\":[0,8]}",
           std::string(8, 'x')),
       "the key 'dtype' twice"},
      {"unknown dtype", img(Entry("a", "F33", "[2]", "[0,8]"), d16.substr(8)),
       "tensor 'a': unknown dtype 'F33'"},
      {"missing dtype", img("\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}", d16.substr(8)),
       "tensor 'a': 'dtype' must be a string"},
      {"offsets not dtype*shape", img(Entry("a", "F32", "[3]", "[0,8]"), d16.substr(8)),
       "tensor 'a': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"},
      {"negative dim", img(Entry("a", "F32", "[-2]", "[0,8]"), d16.substr(8)),
       "tensor 'a': 'shape' holds -2, not a non-negative integer"},
      {"fractional offset", img(Entry("a", "F32", "[2]", "[0,8.5]"), d16.substr(8)),
       "'data_offsets' holds 8.5"},
      {"begin after end", img(Entry("a", "F32", "[0]", "[8,0]"), d16.substr(8)), "begin <= end"},
      {"three offsets", img(Entry("a", "F32", "[2]", "[0,8,8]"), d16.substr(8)), "[begin, end]"},
      {"overlap", img(a + "," + Entry("b", "F32", "[2]", "[4,12]"), std::string(12, 'x')),
       "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"},
      {"out of bounds", img(a + "," + Entry("b", "I64", "[1]", "[8,16]"), std::string(12, 'x')),
       "tensor 'b': data_offsets [8, 16] are out of bounds: the data section has 12 bytes"},
      {"hole", img(Entry("a", "F32", "[2]", "[4,12]"), std::string(12, 'x')),
       "bytes [0, 4) of the data section, before tensor 'a', belong to no tensor"},
      {"trailing bytes", img(a, std::string(10, 'x')),
       "the data section has 10 bytes but the "
       "tensors cover 8"},
      {"overflowing shape",
       img(Entry("a", "F32", "[4294967296,4294967296]", "[0,8]"), std::string(8, 'x')),
       "overflows"},
      {"metadata not strings", img("\"__metadata__\":{\"n\":1}", ""),
       "__metadata__ must map strings to strings: 'n' is number"},
      {"entry not an object", img("\"a\":[0,8]", ""), "tensor 'a': expected an object"},
      {"NUL in the header", FileImage(std::string("{}\0{{", 4), ""), "NUL byte at offset 2"},
      {"byte-order mark", FileImage("\xEF\xBB\xBF{}", ""),
       "must start with '{' (a JSON object), got the byte 239"},
      {"leading space", FileImage(" {}", ""), "must start with '{'"},
      // Deep enough to exhaust the stack of a recursive printer or copy: refused while parsing.
      {"deep nesting",
       img(Entry("a", "F32", (std::string(100000, '[') + std::string(100000, ']')).c_str(),
                 "[0,8]"),
           std::string(8, 'x')),
       "the header nests deeper than 64 levels"},
      {"a list in the shape", img(Entry("a", "F32", "[[[2]]]", "[0,8]"), std::string(8, 'x')),
       "tensor 'a': 'shape' holds [[...]], not a non-negative integer"},
  };
}

TEST(Safetensors, EachBrokenRuleIsAClearError) {
  for (const BadFile& bad : BadFiles()) {
    try {
      SafetensorsFile::FromBytes(bad.image, "bad.safetensors");
      ADD_FAILURE() << bad.rule << ": accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("safetensors file 'bad.safetensors': "), std::string::npos) << what;
      EXPECT_NE(what.find(bad.message), std::string::npos) << bad.rule << ": " << what;
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(Safetensors, LoadErrorsNameTheFileAndTheTensor) {
  std::string data(8, '\0');
  data += std::string("\x00\x02", 2);
  const std::string image = FileImage(
      "{" + Entry("d", "F64", "[1]", "[0,8]") + "," + Entry("m", "BOOL", "[2]", "[8,10]") + "}",
      data);
  const SafetensorsFile f = SafetensorsFile::FromBytes(image, "x.safetensors");
  EXPECT_EQ(f.entry("d").kiln_dtype(), std::nullopt);
  EXPECT_NE(ErrorOf([&] { f.Load("d"); })
                .find("'x.safetensors', tensor 'd': dtype F64 has no "
                      "kiln equivalent"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { f.Load("m"); }).find("tensor 'm': BOOL element 1 is the byte 2"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] { f.Load("nope"); }).find("'x.safetensors' has no tensor 'nope'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] {
              SafetensorsFile::Open("/nonexistent/w.safetensors");
            }).find("'/nonexistent/w.safetensors': cannot open: No such file"),
            std::string::npos);
  EXPECT_NE(ErrorOf([] { SafetensorsFile::Open(::testing::TempDir()); }).find("not a regular file"),
            std::string::npos);
}

TEST(Safetensors, SaveRejectsBadNamesAndTensors) {
  const Tensor t = zeros({2});
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"a", t}, {"a", t}});
            }).find("the tensor name 'a' appears twice"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"__metadata__", t}});
            }).find("invalid tensor name '__metadata__'"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"", t}});
            }).find("invalid tensor name ''"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"u", Tensor()}});
            }).find("tensor 'u' is undefined"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"m", empty({2}, DType::kFloat32, kMeta)}});
            }).find("tensor 'm' (float32[2] on meta) holds no data"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"ok", t}, {std::string("bad\xff", 4), t}});
            }).find("serialize_safetensors: the tensor name 'bad\\xFF' is not valid UTF-8"),
            std::string::npos);
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"a", t}}, {{"note", std::string("\xc0\x80", 2)}});
            }).find("the metadata entry 'note' = '\\xC0\\x80' is not valid UTF-8"),
            std::string::npos);
  EXPECT_EQ(SafetensorsFile::FromBytes(serialize_safetensors({{"\u00e9t\u00e9 \u4e2d", t}}))
                .keys()
                .size(),
            1u);  // well-formed UTF-8 of two and three bytes
  EXPECT_NE(ErrorOf([&] {
              save_safetensors("/nonexistent/dir/w.safetensors", {{"a", t}});
            }).find("'/nonexistent/dir/w.safetensors': cannot create the file beside it"),
            std::string::npos);
  const std::string dir = ::testing::TempDir();
  EXPECT_NE(ErrorOf([&] {
              save_safetensors(dir, {{"a", t}});
            }).find("names a directory"),
            std::string::npos);
  std::string trimmed = dir;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  EXPECT_NE(ErrorOf([&] {
              save_safetensors(trimmed, {{"a", t}});
            }).find("is a directory"),
            std::string::npos);
  // The writer refuses what no reader would load: a header over the format's limit.
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"a", t}}, {{"m", std::string(kMaxSafetensorsHeader, 'x')}});
            }).find("over the format's limit of 100000000"),
            std::string::npos);
  // Uninitialised memory (a parameter made with Init::kNone, never loaded) is not saved.
  Tensor unwritten = empty({2}, DType::kFloat32, kCPU);
  unwritten.storage()->MarkUninitialised();
  EXPECT_NE(ErrorOf([&] {
              serialize_safetensors({{"w", unwritten}});
            }).find("tensor 'w' (float32[2] on cpu) was made without values"),
            std::string::npos);
}

// A zero-size tensor needs no bytes, whatever its other dims: no overflow from them.
TEST(Safetensors, ZeroSizeTensorsWithHugeDimsLoad) {
  for (const char* shape : {"[0,9223372036854775807]", "[9223372036854775807,0]"}) {
    const std::string image = FileImage(
        absl::StrCat("{\"z\":{\"dtype\":\"F32\",\"shape\":", shape, ",\"data_offsets\":[0,0]}}"),
        "");
    const Tensor z = SafetensorsFile::FromBytes(image, "z").Load("z");
    EXPECT_EQ(z.numel(), 0) << shape;
  }
}

// One seeded mutation of a file image: flip, overwrite, insert or delete bytes (mostly in the
// header, where the parser reads), rewrite the length, or truncate.
std::string Mutate(std::string image, std::mt19937& rng) {
  if (image.size() <= 8) return image + static_cast<char>(rng());  // truncated already
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  const size_t header_end = 8 + std::min<uint64_t>(image.size() - 8, n);
  auto pos = [&](size_t end) { return end == 0 ? 0 : rng() % end; };
  const char* kTokens[] = {"{",
                           "}",
                           "[",
                           "]",
                           ",",
                           ":",
                           "\"",
                           "-1",
                           "1e9",
                           "0",
                           "99999999999",
                           "\"F64\"",
                           "\"__metadata__\"",
                           "null",
                           "\\u0000",
                           "\xc3",
                           " "};
  switch (rng() % 7) {
    case 0:
      image[pos(header_end)] ^= static_cast<char>(1 << (rng() % 8));
      break;
    case 1:
      image[pos(image.size())] = static_cast<char>(rng());
      break;
    case 2:
      image.insert(8 + pos(header_end - 8), kTokens[rng() % std::size(kTokens)]);
      break;
    case 3:
      image.erase(8 + pos(header_end - 8), 1 + rng() % 4);
      break;
    case 4: {
      const uint64_t m = rng() % 3 == 0 ? rng() : n + static_cast<int>(rng() % 9) - 4;
      std::memcpy(image.data(), &m, 8);
      break;
    }
    case 5:
      image.resize(pos(image.size() + 1));
      break;
    default: {
      // Change a digit of the header (offsets, shapes).
      const size_t at = 8 + pos(header_end - 8);
      const size_t digit = image.find_first_of("0123456789", at);
      if (digit < header_end) image[digit] = static_cast<char>('0' + rng() % 10);
    }
  }
  return image;
}

TEST(SafetensorsFuzz, MutatedHeadersAreRejectedOrLoadCleanly) {
  const std::vector<std::string> seeds = {
      serialize_safetensors(EveryDType(), {{"format", "pt"}}),
      serialize_safetensors({{"w", RandomBits({3, 2}, DType::kFloat32, 12)},
                             {"b", RandomBits({2}, DType::kFloat16, 13)}}),
      serialize_safetensors({}),
  };
  std::mt19937 rng(20240611);
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string image = seeds[i % seeds.size()];
    for (int k = 1 + rng() % 3; k > 0; --k) image = Mutate(std::move(image), rng);
    std::optional<SafetensorsFile> f;
    try {
      f = SafetensorsFile::FromBytes(image, "fuzz");
    } catch (const Error& e) {
      ++rejected;
      ASSERT_NE(std::string(e.what()).find("safetensors file 'fuzz': "), std::string::npos);
      continue;
    }
    ++accepted;
    // A file that opens is consistent: every tensor lies inside the image and loads or raises.
    for (const SafetensorsEntry& e : f->entries()) {
      ASSERT_LE(8 + e.end, image.size());
      try {
        const Tensor t = f->Load(e.name);
        ASSERT_EQ(static_cast<uint64_t>(t.numel() * t.element_size()), e.nbytes());
        ASSERT_EQ(Bytes(t),
                  std::string(reinterpret_cast<const char*>(f->data(e.name)), e.nbytes()));
      } catch (const Error&) {
        // A dtype kiln lacks, or a bool byte other than 0/1: a clear error is the contract.
      }
    }
  }
  EXPECT_GT(rejected, 10000) << "the mutations should break most files";
  EXPECT_GT(accepted, 10) << "some mutations (metadata, shapes of the same size) stay valid";
}

}  // namespace
}  // namespace kiln
