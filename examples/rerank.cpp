// A reranker over the generated Qwen2-0.5B-shaped model (make demo creates it).
//
// Each (query, document) pair of token ids is one row: template tokens, the query, the
// document, a closing template. Two outputs, as rerankers publish them:
//   yes/no     softmax over the last token's logits of two chosen ids ("no", "yes"), keep
//              "yes"                                   -> scores [N]
//   one logit  sigmoid of the "yes" logit              -> scores [N, 1]
// Both executors score the same batch: batch_unroll (row by row through the batch-1 pipeline,
// what a static NPU graph needs) and the packed batched scorer (the host's fast path).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "npullm/batch/scorer.hpp"
#include "npullm/batch/unroll.hpp"
#include "npullm/model/causal_lm.hpp"
#include "npullm/model/synthetic.hpp"

namespace {

using clock_type = std::chrono::steady_clock;
double since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

constexpr std::int32_t token_no = 2152, token_yes = 9693;  // the ids the scores read

void progress(std::size_t done, std::size_t total) {
  const int width = 30, filled = static_cast<int>(width * done / total);
  std::printf("\r  unroll [%s%s] %zu/%zu",
              std::string(static_cast<std::size_t>(filled), '#').c_str(),
              std::string(static_cast<std::size_t>(width - filled), '.').c_str(), done, total);
  std::fflush(stdout);
}

// The chunk of a bigger batch that unroll scores at a time, so the bar moves.
template <class Fn>
npullm::tensor<float, 2> in_parts(std::size_t n, std::size_t len,
                                  const std::vector<std::int32_t>& ids,
                                  const std::vector<std::int32_t>& mask, std::size_t vocab,
                                  Fn&& score) {
  npullm::tensor<float, 2> out(n, vocab);
  for (std::size_t r = 0; r < n; r += 4) {
    const std::size_t m = std::min<std::size_t>(4, n - r);
    const npullm::batch::batch_inputs in{
        npullm::dense_view<const std::int32_t, 2>(ids.data() + r * len, m, len),
        npullm::dense_view<const std::int32_t, 2>(mask.data() + r * len, m, len)};
    const auto part = score(in);
    std::copy_n(part.data(), part.size(), out.data() + r * vocab);
    progress(r + m, n);
  }
  std::printf("\n");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  const fs::path dir = argc > 1 ? fs::path(argv[1]) : fs::path("models/qwen2-0.5b-bf16");
  try {
    npullm::model::ensure_model(dir, npullm::model::preset("qwen2-0.5b", npullm::dtype::bf16));
    npullm::thread_pool pool(std::max(1u, std::thread::hardware_concurrency()));
    using config =
        npullm::model::pipeline_config<npullm::model::contiguous_kv<npullm::bfloat16>,
                                       npullm::model::dynamic_attention<>, npullm::bfloat16>;
    npullm::model::causal_lm<config> lm(dir, {.max_sequence = 1024, .pool = &pool});
    const std::size_t vocab = lm.config().vocab_size;

    // 16 pairs: one query, documents of 20..60 tokens, right-padded to 96 columns.
    constexpr std::size_t n = 16, len = 96;
    std::vector<std::int32_t> ids(n * len, 0), mask(n * len, 0);
    const std::vector<std::int32_t> prefix = {151644, 8948, 198},
                                    query = {3838, 374, 279, 6722, 315, 9625, 30},
                                    suffix = {151645, 198, 151644, 77091, 198};
    for (std::size_t r = 0; r < n; ++r) {
      std::vector<std::int32_t> row(prefix);
      row.insert(row.end(), query.begin(), query.end());
      const std::size_t doc = 20 + (r * 13) % 41;
      for (std::size_t t = 0; t < doc; ++t)
        row.push_back(static_cast<std::int32_t>(1000 + (r * 7919 + t * 104729) % 50000));
      row.insert(row.end(), suffix.begin(), suffix.end());
      for (std::size_t c = 0; c < row.size(); ++c) {
        ids[r * len + c] = row[c];
        mask[r * len + c] = 1;
      }
    }

    npullm::batch::batch_unroll<decltype(lm)> unroll(lm);
    (void)lm.prefill(
        std::span<const std::int32_t>(ids.data(), 8));  // touch the mapped weights once
    lm.reset();
    auto t = clock_type::now();
    const auto a =
        in_parts(n, len, ids, mask, vocab, [&](const auto& in) { return unroll.score(in); });
    const double unroll_s = since(t);
    npullm::batch::batched_scorer<decltype(lm)> scorer(lm);
    t = clock_type::now();
    const auto b = scorer.score({npullm::dense_view<const std::int32_t, 2>(ids.data(), n, len),
                                 npullm::dense_view<const std::int32_t, 2>(mask.data(), n, len)});
    const double scorer_s = since(t);

    std::printf("\n  doc   yes/no score   one-logit score   |unroll - batched|\n");
    double worst = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const float no = a.view()(r, token_no), yes = a.view()(r, token_yes);
      const double m = std::max(no, yes);
      const double p_yes = std::exp(yes - m) / (std::exp(no - m) + std::exp(yes - m));  // [N]
      const double one = 1.0 / (1.0 + std::exp(-static_cast<double>(yes)));             // [N, 1]
      double diff = 0;
      for (std::size_t v = 0; v < vocab; ++v)
        diff = std::max<double>(diff, std::fabs(a.view()(r, v) - b.view()(r, v)));
      worst = std::max(worst, diff);
      std::printf("  %3zu   %12.4f   %15.4f   %.1e\n", r, p_yes, one, diff);
    }
    std::printf("\n  batch_unroll    %6.1f documents/s (row by row, batch-1 pipeline)\n",
                n / unroll_s);
    std::printf("  batched scorer  %6.1f documents/s (packed, one GEMM per projection)\n",
                n / scorer_s);
    std::printf("  largest logit difference between the executors: %.1e\n", worst);
    std::printf(
        "  (bf16 weights: the packed LM head runs the bf16 GEMM, which rounds activations to "
        "bf16;\n"
        "   one row at a time it is an f32 GEMV. With f32 weights they agree within 1e-5.)\n");
  } catch (const npullm::error& e) {
    std::fprintf(stderr, "rerank failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
