/*
 * test_bad_input.c - every bad input to the allocator gets a defined result
 * and a message, and changes nothing it should not.
 *
 * The strict mode (SYMMEM_STRICT=1 aborts on an invalid free) runs in a
 * child: this program re-executes itself (posix_spawn of /proc/self/exe;
 * never fork, the library carries a Go runtime) with --strict-child.
 */
#include <float.h>
#include <limits.h>
#include <math.h>

#include "check.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static int host_memory;

/* A copy of every statistic, to prove that a failed call changed nothing. */
typedef struct {
  size_t n;
  symmem_stat st[512];
} snapshot;

static void snap(snapshot *s) {
  s->n = symmem_stats(0, s->st, 512);
  if (s->n > 512) s->n = 512;
}

/* Returns the number of differing statistics, printing them. */
static int snap_diff(const snapshot *a, const snapshot *b) {
  int d = 0;
  if (a->n != b->n) return 1000;
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->st[i].key, b->st[i].key) || a->st[i].value != b->st[i].value) {
      d++;
      check_info("statistic %s changed: %" PRId64 " -> %" PRId64, a->st[i].key, a->st[i].value,
                 b->st[i].value);
    }
  return d;
}

/* Frees ptr expecting INVALID_POINTER and no change to any statistic. */
static void expect_invalid_free(void *ptr, size_t size, const char *what) {
  snapshot before, after;
  snap(&before);
  symmem_clear_last_error();
  symmem_free(ptr, size, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "free(%s)", what);
  snap(&after);
  CHECK_EQ(snap_diff(&before, &after), 0, "free(%s) changed no statistic", what);
}

/* ------------------------------------------------------------------------ */

static void test_free_null(void) {
  symmem_clear_last_error();
  (void)symmem_alloc(1, -1, NULL); /* a known last error */
  char *msg = strdup(symmem_last_error_message());
  symmem_free(NULL, 0, 0, NULL);
  symmem_free(NULL, 123, 0, NULL);
  CHECK(symmem_last_error() == SYMMEM_ERROR_INVALID_DEVICE &&
            !strcmp(symmem_last_error_message(), msg),
        "free(NULL) is a no-op: the last error stays what it was");
  free(msg);
  symmem_clear_last_error();
  symmem_free(NULL, 0, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free(NULL) after clear sets no error");
}

static void test_foreign_pointers(void) {
  void *m = malloc(4096);
  expect_invalid_free(m, 4096, "a malloc'd pointer");
  free(m);
  int on_stack[64];
  expect_invalid_free(on_stack, sizeof on_stack, "a stack address");
  expect_invalid_free((void *)(uintptr_t)0x1000, 512, "address 0x1000");
  expect_invalid_free((void *)(uintptr_t)UINTPTR_MAX, 512, "address UINTPTR_MAX");
  expect_invalid_free((void *)&test_foreign_pointers, 64, "a code address");

  /* Interior pointer: refused, block stays live and intact. */
  const size_t sz = 8192;
  unsigned char *p = symmem_alloc(sz, 0, NULL);
  if (!CHECK(p != NULL, "alloc a block for the interior-pointer test")) return;
  if (host_memory) memset(p, 0x77, sz);
  expect_invalid_free(p + 512, sz, "an interior pointer (block + 512)");
  expect_invalid_free(p + 1, sz, "an interior pointer (block + 1)");
  expect_invalid_free(p + sz - 1, sz, "the last byte of a block");
  symmem_pointer_info in;
  CHECK_RESULT(symmem_pointer_get_info(p, &in), SYMMEM_SUCCESS,
               "the block is still live after interior frees");
  if (host_memory) {
    int intact = 1;
    for (size_t i = 0; i < sz; i++)
      if (p[i] != 0x77) intact = 0;
    CHECK(intact, "the block's contents are intact after interior frees");
  }
  symmem_clear_last_error();
  symmem_free(p, sz, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free of the block itself works");

  /* Double free. */
  expect_invalid_free(p, sz, "a block already freed (double free)");
  CHECK_RESULT(symmem_pointer_get_info(p, &in), SYMMEM_ERROR_INVALID_POINTER,
               "pointer_get_info of a freed block");

  /* A freed block, re-used by a new allocation, then the stale pointer to an
   * older neighbour freed again. */
  void *a = symmem_alloc(4096, 0, NULL), *b = symmem_alloc(4096, 0, NULL);
  symmem_free(a, 4096, 0, NULL);
  expect_invalid_free(a, 4096, "a freed block whose neighbour is live");
  symmem_free(b, 4096, 0, NULL);

  /* Size mismatch: INVALID_ARGUMENT, but the block is freed. */
  int64_t live = check_stat(0, "allocation.all.current");
  void *c = symmem_alloc(10000, 0, NULL);
  symmem_clear_last_error();
  symmem_free(c, 12345, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "free with the wrong size");
  CHECK_EQ(check_stat(0, "allocation.all.current"), live,
           "free with the wrong size still frees the block");
  expect_invalid_free(c, 10000, "the block freed with the wrong size, again");

  /* record_stream of a foreign pointer: an error, no crash. */
  symmem_clear_last_error();
  symmem_record_stream(on_stack, NULL);
  CHECK(symmem_last_error() != SYMMEM_SUCCESS && symmem_last_error_message()[0],
        "record_stream(stack address) sets an error (%s)", symmem_strerror(symmem_last_error()));
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after the invalid frees");
}

static int cmp_ptr(const void *a, const void *b) {
  uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return x < y ? -1 : x > y;
}

static void test_size_zero(void) {
  enum { N = 1000 };
  void **p = calloc(N, sizeof *p);
  uintptr_t *sorted = calloc(N, sizeof *sorted);
  int64_t live0 = check_stat(0, "allocation.all.current");
  int nulls = 0, misaligned = 0, small = 0, badreq = 0;
  for (int i = 0; i < N; i++) {
    p[i] = symmem_alloc(0, 0, NULL);
    if (!p[i]) {
      nulls++;
      continue;
    }
    if ((uintptr_t)p[i] & 511) misaligned++;
    symmem_pointer_info in;
    if (symmem_pointer_get_info(p[i], &in) != SYMMEM_SUCCESS || in.block_size < 512) small++;
    else if (in.requested_size != 0) badreq++;
    sorted[i] = (uintptr_t)p[i];
  }
  CHECK_EQ(nulls, 0, "size 0: %d allocations, none NULL", N);
  CHECK_EQ(misaligned, 0, "size 0: every pointer aligned to 512");
  CHECK_EQ(small, 0, "size 0: every pointer is a live block of >= 512 bytes");
  CHECK_EQ(badreq, 0, "size 0: requested_size is 0");
  CHECK_EQ(check_stat(0, "allocation.all.current") - live0, N, "size 0: %d blocks counted live", N);
  qsort(sorted, N, sizeof *sorted, cmp_ptr);
  int close = 0;
  for (int i = 1; i < N; i++)
    if (sorted[i] - sorted[i - 1] < 512) close++;
  CHECK_EQ(close, 0, "size 0: the %d pointers are distinct, at least 512 bytes apart", N);

  /* Free in random order (Fisher-Yates, fixed seed). */
  uint64_t rs = 12345;
  for (int i = N - 1; i > 0; i--) {
    int j = (int)(check_rand(&rs) % (uint64_t)(i + 1));
    void *t = p[i];
    p[i] = p[j];
    p[j] = t;
  }
  symmem_clear_last_error();
  for (int i = 0; i < N; i++) symmem_free(p[i], 0, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "size 0: freeing all %d in random order: no error", N);
  CHECK_EQ(check_stat(0, "allocation.all.current"), live0, "size 0: all freed");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after the size-0 blocks");
  free(p);
  free(sorted);
}

static void test_huge(void) {
  const size_t sizes[] = {SIZE_MAX,       SIZE_MAX - 1,          SIZE_MAX - 511,
                          SIZE_MAX - 4095, SIZE_MAX / 2,          SIZE_MAX / 2 + 1,
                          (size_t)1 << 62, ((size_t)1 << 48) + 1};
  const char *names[] = {"SIZE_MAX",     "SIZE_MAX-1",  "SIZE_MAX-511", "SIZE_MAX-4095",
                         "SIZE_MAX/2",   "SIZE_MAX/2+1", "2^62",        "2^48+1"};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    snapshot before, after;
    snap(&before);
    int64_t ooms = check_stat(0, "num_ooms");
    symmem_clear_last_error();
    void *p = symmem_alloc(sizes[i], 0, NULL);
    CHECK(p == NULL, "alloc(%s) returns NULL", names[i]);
    CHECK_LAST_ERROR(SYMMEM_ERROR_OUT_OF_MEMORY, "alloc(%s)", names[i]);
    CHECK_EQ(check_stat(0, "num_ooms") - ooms, 1, "alloc(%s) counted in num_ooms", names[i]);
    snap(&after);
    /* Releasing idle cache first is allowed; the blocks handed out and the
     * bytes in use must not change. */
    static const char *const fixed[] = {"allocation.", "allocated_bytes.", "active.",
                                        "active_bytes.", "requested_bytes."};
    int other = 0;
    for (size_t k = 0; k < before.n && k < after.n; k++)
      for (size_t f = 0; f < sizeof fixed / sizeof *fixed; f++)
        if (!strncmp(before.st[k].key, fixed[f], strlen(fixed[f])) &&
            before.st[k].value != after.st[k].value) {
          other++;
          check_info("%s changed: %" PRId64 " -> %" PRId64, before.st[k].key,
                     before.st[k].value, after.st[k].value);
        }
    CHECK_EQ(other, 0, "alloc(%s) changed no allocation statistic", names[i]);
    if (p) symmem_free(p, sizes[i], 0, NULL);
  }
  void *ok = symmem_alloc(1 * MiB, 0, NULL);
  CHECK(ok != NULL, "a normal allocation after the huge ones succeeds");
  symmem_free(ok, 1 * MiB, 0, NULL);
}

static void test_memory_limit(void) {
  size_t lim = 12345;
  CHECK_RESULT(symmem_get_memory_limit(0, &lim), SYMMEM_SUCCESS, "get_memory_limit(0)");
  CHECK_EQ(lim, 0, "the default memory limit is 0 (none)");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache before the limit test");

  const size_t L = 64 * MiB;
  CHECK_RESULT(symmem_set_memory_limit(0, L), SYMMEM_SUCCESS, "set_memory_limit(0, 64 MiB)");
  CHECK_RESULT(symmem_get_memory_limit(0, &lim), SYMMEM_SUCCESS, "get_memory_limit after set");
  CHECK_EQ(lim, L, "get_memory_limit returns what was set");
  CHECK_EQ(check_stat(0, "memory_limit"), (int64_t)L, "the memory_limit statistic shows it");

  int64_t ooms = check_stat(0, "num_ooms");
  symmem_clear_last_error();
  void *big = symmem_alloc(100 * MiB, 0, NULL);
  CHECK(big == NULL, "alloc 100 MiB beyond a 64 MiB limit returns NULL");
  CHECK_LAST_ERROR(SYMMEM_ERROR_OUT_OF_MEMORY, "alloc 100 MiB beyond the limit");
  CHECK_EQ(check_stat(0, "num_ooms") - ooms, 1, "num_ooms counts it");
  void *fits = symmem_alloc(8 * MiB, 0, NULL);
  CHECK(fits != NULL, "the next allocation within the limit (8 MiB) succeeds");
  symmem_free(fits, 8 * MiB, 0, NULL);
  if (big) symmem_free(big, 100 * MiB, 0, NULL);

  /* Idle cache is released to make room: 40 MiB cached + 50 MiB > 64 MiB. */
  void *a = symmem_alloc(40 * MiB, 0, NULL);
  CHECK(a != NULL, "alloc 40 MiB under the limit");
  symmem_free(a, 40 * MiB, 0, NULL);
  void *b = symmem_alloc(50 * MiB, 0, NULL);
  CHECK(b != NULL, "alloc 50 MiB with 40 MiB cached: idle cache is released first");
  CHECK(check_stat(0, "reserved_bytes.all.current") <= (int64_t)L,
        "reserved bytes (%" PRId64 ") never exceed the limit", check_stat(0, "reserved_bytes.all.current"));
  if (b) symmem_free(b, 50 * MiB, 0, NULL);

  /* Fill up to the limit with 4 MiB blocks, then one more fails. */
  void *blocks[64];
  int n = 0;
  for (; n < 64; n++) {
    blocks[n] = symmem_alloc(4 * MiB, 0, NULL);
    if (!blocks[n]) break;
  }
  CHECK(n > 0 && n < 64, "filling the limit with 4 MiB blocks stops (%d blocks)", n);
  CHECK_LAST_ERROR(SYMMEM_ERROR_OUT_OF_MEMORY, "the allocation past the limit");
  CHECK(check_stat(0, "reserved_bytes.all.current") <= (int64_t)L,
        "reserved bytes (%" PRId64 ") within the limit when full", check_stat(0, "reserved_bytes.all.current"));
  if (n > 0) {
    symmem_free(blocks[n - 1], 4 * MiB, 0, NULL);
    blocks[n - 1] = symmem_alloc(4 * MiB, 0, NULL);
    CHECK(blocks[n - 1] != NULL, "after one free, the same allocation succeeds again");
  }
  for (int i = 0; i < n; i++)
    if (blocks[i]) symmem_free(blocks[i], 4 * MiB, 0, NULL);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after the limit test");

  /* A limit below what is in use: allowed, frees nothing. Start from an
   * empty cache so that c's segment is the only one. */
  symmem_empty_cache(0);
  void *c = symmem_alloc(16 * MiB, 0, NULL);
  CHECK_RESULT(symmem_set_memory_limit(0, 1 * MiB), SYMMEM_SUCCESS,
               "set a limit below the memory in use");
  symmem_pointer_info in;
  CHECK_RESULT(symmem_pointer_get_info(c, &in), SYMMEM_SUCCESS, "the live block stays live");
  symmem_clear_last_error();
  void *d = symmem_alloc(64 * MiB, 0, NULL); /* needs a new segment */
  CHECK(d == NULL, "above the limit: an allocation that needs a new segment fails");
  CHECK_LAST_ERROR(SYMMEM_ERROR_OUT_OF_MEMORY, "allocation over a lowered limit");
  symmem_free(c, 16 * MiB, 0, NULL);
  if (d) symmem_free(d, 64 * MiB, 0, NULL);

  CHECK_RESULT(symmem_set_memory_limit(0, 0), SYMMEM_SUCCESS, "set_memory_limit(0, 0) removes it");
  void *e = symmem_alloc(100 * MiB, 0, NULL);
  CHECK(e != NULL, "100 MiB succeeds without a limit");
  symmem_free(e, 100 * MiB, 0, NULL);
  symmem_empty_cache(0);
}

static void test_bad_device(void) {
  int nd = symmem_device_count();
  int bad[] = {-1, -2, nd, nd + 1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int d = bad[i];
    symmem_clear_last_error();
    void *p = symmem_alloc(1024, d, NULL);
    CHECK(p == NULL, "alloc on device %d returns NULL", d);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_DEVICE, "alloc on device %d", d);
    if (d != -1) CHECK_RESULT(symmem_empty_cache(d), SYMMEM_ERROR_INVALID_DEVICE, "empty_cache(%d)", d);
    symmem_stat st[4];
    symmem_clear_last_error();
    CHECK_EQ(symmem_stats(d, st, 4), 0, "stats(device %d) returns 0", d);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_DEVICE, "stats(device %d)", d);
    symmem_clear_last_error();
    CHECK_EQ(symmem_stats(d, NULL, 0), 0, "stats(device %d, NULL, 0) returns 0", d);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_DEVICE, "stats(device %d, NULL, 0)", d);
    CHECK_RESULT(symmem_set_memory_limit(d, 1 * MiB), SYMMEM_ERROR_INVALID_DEVICE,
                 "set_memory_limit(%d)", d);
    size_t lim;
    CHECK_RESULT(symmem_get_memory_limit(d, &lim), SYMMEM_ERROR_INVALID_DEVICE,
                 "get_memory_limit(%d)", d);
    CHECK_RESULT(symmem_reset_peak_stats(d), SYMMEM_ERROR_INVALID_DEVICE, "reset_peak_stats(%d)", d);
    CHECK_RESULT(symmem_validate(d), SYMMEM_ERROR_INVALID_DEVICE, "validate(%d)", d);
    symmem_clear_last_error();
    symmem_memory_fraction(0.5, d);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_DEVICE, "memory_fraction(0.5, device %d)", d);
  }
  size_t lim = 1;
  symmem_get_memory_limit(0, &lim);
  CHECK_EQ(lim, 0, "bad-device calls left device 0's limit alone");
}

static void test_null_out(void) {
  CHECK_RESULT(symmem_get_memory_limit(0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "get_memory_limit(0, NULL)");
  void *p = symmem_alloc(512, 0, NULL);
  CHECK_RESULT(symmem_pointer_get_info(p, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "pointer_get_info(live block, NULL)");
  symmem_free(p, 512, 0, NULL);
  symmem_pointer_info in;
  CHECK_RESULT(symmem_pointer_get_info(NULL, &in), SYMMEM_ERROR_INVALID_POINTER,
               "pointer_get_info(NULL, &info)");
  int x;
  CHECK_RESULT(symmem_pointer_get_info(&x, &in), SYMMEM_ERROR_INVALID_POINTER,
               "pointer_get_info(stack address)");
  /* stats with NULL and a capacity: must not write through NULL; either the
   * count or 0 with INVALID_ARGUMENT. */
  symmem_clear_last_error();
  size_t n = symmem_stats(0, NULL, 10);
  CHECK(n == symmem_stats(0, NULL, 0) || (n == 0 && symmem_last_error() == SYMMEM_ERROR_INVALID_ARGUMENT),
        "stats(0, NULL, 10) does not crash and returns the count or INVALID_ARGUMENT (%zu)", n);
  symmem_clear_last_error();
  CHECK_EQ(symmem_copy_last_error(NULL, 0), 0, "copy_last_error(NULL, 0) is allowed");
}

static void test_copy_args(void) {
  char host[64];
  void *p = symmem_alloc(4096, 0, NULL);
  CHECK_RESULT(symmem_copy(NULL, host, 10, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "copy(dst NULL, n 10)");
  CHECK_RESULT(symmem_copy(p, NULL, 10, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "copy(src NULL, n 10)");
  CHECK_RESULT(symmem_memset(NULL, 0, 10, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "memset(dst NULL, n 10)");
  CHECK_RESULT(symmem_copy(p, host, 10, -1, NULL), SYMMEM_ERROR_INVALID_DEVICE, "copy on device -1");
  CHECK_RESULT(symmem_copy(p, host, 10, symmem_device_count(), NULL), SYMMEM_ERROR_INVALID_DEVICE,
               "copy on device == device_count");
  CHECK_RESULT(symmem_memset(p, 0, 10, -1, NULL), SYMMEM_ERROR_INVALID_DEVICE, "memset on device -1");
  symmem_free(p, 4096, 0, NULL);
}

static void test_memory_fraction(void) {
  size_t lim0 = 1;
  symmem_get_memory_limit(0, &lim0);
  /* 1e-12 and DBL_MIN are in (0, 1] but round to 0 bytes, which would mean
   * "no limit": refused too. */
  const double bad[] = {0.0, -1.0, 2.0, NAN, INFINITY, -INFINITY, 1.0000001, -0.0, -DBL_MIN, 1e-12, DBL_MIN};
  const char *names[] = {"0", "-1", "2", "NaN", "+inf", "-inf", "1.0000001", "-0", "-DBL_MIN", "1e-12", "DBL_MIN"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    symmem_clear_last_error();
    symmem_memory_fraction(bad[i], 0);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "memory_fraction(%s, 0)", names[i]);
    size_t lim = 7;
    symmem_get_memory_limit(0, &lim);
    CHECK_EQ(lim, lim0, "memory_fraction(%s) left the limit unchanged", names[i]);
  }
  symmem_clear_last_error();
  symmem_memory_fraction(0.5, 0);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "memory_fraction(0.5, 0) is accepted");
  size_t half = 0, full = 0;
  symmem_get_memory_limit(0, &half);
  CHECK(half > 0, "memory_fraction(0.5) sets a limit (%zu bytes)", half);
  symmem_memory_fraction(1.0, 0);
  symmem_get_memory_limit(0, &full);
  /* Limits may be rounded to the device's granularity: allow 1% or 4 MiB. */
  size_t slack = full / 100 > 4 * MiB ? full / 100 : 4 * MiB;
  CHECK(full >= half && full / 2 <= half + slack && full / 2 + slack >= half,
        "memory_fraction(1.0) sets about twice the 0.5 limit (%zu vs %zu)", full, half);
  CHECK_RESULT(symmem_set_memory_limit(0, 0), SYMMEM_SUCCESS, "limit removed again");
}

/* ------------------------------------------------------------------------ */
/* Strict mode, in a child process. */

static int strict_child(const char *what) {
  void *p = symmem_alloc(4096, 0, NULL);
  if (!p) return 3;
  if (!strcmp(what, "double-free")) {
    symmem_free(p, 4096, 0, NULL);
    symmem_free(p, 4096, 0, NULL); /* must abort here */
  } else {
    int x;
    symmem_free(&x, 4096, 0, NULL); /* must abort here */
  }
  printf("strict child: symmem_free returned (last error %d)\n", (int)symmem_last_error());
  return 0;
}

static void test_strict_mode(const char *self) {
  const char *cases[] = {"double-free", "foreign"};
  /* Build the environment: ours plus SYMMEM_STRICT=1. */
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 2, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_STRICT=", 14)) env[k++] = environ[i];
  env[k++] = "SYMMEM_STRICT=1";
  env[k] = NULL;
  for (size_t c = 0; c < 2; c++) {
    int err = check_tmpfd("strict-stderr");
    int out = check_tmpfd("strict-stdout");
    char *argv[] = {(char *)self, "--strict-child", (char *)cases[c], NULL};
    pid_t pid = check_spawn_self(argv, env, out, err);
    if (!CHECK(pid > 0, "spawn the strict-mode child (%s)", cases[c])) continue;
    int st = check_wait_pid(pid, 60);
    char sbuf[128];
    char *e = check_read_fd(err);
    char *o = check_read_fd(out);
    CHECK(st != -1 && WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
          "SYMMEM_STRICT=1, %s: the child aborts with SIGABRT (%s)", cases[c],
          check_status_str(st, sbuf, sizeof sbuf));
    /* The message names the call; any of these words will do. */
    int named = e && (strstr(e, "free") || strstr(e, "pointer"));
    CHECK(named, "SYMMEM_STRICT=1, %s: the message is printed on stderr", cases[c]);
    const char *first = e ? e : "";
    const char *nl = strchr(first, '\n');
    check_info("child stderr (first line): %.*s", (int)(nl ? nl - first : (long)strlen(first)), first);
    if (o && *o) check_info("child stdout: %s", o);
    free(e);
    free(o);
    close(err);
    close(out);
  }
  free(env);
}

/* ------------------------------------------------------------------------ */
/* No backend: SYMMEM_BACKEND names one that cannot open, in a child. */

static int no_backend_child(const char *want) {
  static char prefix[64];
  snprintf(prefix, sizeof prefix, "[SYMMEM_BACKEND=%s] ", want);
  check_prefix_ = prefix;
  const char *name = symmem_backend_name();
  const char *notes = symmem_backend_notes();
  if (!strcmp(want, "cuda") && name && !strcmp(name, "cuda")) {
    check_info("a cuda device is present: nothing to check");
    return check_summary();
  }
  CHECK(name && !strcmp(name, "none"), "backend_name() is \"none\" (\"%s\")", name ? name : "(null)");
  if (!strcmp(want, "cuda"))
    CHECK(notes && strstr(notes, "cuda backend unavailable: ") && strstr(notes, "SYMMEM_LIBCUDA"),
          "backend_notes() says why the cuda backend is unavailable and which setting names its driver");
  else
    check_info("backend_notes() = \"%s\"", notes ? notes : "(null)");
  symmem_clear_last_error();
  void *p = symmem_alloc(4096, 0, NULL);
  CHECK(p == NULL, "alloc returns NULL without a backend");
  CHECK_LAST_ERROR(SYMMEM_ERROR_UNAVAILABLE, "alloc without a backend");
  symmem_clear_last_error();
  p = symmem_alloc(0, 0, NULL);
  CHECK(p == NULL, "alloc(0) returns NULL without a backend");
  CHECK_LAST_ERROR(SYMMEM_ERROR_UNAVAILABLE, "alloc(0) without a backend");
  symmem_clear_last_error();
  int x;
  symmem_free(&x, 4, 0, NULL);
  CHECK(symmem_last_error() != SYMMEM_SUCCESS, "free of a foreign pointer without a backend sets an error (%s)",
        symmem_strerror(symmem_last_error()));
  check_info("device_count() = %d", symmem_device_count());
  return check_summary();
}

static void test_no_backend(const char *self) {
  const char *wants[] = {"no-such-backend", "cuda"};
  for (size_t w = 0; w < 2; w++) {
    size_t ne = 0;
    while (environ[ne]) ne++;
    char **env = calloc(ne + 2, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < ne; i++)
      if (strncmp(environ[i], "SYMMEM_BACKEND=", 15) && strncmp(environ[i], "SYMMEM_LIBCUDA=", 15))
        env[k++] = environ[i];
    char var[64];
    snprintf(var, sizeof var, "SYMMEM_BACKEND=%s", wants[w]);
    env[k++] = var;
    env[k] = NULL;
    int out = check_tmpfd("nobackend-out");
    char *argv[] = {(char *)self, "--no-backend-child", (char *)wants[w], NULL};
    pid_t pid = check_spawn_self(argv, env, out, out);
    free(env);
    if (!CHECK(pid > 0, "spawn a child with SYMMEM_BACKEND=%s", wants[w])) continue;
    int st = check_wait_pid(pid, 60);
    char prefix[64], sb[128];
    snprintf(prefix, sizeof prefix, "[SYMMEM_BACKEND=%s] ", wants[w]);
    char *o = check_read_fd(out);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0 && fails == 0,
          "SYMMEM_BACKEND=%s: the child passed all its checks (%s, %d failed)", wants[w],
          check_status_str(st, sb, sizeof sb), fails);
  }
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc == 3 && !strcmp(argv[1], "--strict-child")) return strict_child(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "--no-backend-child")) return no_backend_child(argv[2]);
  const char *name = symmem_backend_name();
  host_memory = !strcmp(name, "host");
  check_info("backend %s", name);
  test_free_null();
  test_foreign_pointers();
  test_size_zero();
  test_huge();
  test_bad_device();
  test_null_out();
  test_copy_args();
  test_memory_fraction();
  test_memory_limit();
  test_strict_mode(argv[0]);
  test_no_backend(argv[0]);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate at the end");
  return check_summary();
}
