// bounded: a hostile input's job run in a forked child process under resource limits set in
// that child (not trusted to the code under test): an address-space limit (RLIMIT_AS), CPU
// seconds (RLIMIT_CPU), a wall-clock alarm and the stack of the thread the job runs on. The
// child reports how the job ended (its text, an npullm::error's code and message, a
// std::bad_alloc, another exception), its CPU time and peak resident memory; a child that
// died (a stack overflow's SIGSEGV, SIGXCPU, the alarm's SIGALRM, an abort) says so. Used by
// the hostile-input tests of the Jinja interpreter (text/test_jinja.cpp) and may be by those
// of the grammars (grammar/test_grammar.cpp).
#pragma once

#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <string>

#include "npullm/core/error.hpp"

namespace npullm_test {

// Whether this build runs under AddressSanitizer: its shadow memory reserves terabytes of
// address space (no RLIMIT_AS then) and its stack frames are several times larger.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool under_asan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool under_asan = true;
#else
inline constexpr bool under_asan = false;
#endif
#else
inline constexpr bool under_asan = false;
#endif

// The child's limits; 0 leaves one unset.
struct bounds {
  std::size_t stack = std::size_t{1} << 20;          // the job's thread stack, bytes
  std::size_t address_space = std::size_t{4} << 30;  // RLIMIT_AS, bytes; never set under ASan
  unsigned cpu_seconds = 0;   // RLIMIT_CPU: SIGXCPU past it (a shared machine's slow wall clock
                              // does not count against the job)
  unsigned wall_seconds = 0;  // alarm(): SIGALRM past it (a job that waits, not computes)
};

// How the job ended in the child.
enum class ended : unsigned char { value, npullm_error, bad_alloc, other_exception };

struct bounded_outcome {
  std::string died;  // empty: the child exited normally; else "killed by signal N (name)",
                     // "exit status N" or "pipe failed"
  ended how = ended::value;
  std::string text;           // value: the job's text; npullm_error: its message;
                              // other_exception: what()
  npullm::error_code code{};  // npullm_error
  double seconds = 0;         // wall clock, fork to exit
  double cpu_seconds = 0;     // the child's, user + system
  long max_rss_mib = 0;       // the child's peak resident memory
};

namespace detail_bounded {

inline void write_all(int fd, const std::string& s) {
  for (std::size_t done = 0; done < s.size();) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) ::_exit(4);
    done += static_cast<std::size_t>(n);
  }
}

struct job_state {
  const std::function<std::string()>* job;
  ended how = ended::value;
  int code = 0;
  std::string text;
};

inline void* run_job(void* p) {
  auto* s = static_cast<job_state*>(p);
  try {
    s->text = (*s->job)();
  } catch (const npullm::error& e) {
    s->how = ended::npullm_error;
    s->code = static_cast<int>(e.code());
    s->text = std::string(e.message());
  } catch (const std::bad_alloc&) {
    s->how = ended::bad_alloc;
  } catch (const std::exception& e) {
    s->how = ended::other_exception;
    s->text = e.what();
  }
  return nullptr;
}

}  // namespace detail_bounded

// job() in a forked child under b, on a thread of b.stack bytes. The child writes
// "<how> <code> <max_rss_kib> <cpu_seconds>\n<text>" to a pipe and exits.
inline bounded_outcome run_bounded(const std::function<std::string()>& job, const bounds& b) {
  bounded_outcome r;
  int fds[2];
  if (::pipe(fds) != 0) {
    r.died = "pipe failed";
    return r;
  }
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    if (!under_asan && b.address_space != 0) {
      const rlimit as{b.address_space, b.address_space};
      ::setrlimit(RLIMIT_AS, &as);
    }
    if (b.cpu_seconds != 0) {
      const rlimit cpu{b.cpu_seconds, b.cpu_seconds + 1};
      ::setrlimit(RLIMIT_CPU, &cpu);
    }
    if (b.wall_seconds != 0) ::alarm(b.wall_seconds);
    detail_bounded::job_state s{&job, ended::value, 0, {}};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, b.stack);
    pthread_t thread;
    if (pthread_create(&thread, &attr, detail_bounded::run_job, &s) != 0) ::_exit(3);
    pthread_join(thread, nullptr);
    rusage ru{};
    ::getrusage(RUSAGE_SELF, &ru);
    const double cpu = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                       static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
    detail_bounded::write_all(
        fds[1], std::to_string(static_cast<int>(s.how)) + " " + std::to_string(s.code) + " " +
                    std::to_string(ru.ru_maxrss) + " " + std::to_string(cpu) + "\n" + s.text);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    report.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFSIGNALED(status)) {
    r.died = "killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
             ::strsignal(WTERMSIG(status)) + ")";
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    r.died = "exit status " + std::to_string(WEXITSTATUS(status));
  }
  const std::size_t nl = report.find('\n');
  if (r.died.empty() && nl != std::string::npos) {
    int how = 0, code = 0;
    long rss_kib = 0;
    double cpu = 0;
    if (std::sscanf(report.c_str(), "%d %d %ld %lf", &how, &code, &rss_kib, &cpu) == 4) {
      r.how = static_cast<ended>(how);
      r.code = static_cast<npullm::error_code>(code);
      r.max_rss_mib = rss_kib / 1024;
      r.cpu_seconds = cpu;
      r.text = report.substr(nl + 1);
    } else {
      r.died = "unreadable report: " + report.substr(0, nl);
    }
  } else if (r.died.empty()) {
    r.died = "no report";
  }
  return r;
}

}  // namespace npullm_test
