/*
 * test_fork.c - a child made by fork() after libsymmem was loaded is refused
 * at the C front (export/front.c) without entering Go: every call returns its
 * failure value at once with SYMMEM_ERROR_UNAVAILABLE naming fork, even when
 * another thread of the parent was inside the allocator at fork time (the
 * child would deadlock on that lock if it entered Go). The children here call
 * nothing but libsymmem's fronts and _exit: they never run the Go runtime.
 */
#include "check.h"

static atomic_int stop_;

/* Hammers the allocator so that forks land while it holds its lock. */
static void *churn(void *arg) {
  (void)arg;
  while (!atomic_load(&stop_)) {
    void *p = symmem_alloc(4096, 0, NULL);
    symmem_free(p, 4096, 0, NULL);
  }
  return NULL;
}

/* In the child: every entry point refuses. Returns the number of failures
 * (the child cannot use check.h's counters: they are the parent's). */
static int child_checks(void *parent_ptr) {
  int bad = 0;
#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      char m[160];                                                             \
      int n = snprintf(m, sizeof m, "child FAIL line %d: %s\n", __LINE__, #cond); \
      if (write(2, m, (size_t)n) < 0) {}                                       \
      bad++;                                                                   \
    }                                                                          \
  } while (0)
  symmem_clear_last_error();
  EXPECT(symmem_alloc(100, 0, NULL) == NULL);
  EXPECT(symmem_last_error() == SYMMEM_ERROR_UNAVAILABLE);
  EXPECT(strstr(symmem_last_error_message(), "symmem_alloc") != NULL);
  EXPECT(strstr(symmem_last_error_message(), "fork()") != NULL);
  EXPECT(strstr(symmem_last_error_message(), "spawn") != NULL);
  symmem_clear_last_error();
  symmem_free(parent_ptr, 100, 0, NULL);
  EXPECT(symmem_last_error() == SYMMEM_ERROR_UNAVAILABLE);
  symmem_group *g = (symmem_group *)0x1;
  EXPECT(symmem_group_create("forked", 0, 1, 0, 1000, &g) == SYMMEM_ERROR_UNAVAILABLE);
  EXPECT(g == NULL);
  symmem_handle *h = (symmem_handle *)0x1;
  EXPECT(symmem_rendezvous(parent_ptr, NULL, &h) == SYMMEM_ERROR_UNAVAILABLE && h == NULL);
  EXPECT(symmem_empty_cache(-1) == SYMMEM_ERROR_UNAVAILABLE);
  EXPECT(symmem_stats(0, NULL, 0) == 0);
  EXPECT(symmem_device_count() == 0);
  EXPECT(strcmp(symmem_backend_name(), "none") == 0);
  EXPECT(symmem_version() == SYMMEM_VERSION);
  EXPECT(symmem_group_rank(NULL) == -1);
  EXPECT(symmem_handle_buffer_ptrs(NULL) == NULL);
  EXPECT(symmem_barrier(NULL, 0, 10, NULL) == SYMMEM_ERROR_UNAVAILABLE);
  EXPECT(strstr(symmem_last_error_message(), "symmem_barrier") != NULL);
#undef EXPECT
  return bad;
}

/* Forks; the child runs child_checks under a 10 s alarm (a hang is a
 * failure: SIGALRM kills it). Returns the child's wait status. */
static int fork_and_check(void *parent_ptr) {
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    _exit(child_checks(parent_ptr) == 0 ? 0 : 1);
  }
  int status = -1;
  if (pid > 0) waitpid(pid, &status, 0);
  return status;
}

int main(void) {
  void *p = symmem_alloc(100, 0, NULL);
  CHECK(p != NULL, "the parent allocates before forking");
  int st = fork_and_check(p);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a forked child is refused by every front with UNAVAILABLE naming fork (status %#x)", st);

  pthread_t t[2];
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, churn, NULL);
  int ok = 0, n = 20;
  for (int i = 0; i < n; i++) {
    st = fork_and_check(p);
    ok += WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  atomic_store(&stop_, 1);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  CHECK_EQ(ok, n, "children forked while other threads are in the allocator return at once, none hangs");

  /* The parent is untouched: its allocation is still its own. */
  symmem_clear_last_error();
  symmem_pointer_info info;
  CHECK_RESULT(symmem_pointer_get_info(p, &info), SYMMEM_SUCCESS, "the parent's pointer is still live after the forks");
  symmem_free(p, 100, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "the parent frees it normally");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "the parent's allocator is valid");
  return check_summary();
}
