// dense_huge_pages: load_options::dense_huge_pages (load_options.hpp: which matrices, why, and
// what it costs) carried out for model_weights (weights.hpp, whose friend it is): the chosen
// dense matrices (f32 / f16 / bf16 (N, K), zero-copy views of the file mapping until then)
// copied once, at load, into one block of memory that is 2 MiB-aligned and advised
// MADV_HUGEPAGE (core/huge_page_allocator.hpp, as the quantized weights' tiles are), each
// 64-byte aligned in it, one after the other. After each matrix's copy its whole 4 KiB pages of
// the mapping are dropped from the process (MADV_DONTNEED: a read-only file mapping, so they
// fault back in from the file should anything read them; the norms beside them stay mapped),
// so resident memory holds one copy of the weights, plus one matrix during the load. A matrix
// the loader had already copied out of the mapping (a GGUF's row-permuted Llama Q / K) is
// copied again and its first copy freed.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "npullm/core/dtype.hpp"
#include "npullm/core/huge_page_allocator.hpp"
#include "npullm/core/tensor_view.hpp"
#include "npullm/model/layer_weights.hpp"
#include "npullm/model/load_options.hpp"
#include "npullm/model/projection.hpp"
#include "npullm/ops/linear.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace npullm::model::detail {

// Drops the whole pages of [p, p + bytes), which lie in a read-only file mapping, from the
// process: they leave its resident set, and a later read faults them back in from the file.
// Advisory: where madvise fails, they stay.
inline void drop_mapped_pages(const void* p, std::size_t bytes) noexcept {
#if defined(__linux__) && defined(MADV_DONTNEED)
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t begin = (a + page - 1) / page * page, end = (a + bytes) / page * page;
  if (page > 0 && end > begin) {
    (void)::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
  }
#else
  (void)p;
  (void)bytes;
#endif
}

template <storage_type W>
struct dense_huge_pages {
  // Weights = model_weights<W>, bound (every view set) and not yet shared.
  template <class Weights>
  static void copy(Weights& w, huge_page_copy mode) {
    if (mode == huge_page_copy::off) return;
    const bool on = mode == huge_page_copy::on;
    const bool tied = w.lm_head.identity() == w.embed.identity();
    std::vector<projection<W>*> chosen;
    const auto choose = [&](projection<W>& p) {
      if (!p.is_quantized() && p.w.size() != 0) chosen.push_back(&p);
    };
    if (on || tied) choose(w.embed);
    if (!tied) choose(w.lm_head);
    if (on || !ops::packing_pays<W>()) {
      for (layer_weights<W>& l : w.layers) for_each_projection(l, choose);
    }
    // The layout: 64-byte aligned offsets into one block.
    std::vector<std::size_t> offset(chosen.size());
    std::size_t total = 0;
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      offset[i] = total;
      total += (chosen[i]->w.size() * sizeof(W) + 63) / 64 * 64;
    }
    if (total == 0) return;
    // One chunk of its own (2 MiB-aligned and advised from 2 MiB; a smaller total shares a
    // 2 MiB chunk's first bytes), freed with the weights. The copy only speeds decode: where
    // the memory cannot be had, the matrices stay views of the mapping, as with `off`.
    std::shared_ptr<huge_page_arena> arena;
    std::byte* base = nullptr;
    try {
      arena = std::make_shared<huge_page_arena>(total);
      base = static_cast<std::byte*>(arena->allocate(total));
    } catch (const std::bad_alloc&) {
      return;
    }
    std::vector<std::size_t> released;  // owned_ slots of sources the loader owned
    for (std::size_t i = 0; i < chosen.size(); ++i) {
      projection<W>& p = *chosen[i];
      const W* src = p.w.data_handle();
      const std::size_t bytes = p.w.size() * sizeof(W);
      std::memcpy(base + offset[i], src, bytes);
      if (const auto it = w.owned_matrices_.find(src); it != w.owned_matrices_.end()) {
        released.push_back(it->second);  // freed after every copy is made
      } else {
        drop_mapped_pages(src, bytes);
      }
      p.w = dense_view<const W, 2>(reinterpret_cast<const W*>(base + offset[i]), p.w.extent(0),
                                   p.w.extent(1));
    }
    if (tied) w.lm_head = w.embed;
    for (const std::size_t slot : released) w.owned_[slot].reset();
    w.owned_matrices_.clear();
    w.owned_.push_back(arena);
    w.huge_page_copy_bytes_ = total;
  }
};

}  // namespace npullm::model::detail
