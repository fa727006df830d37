// tensor_view<T, Extents, Layout, Accessor>: a non-owning multidimensional view shaped like
// std::mdspan (C++23), for C++20.
//
//   extents<I, 4, dynamic_extent>     a shape: static extents cost no storage
//   layout_right / layout_stride      maps an index tuple to an offset
//   default_accessor<T>               reads T& at p[i]
//   converting_accessor<S>            reads f16/bf16 storage S as float (read-only)
//
// Policies that hold no state add no size: a view with static extents, layout_right and
// default_accessor is one pointer. Element access does not check bounds (hot loops);
// `at(...)` does and throws npullm::error(out_of_range).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include "npullm/core/dtype.hpp"
#include "npullm/core/error.hpp"
#include "npullm/core/isa.hpp"

namespace npullm {

inline constexpr std::size_t dynamic_extent = std::dynamic_extent;

namespace detail {

// Storage for the dynamic extents only: empty (and so free, by EBO) when all are static.
template <class IndexType, std::size_t N>
struct dynamic_extents_storage {
  std::array<IndexType, N> dynamic_{};
};
template <class IndexType>
struct dynamic_extents_storage<IndexType, 0> {};

}  // namespace detail

template <class IndexType, std::size_t... Exts>
class extents
    : private detail::dynamic_extents_storage<IndexType,
                                              ((Exts == dynamic_extent ? 1 : 0) + ... + 0)> {
  static_assert(std::is_integral_v<IndexType>, "extents: IndexType must be an integer type");

 public:
  using index_type = IndexType;
  using size_type = std::make_unsigned_t<IndexType>;
  using rank_type = std::size_t;

  static constexpr rank_type rank() noexcept { return sizeof...(Exts); }
  static constexpr rank_type rank_dynamic() noexcept {
    return ((Exts == dynamic_extent ? 1 : 0) + ... + 0);
  }
  static constexpr std::size_t static_extent(rank_type r) noexcept { return static_[r]; }

  constexpr extents() noexcept = default;

  // Either the dynamic extents only, or all of them (static ones must then match).
  template <std::integral... I>
  requires(sizeof...(I) == rank_dynamic() ||
           (sizeof...(I) == rank() && rank() != 0)) constexpr explicit extents(I... values) {
    const std::array<index_type, sizeof...(I)> v{static_cast<index_type>(values)...};
    assign(std::span<const index_type, sizeof...(I)>(v));
  }

  template <std::integral I, std::size_t N>
  requires(N == rank_dynamic() ||
           N == rank()) constexpr explicit extents(const std::array<I, N>& values) {
    std::array<index_type, N> v{};
    for (std::size_t r = 0; r < N; ++r) v[r] = static_cast<index_type>(values[r]);
    assign(std::span<const index_type, N>(v));
  }

  // From other extents of the same rank; a static extent here must match there.
  template <class OtherIndex, std::size_t... OtherExts>
  requires(sizeof...(OtherExts) == rank() && rank() != 0) constexpr explicit(
      ((Exts != dynamic_extent && OtherExts == dynamic_extent) || ...))
      extents(const extents<OtherIndex, OtherExts...>& other) {
    std::array<index_type, rank()> v{};
    for (rank_type r = 0; r < rank(); ++r) v[r] = static_cast<index_type>(other.extent(r));
    assign(std::span<const index_type, rank()>(v));
  }

  [[nodiscard]] constexpr index_type extent(rank_type r) const noexcept {
    if (static_[r] != dynamic_extent) return static_cast<index_type>(static_[r]);
    if constexpr (rank_dynamic() != 0) {
      return this->dynamic_[dynamic_index_[r]];
    } else {
      return 0;  // unreachable: every extent is static
    }
  }

  template <class OtherIndex, std::size_t... OtherExts>
  friend constexpr bool operator==(const extents& a,
                                   const extents<OtherIndex, OtherExts...>& b) noexcept {
    if constexpr (sizeof...(OtherExts) != rank()) {
      return false;
    } else {
      for (rank_type r = 0; r < rank(); ++r) {
        if (static_cast<std::size_t>(a.extent(r)) != static_cast<std::size_t>(b.extent(r))) {
          return false;
        }
      }
      return true;
    }
  }

 private:
  static constexpr std::size_t static_[rank() + 1] = {Exts..., 0};

  // dynamic_index_[r]: position of extent r among the dynamic ones.
  static constexpr std::array<rank_type, rank() + 1> dynamic_index_ = [] {
    std::array<rank_type, rank() + 1> idx{};
    rank_type d = 0;
    for (rank_type r = 0; r < rank(); ++r) {
      idx[r] = d;
      if (static_[r] == dynamic_extent) ++d;
    }
    return idx;
  }();

  template <std::size_t N>
  constexpr void assign(std::span<const index_type, N> v) {
    if constexpr (std::is_signed_v<index_type>) {
      for (rank_type i = 0; i < N; ++i) {
        if (v[i] < 0) raise(error_code::invalid_shape, "extents: negative extent ", v[i]);
      }
    }
    if constexpr (N == rank() && rank() != rank_dynamic()) {
      for (rank_type r = 0; r < rank(); ++r) {
        if (static_[r] != dynamic_extent && static_[r] != static_cast<std::size_t>(v[r])) {
          raise(error_code::invalid_shape, "extents: extent ", r, " is ", v[r],
                " but the static extent is ", static_[r]);
        }
        if constexpr (rank_dynamic() != 0) {
          if (static_[r] == dynamic_extent) this->dynamic_[dynamic_index_[r]] = v[r];
        }
      }
    } else if constexpr (N != 0) {
      for (rank_type i = 0; i < N; ++i) this->dynamic_[i] = v[i];
    }
  }
};

namespace detail {
template <class IndexType, std::size_t Rank, class Seq = std::make_index_sequence<Rank>>
struct make_dextents;
template <class IndexType, std::size_t Rank, std::size_t... I>
struct make_dextents<IndexType, Rank, std::index_sequence<I...>> {
  using type = extents<IndexType, ((void)I, dynamic_extent)...>;
};
}  // namespace detail

// All-dynamic extents of a given rank.
template <std::size_t Rank, class IndexType = std::size_t>
using dextents = typename detail::make_dextents<IndexType, Rank>::type;

template <class E>
inline constexpr bool is_extents_v = false;
template <class I, std::size_t... E>
inline constexpr bool is_extents_v<extents<I, E...>> = true;

namespace detail {
inline namespace NPULLM_ISA_NAMESPACE {  // string code, built per ISA as format_list is
template <class Extents>
std::string format_extents(const Extents& e) {
  std::array<std::size_t, Extents::rank()> v{};
  for (std::size_t r = 0; r < Extents::rank(); ++r) v[r] = static_cast<std::size_t>(e.extent(r));
  return format_list(v);
}
}  // namespace NPULLM_ISA_NAMESPACE
}  // namespace detail

// ---- layouts --------------------------------------------------------------------------------

// Row-major and contiguous: the last index varies fastest (C order).
struct layout_right {
  template <class Extents>
  class mapping {
   public:
    using extents_type = Extents;
    using index_type = typename Extents::index_type;
    using size_type = typename Extents::size_type;
    using rank_type = typename Extents::rank_type;
    using layout_type = layout_right;

    constexpr mapping() noexcept = default;
    constexpr mapping(const extents_type& e) noexcept : extents_(e) {}  // NOLINT: implicit
    template <class Other>
    requires std::is_constructible_v<extents_type, Other>
    constexpr explicit(!std::is_convertible_v<Other, extents_type>)
        mapping(const mapping<Other>& other)
        : extents_(other.extents()) {}

    [[nodiscard]] constexpr const extents_type& extents() const noexcept { return extents_; }

    template <std::integral... I>
    requires(sizeof...(I) == Extents::rank()) constexpr index_type operator()(
        I... idx) const noexcept {
      index_type offset = 0;
      [[maybe_unused]] rank_type r = 0;
      ((offset =
            static_cast<index_type>(offset * extents_.extent(r++) + static_cast<index_type>(idx))),
       ...);
      return offset;
    }

    [[nodiscard]] constexpr index_type required_span_size() const noexcept {
      index_type n = 1;
      for (rank_type r = 0; r < Extents::rank(); ++r) n *= extents_.extent(r);
      return n;
    }
    [[nodiscard]] constexpr index_type stride(rank_type r) const noexcept {
      index_type s = 1;
      for (rank_type k = r + 1; k < Extents::rank(); ++k) s *= extents_.extent(k);
      return s;
    }

    static constexpr bool is_always_unique() noexcept { return true; }
    static constexpr bool is_always_exhaustive() noexcept { return true; }
    static constexpr bool is_always_strided() noexcept { return true; }
    static constexpr bool is_unique() noexcept { return true; }
    static constexpr bool is_exhaustive() noexcept { return true; }
    static constexpr bool is_strided() noexcept { return true; }

    friend constexpr bool operator==(const mapping& a, const mapping& b) noexcept {
      return a.extents_ == b.extents_;
    }

   private:
    [[no_unique_address]] extents_type extents_{};
  };
};

// Any strides (in elements): what a region of interest of a larger tensor needs.
struct layout_stride {
  template <class Extents>
  class mapping {
   public:
    using extents_type = Extents;
    using index_type = typename Extents::index_type;
    using size_type = typename Extents::size_type;
    using rank_type = typename Extents::rank_type;
    using layout_type = layout_stride;
    using strides_type = std::array<index_type, Extents::rank()>;

    constexpr mapping() noexcept : mapping(layout_right::mapping<Extents>()) {}
    constexpr mapping(const extents_type& e, const strides_type& s) noexcept
        : extents_(e), strides_(s) {}
    // Any layout with a stride() per rank converts (layout_right, another layout_stride).
    template <class OtherMapping>
    requires(std::is_constructible_v<extents_type, typename OtherMapping::extents_type>&&
                 OtherMapping::is_always_strided() &&
             !std::is_same_v<OtherMapping,
                             mapping>) constexpr mapping(const OtherMapping&
                                                             other) noexcept  // NOLINT: implicit
        : extents_(other.extents()) {
      for (rank_type r = 0; r < Extents::rank(); ++r) strides_[r] = other.stride(r);
    }

    [[nodiscard]] constexpr const extents_type& extents() const noexcept { return extents_; }
    [[nodiscard]] constexpr const strides_type& strides() const noexcept { return strides_; }
    [[nodiscard]] constexpr index_type stride(rank_type r) const noexcept { return strides_[r]; }

    template <std::integral... I>
    requires(sizeof...(I) == Extents::rank()) constexpr index_type operator()(
        I... idx) const noexcept {
      index_type offset = 0;
      [[maybe_unused]] rank_type r = 0;
      ((offset += static_cast<index_type>(idx) * strides_[r++]), ...);
      return offset;
    }

    [[nodiscard]] constexpr index_type required_span_size() const noexcept {
      index_type n = 1;
      for (rank_type r = 0; r < Extents::rank(); ++r) {
        if (extents_.extent(r) == 0) return 0;
        n += (extents_.extent(r) - 1) * strides_[r];
      }
      return n;
    }

    static constexpr bool is_always_unique() noexcept { return true; }
    static constexpr bool is_always_exhaustive() noexcept { return false; }
    static constexpr bool is_always_strided() noexcept { return true; }
    static constexpr bool is_unique() noexcept { return true; }
    static constexpr bool is_strided() noexcept { return true; }
    // Exhaustive when the strides are those of some permutation of a packed layout; npullm
    // checks the common case it relies on: the row-major packed strides.
    [[nodiscard]] constexpr bool is_exhaustive() const noexcept {
      return *this == mapping(layout_right::mapping<Extents>(extents_));
    }

    friend constexpr bool operator==(const mapping& a, const mapping& b) noexcept {
      return a.extents_ == b.extents_ && a.strides_ == b.strides_;
    }

   private:
    extents_type extents_{};
    strides_type strides_{};
  };
};

// ---- accessors ------------------------------------------------------------------------------

template <class T>
struct default_accessor {
  using offset_policy = default_accessor;
  using element_type = T;
  using reference = T&;
  using data_handle_type = T*;

  constexpr default_accessor() noexcept = default;
  // default_accessor<float> converts to default_accessor<const float>, not the other way.
  template <class U>
  requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr default_accessor(default_accessor<U>) noexcept {}  // NOLINT: implicit

  constexpr reference access(data_handle_type p, std::size_t i) const noexcept { return p[i]; }
  constexpr data_handle_type offset(data_handle_type p, std::size_t i) const noexcept {
    return p + i;
  }
};

// Reads float16 / bfloat16 (or float) storage as float values: a read-only view in float
// over 16-bit storage, with no converted copy.
template <storage_type Storage>
struct converting_accessor {
  using offset_policy = converting_accessor;
  using element_type = const float;
  using reference = float;
  using data_handle_type = const Storage*;

  float access(data_handle_type p, std::size_t i) const noexcept { return to_float(p[i]); }
  constexpr data_handle_type offset(data_handle_type p, std::size_t i) const noexcept {
    return p + i;
  }
};

// ---- the view -------------------------------------------------------------------------------

template <class T, class Extents, class Layout = layout_right, class Accessor = default_accessor<T>>
class tensor_view {
  static_assert(is_extents_v<Extents>, "tensor_view: Extents must be npullm::extents<...>");

 public:
  using extents_type = Extents;
  using layout_type = Layout;
  using accessor_type = Accessor;
  using mapping_type = typename Layout::template mapping<Extents>;
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using index_type = typename Extents::index_type;
  using size_type = typename Extents::size_type;
  using rank_type = typename Extents::rank_type;
  using data_handle_type = typename Accessor::data_handle_type;
  using reference = typename Accessor::reference;

  static constexpr rank_type rank() noexcept { return Extents::rank(); }
  static constexpr rank_type rank_dynamic() noexcept { return Extents::rank_dynamic(); }
  static constexpr std::size_t static_extent(rank_type r) noexcept {
    return Extents::static_extent(r);
  }

  constexpr tensor_view() = default;

  template <std::integral... I>
  requires((sizeof...(I) == rank_dynamic() || sizeof...(I) == rank()) &&
           std::is_constructible_v<mapping_type, const extents_type&> &&
           std::is_default_constructible_v<
               accessor_type>) constexpr explicit tensor_view(data_handle_type p, I... exts)
      : ptr_(p), map_(extents_type(exts...)) {}

  constexpr tensor_view(data_handle_type p, const extents_type& e) requires
      std::is_constructible_v<mapping_type, const extents_type&> : ptr_(p),
                                                                   map_(e) {}

  constexpr tensor_view(data_handle_type p, const mapping_type& m) : ptr_(p), map_(m) {}

  constexpr tensor_view(data_handle_type p, const mapping_type& m, const accessor_type& a)
      : ptr_(p), map_(m), acc_(a) {}

  // Conversions that lose nothing: T -> const T, layout_right -> layout_stride, static ->
  // dynamic extents.
  template <class U, class E, class L, class A>
  requires(std::is_constructible_v<mapping_type, const typename L::template mapping<E>&>&&
               std::is_constructible_v<accessor_type, const A&>&& std::is_convertible_v<
                   typename A::data_handle_type,
                   data_handle_type>) constexpr tensor_view(const tensor_view<U, E, L, A>&
                                                                other)  // NOLINT: implicit
      : ptr_(other.data_handle()), map_(other.mapping()), acc_(other.accessor()) {}

  template <std::integral... I>
  requires(sizeof...(I) == rank()) constexpr reference operator()(I... idx) const noexcept {
    return acc_.access(ptr_, static_cast<std::size_t>(map_(idx...)));
  }

  constexpr reference operator[](const std::array<index_type, rank()>& idx) const noexcept {
    return apply_index(idx, std::make_index_sequence<rank()>());
  }

  // Bounds-checked access: throws out_of_range naming the index and the extents.
  template <std::integral... I>
  requires(sizeof...(I) == rank()) constexpr reference at(I... idx) const {
    const std::array<index_type, rank()> v{static_cast<index_type>(idx)...};
    for (rank_type r = 0; r < rank(); ++r) {
      if (std::cmp_less(v[r], 0) || v[r] >= extent(r)) {
        raise(error_code::out_of_range, "index ", detail::format_list(v),
              " out of range for extents ", detail::format_extents(extents()));
      }
    }
    return (*this)(idx...);
  }

  [[nodiscard]] constexpr const extents_type& extents() const noexcept { return map_.extents(); }
  [[nodiscard]] constexpr index_type extent(rank_type r) const noexcept {
    return extents().extent(r);
  }
  [[nodiscard]] constexpr size_type size() const noexcept {
    size_type n = 1;
    for (rank_type r = 0; r < rank(); ++r) n *= static_cast<size_type>(extent(r));
    return n;
  }
  [[nodiscard]] constexpr bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] constexpr index_type stride(rank_type r) const noexcept { return map_.stride(r); }
  [[nodiscard]] constexpr bool is_exhaustive() const noexcept { return map_.is_exhaustive(); }
  [[nodiscard]] constexpr const data_handle_type& data_handle() const noexcept { return ptr_; }
  [[nodiscard]] constexpr const mapping_type& mapping() const noexcept { return map_; }
  [[nodiscard]] constexpr const accessor_type& accessor() const noexcept { return acc_; }

 private:
  template <std::size_t... R>
  constexpr reference apply_index(const std::array<index_type, rank()>& idx,
                                  std::index_sequence<R...>) const noexcept {
    return (*this)(idx[R]...);
  }

  data_handle_type ptr_{};
  [[no_unique_address]] mapping_type map_{};
  [[no_unique_address]] accessor_type acc_{};
};

template <class T, std::integral... I>
tensor_view(T*, I...) -> tensor_view<T, dextents<sizeof...(I)>>;

// The usual spellings: all-dynamic extents, row-major or strided.
template <class T, std::size_t Rank>
using dense_view = tensor_view<T, dextents<Rank>>;
template <class T, std::size_t Rank>
using strided_view = tensor_view<T, dextents<Rank>, layout_stride>;
// Float values read from f16/bf16 (or f32) storage, row-major.
template <storage_type Storage, std::size_t Rank>
using float_view =
    tensor_view<const float, dextents<Rank>, layout_right, converting_accessor<Storage>>;

template <class V>
inline constexpr bool is_tensor_view_v = false;
template <class T, class E, class L, class A>
inline constexpr bool is_tensor_view_v<tensor_view<T, E, L, A>> = true;

template <class V>
concept any_tensor_view = is_tensor_view_v<std::remove_cvref_t<V>>;

}  // namespace npullm
