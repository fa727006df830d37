// Greedy speculative decoding gives exactly plain greedy decoding's tokens for k = 1..4 with
// every kind of draft (the target's twin: always right; a different 1-layer model: mostly
// wrong; a draft that is always wrong), and leaves the target's KV as plain decoding would.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "npullm/batch/speculative.hpp"
#include "npullm/model/causal_lm.hpp"
#include "support.hpp"

namespace {

using namespace npullm;
using namespace npullm::batch;
namespace fs = std::filesystem;

using lm_t = model::causal_lm<
    model::pipeline_config<model::contiguous_kv<float>, model::dynamic_attention<>, float>>;

const fs::path& one_layer_dir() {
  static const fs::path d = [] {
    const fs::path p =
        fs::temp_directory_path() / ("npullm_spec_1layer_" + std::to_string(::getpid()));
    auto spec = model::preset("tiny", npullm::dtype::f32, 99);
    spec.config.num_hidden_layers = 1;
    model::write_model(p, spec);
    return p;
  }();
  return d;
}

// Proposes last + 1, last + 2, ... (mod vocab): almost never what the target says.
struct wrong_draft {
  std::size_t len = 0;
  void start(std::span<const std::int32_t> prompt) { len = prompt.size(); }
  std::vector<std::int32_t> propose(std::int32_t last, std::size_t n) {
    std::vector<std::int32_t> out;
    for (std::size_t i = 1; i <= n; ++i)
      out.push_back(static_cast<std::int32_t>((last + static_cast<std::int32_t>(i) * 37) % 512));
    len += n;
    return out;
  }
  void rollback(std::size_t n) { len = n; }
  void feed(std::span<const std::int32_t> ids) { len += ids.size(); }
  std::size_t length() const { return len; }
};
static_assert(draft_source<wrong_draft>);
static_assert(draft_source<model_draft<lm_t>>);

std::vector<std::int32_t> plain_greedy(lm_t& lm, std::span<const std::int32_t> prompt,
                                       std::size_t n) {
  lm.reset();
  std::vector<std::int32_t> out{greedy_token(lm.prefill(prompt).logits_of(prompt.size() - 1))};
  while (out.size() < n) {
    const std::array<std::int32_t, 1> one{out.back()};
    out.push_back(greedy_token(lm.decode(one).logits_of(0)));
  }
  return out;
}

std::vector<std::int32_t> prompt() {
  std::vector<std::int32_t> p(23);
  for (std::size_t i = 0; i < p.size(); ++i) p[i] = static_cast<std::int32_t>((i * 131 + 7) % 512);
  return p;
}

TEST(Speculative, EqualsPlainGreedyWithEveryDraft) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t plain(dir, {.max_sequence = 128});
  const auto p = prompt();
  const auto expected = plain_greedy(plain, p, 20);
  for (std::size_t k = 1; k <= 4; ++k) {
    lm_t target(dir, {.max_sequence = 128, .decode_rows = 8});
    lm_t twin(dir, {.max_sequence = 128, .decode_rows = 8});
    lm_t small(one_layer_dir(), {.max_sequence = 128, .decode_rows = 8});
    model_draft<lm_t> right(twin), other(small);
    wrong_draft wrong;
    speculative_stats s_right, s_other, s_wrong;
    EXPECT_EQ(speculative_generate(target, right, p, 20, k, &s_right), expected) << "k " << k;
    EXPECT_EQ(speculative_generate(target, other, p, 20, k, &s_other), expected) << "k " << k;
    EXPECT_EQ(speculative_generate(target, wrong, p, 20, k, &s_wrong), expected) << "k " << k;
    EXPECT_EQ(s_right.acceptance(), 1.0) << "k " << k;  // always right
    EXPECT_EQ(s_wrong.accepted, 0u) << "k " << k;       // always wrong
    EXPECT_LT(s_right.rounds, s_wrong.rounds);
  }
}

TEST(Speculative, KvAfterRollbackEqualsPlainDecoding) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t plain(dir, {.max_sequence = 128});
  lm_t target(dir, {.max_sequence = 128, .decode_rows = 8});
  lm_t small(one_layer_dir(), {.max_sequence = 128, .decode_rows = 8});
  model_draft<lm_t> draft(small);
  const auto p = prompt();
  plain_greedy(plain, p, 17);
  speculative_generate(target, draft, p, 17, 3);
  ASSERT_EQ(target.length(), plain.length());
  const auto& a = target.kv_cache();
  const auto& b = plain.kv_cache();
  double diff = 0;
  for (std::size_t layer = 0; layer < target.config().num_hidden_layers; ++layer) {
    const auto ta = a.range_tile(layer, 0, a.length()), tb = b.range_tile(layer, 0, b.length());
    for (std::size_t h = 0; h < ta.k.extent(0); ++h) {
      for (std::size_t j = 0; j < ta.k.extent(1); ++j) {
        for (std::size_t d = 0; d < ta.k.extent(2); ++d) {
          diff = std::max<double>(diff, std::fabs(ta.k(h, j, d) - tb.k(h, j, d)));
          diff = std::max<double>(diff, std::fabs(ta.v(h, j, d) - tb.v(h, j, d)));
        }
      }
    }
  }
  EXPECT_LE(diff, 1e-5);  // the same keys and values, up to f32 summation order
}

TEST(Speculative, BadArguments) {
  const auto& dir = npullm::testing::generated_model("tiny", 21);
  lm_t target(dir, {.max_sequence = 64});
  wrong_draft d;
  const auto p = prompt();
  EXPECT_THROW(speculative_generate(target, d, p, 5, 0), error);
  EXPECT_THROW(speculative_generate(target, d, p, 0, 2), error);
}

}  // namespace
