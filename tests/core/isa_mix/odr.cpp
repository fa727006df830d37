// test_isa_odr: the one-definition-rule check of test_isa_mix. Its three copies of kernels.cpp
// (native, avx2, x86-64 flags) are read as ELF relocatable objects; every inline function or
// variable of namespace npullm is emitted there as a COMDAT group named after its mangled name,
// and the linker keeps ONE group of each name for the whole program. A group whose name carries
// an ISA inline namespace (core/isa.hpp) is distinct per copy; one without it, defined by
// several copies with different contents, is an inline function the linker merges although its
// code differs per ISA: every copy then runs one ISA's code (AVX-512 instructions on a CPU
// without them, or the baseline's in the AVX-512 copy). The test lists such groups.
//
// Contents are compared as the linker would place them: each member section's bytes (code,
// jump tables, exception tables) with the relocation slots zeroed (a RELA object keeps addends in
// the relocations; zero slots are checked, not assumed), and each relocation as (offset, type,
// target, addend), the target named by what it resolves to: a global symbol by its name (a call
// into an ISA namespace differs per copy), a constant in a mergeable section by its bytes (the
// .LC numbering and pool offsets differ between TUs for the same constant), a member of the
// same group by its section name, other TU-local data (sanitizer records) by its section name
// only, since its offset depends on the rest of the TU.
//
// Usage: test_isa_odr <object>... (CMake passes $<TARGET_OBJECTS:test_isa_mix_*>).
#include <cxxabi.h>
#include <elf.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

std::vector<std::string> object_paths;  // from the command line

// Strings joined by appending (GCC 12 warns, wrongly, -Wrestrict on "literal" + std::string).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s += ... += parts);
  return s;
}

std::string demangle(const std::string& mangled) {
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> d(
      abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), &std::free);
  return status == 0 && d ? std::string(d.get()) : mangled;
}

// Whether a mangled name is an entity of namespace npullm: _ZN6npullm..., a member function
// (_ZNK6npullm...), a local entity or a guard variable of one (_ZZN6npullm..., _ZGVZN...).
bool in_npullm(std::string_view m) {
  if (!m.starts_with("_Z")) return false;
  m.remove_prefix(2);
  if (m.starts_with("GV") || m.starts_with("TH") || m.starts_with("TW")) m.remove_prefix(2);
  if (m.starts_with("Z")) m.remove_prefix(1);
  if (!m.starts_with("N")) return false;
  m.remove_prefix(1);
  while (!m.empty() && std::string_view("rVKRO").find(m.front()) != std::string_view::npos)
    m.remove_prefix(1);
  return m.starts_with("6npullm");
}

// Whether a mangled name names an ISA inline namespace (core/isa.hpp's NPULLM_ISA_NAMESPACE:
// avx512_bf16, avx512, avx2, portable), anywhere: a template argument of an ISA's type makes
// the name differ per ISA too. A source name is <length><identifier>: the token must not
// follow another digit (14avx2... would be another identifier).
bool names_isa(std::string_view m) {
  for (std::string_view token : {"11avx512_bf16", "6avx512", "4avx2", "8portable"}) {
    for (std::size_t at = m.find(token); at != std::string_view::npos; at = m.find(token, at + 1)) {
      if (at == 0 || m[at - 1] < '0' || m[at - 1] > '9') return true;
    }
  }
  return false;
}

// Bytes a relocation of this type writes (x86-64); 0 for a type this test does not know.
std::size_t slot_size(std::uint32_t type) {
  switch (type) {
    case R_X86_64_64:
    case R_X86_64_PC64:
    case R_X86_64_DTPOFF64:
    case R_X86_64_TPOFF64:
    case R_X86_64_GOTOFF64:
    case R_X86_64_SIZE64: return 8;
    case R_X86_64_PC32:
    case R_X86_64_GOT32:
    case R_X86_64_PLT32:
    case R_X86_64_GOTPCREL:
    case R_X86_64_32:
    case R_X86_64_32S:
    case R_X86_64_TLSGD:
    case R_X86_64_TLSLD:
    case R_X86_64_DTPOFF32:
    case R_X86_64_GOTTPOFF:
    case R_X86_64_TPOFF32:
    case R_X86_64_GOTPC32:
    case R_X86_64_SIZE32:
    case R_X86_64_GOTPCRELX:
    case R_X86_64_REX_GOTPCRELX: return 4;
    default: return 0;
  }
}

struct member {
  std::string name;  // section name: the same in every object that defines the group
  std::uint32_t type = 0;
  std::uint64_t size = 0;
  std::vector<std::uint8_t> bytes;       // relocation slots zeroed
  std::vector<std::string> relocations;  // "offset type target addend", in the object's order
  friend bool operator==(const member&, const member&) = default;
};

struct comdat_group {
  std::string signature;
  bool function = false;        // the signature symbol is a function (else data)
  std::vector<member> members;  // by section name
  friend bool operator==(const comdat_group& a, const comdat_group& b) {
    return a.members == b.members;
  }
};

struct object_file {
  std::string path;
  std::map<std::string, comdat_group> groups;  // by signature
  std::size_t nonzero_slots = 0;               // relocation slots whose bytes were not zero
};

class elf_reader {
 public:
  explicit elf_reader(const std::string& path) : path_(path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) fail("cannot open");
    data_.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    if (data_.size() < sizeof(Elf64_Ehdr)) fail("too short for an ELF header");
    const auto& eh = at<Elf64_Ehdr>(0);
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_ident[EI_DATA] != ELFDATA2LSB || eh.e_type != ET_REL) {
      fail("not a little-endian ELF64 relocatable object");
    }
    if (eh.e_machine != EM_X86_64) fail("not x86-64 (the relocation types read are x86-64's)");
    if (eh.e_shentsize != sizeof(Elf64_Shdr)) fail("unexpected section header size");
    std::uint64_t count = eh.e_shnum;
    if (count == 0) count = at<Elf64_Shdr>(eh.e_shoff).sh_size;  // > 0xff00 sections
    for (std::uint64_t i = 0; i < count; ++i)
      sections_.push_back(at<Elf64_Shdr>(eh.e_shoff + i * sizeof(Elf64_Shdr)));
    std::uint32_t names = eh.e_shstrndx;
    if (names == SHN_XINDEX) names = sections_.at(0).sh_link;
    section_names_ = &sections_.at(names);
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      if (sections_[i].sh_type == SHT_SYMTAB) symtab_ = &sections_[i];
    }
    if (symtab_ == nullptr) fail("no symbol table");
  }

  object_file read() {
    object_file out;
    out.path = path_;
    // Which group each section belongs to, and the relocation section of each section.
    std::vector<std::size_t> group_of(sections_.size(), 0), rela_of(sections_.size(), 0);
    for (std::size_t i = 0; i < sections_.size(); ++i) {
      const Elf64_Shdr& s = sections_[i];
      if (s.sh_type == SHT_RELA) rela_of.at(s.sh_info) = i;
      if (s.sh_type == SHT_REL) fail("REL relocations (addends in the bytes) are not handled");
      if (s.sh_type == SHT_GROUP) {
        for (std::uint32_t m : words(s).subspan(1)) group_of.at(m) = i;
      }
    }
    for (std::size_t g = 0; g < sections_.size(); ++g) {
      const Elf64_Shdr& gs = sections_[g];
      if (gs.sh_type != SHT_GROUP || (words(gs)[0] & GRP_COMDAT) == 0) continue;
      if (gs.sh_link != index_of(symtab_)) fail("group with another symbol table");
      const Elf64_Sym& sig = symbol(gs.sh_info);
      comdat_group grp;
      grp.signature = symbol_name(sig);
      grp.function = ELF64_ST_TYPE(sig.st_info) == STT_FUNC;
      for (std::uint32_t m : words(gs).subspan(1)) {
        const Elf64_Shdr& s = sections_.at(m);
        if (s.sh_type == SHT_RELA || s.sh_type == SHT_REL) continue;  // with their section
        member mem{section_name(m), s.sh_type, s.sh_size, {}, {}};
        if (s.sh_type != SHT_NOBITS) mem.bytes = contents(s);
        if (rela_of[m] != 0) {
          const Elf64_Shdr& rs = sections_[rela_of[m]];
          for (std::uint64_t r = 0; r < rs.sh_size / sizeof(Elf64_Rela); ++r) {
            const auto& rel = at<Elf64_Rela>(rs.sh_offset + r * sizeof(Elf64_Rela));
            const auto type = static_cast<std::uint32_t>(ELF64_R_TYPE(rel.r_info));
            const std::size_t n = slot_size(type);
            if (n == 0) fail("relocation type " + std::to_string(type) + " in " + mem.name);
            if (rel.r_offset + n > mem.bytes.size()) fail("relocation outside " + mem.name);
            for (std::size_t b = 0; b < n; ++b) {
              out.nonzero_slots += mem.bytes[rel.r_offset + b] != 0;
              mem.bytes[rel.r_offset + b] = 0;
            }
            mem.relocations.push_back(
                cat(std::to_string(rel.r_offset), " ", std::to_string(type), " ",
                    target(ELF64_R_SYM(rel.r_info), rel.r_addend, g, group_of)));
          }
        }
        grp.members.push_back(std::move(mem));
      }
      std::sort(grp.members.begin(), grp.members.end(),
                [](const member& a, const member& b) { return a.name < b.name; });
      out.groups[grp.signature] = std::move(grp);
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(path_ + ": " + why);
  }

  template <class T>
  const T& at(std::uint64_t offset) const {
    if (offset + sizeof(T) > data_.size()) fail("truncated");
    return *reinterpret_cast<const T*>(data_.data() + offset);
  }
  std::span<const std::uint32_t> words(const Elf64_Shdr& s) const {
    if (s.sh_offset + s.sh_size > data_.size() || s.sh_size < 4) fail("bad group section");
    return {reinterpret_cast<const std::uint32_t*>(data_.data() + s.sh_offset), s.sh_size / 4};
  }
  std::vector<std::uint8_t> contents(const Elf64_Shdr& s) const {
    if (s.sh_offset + s.sh_size > data_.size()) fail("section outside the file");
    const auto* p = reinterpret_cast<const std::uint8_t*>(data_.data() + s.sh_offset);
    return {p, p + s.sh_size};
  }
  std::size_t index_of(const Elf64_Shdr* s) const {
    return static_cast<std::size_t>(s - sections_.data());
  }
  std::string string_at(const Elf64_Shdr& table, std::uint64_t offset) const {
    if (table.sh_offset + offset >= data_.size()) fail("string outside the file");
    const char* p = data_.data() + table.sh_offset + offset;
    return std::string(p, strnlen(p, data_.size() - (table.sh_offset + offset)));
  }
  std::string section_name(std::size_t i) const {
    return string_at(*section_names_, sections_.at(i).sh_name);
  }
  const Elf64_Sym& symbol(std::uint64_t i) const {
    if ((i + 1) * sizeof(Elf64_Sym) > symtab_->sh_size) fail("symbol index out of range");
    return at<Elf64_Sym>(symtab_->sh_offset + i * sizeof(Elf64_Sym));
  }
  std::string symbol_name(const Elf64_Sym& s) const {
    return string_at(sections_.at(symtab_->sh_link), s.st_name);
  }

  // What a relocation of group `g` against symbol `sym` resolves to (see the top of the file).
  std::string target(std::uint64_t sym, std::int64_t addend, std::size_t g,
                     const std::vector<std::size_t>& group_of) const {
    const Elf64_Sym& s = symbol(sym);
    const auto bind = ELF64_ST_BIND(s.st_info), type = ELF64_ST_TYPE(s.st_info);
    const std::string a = cat(" ", std::to_string(addend));
    if (bind != STB_LOCAL) return symbol_name(s) + a;
    if (s.st_shndx == SHN_UNDEF || s.st_shndx >= SHN_LORESERVE) return symbol_name(s) + a;
    const Elf64_Shdr& in = sections_.at(s.st_shndx);
    const bool section = type == STT_SECTION;
    if (group_of.at(s.st_shndx) == g) {
      return cat("[", section_name(s.st_shndx), "]", section ? "" : " ",
                 section ? "" : symbol_name(s), a);
    }
    if ((in.sh_flags & SHF_MERGE) != 0) {
      // The constant's bytes: from the symbol (+ the addend where it is a section symbol, whose
      // addend is the offset), one entry or one string.
      const std::uint64_t off = s.st_value + (section ? static_cast<std::uint64_t>(addend) : 0);
      const std::vector<std::uint8_t> all = contents(in);
      if (off > all.size()) fail("constant outside its section");
      std::uint64_t end = off + std::max<std::uint64_t>(in.sh_entsize, 1);
      if ((in.sh_flags & SHF_STRINGS) != 0) {
        end = off;
        while (end < all.size() && all[end] != 0) ++end;
      }
      end = std::min<std::uint64_t>(end, all.size());
      std::string hex = "const ";
      for (std::uint64_t i = off; i < end; ++i) {
        static constexpr char digits[] = "0123456789abcdef";
        hex += digits[all[i] >> 4];
        hex += digits[all[i] & 15];
      }
      return hex + (section ? "" : a);
    }
    if (type == STT_FUNC || type == STT_OBJECT) return symbol_name(s) + a;  // internal linkage
    return "local data in " + section_name(s.st_shndx);
  }

  std::string path_;
  std::vector<char> data_;
  std::vector<Elf64_Shdr> sections_;
  const Elf64_Shdr* section_names_ = nullptr;
  const Elf64_Shdr* symtab_ = nullptr;
};

// How two definitions of a group differ, in a few words.
std::string difference(const comdat_group& a, const comdat_group& b) {
  if (a.members.size() != b.members.size()) return "sections differ";
  for (std::size_t i = 0; i < a.members.size(); ++i) {
    const member &x = a.members[i], &y = b.members[i];
    if (x.name != y.name) return "sections differ";
    if (x.size != y.size)
      return x.name + ": " + std::to_string(x.size) + " / " + std::to_string(y.size) + " bytes";
    if (x.bytes != y.bytes) return x.name + ": bytes differ";
    if (x.relocations != y.relocations) {
      for (std::size_t r = 0; r < std::min(x.relocations.size(), y.relocations.size()); ++r) {
        if (x.relocations[r] != y.relocations[r])
          return x.name + ": relocation " + x.relocations[r] + " / " + y.relocations[r];
      }
      return x.name + ": relocations differ";
    }
  }
  return "equal";
}

// The ISA namespace of a name replaced by one placeholder (for the check that the comparison
// sees code that differs: the ISA copies of one kernel).
std::string without_isa(std::string m) {
  for (std::string_view token : {"11avx512_bf16", "6avx512", "4avx2", "8portable"}) {
    for (std::size_t at = m.find(token); at != std::string::npos; at = m.find(token, at + 1)) {
      if (at == 0 || m[at - 1] < '0' || m[at - 1] > '9') m.replace(at, token.size(), "3ISA");
    }
  }
  return m;
}

// A short name for an object in the messages: test_isa_mix_native for
// .../test_isa_mix_native.dir/core/isa_mix/kernels.cpp.o, else its path.
std::string label(const std::string& path) {
  const std::size_t at = path.find("test_isa_mix_");
  return at == std::string::npos ? path : path.substr(at, path.find('.', at) - at);
}

bool bytes_differ(const comdat_group& a, const comdat_group& b) {
  if (a.members.size() != b.members.size()) return true;
  for (std::size_t i = 0; i < a.members.size(); ++i) {
    if (a.members[i].size != b.members[i].size || a.members[i].bytes != b.members[i].bytes)
      return true;
  }
  return false;
}

TEST(IsaOdr, NoInlineFunctionOfNpullmDiffersBetweenIsasOutsideTheIsaNamespaces) {
  ASSERT_GE(object_paths.size(), 2u) << "usage: test_isa_odr <object> <object>...";
  std::vector<object_file> objects;
  for (const auto& path : object_paths) objects.push_back(elf_reader(path).read());

  // The definitions of each group name: (object, group).
  using definitions = std::vector<std::pair<const object_file*, const comdat_group*>>;
  std::map<std::string, definitions> shared;      // npullm, no ISA namespace in the name
  std::map<std::string, definitions> std_shared;  // outside npullm, naming an npullm entity
  std::map<std::string, definitions> isa_copies;  // ISA-named, by the name without the ISA
  for (const auto& o : objects) {
    for (const auto& [name, g] : o.groups) {
      if (names_isa(name)) {
        isa_copies[without_isa(name)].emplace_back(&o, &g);
      } else if (in_npullm(name)) {
        shared[name].emplace_back(&o, &g);
      } else if (name.find("6npullm") != std::string::npos) {
        std_shared[name].emplace_back(&o, &g);
      }
    }
  }
  std::vector<std::string> differing;
  std::size_t compared = 0;
  for (const auto& [name, defs] : shared) {
    if (defs.size() < 2) continue;
    ++compared;
    for (std::size_t i = 1; i < defs.size(); ++i) {
      const auto& [o0, g0] = defs[0];
      const auto& [oi, gi] = defs[i];
      if (!(*gi == *g0)) {
        differing.push_back(std::string(g0->function ? "" : "(data) ") + demangle(name) +
                            "\n      [" + label(o0->path) + " / " + label(oi->path) + ": " +
                            difference(*g0, *gi) + "]");
        break;
      }
    }
  }
  std::size_t std_differing = 0;
  for (const auto& [name, defs] : std_shared) {
    for (std::size_t i = 1; i < defs.size(); ++i) {
      if (!(*defs[i].second == *defs[0].second)) {
        ++std_differing;
        std::printf("outside npullm, differs per ISA: %s\n", demangle(name).c_str());
        break;
      }
    }
  }
  std::size_t isa_compared = 0, isa_differing = 0;
  for (const auto& [name, defs] : isa_copies) {
    if (defs.size() < 2) continue;
    ++isa_compared;
    for (std::size_t i = 1; i < defs.size(); ++i) {
      if (bytes_differ(*defs[i].second, *defs[0].second)) {
        ++isa_differing;
        break;
      }
    }
  }
  std::size_t nonzero = 0;
  for (const auto& o : objects) nonzero += o.nonzero_slots;
  std::printf(
      "npullm inline entities outside the ISA namespaces defined by several objects: %zu, "
      "differing: %zu\nnpullm-caused instantiations outside npullm differing: %zu\n"
      "ISA-namespaced entities in several objects (the namespace ignored): %zu, code differing: "
      "%zu\nrelocation slots not zero in the objects: %zu\n",
      compared, differing.size(), std_differing, isa_compared, isa_differing, nonzero);

  // The comparison must see both kernels whose code differs per ISA (else it would pass while
  // comparing nothing) and shared entities that are equal (else relocations or TU-local data
  // would make everything differ, and the list below would mean nothing).
  EXPECT_GT(isa_differing, 0u) << "no ISA-namespaced kernel's code differs between the objects";
  EXPECT_GT(compared - differing.size(), 0u) << "no shared entity compares equal";
  std::string list;
  for (const auto& d : differing) list += "  " + d + "\n";
  EXPECT_TRUE(differing.empty())
      << differing.size()
      << " inline entities of npullm outside the ISA namespaces differ between the ISA copies "
         "(the linker keeps one of them for all; move them into NPULLM_ISA_NAMESPACE):\n"
      << list;
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) object_paths.emplace_back(argv[i]);
  return RUN_ALL_TESTS();
}
