// safetensors: a generated model round-trips; every kind of bad file is a clear error naming
// the file and the tensor (corrupt_data or io), never a crash; sharded models; the fuzz corpus.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "npullm/model/synthetic.hpp"
#include "npullm/io/safetensors.hpp"

namespace {

using namespace npullm;
using namespace npullm::model;
using namespace npullm::io;
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("npullm_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

// A file image: 8-byte length, header text (padded with spaces so the data section starts
// 8-byte aligned, as safetensors writers do), data bytes.
std::vector<std::byte> image(std::string header, std::size_t data_bytes) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<std::byte> v(8 + header.size() + data_bytes, std::byte{0});
  const std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xff);
  std::memcpy(v.data() + 8, header.data(), header.size());
  return v;
}

void expect_corrupt(const std::vector<std::byte>& bytes, const std::string& fragment) {
  try {
    (void)parse_safetensors_header(bytes, "f.safetensors");
    FAIL() << "expected corrupt_data containing: " << fragment;
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::corrupt_data) << e.what();
    EXPECT_NE(std::string(e.what()).find("f.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(Safetensors, ValidHeaderParses) {
  const auto h = parse_safetensors_header(
      image(
          R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},"__metadata__":{"k":"v"}})",
          32),
      "f");
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors.at("a").shape, (std::vector<std::size_t>{2, 3}));
  EXPECT_EQ(h.tensors.at("b").storage(), npullm::dtype::bf16);
  EXPECT_EQ(h.metadata.at("k"), "v");
}

TEST(Safetensors, EveryBadFileIsAClearError) {
  expect_corrupt(std::vector<std::byte>(5), "shorter than the 8-byte header length");
  auto beyond = image("{}", 0);
  beyond[0] = std::byte{0xff};
  expect_corrupt(beyond, "header length 255 runs past the end");
  expect_corrupt(image("{not json", 0), "not valid JSON");
  expect_corrupt(image("[1,2]", 0), "not a JSON object");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", 8),
                 "'t' data_offsets [0, 16) lie outside the 8-byte data section");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
                 "'t' holds 8 bytes, but F32 [3] needs 3 x 4");
  expect_corrupt(image(R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8),
                 "unknown dtype 'Q4'");
  expect_corrupt(
      image(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "'a' and 'b' overlap");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})", 8),
                 "misaligned for F32");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 8),
                 "not a non-negative integer");
  expect_corrupt(image(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", 8),
                 "'t' has no string dtype");
  expect_corrupt(image(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", 8), "no shape array");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 8),
                 "no [begin, end] data_offsets");
  expect_corrupt(image(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 8),
                 "lie outside");
  expect_corrupt(
      image(
          R"({"t":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})",
          8),
      "overflows");
  expect_corrupt(image(R"({"t":5})", 8), "'t' is not an object");
  expect_corrupt(image(R"({"__metadata__":{"k":1}})", 0),
                 "__metadata__ value of 'k' is not a string");
}

TEST(Safetensors, GeneratedModelRoundTripsZeroCopy) {
  const fs::path dir = temp_dir("roundtrip");
  const auto spec = preset("tiny", npullm::dtype::bf16, 7);
  write_model(dir, spec);
  const auto file = safetensors_file::open(dir / "model.safetensors");
  for (const auto& [name, shape] : tensor_list(spec.config)) {
    const tensor_info& t = file->info(name);
    EXPECT_EQ(t.shape, shape) << name;
    EXPECT_EQ(t.dtype, "BF16");
  }
  const auto emb = file->view<bfloat16, 2>("model.embed_tokens.weight");
  EXPECT_EQ(emb.extent(0), 512u);
  EXPECT_EQ(emb.extent(1), 128u);
  // Zero-copy: the view points into the mapping, 8 + N + begin bytes in.
  const auto& info = file->info("model.embed_tokens.weight");
  const auto* base = reinterpret_cast<const std::byte*>(emb.data_handle()) -
                     file->header().data_offset - info.begin;
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(std::memcmp(base, raw.data(), raw.size()), 0);
  // Realistic scales: norms near 1, projections ~ 1/sqrt(fan_in).
  const auto norm = file->view<bfloat16, 1>("model.layers.1.input_layernorm.weight");
  double mean = 0;
  for (std::size_t i = 0; i < 128; ++i) mean += static_cast<float>(norm(i));
  EXPECT_NEAR(mean / 128, 1.0, 0.03);
  // Deterministic: the same seed writes the same bytes.
  const fs::path again = temp_dir("roundtrip2");
  write_model(again, spec);
  std::ifstream in2(again / "model.safetensors", std::ios::binary);
  std::vector<char> raw2((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
  EXPECT_EQ(raw, raw2);
  fs::remove_all(dir);
  fs::remove_all(again);
}

TEST(Safetensors, ViewErrors) {
  const fs::path dir = temp_dir("views");
  write_model(dir, preset("tiny", npullm::dtype::f16));
  const auto file = safetensors_file::open(dir / "model.safetensors");
  try {
    (void)file->view<float16, 2>("model.layers.9.mlp.up_proj.weight");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::corrupt_data);
    EXPECT_NE(std::string(e.what()).find("missing tensor 'model.layers.9.mlp.up_proj.weight'"),
              std::string::npos);
  }
  EXPECT_THROW(((void)file->view<float, 2>("model.embed_tokens.weight")), error);    // stored F16
  EXPECT_THROW(((void)file->view<float16, 1>("model.embed_tokens.weight")), error);  // rank 2
  try {
    (void)safetensors_file::open(dir / "missing.safetensors");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::io);
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(Safetensors, UnsupportedDtypeParsesButDoesNotView) {
  const fs::path dir = temp_dir("i64");
  const auto bytes = image(R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
  {
    std::ofstream out(dir / "model.safetensors", std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const auto file = safetensors_file::open(dir / "model.safetensors");
  try {
    (void)file->view<float, 1>("ids");
    FAIL();
  } catch (const error& e) {
    EXPECT_EQ(e.code(), error_code::unsupported);
    EXPECT_NE(std::string(e.what()).find("'ids' has dtype I64"), std::string::npos);
  }
  fs::remove_all(dir);
}

TEST(Safetensors, ShardedModel) {
  const fs::path dir = temp_dir("sharded");
  const auto a = image(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8);
  auto b = image(R"({"y":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8);
  const float yv = 2.5f;
  std::memcpy(b.data() + b.size() - 8, &yv, 4);
  for (const auto& [name, bytes] :
       {std::pair{"s1.safetensors", a}, std::pair{"s2.safetensors", b}}) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  {
    std::ofstream out(dir / "model.safetensors.index.json");
    out << R"({"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})";
  }
  const auto m = safetensors_model::open(dir);
  EXPECT_EQ(m.shard_count(), 2u);
  EXPECT_EQ((m.view<float, 1>("y")(0)), 2.5f);
  EXPECT_EQ((m.view<float, 1>("x").extent(0)), 2u);
  {
    std::ofstream out(dir / "model.safetensors.index.json");
    out << R"({"weight_map":{"x":"s1.safetensors","z":"s1.safetensors"}})";
  }
  EXPECT_THROW((void)safetensors_model::open(dir), error);  // z is not in s1
  {
    std::ofstream out(dir / "model.safetensors.index.json");
    out << R"({"weight_map":{"x":"../s1.safetensors"}})";
  }
  EXPECT_THROW((void)safetensors_model::open(dir), error);  // not a plain file name
  fs::remove_all(dir);
}

TEST(Safetensors, FuzzCorpusReplays) {
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_SAFETENSORS_CORPUS_DIR)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::vector<char> raw((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes(raw.size());
    std::memcpy(bytes.data(), raw.data(), raw.size());
    try {
      (void)parse_safetensors_header(bytes, entry.path().string());
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::corrupt_data) << entry.path() << ": " << e.what();
    }
    ++files;
  }
  EXPECT_GE(files, 5u);
}

}  // namespace
