// expert_weights: a mixture-of-experts MLP's weights (moe_weights: the router in f32, each
// expert's gate / up / down, Qwen2-MoE's shared expert and its gate) and bind_experts, which
// binds them for one layer by their Hugging Face names (Mixtral's block_sparse_moe, the Qwen
// mixtures' mlp.experts) or from a GGUF's stacked 3-D expert tensors. model_weights
// (model/weights.hpp) calls it for every MoE layer; the MoE MLP (moe/mlp.hpp) runs them.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/config_types.hpp"
#include "npullm/model/projection.hpp"

namespace npullm::moe {

// A mixture-of-experts MLP's weights (config.moe): the router in f32 (the choice of experts
// turns on near-ties, so its logits are computed from the stored values without rounding them
// to W), each expert's three matrices (views of the GGUF's 3-D tensors' slabs, zero-copy, or
// of the per-expert safetensors), and Qwen2-MoE's shared expert with its sigmoid gate.
template <storage_type W>
struct moe_weights {
  dense_view<const float, 2> router;                         // (experts, hidden)
  std::vector<model::projection<W>> gate, up;                // [experts] (expert_inter, hidden)
  std::vector<model::projection<W>> down;                    // [experts] (hidden, expert_inter)
  model::projection<W> shared_gate, shared_up, shared_down;  // rows() == 0 without a shared one
  std::span<const float> shared_expert_gate;                 // (hidden); empty without one

  [[nodiscard]] bool present() const noexcept { return !gate.empty(); }
};

// Layer l's experts (HF prefix p, "model.layers.<l>."): Mixtral's block_sparse_moe (w1 gate, w3
// up, w2 down) or the Qwen mixtures' mlp.experts, the router, and Qwen2-MoE's shared expert.
// mat(name, rows, cols) gives a projection, f32(name, rows, cols) a small matrix as f32 (the
// router, the shared expert's gate); with `stacked` (a GGUF), stacked(part, rows, cols) gives
// every expert's matrix of `part` ("gate", "up", "down") at once, else each expert is read by
// name through mat.
template <storage_type W, class Mat, class F32, class Stacked>
void bind_experts(const model::model_config& c, const std::string& p, moe_weights<W>& m, Mat&& mat,
                  F32&& f32, bool stacked, Stacked&& stacked_experts) {
  using model::model_family;
  const std::size_t h = c.hidden_size, n = c.moe.experts, ff = c.moe.expert_intermediate_size;
  const bool mixtral = c.family == model_family::mistral || c.family == model_family::llama;
  const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
  m.router = f32(block + "gate.weight", n, h);
  if (stacked) {
    m.gate = stacked_experts(std::string_view("gate"), ff, h);
    m.up = stacked_experts(std::string_view("up"), ff, h);
    m.down = stacked_experts(std::string_view("down"), h, ff);
  } else {
    for (std::size_t e = 0; e < n; ++e) {
      const std::string x = block + "experts." + std::to_string(e) + ".";
      m.gate.push_back(mat(x + (mixtral ? "w1.weight" : "gate_proj.weight"), ff, h));
      m.up.push_back(mat(x + (mixtral ? "w3.weight" : "up_proj.weight"), ff, h));
      m.down.push_back(mat(x + (mixtral ? "w2.weight" : "down_proj.weight"), h, ff));
    }
  }
  if (const std::size_t sf = c.moe.shared_expert_intermediate_size; sf != 0) {
    m.shared_gate = mat(p + "mlp.shared_expert.gate_proj.weight", sf, h);
    m.shared_up = mat(p + "mlp.shared_expert.up_proj.weight", sf, h);
    m.shared_down = mat(p + "mlp.shared_expert.down_proj.weight", h, sf);
    const auto g = f32(p + "mlp.shared_expert_gate.weight", 1, h);
    m.shared_expert_gate = {g.data_handle(), h};
  }
}

}  // namespace npullm::moe
