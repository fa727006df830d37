// GGUF: the writer and the reader round-trip every metadata type and tensors of several types
// at several alignments; a file assembled byte by byte here (not by the writer) reads as it
// should, so the two cannot share a mistake; every malformed file is corrupt_data (or
// unsupported) with a message naming the file and the problem; the fuzz corpus replays.
#include <gtest/gtest.h>
#include <unistd.h>

#include <bit>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "npullm/io/gguf.hpp"
#include "npullm/io/gguf_writer.hpp"

#define NPULLM_GGUF_FUZZ_NO_ENTRY
#include "model/fuzz_gguf.cpp"

namespace {

using namespace npullm;
using namespace npullm::io;
namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("npullm_test_gguf_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

void write_file(const fs::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> raw((std::istreambuf_iterator<char>(in)),
                              std::istreambuf_iterator<char>());
  std::vector<std::byte> v(raw.size());
  if (!raw.empty()) std::memcpy(v.data(), raw.data(), raw.size());
  return v;
}

// Builds a file image field by field, little-endian, independently of gguf_writer.
struct assembler {
  std::vector<std::byte> v;

  assembler& byte(std::uint8_t b) {
    v.push_back(std::byte{b});
    return *this;
  }
  assembler& le(std::uint64_t x, int n) {
    for (int i = 0; i < n; ++i) byte(static_cast<std::uint8_t>(x >> (8 * i)));
    return *this;
  }
  assembler& u16(std::uint16_t x) { return le(x, 2); }
  assembler& u32(std::uint32_t x) { return le(x, 4); }
  assembler& u64(std::uint64_t x) { return le(x, 8); }
  assembler& f32(float x) { return u32(std::bit_cast<std::uint32_t>(x)); }
  assembler& text(std::string_view s) {  // raw characters, no length
    for (char c : s) byte(static_cast<std::uint8_t>(c));
    return *this;
  }
  assembler& str(std::string_view s) { return u64(s.size()).text(s); }
  // "GGUF", version, tensor count, metadata count.
  assembler& header(std::uint64_t tensors, std::uint64_t kvs, std::uint32_t version = 3) {
    return text("GGUF").u32(version).u64(tensors).u64(kvs);
  }
  // A tensor info: name, n_dims, ne (ggml order), type, offset.
  assembler& tensor(std::string_view name, std::vector<std::uint64_t> ne, std::uint32_t type,
                    std::uint64_t offset) {
    str(name).u32(static_cast<std::uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  assembler& pad_to(std::size_t alignment) {
    while (v.size() % alignment != 0) byte(0);
    return *this;
  }
  assembler& zeros(std::size_t n) {
    v.insert(v.end(), n, std::byte{0});
    return *this;
  }
};

// parse_gguf must fail with `code` and a message naming the file and containing `needle`.
void expect_bad(std::span<const std::byte> image, error_code code, const std::string& needle) {
  try {
    (void)parse_gguf(image, "bad.gguf");
    ADD_FAILURE() << "parsed, expected an error containing '" << needle << "'";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    const std::string what = e.what();
    EXPECT_NE(what.find("bad.gguf"), std::string::npos) << what;
    EXPECT_NE(what.find(needle), std::string::npos) << "'" << needle << "' not in: " << what;
  }
  // The fuzz harness agrees: an error of an allowed kind, no invariant broken.
  EXPECT_NO_THROW(npullm_fuzz_gguf::run_one(image));
}

template <class F>
void expect_error(F&& f, error_code code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, expected one containing '" << needle << "'";
  } catch (const error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "'" << needle << "' not in: " << e.what();
  }
}

// ---- metadata -----------------------------------------------------------------------------------

gguf_writer every_metadata_type() {
  gguf_writer w;
  w.add("t.u8", std::uint8_t{200})
      .add("t.i8", std::int8_t{-100})
      .add("t.u16", std::uint16_t{60000})
      .add("t.i16", std::int16_t{-30000})
      .add("t.u32", std::uint32_t{4000000000u})
      .add("t.i32", std::int32_t{-2000000000})
      .add("t.f32", 1.5f)
      .add("t.bool_true", true)
      .add("t.bool_false", false)
      .add("t.str", "qwen2 \xc3\xa9")
      .add("t.empty_str", "")
      .add("t.u64", std::uint64_t{1} << 63)
      .add("t.i64", std::int64_t{-(std::int64_t{1} << 62)})
      .add("t.f64", 0.1);
  w.add("a.u8", gguf_meta::array(std::vector<std::uint8_t>{0, 255}))
      .add("a.i8", gguf_meta::array(std::vector<std::int8_t>{-128, 127}))
      .add("a.u16", gguf_meta::array(std::vector<std::uint16_t>{1, 65535}))
      .add("a.i16", gguf_meta::array(std::vector<std::int16_t>{-1, 2}))
      .add("a.u32", gguf_meta::array(std::vector<std::uint32_t>{7}))
      .add("a.i32", gguf_meta::array(std::vector<std::int32_t>{1, -2, 3}))
      .add("a.f32", gguf_meta::array(std::vector<float>{0.5f, -2.25f}))
      .add("a.bool", gguf_meta::array(std::vector<bool>{true, false, true}))
      .add("a.str", gguf_meta::array(std::vector<std::string>{"a", "", "ccc"}))
      .add("a.u64", gguf_meta::array(std::vector<std::uint64_t>{~std::uint64_t{0}}))
      .add("a.i64", gguf_meta::array(std::vector<std::int64_t>{-5}))
      .add("a.f64", gguf_meta::array(std::vector<double>{1e300}))
      .add("a.empty", gguf_meta::array(std::vector<std::uint8_t>{}))
      .add("a.empty_str", gguf_meta::array(std::vector<std::string_view>{}));
  const std::vector<gguf_meta> deepest{gguf_meta::array(std::vector<std::uint64_t>{7, 8})};
  const std::vector<gguf_meta> inner{gguf_meta::array(std::vector<std::int16_t>{1, 2}),
                                     gguf_meta::array(std::vector<std::string>{"x"}),
                                     gguf_meta::array(std::vector<double>{}),
                                     gguf_meta::array_of(gguf_type::array, deepest)};
  w.add("a.nested", gguf_meta::array_of(gguf_type::array, inner));
  w.add("a.empty_nested", gguf_meta::array_of(gguf_type::array, {}));
  return w;
}

void check_every_metadata_type(const gguf_header& h) {
  EXPECT_EQ(h.get<std::uint8_t>("t.u8"), 200);
  EXPECT_EQ(h.get<std::int8_t>("t.i8"), -100);
  EXPECT_EQ(h.get<std::uint16_t>("t.u16"), 60000);
  EXPECT_EQ(h.get<std::int16_t>("t.i16"), -30000);
  EXPECT_EQ(h.get<std::uint32_t>("t.u32"), 4000000000u);
  EXPECT_EQ(h.get<std::int32_t>("t.i32"), -2000000000);
  EXPECT_EQ(h.get<float>("t.f32"), 1.5f);
  EXPECT_TRUE(h.get<bool>("t.bool_true"));
  EXPECT_FALSE(h.get<bool>("t.bool_false"));
  EXPECT_EQ(h.get<std::string_view>("t.str"), "qwen2 \xc3\xa9");
  EXPECT_EQ(h.get<std::string_view>("t.empty_str"), "");
  EXPECT_EQ(h.get<std::uint64_t>("t.u64"), std::uint64_t{1} << 63);
  EXPECT_EQ(h.get<std::int64_t>("t.i64"), -(std::int64_t{1} << 62));
  EXPECT_EQ(h.get<double>("t.f64"), 0.1);
  // The variant's index is the GGUF type id.
  EXPECT_EQ(type_of(*h.find_value("t.u8")), gguf_type::uint8);
  EXPECT_EQ(h.find_value("t.f64")->index(), 12u);
  EXPECT_EQ(type_of(*h.find_value("a.nested")), gguf_type::array);

  EXPECT_EQ(h.array("a.u8").to_vector<std::uint8_t>(), (std::vector<std::uint8_t>{0, 255}));
  EXPECT_EQ(h.array("a.i8").to_vector<std::int8_t>(), (std::vector<std::int8_t>{-128, 127}));
  EXPECT_EQ(h.array("a.u16").to_vector<std::uint16_t>(), (std::vector<std::uint16_t>{1, 65535}));
  EXPECT_EQ(h.array("a.i16").to_vector<std::int16_t>(), (std::vector<std::int16_t>{-1, 2}));
  EXPECT_EQ(h.array("a.u32").at<std::uint32_t>(0), 7u);
  EXPECT_EQ(h.array("a.i32").to_vector<std::int32_t>(), (std::vector<std::int32_t>{1, -2, 3}));
  EXPECT_EQ(h.array("a.f32").to_vector<float>(), (std::vector<float>{0.5f, -2.25f}));
  EXPECT_EQ(h.array("a.bool").to_vector<bool>(), (std::vector<bool>{true, false, true}));
  const auto strs = h.array("a.str").strings();
  ASSERT_EQ(strs.size(), 3u);
  EXPECT_EQ(strs[0], "a");
  EXPECT_EQ(strs[1], "");
  EXPECT_EQ(strs[2], "ccc");
  EXPECT_EQ(h.array("a.u64").at<std::uint64_t>(0), ~std::uint64_t{0});
  EXPECT_EQ(h.array("a.i64").at<std::int64_t>(0), -5);
  EXPECT_EQ(h.array("a.f64").at<double>(0), 1e300);
  EXPECT_TRUE(h.array("a.empty").empty());
  EXPECT_EQ(h.array("a.empty").type(), gguf_type::uint8);
  EXPECT_TRUE(h.array("a.empty_str").strings().empty());
  EXPECT_EQ(h.array("a.empty_str").type(), gguf_type::string);

  const gguf_array& nested = h.array("a.nested");
  ASSERT_EQ(nested.type(), gguf_type::array);
  ASSERT_EQ(nested.size(), 4u);
  const auto inner = nested.arrays();
  EXPECT_EQ(inner[0].to_vector<std::int16_t>(), (std::vector<std::int16_t>{1, 2}));
  EXPECT_EQ(inner[1].strings()[0], "x");
  EXPECT_EQ(inner[2].type(), gguf_type::float64);
  EXPECT_TRUE(inner[2].empty());
  ASSERT_EQ(inner[3].arrays().size(), 1u);
  EXPECT_EQ(inner[3].arrays()[0].to_vector<std::uint64_t>(), (std::vector<std::uint64_t>{7, 8}));
  EXPECT_TRUE(h.array("a.empty_nested").arrays().empty());
}

TEST(Gguf, RoundTripsEveryMetadataType) {
  const auto w = every_metadata_type();
  const auto image = w.image();
  const gguf_header h = parse_gguf(image, "mem.gguf");
  EXPECT_EQ(h.version, 3u);
  EXPECT_EQ(h.alignment, 32u);
  EXPECT_EQ(h.find_value("general.alignment"), nullptr);  // the default is not written
  EXPECT_TRUE(h.tensors.empty());
  EXPECT_EQ(h.metadata.size(), 30u);
  EXPECT_EQ(h.metadata.front().key, "t.u8");  // file order
  check_every_metadata_type(h);

  // The same through a mapped file.
  const fs::path dir = temp_dir("meta");
  w.write(dir / "m.gguf");
  const auto f = gguf_file::open(dir / "m.gguf");
  check_every_metadata_type(f->header());
  EXPECT_EQ(f->get<std::uint32_t>("t.u32"), 4000000000u);
  fs::remove_all(dir);
}

TEST(Gguf, TypedAccessors) {
  const auto image = every_metadata_type().image();
  const gguf_header h = parse_gguf(image, "mem.gguf");
  EXPECT_EQ(h.find<std::uint32_t>("t.u32"), std::optional<std::uint32_t>(4000000000u));
  EXPECT_EQ(h.find<std::uint32_t>("no.such.key"), std::nullopt);
  EXPECT_EQ(h.find_value("no.such.key"), nullptr);
  expect_error([&] { (void)h.get<std::uint32_t>("no.such.key"); }, error_code::corrupt_data,
               "missing key 'no.such.key'");
  expect_error([&] { (void)h.get<std::int32_t>("t.u32"); }, error_code::corrupt_data,
               "key 't.u32' is uint32, expected int32");
  expect_error([&] { (void)h.find<std::string_view>("a.str"); }, error_code::corrupt_data,
               "is array, expected string");
  expect_error([&] { (void)h.array("a.i32").to_vector<float>(); }, error_code::corrupt_data,
               "array of int32 read as float32");
  expect_error([&] { (void)h.array("a.i32").strings(); }, error_code::corrupt_data,
               "array of int32 read as string");
  expect_error([&] { (void)h.array("a.i32").at<std::int32_t>(3); }, error_code::out_of_range,
               "element 3 of 3");
  // Counts in any integer type; floats in either width.
  EXPECT_EQ(h.get_uint("t.u8"), 200u);
  EXPECT_EQ(h.get_uint("t.u16"), 60000u);
  EXPECT_EQ(h.get_uint("t.u32"), 4000000000u);
  EXPECT_EQ(h.get_uint("t.u64"), std::uint64_t{1} << 63);
  EXPECT_EQ(h.find_uint("no.such.key"), std::nullopt);
  expect_error([&] { (void)h.get_uint("t.i8"); }, error_code::corrupt_data, "is -100");
  expect_error([&] { (void)h.get_uint("t.f32"); }, error_code::corrupt_data,
               "expected an unsigned");
  expect_error([&] { (void)h.get_uint("no.such.key"); }, error_code::corrupt_data, "missing key");
  EXPECT_EQ(h.get_float("t.f32"), 1.5);
  EXPECT_EQ(h.get_float("t.f64"), 0.1);
  EXPECT_EQ(h.find_float("no.such.key"), std::nullopt);
  expect_error([&] { (void)h.get_float("t.u8"); }, error_code::corrupt_data, "expected float32");
}

TEST(Gguf, MetadataCopiesByteForByte) {
  // gguf_meta::from re-encodes what was read: copying every key gives the same file.
  const auto image = every_metadata_type().image();
  const gguf_header h = parse_gguf(image, "mem.gguf");
  gguf_writer copy;
  for (const auto& kv : h.metadata) copy.add(std::string(kv.key), gguf_meta::from(kv.value));
  EXPECT_EQ(copy.image(), image);
}

// ---- tensors ------------------------------------------------------------------------------------

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + seed * 7 + 3) & 0xff);
  return v;
}

TEST(Gguf, RoundTripsTensorsAtSeveralAlignments) {
  const std::vector<float> w32{0, 1, 2, 3, 4, 5};  // (2, 3)
  const std::vector<float16> w16{float16(1.0f), float16(-2.0f), float16(0.5f), float16(3.0f)};
  std::vector<bfloat16> wbf;  // (2, 2, 2)
  for (int i = 0; i < 8; ++i) wbf.push_back(bfloat16(static_cast<float>(i) - 3.5f));
  const auto q8 = pattern(3 * 2 * 34, 1);  // Q8_0 (3, 64): 2 blocks of 34 bytes per row
  const auto q4 = pattern(18, 2);          // Q4_0 (1, 32)
  const auto q4k = pattern(2 * 144, 3);    // Q4_K (2, 256)
  const auto q6k = pattern(210, 4);        // Q6_K (1, 256)
  const auto i32 = pattern(5 * 4, 5);      // I32 (5)
  const std::vector<float> w4d(6, 2.5f);   // (1, 2, 1, 3)

  for (std::size_t alignment : {std::size_t{32}, std::size_t{64}, std::size_t{8}}) {
    SCOPED_TRACE(alignment);
    gguf_writer w(alignment);
    w.add("general.architecture", "test");
    w.add_tensor("w32", ggml_type::f32, {2, 3}, std::as_bytes(std::span(w32)));
    w.add_tensor("w16", ggml_type::f16, {4}, std::as_bytes(std::span(w16)));
    w.add_tensor("wbf", ggml_type::bf16, {2, 2, 2}, std::as_bytes(std::span(wbf)));
    w.add_tensor("q8", ggml_type::q8_0, {3, 64}, q8);
    w.add_tensor("q4", ggml_type::q4_0, {1, 32}, std::vector<std::byte>(q4));  // kept by the writer
    w.add_tensor("q4k", ggml_type::q4_k, {2, 256}, q4k);
    w.add_tensor("q6k", ggml_type::q6_k, {1, 256}, q6k);
    w.add_tensor("i32", ggml_type::i32, {5}, i32);
    w.add_tensor("w4d", ggml_type::f32, {1, 2, 1, 3}, std::as_bytes(std::span(w4d)));

    const fs::path dir = temp_dir("tensors");
    w.write(dir / "t.gguf");
    EXPECT_FALSE(fs::exists(dir / "t.gguf.tmp"));
    const auto f = gguf_file::open(dir / "t.gguf");
    const gguf_header& h = f->header();
    EXPECT_EQ(h.alignment, alignment);
    EXPECT_EQ(h.data_offset % alignment, 0u);
    EXPECT_EQ(f->find_uint("general.alignment").has_value(), alignment != 32);
    ASSERT_EQ(f->tensors().size(), 9u);
    EXPECT_EQ(f->tensors()[0].name, "w32");  // file order
    for (const auto& t : f->tensors()) {
      EXPECT_EQ(t.offset % alignment, 0u) << t.name;
      EXPECT_TRUE(t.known());
    }

    // Row-major (2, 3) is stored as ne = [3, 2].
    const auto& i = f->info("w32");
    EXPECT_EQ(i.n_dims, 2u);
    EXPECT_EQ(i.ne[0], 3u);
    EXPECT_EQ(i.ne[1], 2u);
    EXPECT_EQ(i.ne[2], 1u);
    EXPECT_EQ(i.shape(), (std::vector<std::size_t>{2, 3}));
    EXPECT_EQ(i.elements, 6u);
    EXPECT_EQ(i.nbytes, 24u);
    EXPECT_EQ(i.rows(), 2u);
    EXPECT_EQ(i.row_bytes(), 12u);
    const auto v = f->view<float, 2>("w32");
    EXPECT_EQ(v.extent(0), 2u);
    EXPECT_EQ(v.extent(1), 3u);
    EXPECT_EQ(v(1, 2), 5.0f);
    EXPECT_EQ(v(0, 1), 1.0f);
    // Zero-copy: the view points into the mapping.
    EXPECT_EQ(reinterpret_cast<const std::byte*>(&v(0, 0)), f->bytes("w32").data());

    const auto v16 = f->view<float16, 1>("w16");
    EXPECT_EQ(static_cast<float>(v16(1)), -2.0f);
    const auto vbf = f->view<bfloat16, 3>("wbf");
    EXPECT_EQ(static_cast<float>(vbf(1, 1, 1)), 3.5f);
    const auto v4 = f->view<float, 4>("w4d");
    EXPECT_EQ(v4.extent(1), 2u);
    EXPECT_EQ(v4.extent(3), 3u);
    EXPECT_EQ(f->info("w4d").ne, (std::array<std::uint64_t, 4>{3, 1, 2, 1}));

    const auto b8 = f->bytes("q8");
    EXPECT_TRUE(std::equal(b8.begin(), b8.end(), q8.begin(), q8.end()));
    EXPECT_EQ(f->info("q8").shape(), (std::vector<std::size_t>{3, 64}));
    EXPECT_EQ(f->info("q8").rows(), 3u);
    EXPECT_EQ(f->info("q8").row_bytes(), 68u);
    const auto b4 = f->bytes("q4");
    EXPECT_TRUE(std::equal(b4.begin(), b4.end(), q4.begin(), q4.end()));
    const auto bk = f->bytes("q4k");
    EXPECT_TRUE(std::equal(bk.begin(), bk.end(), q4k.begin(), q4k.end()));
    EXPECT_EQ(f->info("q4k").type, ggml_type::q4_k);
    const auto b6 = f->bytes("q6k");
    EXPECT_TRUE(std::equal(b6.begin(), b6.end(), q6k.begin(), q6k.end()));
    const auto bi = f->bytes("i32");
    EXPECT_TRUE(std::equal(bi.begin(), bi.end(), i32.begin(), i32.end()));

    // Checked access.
    expect_error([&] { (void)f->view<float, 2>("q8"); }, error_code::unsupported, "is Q8_0");
    expect_error([&] { (void)f->view<float16, 2>("w32"); }, error_code::unsupported,
                 "asked for as f16");
    expect_error([&] { (void)f->view<float, 3>("w32"); }, error_code::invalid_shape,
                 "asked for rank 3");
    expect_error([&] { (void)f->info("nope"); }, error_code::corrupt_data, "missing tensor 'nope'");
    expect_error([&] { (void)f->bytes("nope"); }, error_code::corrupt_data, "t.gguf");
    EXPECT_EQ(f->find_tensor("nope"), nullptr);
    fs::remove_all(dir);
  }
}

TEST(Gguf, TypeTable) {
  struct row {
    ggml_type t;
    std::uint32_t id;
    std::size_t block, bytes;
  };
  for (const row& r : {row{ggml_type::f32, 0, 1, 4},       row{ggml_type::f16, 1, 1, 2},
                       row{ggml_type::q4_0, 2, 32, 18},    row{ggml_type::q4_1, 3, 32, 20},
                       row{ggml_type::q5_0, 6, 32, 22},    row{ggml_type::q5_1, 7, 32, 24},
                       row{ggml_type::q8_0, 8, 32, 34},    row{ggml_type::q8_1, 9, 32, 36},
                       row{ggml_type::q2_k, 10, 256, 84},  row{ggml_type::q3_k, 11, 256, 110},
                       row{ggml_type::q4_k, 12, 256, 144}, row{ggml_type::q5_k, 13, 256, 176},
                       row{ggml_type::q6_k, 14, 256, 210}, row{ggml_type::q8_k, 15, 256, 292},
                       row{ggml_type::i8, 24, 1, 1},       row{ggml_type::i16, 25, 1, 2},
                       row{ggml_type::i32, 26, 1, 4},      row{ggml_type::i64, 27, 1, 8},
                       row{ggml_type::f64, 28, 1, 8},      row{ggml_type::bf16, 30, 1, 2}}) {
    EXPECT_EQ(static_cast<std::uint32_t>(r.t), r.id);
    EXPECT_EQ(ggml_traits(r.t).block_size, r.block) << ggml_type_name(r.t);
    EXPECT_EQ(ggml_traits(r.t).block_bytes, r.bytes) << ggml_type_name(r.t);
  }
  EXPECT_EQ(ggml_type_name(ggml_type::q4_k), "Q4_K");
  EXPECT_EQ(ggml_type_name(static_cast<ggml_type>(31)), "type 31");
  EXPECT_FALSE(ggml_type_known(static_cast<ggml_type>(4)));
  EXPECT_FALSE(ggml_type_known(static_cast<ggml_type>(1000)));
  EXPECT_EQ(ggml_storage(ggml_type::bf16), npullm::dtype::bf16);
  EXPECT_EQ(ggml_storage(ggml_type::q8_0), std::nullopt);
}

// ---- a file assembled byte by byte ------------------------------------------------------------

// Two tensors, three keys, default alignment: written here field by field.
std::vector<std::byte> hand_file() {
  assembler a;
  a.header(/*tensors=*/2, /*kvs=*/4);
  a.str("general.architecture").u32(8).str("llama");
  a.str("llama.block_count").u32(4).u32(2);
  a.str("test.list").u32(9).u32(3).u64(2).u16(0xffff).u16(2);  // int16 [-1, 2]
  a.str("test.flag").u32(7).byte(1);
  a.tensor("w", {3, 2}, 0, 0);  // F32, row-major (2, 3): 24 bytes at 0
  a.tensor("q", {32}, 8, 32);   // Q8_0, one block: 34 bytes at 32
  a.pad_to(32);
  for (int i = 0; i < 6; ++i) a.f32(static_cast<float>(i) * 0.5f);
  a.zeros(8);
  a.u16(0x3c00);  // the block's f16 scale: 1.0
  for (int i = 0; i < 32; ++i) a.byte(static_cast<std::uint8_t>(i - 16));
  return a.v;
}

TEST(Gguf, ReadsAHandAssembledFile) {
  const auto image = hand_file();
  const fs::path dir = temp_dir("hand");
  write_file(dir / "hand.gguf", image);
  const auto f = gguf_file::open(dir / "hand.gguf");
  EXPECT_EQ(f->get<std::string_view>("general.architecture"), "llama");
  EXPECT_EQ(f->get<std::uint32_t>("llama.block_count"), 2u);
  EXPECT_EQ(f->array("test.list").to_vector<std::int16_t>(), (std::vector<std::int16_t>{-1, 2}));
  EXPECT_TRUE(f->get<bool>("test.flag"));
  const gguf_header& h = f->header();
  EXPECT_EQ(h.alignment, 32u);
  // 24-byte header + keys (8+20+4+8+5, 8+17+4+4, 8+9+4+4+8+4, 8+9+4+1) + tensor infos
  // (8+1+4+16+4+8, 8+1+4+8+4+8) = 235 bytes, padded to 256.
  EXPECT_EQ(h.data_offset, 256u);
  EXPECT_EQ(h.data_size, 32u + 34u);
  const auto v = f->view<float, 2>("w");
  EXPECT_EQ(v.extent(0), 2u);
  EXPECT_EQ(v.extent(1), 3u);
  EXPECT_EQ(v(1, 0), 1.5f);
  EXPECT_EQ(v(1, 2), 2.5f);
  const auto q = f->bytes("q");
  ASSERT_EQ(q.size(), 34u);
  EXPECT_EQ(std::to_integer<int>(q[1]), 0x3c);
  EXPECT_EQ(static_cast<std::int8_t>(q[2]), -16);
  EXPECT_EQ(f->info("q").shape(), (std::vector<std::size_t>{32}));
  fs::remove_all(dir);

  // The writer produces the same bytes for the same content.
  gguf_writer w;
  w.add("general.architecture", "llama")
      .add("llama.block_count", std::uint32_t{2})
      .add("test.list", gguf_meta::array(std::vector<std::int16_t>{-1, 2}))
      .add("test.flag", true);
  w.add_tensor("w", ggml_type::f32, {2, 3}, std::span(image).subspan(256, 24));
  w.add_tensor("q", ggml_type::q8_0, {32}, std::span(image).subspan(288, 34));
  EXPECT_EQ(w.image(), image);
}

TEST(Gguf, UnknownTensorTypesAreKeptButNotRead) {
  assembler a;
  a.header(2, 0);
  a.tensor("odd", {256}, 31, 0);  // Q4_0_4_4: no longer in GGUF files
  a.tensor("f", {4}, 0, 32);
  a.pad_to(32).zeros(48);
  const fs::path dir = temp_dir("unknown");
  write_file(dir / "u.gguf", a.v);
  const auto f = gguf_file::open(dir / "u.gguf");
  EXPECT_FALSE(f->info("odd").known());
  EXPECT_EQ(f->info("odd").nbytes, 0u);
  EXPECT_EQ(f->info("odd").row_bytes(), 0u);
  expect_error([&] { (void)f->bytes("odd"); }, error_code::unsupported, "'odd' has type 31");
  expect_error([&] { (void)f->view<float, 1>("odd"); }, error_code::unsupported, "type 31");
  EXPECT_EQ((f->view<float, 1>("f").extent(0)), 4u);
  fs::remove_all(dir);
}

// ---- malformed files ----------------------------------------------------------------------------

TEST(Gguf, RejectsBadHeaders) {
  expect_bad(assembler{}.text("GGUF").u32(3).v, error_code::corrupt_data, "truncated");
  expect_bad(assembler{}.text("GGUX").u32(3).u64(0).u64(0).v, error_code::corrupt_data,
             "not a GGUF file");
  for (std::uint32_t version : {0u, 1u, 2u, 4u}) {
    expect_bad(assembler{}.header(0, 0, version).v, error_code::unsupported,
               "version " + std::to_string(version));
  }
  // A big-endian file: every field byte-swapped, version 3 reads 0x03000000.
  expect_bad(assembler{}.text("GGUF").byte(0).byte(0).byte(0).byte(3).zeros(16).v,
             error_code::unsupported, "big-endian");
  expect_bad(assembler{}.header(0, std::uint64_t{1} << 40).v, error_code::corrupt_data,
             "metadata count 1099511627776");
  expect_bad(assembler{}.header(std::uint64_t{1} << 40, 0).v, error_code::corrupt_data,
             "tensor count 1099511627776");
}

TEST(Gguf, RejectsBadMetadata) {
  auto kv = [](auto&& value) {  // a file with one key "k", whose type and value `value` writes
    assembler a;
    a.header(0, 1).str("k");
    value(a);
    return a.v;
  };
  expect_bad(assembler{}.header(0, 1).u64(100).text("a key cut short").v, error_code::corrupt_data,
             "metadata key at byte 24 has length 100, past the end");
  expect_bad(kv([](assembler& a) { a.u32(8).u64(1000).text("abc"); }), error_code::corrupt_data,
             "key 'k': string value at byte 37 has length 1000, past the end");
  expect_bad(kv([](assembler& a) { a.u32(8).u64(~std::uint64_t{0}); }), error_code::corrupt_data,
             "past the end");
  expect_bad(kv([](assembler& a) { a.u32(4).u16(1); }), error_code::corrupt_data,
             "truncated: uint32 value");
  expect_bad(kv([](assembler& a) { a.u32(7).byte(2); }), error_code::corrupt_data,
             "bad bool value 2");
  expect_bad(kv([](assembler& a) { a.u32(9).u32(7).u64(3).byte(1).byte(0).byte(5); }),
             error_code::corrupt_data, "bad bool value 5");
  expect_bad(kv([](assembler& a) { a.u32(13).u32(0); }), error_code::corrupt_data,
             "bad value type 13");
  expect_bad(kv([](assembler& a) { a.u32(9).u32(99).u64(0); }), error_code::corrupt_data,
             "bad array element type 99");
  expect_bad(kv([](assembler& a) { a.u32(9).u32(4).u64(std::uint64_t{1} << 60).u32(1); }),
             error_code::corrupt_data, "claims 1152921504606846976 uint32 elements");
  expect_bad(kv([](assembler& a) { a.u32(9).u32(8).u64(1000000).str("a"); }),
             error_code::corrupt_data, "claims 1000000 string elements");
  expect_bad(kv([](assembler& a) {
               a.u32(9);                                      // the value: an array
               for (int i = 0; i < 70; ++i) a.u32(9).u64(1);  // of one array of one array ...
               a.u32(0).u64(0);
             }),
             error_code::corrupt_data, "nested deeper than 64");
  expect_bad(assembler{}.header(0, 2).str("k").u32(0).byte(1).str("k").u32(0).byte(2).v,
             error_code::corrupt_data, "key 'k': duplicate key");
  // Keys from the file appear in messages escaped and cut short.
  const std::string odd = std::string("a\x01") + "b\\";
  expect_bad(assembler{}.header(0, 2).str(odd).u32(0).byte(1).str(odd).u32(0).byte(2).v,
             error_code::corrupt_data, "key 'a\\x01b\\x5c': duplicate key");
  const std::string long_key(1000, 'k');
  expect_bad(assembler{}.header(0, 1).str(long_key).u32(7).byte(3).v, error_code::corrupt_data,
             "key '" + std::string(96, 'k') + "...': bad bool value 3");
  expect_bad(assembler{}.header(0, 1).str("").u32(0).byte(1).zeros(4).v, error_code::corrupt_data,
             "empty metadata key");
  expect_bad(assembler{}.header(0, 1).str("general.alignment").u32(10).u64(32).v,
             error_code::corrupt_data, "general.alignment': is uint64, must be uint32");
  expect_bad(assembler{}.header(0, 1).str("general.alignment").u32(4).u32(0).v,
             error_code::corrupt_data, "0 is not a power of two");
  expect_bad(assembler{}.header(0, 1).str("general.alignment").u32(4).u32(48).v,
             error_code::corrupt_data, "48 is not a power of two");
}

TEST(Gguf, RejectsBadTensorInfos) {
  // One tensor; `data` bytes after the (32-aligned) header.
  auto one = [](std::string_view name, std::vector<std::uint64_t> ne, std::uint32_t type,
                std::uint64_t offset, std::size_t data) {
    assembler a;
    a.header(1, 0).tensor(name, std::move(ne), type, offset).pad_to(32).zeros(data);
    return a.v;
  };
  expect_bad(one("t", {}, 0, 0, 32), error_code::corrupt_data, "tensor 't': n_dims 0");
  expect_bad(one("t", {1, 1, 1, 1, 1}, 0, 0, 32), error_code::corrupt_data, "n_dims 5");
  expect_bad(one("", {1}, 0, 0, 32), error_code::corrupt_data, "name of 0 bytes");
  expect_bad(one(std::string(65, 'n'), {1}, 0, 0, 32), error_code::corrupt_data,
             "name of 65 bytes");
  expect_bad(one("t", {33}, 8, 0, 64), error_code::corrupt_data,
             "ne[0] = 33 is not a multiple of Q8_0's block size 32");
  expect_bad(one("t", {std::uint64_t{1} << 32, std::uint64_t{1} << 32}, 0, 0, 32),
             error_code::corrupt_data, "element count of ne = [4294967296, 4294967296] overflows");
  expect_bad(one("t", {std::uint64_t{1} << 62}, 0, 0, 32), error_code::corrupt_data,
             "byte size of F32 [4611686018427387904] overflows");
  expect_bad(one("t", {std::uint64_t{1} << 63}, 0, 0, 32), error_code::corrupt_data,
             "above INT64_MAX");
  expect_bad(one("t", {4}, 0, 4, 32), error_code::corrupt_data,
             "offset 4 is not a multiple of the alignment 32");
  expect_bad(one("t", {16}, 0, 0, 32), error_code::corrupt_data,
             "F32 [16] needs 64 bytes at data offset 0, past the end of the 32-byte data section");
  expect_bad(one("t", {1}, 0, 64, 32), error_code::corrupt_data,
             "offset 64 lies past the end of the 32-byte data section");
  expect_bad(one("t", {1}, 31, 64, 32), error_code::corrupt_data, "offset 64 lies past the end");
  expect_bad(one("t", {1}, 0, 0, 0), error_code::corrupt_data, "past the end");

  assembler overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(96);
  expect_bad(overlap.v, error_code::corrupt_data, "tensors 'a' and 'b' overlap");
  assembler twice;
  twice.header(2, 0).tensor("a", {1}, 0, 0).tensor("a", {1}, 0, 32).pad_to(32).zeros(64);
  expect_bad(twice.v, error_code::corrupt_data, "tensor 'a': duplicate tensor name");
  assembler cut;  // the infos end mid-way: no room for the padding before the data section
  cut.header(1, 0).tensor("a", {1}, 0, 0);
  expect_bad(cut.v, error_code::corrupt_data, "data section would start at byte 64");
  assembler short_info;
  short_info.header(1, 0).str("a").u32(4).u64(4).zeros(12);
  expect_bad(short_info.v, error_code::corrupt_data, "tensor 'a': truncated: dimension");
}

TEST(Gguf, EveryTruncationIsRejected) {
  const auto image = hand_file();
  for (std::size_t n = 0; n < image.size(); ++n) {
    try {
      (void)parse_gguf(std::span(image).first(n), "cut.gguf");
      ADD_FAILURE() << "a " << n << "-byte prefix parsed";
    } catch (const error& e) {
      EXPECT_EQ(e.code(), error_code::corrupt_data) << n << ": " << e.what();
    }
  }
  EXPECT_NO_THROW((void)parse_gguf(image, "whole.gguf"));
}

TEST(Gguf, OpenErrorsNameThePath) {
  const fs::path dir = temp_dir("open");
  expect_error([&] { (void)gguf_file::open(dir / "missing.gguf"); }, error_code::io,
               "missing.gguf");
  write_file(dir / "v2.gguf", assembler{}.header(0, 0, 2).v);
  expect_error([&] { (void)gguf_file::open(dir / "v2.gguf"); }, error_code::unsupported,
               "v2.gguf: version 2");
  write_file(dir / "empty.gguf", {});
  expect_error([&] { (void)gguf_file::open(dir / "empty.gguf"); }, error_code::corrupt_data,
               "empty.gguf: truncated");
  fs::remove_all(dir);
}

// ---- the writer's own checks ----------------------------------------------------------------

TEST(Gguf, WriterChecksItsArguments) {
  expect_error([] { gguf_writer w(0); }, error_code::invalid_argument, "alignment 0");
  expect_error([] { gguf_writer w(48); }, error_code::invalid_argument, "alignment 48");
  gguf_writer w;
  w.add("k", 1);
  const auto before = w.image();
  const std::vector<std::byte> b16(16);
  expect_error([&] { w.add("k", 2); }, error_code::invalid_argument, "duplicate key 'k'");
  expect_error([&] { w.add("", 2); }, error_code::invalid_argument, "key of 0 bytes");
  expect_error([&] { w.add("general.alignment", std::uint32_t{64}); }, error_code::invalid_argument,
               "constructor");
  expect_error(
      [&] {
        w.add_tensor("t", ggml_type::f32, {2, 3}, b16);
      },
      error_code::invalid_shape, "has 16 bytes of data");
  expect_error(
      [&] {
        w.add_tensor("t", ggml_type::q8_0, {1, 33}, b16);
      },
      error_code::invalid_shape, "not a multiple of Q8_0's block size 32");
  expect_error([&] { w.add_tensor("t", static_cast<ggml_type>(5), {16}, b16); },
               error_code::unsupported, "type 5");
  expect_error([&] { w.add_tensor("t", ggml_type::f32, {}, b16); }, error_code::invalid_shape,
               "rank 0");
  expect_error(
      [&] {
        w.add_tensor("t", ggml_type::f32, {1, 1, 1, 1, 4}, b16);
      },
      error_code::invalid_shape, "rank 5");
  expect_error([&] { w.add_tensor(std::string(65, 'x'), ggml_type::f32, {4}, b16); },
               error_code::invalid_argument, "65 bytes");
  w.add_tensor("t", ggml_type::f32, {4}, b16);
  expect_error([&] { w.add_tensor("t", ggml_type::f32, {4}, b16); }, error_code::invalid_argument,
               "duplicate tensor 't'");
  const std::vector<gguf_meta> mixed{gguf_meta(1), gguf_meta(2.0f)};
  expect_error([&] { (void)gguf_meta::array_of(gguf_type::int32, mixed); },
               error_code::invalid_argument, "float32 in an array of int32");

  gguf_writer unchanged;
  unchanged.add("k", 1);
  EXPECT_EQ(before, unchanged.image());  // the failed calls left nothing behind

  const fs::path dir = temp_dir("writer");
  expect_error([&] { w.write(dir / "no_such_dir" / "x.gguf"); }, error_code::io, "x.gguf.tmp");
  write_file(dir / "x.gguf", std::vector<std::byte>(7));
  w.write(dir / "x.gguf");  // replaces the old file
  EXPECT_EQ(read_file(dir / "x.gguf"), w.image());
  EXPECT_FALSE(fs::exists(dir / "x.gguf.tmp"));
  fs::remove_all(dir);
}

// ---- the fuzz corpus ----------------------------------------------------------------------------

TEST(Gguf, FuzzCorpusReplays) {
  std::size_t files = 0;
  for (const auto& entry : fs::directory_iterator(NPULLM_GGUF_CORPUS_DIR)) {
    if (!entry.is_regular_file()) continue;
    const auto bytes = read_file(entry.path());
    EXPECT_NO_THROW(npullm_fuzz_gguf::run_one(bytes)) << entry.path();
    ++files;
  }
  EXPECT_GE(files, 5u);
}

// A small model header of each architecture the model reader maps (keys, token_embd and the
// RoPE factor tensors it reads; the layers' tensors are not needed to read the config): seeds
// that take the fuzzer into model::read_gguf_model's branches.
std::vector<std::pair<std::string, std::vector<std::byte>>> architecture_seeds() {
  std::vector<std::pair<std::string, std::vector<std::byte>>> out;
  auto model = [](const std::string& arch) {
    gguf_writer w;
    const std::string p = arch + ".";
    w.add("general.architecture", arch).add("general.type", "model");
    w.add(p + "block_count", std::uint32_t{1}).add(p + "embedding_length", std::uint32_t{8});
    w.add(p + "feed_forward_length", std::uint32_t{16});
    w.add(p + "attention.head_count", std::uint32_t{2});
    w.add(p + "attention.head_count_kv", std::uint32_t{1});
    w.add(p + "attention.key_length", std::uint32_t{4});
    w.add(p + "attention.value_length", std::uint32_t{4});
    w.add(p + "attention.layer_norm_rms_epsilon", 1e-6f).add(p + "rope.freq_base", 10000.0f);
    w.add(p + "context_length", std::uint32_t{128}).add(p + "vocab_size", std::uint32_t{4});
    w.add("tokenizer.ggml.model", "none").add("general.quantization_version", std::uint32_t{2});
    w.add_tensor("token_embd.weight", ggml_type::f32, {4, 8}, std::vector<std::byte>(128));
    return w;
  };
  const std::vector<float> two{1.0f, 2.5f};
  {
    gguf_writer w = model("qwen3");
    out.emplace_back("arch_qwen3", w.image());
  }
  {
    gguf_writer w = model("llama");
    w.add_tensor("rope_freqs.weight", ggml_type::f32, {2}, std::as_bytes(std::span(two)));
    out.emplace_back("arch_llama_rope_freqs", w.image());
  }
  {
    gguf_writer w = model("phi3");
    w.add("phi3.rope.scaling.original_context_length", std::uint32_t{32});
    w.add("phi3.rope.scaling.attn_factor", 1.2f).add("phi3.attention.sliding_window", 0u);
    w.add_tensor("rope_factors_long.weight", ggml_type::f32, {2}, std::as_bytes(std::span(two)));
    w.add_tensor("rope_factors_short.weight", ggml_type::f32, {2}, std::as_bytes(std::span(two)));
    out.emplace_back("arch_phi3_longrope", w.image());
  }
  {
    gguf_writer w = model("gemma2");
    w.add("gemma2.attn_logit_softcapping", 50.0f).add("gemma2.final_logit_softcapping", 30.0f);
    w.add("gemma2.attention.sliding_window", std::uint32_t{16});
    out.emplace_back("arch_gemma2", w.image());
  }
  {
    gguf_writer w = model("qwen2");
    w.add("qwen2.rope.scaling.type", "yarn").add("qwen2.rope.scaling.factor", 4.0f);
    w.add("qwen2.rope.scaling.original_context_length", std::uint32_t{32});
    w.add("general.license", "apache-2.0").add("unknown.key", std::uint8_t{1});
    out.emplace_back("arch_qwen2_yarn", w.image());
  }
  return out;
}

// The architecture seeds read as models (the corpus replay only checks that nothing but
// corpus_data / unsupported comes out): each gives its family's config, but the last, whose
// unclassified key is refused.
TEST(Gguf, ArchitectureSeedsReadAsModels) {
  for (const auto& [name, image] : architecture_seeds()) {
    const gguf_header h = parse_gguf(image, name);
    auto bytes_of = [&](const gguf_tensor_info& t) {
      return std::span<const std::byte>(image).subspan(h.data_offset + t.offset, t.nbytes);
    };
    if (name == "arch_qwen2_yarn") {
      try {
        (void)npullm::model::read_gguf_model(h, bytes_of);
        ADD_FAILURE() << name;
      } catch (const npullm::error& e) {
        EXPECT_NE(e.message().find("unknown.key"), std::string::npos) << e.message();
      }
      const std::vector<std::string> accept{"unknown.*"};
      const auto c = npullm::model::read_gguf_model(h, bytes_of, accept).config;
      EXPECT_EQ(c.rope_scaling.kind, npullm::ops::rope_kind::yarn);
      continue;
    }
    const auto info = npullm::model::read_gguf_model(h, bytes_of);
    EXPECT_EQ(npullm::model::to_string(info.config.family), name.substr(5, name.find('_', 5) - 5));
    EXPECT_EQ(info.config.head_dim, 4u);
    if (name == "arch_llama_rope_freqs" || name == "arch_phi3_longrope") {
      EXPECT_EQ(info.config.rope_scaling.kind, npullm::ops::rope_kind::longrope);
      EXPECT_EQ(info.config.rope_scaling.long_factor, (std::vector<double>{1.0, 2.5}));
    }
  }
}

// Writes the seed corpus into $NPULLM_GGUF_CORPUS_OUT (how tests/model/corpus_gguf was made): a
// tool, not a check, so disabled (gtest lists it as such); run it with
// NPULLM_GGUF_CORPUS_OUT=<dir> test_gguf --gtest_also_run_disabled_tests
// --gtest_filter=Gguf.DISABLED_WritesSeedCorpus.
TEST(Gguf, DISABLED_WritesSeedCorpus) {
  const char* out = std::getenv("NPULLM_GGUF_CORPUS_OUT");
  if (out == nullptr) GTEST_SKIP() << "set NPULLM_GGUF_CORPUS_OUT=<dir> to write the seeds";
  const fs::path dir = out;
  fs::create_directories(dir);
  write_file(dir / "metadata", every_metadata_type().image());
  write_file(dir / "hand", hand_file());
  {
    gguf_writer w(64);
    const std::vector<float> x{1, 2, 3, 4};
    w.add("general.architecture", "qwen2").add("qwen2.block_count", std::uint32_t{1});
    w.add_tensor("a", ggml_type::f32, {2, 2}, std::as_bytes(std::span(x)));
    w.add_tensor("b", ggml_type::q8_0, {1, 32}, pattern(34, 9));
    w.add_tensor("c", ggml_type::q4_k, {1, 256}, pattern(144, 10));
    write_file(dir / "tensors_align64", w.image());
  }
  {
    assembler a;
    a.header(2, 0).tensor("odd", {256}, 31, 0).tensor("f", {4}, 0, 32).pad_to(32).zeros(48);
    write_file(dir / "unknown_type", a.v);
  }
  {
    assembler a;
    a.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(32).zeros(96);
    write_file(dir / "overlap", a.v);
  }
  {
    assembler a;
    a.header(0, 1).str("k").u32(9).u32(9).u64(1).u32(9).u64(1).u32(7).u64(1).byte(2);
    write_file(dir / "nested_bad_bool", a.v);
  }
  {
    // One tensor of every weight type the pipeline runs (2 rows of 256), bytes of a pattern:
    // the harness decodes them.
    gguf_writer w;
    w.add("general.architecture", "qwen2");
    for (const auto t : {ggml_type::q8_0, ggml_type::q4_0, ggml_type::q4_1, ggml_type::q5_0,
                         ggml_type::q5_1, ggml_type::q2_k, ggml_type::q3_k, ggml_type::q4_k,
                         ggml_type::q5_k, ggml_type::q6_k, ggml_type::iq4_nl, ggml_type::iq4_xs}) {
      const auto tr = npullm::io::ggml_traits(t);
      w.add_tensor("w." + npullm::io::ggml_type_name(t), t, {2, 256},
                   pattern(2 * 256 / tr.block_size * tr.block_bytes, static_cast<unsigned>(t)));
    }
    write_file(dir / "tensors_every_type", w.image());
  }
  write_file(dir / "big_endian",
             assembler{}.text("GGUF").byte(0).byte(0).byte(0).byte(3).zeros(16).v);
  const auto hand = hand_file();
  write_file(dir / "truncated", std::span(hand).first(100));
  for (const auto& [name, image] : architecture_seeds()) write_file(dir / name, image);
}

}  // namespace
