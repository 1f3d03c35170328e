/*
 * test_faults.c - failure paths that need a C process:
 *   - group creation with 0..4 descriptors left returns an error (EMFILE
 *     named) or times out, never aborts in the Go runtime;
 *   - a forked child that touches the parent's library memory faults
 *     (MADV_DONTFORK) instead of writing into the parent's data;
 *   - symmem_copy / symmem_memset: overruns of known blocks and wild
 *     pointers are SYMMEM_ERROR_INVALID_ARGUMENT, not a dead process;
 *   - timeouts near INT64_MAX do not wrap to under a millisecond;
 *   - a 3000-character setting value comes back in the message once, cut at
 *     64 characters with its length, and the message stays under 1 KiB.
 */
#include <sys/resource.h>

#include "check.h"

static int count_open_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++) {
    if (fcntl(fd, F_GETFD) != -1) n = fd + 1;
  }
  return n;
}

/* Child: only `spare` descriptors above the highest open one, then the
 * first group creation as rank (0: listens; 1: connects) of a group whose
 * other rank never comes. */
static int child_fds(int spare, int rank) {
  check_prefix_ = "[fds] ";
  symmem_device_count(); /* the backend opens with descriptors to spare */
  int top = count_open_fds();
  /* Fill the holes below the highest descriptor, so that exactly `spare`
   * are left. */
  for (int fd = 0; fd < top; fd++)
    if (fcntl(fd, F_GETFD) == -1 && open("/dev/null", O_RDONLY) < 0) return 2;
  struct rlimit saved, rl;
  getrlimit(RLIMIT_NOFILE, &saved);
  rl = saved;
  rl.rlim_cur = (rlim_t)(top + spare);
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
    perror("setrlimit");
    return 2;
  }
  symmem_group *g = NULL;
  char name[64];
  snprintf(name, sizeof name, "fds-%d-%d-%d", rank, spare, (int)getpid());
  int rc = symmem_group_create(name, rank, 2, 0, 300, &g);
  const char *msg = symmem_last_error_message();
  CHECK(rc == SYMMEM_ERROR_TIMEOUT || (rc != SYMMEM_SUCCESS && (strstr(msg, "EMFILE") || strstr(msg, "file descriptors"))),
        "group_create as rank %d with %d spare descriptors returns an error naming the cause (rc %d: %s)", rank, spare,
        rc, msg);
  setrlimit(RLIMIT_NOFILE, &saved); /* LeakSanitizer needs descriptors at exit */
  return check_summary();
}

static void test_fds(void) {
  for (int rank = 0; rank <= 1; rank++)
    for (int spare = 0; spare <= 4; spare++) {
      char arg[8], rarg[8];
      snprintf(arg, sizeof arg, "%d", spare);
      snprintf(rarg, sizeof rarg, "%d", rank);
      char *argv[] = {"test_faults", "fds", arg, rarg, NULL};
      int out = check_tmpfd("out");
      pid_t pid = check_spawn_self(argv, NULL, out, out);
      int st = check_wait_pid(pid, 60);
      char *text = check_read_fd(out);
      check_count_output(text, "");
      char buf[64];
      CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
            "a process with %d spare descriptors survives group creation as rank %d (%s)", spare, rank,
            check_status_str(st, buf, sizeof buf));
      free(text);
      close(out);
    }
}

static void test_fork_cannot_write_parent_memory(void) {
  if (!check_is_host()) {
    check_skip("the child's CPU store needs host memory (backend %s)", symmem_backend_name());
    return;
  }
  size_t n = 1 << 20;
  unsigned char *p = symmem_alloc(n, 0, NULL);
  CHECK(p != NULL, "allocate 1 MiB");
  if (!p) return;
  memset(p, 0x5a, n);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    /* Faults on the first store (not inherited); exit 0 only if it did not. */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    p[0] = 0x11;
    p[n - 1] = 0x11;
    _exit(0);
  }
  int st = check_wait_pid(pid, 30);
  char buf[64];
  CHECK(st != -1 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0),
        "a forked child that stores into the library's heap does not get to (%s)", check_status_str(st, buf, sizeof buf));
  int intact = p[0] == 0x5a && p[n - 1] == 0x5a;
  CHECK(intact, "the parent's data is intact after the child's attempt");
  symmem_free(p, n, 0, NULL);
}

static void test_copy_bounds(void) {
  char *a = symmem_alloc(4096, 0, NULL), *b = symmem_alloc(4096, 0, NULL);
  CHECK(a && b, "two 4 KiB blocks");
  if (!a || !b) return;
  CHECK_RESULT(symmem_copy(a + 4000, b, 200, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "a copy that runs past the end of its destination block");
  CHECK(strstr(symmem_last_error_message(), "past the end of its block") != NULL, "the message says so: %s",
        symmem_last_error_message());
  CHECK_RESULT(symmem_copy(a, b + 100, 4096, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "a copy whose source runs past its block");
  CHECK_RESULT(symmem_memset(b + 1, 0, 4096, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "a memset past the end of its block");
  CHECK_RESULT(symmem_copy(a, b, 4096, 0, NULL), SYMMEM_SUCCESS, "an exact copy still works");
  if (check_is_host()) {
    /* Pointers the library does not know: the copy runs in Go, a fault is
     * an error. */
    CHECK_RESULT(symmem_copy(a, (void *)(uintptr_t)0x10, 64, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "a copy from a wild pointer (0x10)");
    CHECK(strstr(symmem_last_error_message(), "faulted") != NULL, "the message names the fault: %s",
          symmem_last_error_message());
    /* An address that was mapped and is not any more. */
    void *gone = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(gone, 1 << 16);
    CHECK_RESULT(symmem_memset(gone, 1, 64, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "a memset of an unmapped address");
    CHECK_RESULT(symmem_copy((char *)gone + 4096, a, 64, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "a copy to an unmapped address");
    CHECK_RESULT(symmem_copy(a, gone, 64, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "a copy from an unmapped address");
    char local[64] = {0};
    CHECK_RESULT(symmem_copy(local, a, sizeof local, 0, NULL), SYMMEM_SUCCESS, "a copy to the caller's memory works");
  }
  symmem_free(a, 4096, 0, NULL);
  symmem_free(b, 4096, 0, NULL);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "the allocator is valid after the refused copies");
}

static void *put_later(void *arg) {
  struct timespec ts = {0, 200 * 1000 * 1000};
  nanosleep(&ts, NULL);
  symmem_put_signal((symmem_handle *)arg, 0, 0, NULL);
  return NULL;
}

static void test_huge_timeouts(void) {
  if (!check_is_host()) {
    check_skip("wait_signal waits on the calling thread only on the host backend");
    return;
  }
  char name[64];
  snprintf(name, sizeof name, "huge-%d", (int)getpid());
  symmem_group *g = NULL;
  CHECK_RESULT(symmem_group_create(name, 0, 1, 0, INT64_MAX, &g), SYMMEM_SUCCESS, "a group with timeout INT64_MAX ms");
  void *buf = symmem_alloc(4096, 0, NULL);
  symmem_handle *h = NULL;
  CHECK_RESULT(symmem_rendezvous(buf, g, &h), SYMMEM_SUCCESS, "rendezvous");
  int64_t huge[] = {INT64_MAX, INT64_MAX - 1, (int64_t)9223372036854776LL, 0};
  for (size_t i = 0; i < sizeof huge / sizeof *huge && h; i++) {
    pthread_t t;
    pthread_create(&t, NULL, put_later, h);
    double t0 = check_now_s();
    CHECK_RESULT(symmem_wait_signal(h, 0, 0, huge[i], NULL), SYMMEM_SUCCESS,
                 "wait_signal with timeout %" PRId64 " ms waits for the signal 200 ms later", huge[i]);
    CHECK(check_now_s() - t0 > 0.15, "it really waited (%.3f s)", check_now_s() - t0);
    pthread_join(t, NULL);
  }
  symmem_handle_release(h);
  symmem_free(buf, 4096, 0, NULL);
  symmem_group_destroy(g);
}

static int child_long_message(void) {
  check_prefix_ = "[long] ";
  void *p = symmem_alloc(1, 0, NULL);
  const char *msg = symmem_last_error_message();
  size_t n = strlen(msg);
  CHECK(p == NULL && n < 1024, "a message of %zu bytes (the backend's name is 3000 bytes) stays under 1 KiB", n);
  const char *q = strstr(msg, "\"zzzz");
  CHECK(q != NULL && strstr(msg, "zzzz\xe2\x80\xa6\" (3000 characters)") != NULL && strstr(q + 1, "\"zzzz") == NULL,
        "the name is quoted once, cut at 64 characters with its length");
  char small[32];
  CHECK_EQ(symmem_copy_last_error(small, sizeof small), n, "copy_last_error reports the full length");
  return check_summary();
}

static void test_long_message(void) {
  static char env[3100];
  memcpy(env, "SYMMEM_BACKEND=", 15);
  memset(env + 15, 'z', 3000);
  env[3015] = 0;
  char *envp[] = {env, NULL};
  char *argv[] = {"test_faults", "long", NULL};
  int out = check_tmpfd("out");
  pid_t pid = check_spawn_self(argv, envp, out, out);
  int st = check_wait_pid(pid, 60);
  char *text = check_read_fd(out);
  check_count_output(text, "");
  CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the long-message child passed");
  free(text);
  close(out);
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "fds")) return child_fds(atoi(argv[2]), atoi(argv[3]));
  if (argc == 2 && !strcmp(argv[1], "long")) return child_long_message();
  test_fds();
  test_fork_cannot_write_parent_memory();
  test_copy_bounds();
  test_huge_timeouts();
  test_long_message();
  return check_summary();
}
