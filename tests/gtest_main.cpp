// The main() of every npullm test program (instead of gtest_main), so that a skip is never
// reported as a pass:
//   - each skipped test is printed as one line "npullm-skipped: Suite.Name: <reason>", which
//     `make test` collects into its closing summary (scripts/test-summary.sh);
//   - a run in which tests were skipped and none passed (or failed) exits with 77, which ctest
//     reports as "Skipped" (SKIP_RETURN_CODE 77 on every test entry, tests/CMakeLists.txt). A
//     run with failures exits 1 whatever was skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

// The reason GTEST_SKIP() gave, on one line.
std::string skip_reason(const testing::TestResult& r) {
  for (int i = 0; i < r.total_part_count(); ++i) {
    const testing::TestPartResult& part = r.GetTestPartResult(i);
    if (!part.skipped()) continue;
    std::string reason = part.message();
    for (char& c : reason) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    return reason.empty() ? "(no reason given)" : reason;
  }
  return "(no reason given)";
}

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const testing::UnitTest& unit = *testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite& suite = *unit.GetTestSuite(s);
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const testing::TestInfo& info = *suite.GetTestInfo(t);
      if (!info.should_run() || !info.result()->Skipped()) continue;
      std::printf("npullm-skipped: %s.%s: %s\n", suite.name(), info.name(),
                  skip_reason(*info.result()).c_str());
    }
  }
  std::fflush(stdout);
  if (rc == 0 && unit.skipped_test_count() > 0 && unit.successful_test_count() == 0) return 77;
  return rc;
}
