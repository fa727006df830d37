// npullm_isa_run <isa> <test binary> [arguments...]: runs a kernel test built for another ISA
// (tests/CMakeLists.txt, npullm_add_test ISAS) when this CPU can run that ISA, and otherwise
// reports the test as skipped (exit code 77, the ctest entry's SKIP_RETURN_CODE) instead of
// letting it die of an illegal instruction. Built without -march, so that it runs on any x86-64.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

namespace {

// What `isa` needs that this CPU (and OS: __builtin_cpu_supports("avx") checks that the OS saves
// the YMM state) lacks, as a space-separated list; empty when it can run it.
std::string missing_features(std::string_view isa) {
  std::string missing;
  auto need = [&](bool has, const char* name) {
    if (!has) missing += (missing.empty() ? "" : " ") + std::string(name);
  };
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  if (isa == "avx2") {  // -march=x86-64-v3
    need(__builtin_cpu_supports("avx"), "avx");
    need(__builtin_cpu_supports("avx2"), "avx2");
    need(__builtin_cpu_supports("fma"), "fma");
    need(__builtin_cpu_supports("f16c"), "f16c");
    need(__builtin_cpu_supports("bmi"), "bmi");
    need(__builtin_cpu_supports("bmi2"), "bmi2");
    need(__builtin_cpu_supports("lzcnt"), "lzcnt");
    need(__builtin_cpu_supports("movbe"), "movbe");
  } else if (isa == "x86-64") {  // the baseline: every x86-64 CPU
    need(__builtin_cpu_supports("sse2"), "sse2");
  }
#else
  if (isa != "native") missing = "an x86-64 CPU";
#endif
  return missing;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <native|avx2|x86-64> <test binary> [arguments...]\n", argv[0]);
    return 2;
  }
  const std::string_view isa = argv[1];
  if (isa != "native" && isa != "avx2" && isa != "x86-64") {
    std::fprintf(stderr, "npullm_isa_run: unknown ISA '%s' (native, avx2, x86-64)\n", argv[1]);
    return 2;
  }
  const std::string missing = missing_features(isa);
  if (!missing.empty()) {
    std::printf("skipped: %s is built for %s and this CPU lacks %s\n", argv[2], argv[1],
                missing.c_str());
    return 77;
  }
  std::fflush(stdout);
  execv(argv[2], argv + 2);
  std::fprintf(stderr, "npullm_isa_run: cannot run %s: %s\n", argv[2], std::strerror(errno));
  return 1;
}
