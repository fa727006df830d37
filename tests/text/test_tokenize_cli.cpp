// npullm_tokenize end to end: test strings of two vocabularies (../shared/vocab), written to a
// file and read back with -f byte for byte, print llama.cpp's ids (every string of llama-spm,
// every 10th of qwen2, whose 150k-token vocabulary takes a moment to load per process); -p
// processes escapes; the `id -> 'piece'` lines.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;
const fs::path vocab_dir = NPULLM_VOCAB_DIR;
const std::string tool = NPULLM_TOKENIZE_EXE;

std::string run(const std::string& args) {
  std::string out;
  FILE* p = popen((tool + " " + args).c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf{};
  for (std::size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;)
    out.append(buf.data(), n);
  EXPECT_EQ(pclose(p), 0) << args;
  return out;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "[1, 2, 3]" as written by --ids, from the .out line "1 2 3".
std::string bracketed(const std::string& line) {
  std::istringstream ls(line);
  std::string out = "[";
  bool first = true;
  for (long id = 0; ls >> id; first = false) out += (first ? "" : ", ") + std::to_string(id);
  return out + "]\n";
}

class tokenize_cli : public ::testing::TestWithParam<std::string> {};

TEST_P(tokenize_cli, file_input_prints_llama_cpp_ids) {
  const fs::path gguf = vocab_dir / ("ggml-vocab-" + GetParam() + ".gguf");
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is absent (../shared/vocab beside the checkout)";
  const std::string inp = read_all(gguf.string() + ".inp");
  std::ifstream out(gguf.string() + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  const fs::path tmp = fs::temp_directory_path() / ("npullm_tokenize_" + GetParam() + ".txt");
  std::size_t pos = 0, n = 0;
  for (std::string line; pos < inp.size() && std::getline(out, line); ++n) {
    std::size_t next = inp.find(sep, pos);
    if (next == std::string::npos) next = inp.size();
    std::ofstream(tmp, std::ios::binary) << inp.substr(pos, next - pos);
    pos = next + sep.size();
    if (GetParam() == "qwen2" && n % 10 != 0) continue;
    EXPECT_EQ(
        run("-m " + gguf.string() + " -f " + tmp.string() + " --ids --no-bos --no-parse-special"),
        bracketed(line))
        << "string " << n;
  }
  EXPECT_GT(n, 40u);
  fs::remove(tmp);
}

INSTANTIATE_TEST_SUITE_P(vocab, tokenize_cli, ::testing::Values("qwen2", "llama-spm"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s) c = (c == '-') ? '_' : c;
                           return s;
                         });

TEST(tokenize_cli, prompt_escapes_bos_and_piece_lines) {
  const fs::path gguf = vocab_dir / "ggml-vocab-llama-spm.gguf";
  if (!fs::exists(gguf)) GTEST_SKIP() << gguf << " is absent";
  // "\n" in -p is a newline: llama's byte fallback token <0x0A> = 13; BOS 1 first.
  const std::string ids = run("-m " + gguf.string() + " -p 'a\\nb' --ids --show-count");
  EXPECT_EQ(ids.rfind("[1, ", 0), 0u) << ids;
  EXPECT_NE(ids.find(", 13, "), std::string::npos) << ids;
  EXPECT_NE(ids.find("Total number of tokens: "), std::string::npos);
  // The piece lines: "     1 -> '<s>'" then the text's tokens, pieces with their spaces.
  const std::string lines = run("-m " + gguf.string() + " -p 'Hello world'");
  EXPECT_EQ(lines, "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n");
  // --no-escape keeps the backslash.
  const std::string raw = run("-m " + gguf.string() + " -p 'a\\nb' --ids --no-escape --no-bos");
  EXPECT_EQ(raw.find(", 13, "), std::string::npos) << raw;
}

}  // namespace
