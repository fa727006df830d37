// tensor<T, Rank, Allocator>: an owning, row-major tensor with 64-byte aligned storage.
//
// Move-only: copying data is explicit (`clone()`), never hidden in a copy constructor.
// Elements are value-initialized (zero). `view()` hands out dense_view<T, Rank>.
// The allocator is a policy (std::allocator-shaped: allocate(n) / deallocate(p, n)), so that
// host-visible device memory can back a tensor; the default is aligned host memory.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <limits>
#include <new>
#include <type_traits>
#include <utility>

#include "npullm/core/error.hpp"
#include "npullm/core/tensor_view.hpp"

namespace npullm {

inline constexpr std::size_t tensor_alignment = 64;  // one cache line, one AVX-512 register

// Host memory aligned to Alignment bytes.
template <class T, std::size_t Alignment = tensor_alignment>
struct aligned_allocator {
  static_assert(Alignment >= alignof(T) && (Alignment & (Alignment - 1)) == 0,
                "aligned_allocator: Alignment must be a power of two >= alignof(T)");
  using value_type = T;
  template <class U>
  struct rebind {
    using other = aligned_allocator<U, Alignment>;
  };

  aligned_allocator() = default;
  template <class U>
  constexpr aligned_allocator(const aligned_allocator<U, Alignment>&) noexcept {}  // NOLINT

  [[nodiscard]] T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) {
      raise(error_code::invalid_shape, "aligned_allocator: ", n, " elements of ", sizeof(T),
            " bytes overflow the address space");
    }
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{Alignment}));
  }
  void deallocate(T* p, std::size_t) noexcept {
    ::operator delete (p, std::align_val_t{Alignment});
  }

  friend constexpr bool operator==(const aligned_allocator&, const aligned_allocator&) noexcept {
    return true;
  }
};

template <class T, std::size_t Rank, class Allocator = aligned_allocator<T>>
class tensor {
  static_assert(std::is_trivially_copyable_v<T>,
                "tensor: elements must be trivially copyable (numbers, float16, bfloat16)");

 public:
  using value_type = T;
  using allocator_type = Allocator;
  using shape_type = std::array<std::size_t, Rank>;
  using view_type = dense_view<T, Rank>;
  using const_view_type = dense_view<const T, Rank>;

  tensor() = default;

  explicit tensor(const shape_type& shape, const Allocator& alloc = Allocator())
      : shape_(shape), alloc_(alloc) {
    size_ = checked_size(shape);
    if (size_ != 0) {
      data_ = alloc_.allocate(size_);
      std::fill_n(data_, size_, T{});
    }
  }

  template <std::integral... I>
  requires(sizeof...(I) == Rank) explicit tensor(I... dims)
      : tensor(shape_type{checked_dim(dims)...}) {}

  tensor(const tensor&) = delete;
  tensor& operator=(const tensor&) = delete;
  tensor(tensor&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        shape_(std::exchange(other.shape_, shape_type{})),
        alloc_(other.alloc_) {}
  tensor& operator=(tensor&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      shape_ = std::exchange(other.shape_, shape_type{});
      alloc_ = other.alloc_;
    }
    return *this;
  }
  ~tensor() { release(); }

  // A deep copy, with its own storage.
  [[nodiscard]] tensor clone() const {
    tensor copy(shape_, alloc_);
    if (size_ != 0) std::memcpy(copy.data_, data_, size_ * sizeof(T));
    return copy;
  }

  [[nodiscard]] view_type view() noexcept { return view_type(data_, extents_of()); }
  [[nodiscard]] const_view_type view() const noexcept {
    return const_view_type(data_, extents_of());
  }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] const shape_type& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t extent(std::size_t r) const noexcept { return shape_[r]; }
  static constexpr std::size_t rank() noexcept { return Rank; }

 private:
  template <std::integral I>
  static std::size_t checked_dim(I d) {
    if (std::cmp_less(d, 0)) raise(error_code::invalid_shape, "tensor: negative extent ", d);
    return static_cast<std::size_t>(d);
  }

  static std::size_t checked_size(const shape_type& shape) {
    std::size_t n = 1;
    for (std::size_t d : shape) {
      if (d != 0 && n > std::numeric_limits<std::size_t>::max() / sizeof(T) / d) {
        raise(error_code::invalid_shape, "tensor: shape ", detail::format_list(shape), " of ",
              sizeof(T), "-byte elements overflows the address space");
      }
      n *= d;
    }
    return n;
  }

  typename view_type::extents_type extents_of() const noexcept {
    return typename view_type::extents_type(shape_);
  }

  void release() noexcept {
    if (data_ != nullptr) alloc_.deallocate(data_, size_);
    data_ = nullptr;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  shape_type shape_{};
  [[no_unique_address]] Allocator alloc_{};
};

}  // namespace npullm
