/*
 * check.h - the few macros the C tests of libsymmem share.
 *
 * Every check prints one line:
 *     ok   <description>
 *     FAIL <description>  (file:line: expression) [last error N "message"]
 *     skip <description>  (not counted)
 *     #    <information>  (not counted)
 * and check_summary() prints the last line, exactly "N passed, M failed",
 * and returns the process exit status (0 when M == 0).
 *
 * The counters are atomic and the printing is serialised, so checks may run
 * on any thread. Multi-rank tests run the ranks as child processes whose
 * output the parent reads back and counts (check_count_output).
 *
 * Include it in exactly one translation unit per program: it also defines
 * the AddressSanitizer/LeakSanitizer default hooks (see the note below).
 */
#ifndef SYMMEM_TESTS_CHECK_H
#define SYMMEM_TESTS_CHECK_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "symmem.h"

extern char **environ;

/* Note [sanitizers and the Go runtime]
 *
 * libsymmem.so carries a Go runtime (go build -buildmode=c-shared). Measured
 * with gcc 12's ASan: the Go runtime and ASan coexist with ASan's default
 * options (Go chains to ASan's SIGSEGV handler for faults outside Go code,
 * and ASan's handler runs on an alternate stack, as Go requires), and leak
 * detection works. One class of false positive remains: C memory that the
 * library allocates through cgo (C.malloc, C.CString) and keeps referenced
 * only from the Go heap. LeakSanitizer does not scan the Go heap (it is
 * anonymous mmap, not malloc), so such memory looks leaked although Go still
 * holds it (export/main.go's interned strings and statistic keys: about 100
 * small strings). We suppress leaks whose allocation stack passes through
 * libsymmem.so; leaks of the tests' own memory are still reported. The
 * library is stripped (-s -w), so only the module name can be matched.
 *
 * The cuda backend adds two things: ASan's protected shadow gap collides
 * with the address range the CUDA driver reserves (cuInit or the first
 * allocation fails with "out of memory"), hence protect_shadow_gap=0; and
 * libcuda keeps allocations LeakSanitizer cannot trace, hence leak:libcuda.
 * Both are harmless on the host backend. The same settings are in
 * tests/c/env.sh; the environment overrides these defaults.
 */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
  return "detect_leaks=1:abort_on_error=0:allow_user_segv_handler=1:protect_shadow_gap=0";
}
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
  return "leak:libsymmem.so\nleak:libcuda.so\nleak:libnvidia-\n";
}
const char *__lsan_default_options(void);
const char *__lsan_default_options(void) { return "print_suppressions=0"; }

static atomic_int check_passed_;
static atomic_int check_failed_;
static pthread_mutex_t check_print_mu_ = PTHREAD_MUTEX_INITIALIZER;
static const char *check_prefix_ = ""; /* e.g. "[rank 2] " */

static inline void check_vprint_(const char *tag, const char *fmt, va_list ap,
                          const char *suffix) {
  char line[2048];
  int n = vsnprintf(line, sizeof line, fmt, ap);
  (void)n;
  pthread_mutex_lock(&check_print_mu_);
  fprintf(stdout, "%s%s %s%s\n", check_prefix_, tag, line, suffix ? suffix : "");
  fflush(stdout);
  pthread_mutex_unlock(&check_print_mu_);
}

/* Records one check; returns cond so callers can stop early. */
__attribute__((format(printf, 5, 6))) static inline int
check_impl_(int cond, const char *file, int line, const char *expr,
            const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  if (cond) {
    atomic_fetch_add(&check_passed_, 1);
    check_vprint_("ok  ", fmt, ap, NULL);
  } else {
    char suffix[1024];
    symmem_result code = symmem_last_error();
    snprintf(suffix, sizeof suffix, "  (%s:%d: %s) [last error %d \"%s\"]",
             file, line, expr, (int)code, symmem_last_error_message());
    atomic_fetch_add(&check_failed_, 1);
    check_vprint_("FAIL", fmt, ap, suffix);
  }
  va_end(ap);
  return cond;
}

/* CHECK(cond, "description", ...) */
#define CHECK(cond, ...) check_impl_(!!(cond), __FILE__, __LINE__, #cond, __VA_ARGS__)

/* CHECK_EQ(a, b, "description", ...) for integers; prints both values. */
#define CHECK_EQ(a, b, ...)                                                    \
  do {                                                                         \
    long long ca_ = (long long)(a), cb_ = (long long)(b);                      \
    char cdesc_[512];                                                          \
    snprintf(cdesc_, sizeof cdesc_, __VA_ARGS__);                              \
    check_impl_(ca_ == cb_, __FILE__, __LINE__, #a " == " #b,                  \
                "%s (%lld == %lld)", cdesc_, ca_, cb_);                        \
  } while (0)

/* CHECK_RESULT(call, expected_code, "description", ...): the call's result
 * and the thread's last error are both expected_code, and for an error the
 * message is not empty. */
#define CHECK_RESULT(call, expected, ...)                                      \
  do {                                                                         \
    symmem_result cr_ = (call);                                                \
    symmem_result ce_ = (expected);                                            \
    char cdesc_[512];                                                          \
    snprintf(cdesc_, sizeof cdesc_, __VA_ARGS__);                              \
    int cok_ = cr_ == ce_ &&                                                   \
               (ce_ == SYMMEM_SUCCESS ||                                       \
                (symmem_last_error() == ce_ &&                                 \
                 symmem_last_error_message()[0] != '\0'));                     \
    check_impl_(cok_, __FILE__, __LINE__, #call, "%s -> %s%s%s", cdesc_,       \
                symmem_strerror(cr_), ce_ ? ": " : "",                         \
                ce_ ? symmem_last_error_message() : "");                       \
  } while (0)

/* CHECK_LAST_ERROR(expected_code, "description", ...): for void calls and
 * pointer-returning calls: the last error is expected_code with a message. */
#define CHECK_LAST_ERROR(expected, ...)                                        \
  do {                                                                         \
    symmem_result ce_ = (expected), cl_ = symmem_last_error();                 \
    char cdesc_[512];                                                          \
    snprintf(cdesc_, sizeof cdesc_, __VA_ARGS__);                              \
    int cok_ = cl_ == ce_ && (ce_ == SYMMEM_SUCCESS ||                         \
                              symmem_last_error_message()[0] != '\0');         \
    check_impl_(cok_, __FILE__, __LINE__, "last error == " #expected,          \
                "%s -> %s%s%s", cdesc_, symmem_strerror(cl_),                  \
                cl_ ? ": " : "", cl_ ? symmem_last_error_message() : "");      \
  } while (0)

__attribute__((format(printf, 1, 2))) static inline void check_skip(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_vprint_("skip", fmt, ap, NULL);
  va_end(ap);
}

__attribute__((format(printf, 1, 2))) static inline void check_info(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  check_vprint_("#   ", fmt, ap, NULL);
  va_end(ap);
}

/* Prints "N passed, M failed" and returns the exit status. */
static inline int check_summary(void) {
  int p = atomic_load(&check_passed_), f = atomic_load(&check_failed_);
  pthread_mutex_lock(&check_print_mu_);
  printf("%s%d passed, %d failed\n", check_prefix_, p, f);
  fflush(stdout);
  pthread_mutex_unlock(&check_print_mu_);
  return f > 0 ? 1 : 0;
}

/* ---------------------------------------------------------------------------
 * Helpers used by several tests
 * ------------------------------------------------------------------------- */

static inline double check_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The value of one statistic of device, or INT64_MIN if the key is missing. */
static inline int64_t check_stat(int device, const char *key) {
  symmem_stat st[512];
  size_t n = symmem_stats(device, st, sizeof st / sizeof st[0]);
  if (n > sizeof st / sizeof st[0]) n = sizeof st / sizeof st[0];
  for (size_t i = 0; i < n; i++)
    if (st[i].key && strcmp(st[i].key, key) == 0) return st[i].value;
  return INT64_MIN;
}

/* Moving bytes in and out of allocated memory. On the host backend the
 * memory is CPU memory and the tests load and store it directly (that is part
 * of the contract); on cuda it is device memory and goes through
 * symmem_copy. Return 0 on success. */
static inline int check_is_host(void) { return strcmp(symmem_backend_name(), "host") == 0; }

/* SYMMEM_TEST_VIA_COPY=1 sends the host backend through symmem_copy too, to
 * exercise the tests' cuda paths where there is no GPU. */
static inline int check_direct_access(void) {
  static int direct = -1;
  if (direct < 0) {
    const char *e = getenv("SYMMEM_TEST_VIA_COPY");
    direct = check_is_host() && !(e && *e && strcmp(e, "0"));
  }
  return direct;
}

static inline int check_mem_write(void *dst, const void *src, size_t n, int device) {
  int host = check_direct_access();
  if (host) {
    memcpy(dst, src, n);
    return 0;
  }
  return symmem_copy(dst, src, n, device, NULL) == SYMMEM_SUCCESS ? 0 : -1;
}

static inline int check_mem_read(void *dst, const void *src, size_t n, int device) {
  int host = check_direct_access();
  if (host) {
    memcpy(dst, src, n);
    return 0;
  }
  return symmem_copy(dst, src, n, device, NULL) == SYMMEM_SUCCESS ? 0 : -1;
}

static inline int check_mem_set(void *dst, int value, size_t n, int device) {
  if (check_direct_access()) {
    memset(dst, value, n);
    return 0;
  }
  return symmem_memset(dst, value, n, device, NULL) == SYMMEM_SUCCESS ? 0 : -1;
}

/* A small deterministic PRNG (splitmix64), one state per user. */
static inline uint64_t check_rand(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* An anonymous file (memfd) that the children of posix_spawn inherit.
 * Used to catch a child's output. Returns -1 on failure. */
static inline int check_tmpfd(const char *name) {
  int fd = memfd_create(name, 0); /* no MFD_CLOEXEC: children inherit it */
  return fd;
}

/* Reads all of fd (from its start) into a malloc'd NUL-terminated string. */
static inline char *check_read_fd(int fd) {
  off_t end = lseek(fd, 0, SEEK_END);
  if (end < 0) end = 0;
  char *buf = malloc((size_t)end + 1);
  if (!buf) return NULL;
  ssize_t got = pread(fd, buf, (size_t)end, 0);
  buf[got > 0 ? got : 0] = '\0';
  return buf;
}

/* Starts /proc/self/exe with argv (argv[0] included, NULL-terminated) and
 * envp (NULL: ours), stdout and stderr of the child going to out_fd and
 * err_fd (-1: ours). Never fork: the Go runtime of libsymmem must not run
 * in a forked child. Returns the pid, or -1. */
static inline pid_t check_spawn_self(char *const argv[], char *const envp[], int out_fd,
                              int err_fd) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  if (out_fd >= 0) posix_spawn_file_actions_adddup2(&fa, out_fd, STDOUT_FILENO);
  if (err_fd >= 0) posix_spawn_file_actions_adddup2(&fa, err_fd, STDERR_FILENO);
  pid_t pid = -1;
  fflush(stdout);
  fflush(stderr);
  int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv,
                       envp ? envp : environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    errno = rc;
    return -1;
  }
  return pid;
}

/* Waits for pid up to timeout_s seconds; on expiry kills it (SIGKILL) and
 * reaps it. Returns the wait status, or -1 on a timeout. */
static inline int check_wait_pid(pid_t pid, double timeout_s) {
  double deadline = check_now_s() + timeout_s;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return status;
    if (r < 0 && errno != EINTR) return -1;
    if (check_now_s() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

/* Describes a wait status for messages. */
static inline const char *check_status_str(int status, char *buf, size_t len) {
  if (status == -1)
    snprintf(buf, len, "timed out, killed");
  else if (WIFEXITED(status))
    snprintf(buf, len, "exit %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
  else
    snprintf(buf, len, "status 0x%x", status);
  return buf;
}

/* Prints a child's captured output (prefixing lines not already prefixed)
 * and adds its "ok" / "FAIL" lines to our counters, so that the final
 * summary counts every check of every rank. Returns the number of FAIL
 * lines. */
static inline int check_count_output(const char *out, const char *prefix) {
  int fails = 0;
  const char *p = out;
  while (p && *p) {
    const char *nl = strchr(p, '\n');
    size_t n = nl ? (size_t)(nl - p) : strlen(p);
    char line[4096];
    if (n >= sizeof line) n = sizeof line - 1;
    memcpy(line, p, n);
    line[n] = '\0';
    /* Skip the child's own prefix to classify the line. */
    const char *body = line;
    size_t plen = strlen(prefix);
    if (plen && strncmp(body, prefix, plen) == 0) body += plen;
    int is_ok = strncmp(body, "ok  ", 4) == 0;
    int is_fail = strncmp(body, "FAIL", 4) == 0;
    int is_summary = strstr(body, " passed, ") != NULL && strstr(body, " failed") != NULL &&
                     (body[0] >= '0' && body[0] <= '9');
    if (is_ok) atomic_fetch_add(&check_passed_, 1);
    if (is_fail) {
      atomic_fetch_add(&check_failed_, 1);
      fails++;
    }
    if (!is_summary) {
      pthread_mutex_lock(&check_print_mu_);
      printf("%s%s\n", prefix, body);
      pthread_mutex_unlock(&check_print_mu_);
    }
    p = nl ? nl + 1 : NULL;
  }
  fflush(stdout);
  return fails;
}

#endif /* SYMMEM_TESTS_CHECK_H */
