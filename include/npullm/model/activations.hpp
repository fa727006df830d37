// activations: the buffers one step of a decoder runs through, sized for `rows` rows (the
// largest step the pipeline takes: its step_rows, static or chunked prefill size, or decode
// rows), in memory the backend allocates so a device can bind them.
//
// Per row, in f32: x, h (hidden); q, qh, att (q_size); k, v, kh, vh (kv_size); gate, up
// (intermediate, or the widest of the dense, expert and shared-expert MLPs of a mixture of
// experts, which also takes expert_in, expert_out, moe_out (hidden) and host-side routing
// state; without experts those three are one row each). For Qwen2-0.5B that is 58.9 KB a row: 2048
// rows take 121 MB, 4096 take 241 MB (of which gate and up 159 MB); step_rows = 256 takes 15 MB.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "npullm/model/config.hpp"
#include "npullm/moe/mlp.hpp"
#include "npullm/npu/backend.hpp"

namespace npullm::model {

template <class Backend>
struct activations {
  template <std::size_t Rank>
  using buffer = typename Backend::template buffer<float, Rank>;

  std::size_t rows = 0;
  buffer<2> x, h;        // (rows, hidden): the residual stream, a normed / projected copy
  buffer<2> q, k, v;     // (rows, q_size | kv_size)
  buffer<3> qh, kh, vh;  // (heads | kv_heads, rows, head_dim): head-major q and the step's K/V
  buffer<3> att;         // (heads, rows, head_dim): attention output
  buffer<2> gate, up;    // (rows, mlp_width): each MLP views (rows, its intermediate) of them
  buffer<2> expert_in, expert_out, moe_out;  // (rows | 1, hidden): moe_mlp's gathered rows
  npullm::moe::moe_scratch moe;              // routing state (host memory)

  // The widest MLP of the model: what gate and up hold per row.
  static std::size_t mlp_width(const model_config& c) noexcept {
    return std::max({c.intermediate_size, c.moe.expert_intermediate_size,
                     c.moe.shared_expert_intermediate_size});
  }

  static activations allocate(Backend& backend, const model_config& c, std::size_t rows) {
    activations a;
    a.rows = rows;
    a.x = backend.template allocate<float, 2>({rows, c.hidden_size});
    a.h = backend.template allocate<float, 2>({rows, c.hidden_size});
    a.q = backend.template allocate<float, 2>({rows, c.q_size()});
    a.k = backend.template allocate<float, 2>({rows, c.kv_size()});
    a.v = backend.template allocate<float, 2>({rows, c.kv_size()});
    a.qh = backend.template allocate<float, 3>({c.num_attention_heads, rows, c.head_dim});
    a.kh = backend.template allocate<float, 3>({c.num_key_value_heads, rows, c.head_dim});
    a.vh = backend.template allocate<float, 3>({c.num_key_value_heads, rows, c.head_dim});
    a.att = backend.template allocate<float, 3>({c.num_attention_heads, rows, c.head_dim});
    a.gate = backend.template allocate<float, 2>({rows, mlp_width(c)});
    a.up = backend.template allocate<float, 2>({rows, mlp_width(c)});
    const std::size_t moe_rows = c.moe.experts != 0 ? rows : 1;
    a.expert_in = backend.template allocate<float, 2>({moe_rows, c.hidden_size});
    a.expert_out = backend.template allocate<float, 2>({moe_rows, c.hidden_size});
    a.moe_out = backend.template allocate<float, 2>({moe_rows, c.hidden_size});
    return a;
  }

  // Bytes a row takes (what `rows` multiplies).
  static std::size_t row_bytes(const model_config& c) noexcept {
    return (2 * c.hidden_size + 3 * c.q_size() + 4 * c.kv_size() + 2 * mlp_width(c) +
            (c.moe.experts != 0 ? 3 * c.hidden_size : 0)) *
           sizeof(float);
  }

  // Every buffer as a graph argument, in a fixed order (head, body and tail bind these first).
  [[nodiscard]] std::vector<npu::argument> arguments() const {
    auto arg = [](const auto& t) { return npu::argument{t.data(), t.size() * sizeof(float)}; };
    return {arg(x),  arg(h),  arg(q),   arg(k),    arg(v), arg(qh),
            arg(kh), arg(vh), arg(att), arg(gate), arg(up)};
  }
};

}  // namespace npullm::model
