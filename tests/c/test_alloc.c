/*
 * test_alloc.c - the caching allocator through the C ABI, good input only:
 * round trips, alignment, contents, pointer info, statistics, empty_cache,
 * the validator, versions and error strings.
 *
 * Contents are written and read with plain CPU loads and stores on the host
 * backend, and through symmem_copy / symmem_memset on cuda (device memory);
 * SYMMEM_TEST_VIA_COPY=1 takes the copy path on host too. The stream test
 * uses made-up stream handles and runs on the host backend only.
 */
#include "check.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static int host_memory; /* 1 when the CPU may touch what symmem_alloc returns */
/* Contents are written and read with check_mem_write/read (check.h): plain
 * loads and stores on host, symmem_copy on cuda. */

/* ------------------------------------------------------------------------ */

static void test_version_and_backend(void) {
  CHECK_EQ(symmem_version(), SYMMEM_VERSION,
           "symmem_version() equals the header's SYMMEM_VERSION");
  CHECK_EQ(SYMMEM_VERSION,
           SYMMEM_VERSION_MAJOR * 10000 + SYMMEM_VERSION_MINOR * 100 + SYMMEM_VERSION_PATCH,
           "SYMMEM_VERSION is MAJOR*10000 + MINOR*100 + PATCH");
  const char *name = symmem_backend_name();
  CHECK(name && (!strcmp(name, "host") || !strcmp(name, "cuda")),
        "symmem_backend_name() is \"host\" or \"cuda\" (it is \"%s\")", name ? name : "(null)");
  const char *notes = symmem_backend_notes();
  CHECK(notes != NULL, "symmem_backend_notes() is not NULL");
  check_info("backend %s; notes: %s", name ? name : "(null)",
             notes && *notes ? notes : "(none)");
  CHECK(symmem_device_count() >= 1, "symmem_device_count() >= 1 (it is %d)",
        symmem_device_count());
  if (name && !strcmp(name, "host"))
    CHECK_EQ(symmem_device_count(), 1, "the host backend has exactly one device");
  host_memory = name && !strcmp(name, "host");
  if (!host_memory)
    check_info("backend is \"%s\": contents are checked through symmem_copy, not CPU loads/stores",
               name ? name : "(null)");
}

static void test_strerror(void) {
  enum { NCODES = SYMMEM_ERROR_INTERRUPTED + 1 };
  const char *seen[NCODES];
  int all_ok = 1, distinct = 1;
  for (int c = 0; c < NCODES; c++) {
    const char *s = symmem_strerror((symmem_result)c);
    seen[c] = s;
    if (!s || !*s) {
      all_ok = 0;
      continue;
    }
    if (strstr(s, "unknown")) all_ok = 0;
    for (int d = 0; d < c; d++)
      if (seen[d] && !strcmp(seen[d], s)) distinct = 0;
    check_info("strerror(%d) = \"%s\"", c, s);
  }
  CHECK(all_ok, "symmem_strerror(0..%d): every known code has a non-empty, known description", NCODES - 1);
  CHECK(distinct, "symmem_strerror(0..%d): the descriptions are distinct", NCODES - 1);
  CHECK(symmem_strerror(SYMMEM_SUCCESS) == symmem_strerror(SYMMEM_SUCCESS),
        "symmem_strerror returns a static string (same pointer twice)");
  /* Unknown codes share one static string: nothing is made per code, so a
   * caller looping over codes cannot grow the process. */
  int unknown[] = {NCODES, -1, 1000, 2147483647};
  const char *first_unknown = symmem_strerror((symmem_result)unknown[0]);
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *s = symmem_strerror((symmem_result)unknown[i]);
    CHECK(s && strstr(s, "unknown") && s == first_unknown,
          "symmem_strerror(%d) says unknown, with the one static string for every unknown code (\"%s\")",
          unknown[i], s ? s : "(null)");
  }
  int same = 1;
  for (int c = 100; c < 200100; c++)
    same &= symmem_strerror((symmem_result)c) == first_unknown;
  CHECK(same, "symmem_strerror of 200000 unknown codes returns one pointer");
}

struct thread_seen {
  symmem_result code;
  int empty;
};

static void *thread_last_error(void *arg) {
  struct thread_seen *seen = arg;
  seen->code = symmem_last_error();
  seen->empty = symmem_last_error_message()[0] == '\0';
  /* Fail here too: it must not leak into the main thread. */
  (void)symmem_alloc(1, -7, NULL);
  return NULL;
}

static void test_last_error(void) {
  char buf[256];
  symmem_clear_last_error();
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "after clear: last error is SUCCESS");
  CHECK(symmem_last_error_message() && symmem_last_error_message()[0] == '\0',
        "after clear: last error message is \"\"");
  memset(buf, 'X', sizeof buf);
  CHECK_EQ(symmem_copy_last_error(buf, sizeof buf), 0, "after clear: copy returns 0");
  CHECK(buf[0] == '\0', "after clear: copy writes \"\"");
  CHECK_EQ(symmem_copy_last_error(NULL, 0), 0, "copy(NULL, 0) returns the length (0)");

  /* Make a failure: an invalid device. */
  void *p = symmem_alloc(64, -1, NULL);
  CHECK(p == NULL, "alloc on device -1 fails (to produce an error)");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_DEVICE, "alloc on device -1");
  const char *msg = symmem_last_error_message();
  size_t len = strlen(msg);
  char *copy = strdup(msg);
  CHECK(len >= 8, "the message has some words (%zu bytes)", len);

  CHECK_EQ(symmem_copy_last_error(NULL, 0), len, "copy(NULL, 0) returns the length");
  memset(buf, 'X', sizeof buf);
  CHECK_EQ(symmem_copy_last_error(buf, 0), len, "copy(buf, 0) returns the length");
  CHECK(buf[0] == 'X', "copy(buf, 0) writes nothing");

  if (len + 1 <= sizeof buf) {
    memset(buf, 'X', sizeof buf);
    CHECK_EQ(symmem_copy_last_error(buf, len + 1), len, "copy with room returns the length");
    CHECK(strcmp(buf, copy) == 0, "copy with room copies the whole message");
    memset(buf, 'X', sizeof buf);
    CHECK_EQ(symmem_copy_last_error(buf, len), len,
             "copy one byte short returns the length (>= len: truncated)");
    CHECK(strlen(buf) == len - 1 && strncmp(buf, copy, len - 1) == 0,
          "copy one byte short keeps len-1 bytes and the NUL");
    CHECK(buf[len] == 'X', "copy one byte short writes nothing past its capacity");
  } else {
    check_skip("message longer than the test's buffer (%zu bytes)", len);
  }
  memset(buf, 'X', sizeof buf);
  CHECK_EQ(symmem_copy_last_error(buf, 5), len, "copy into 5 bytes returns the full length");
  CHECK(strncmp(buf, copy, 4) == 0 && buf[4] == '\0' && buf[5] == 'X',
        "copy into 5 bytes: 4 bytes, NUL, nothing beyond");
  memset(buf, 'X', sizeof buf);
  CHECK_EQ(symmem_copy_last_error(buf, 1), len, "copy into 1 byte returns the full length");
  CHECK(buf[0] == '\0' && buf[1] == 'X', "copy into 1 byte writes just the NUL");

  /* Success does not clear the last error (as with errno). */
  void *q = symmem_alloc(64, 0, NULL);
  CHECK(q != NULL, "a successful alloc after the failure");
  CHECK_EQ(symmem_last_error(), SYMMEM_ERROR_INVALID_DEVICE,
           "success leaves the last error as it was");
  CHECK(strcmp(symmem_last_error_message(), copy) == 0,
        "success leaves the last error message as it was");
  symmem_free(q, 64, 0, NULL);

  /* The last error is per thread: a new thread starts clean. */
  pthread_t t;
  struct thread_seen seen = {(symmem_result)-1, 0};
  pthread_create(&t, NULL, thread_last_error, &seen);
  pthread_join(t, NULL);
  CHECK(seen.code == SYMMEM_SUCCESS && seen.empty,
        "a new thread's last error is SUCCESS and \"\" (per-thread state)");
  CHECK_EQ(symmem_last_error(), SYMMEM_ERROR_INVALID_DEVICE,
           "another thread's calls leave this thread's last error alone");

  symmem_clear_last_error();
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "clear resets the code");
  CHECK(symmem_last_error_message()[0] == '\0', "clear resets the message");
  free(copy);
}

/* ------------------------------------------------------------------------ */

static unsigned char pattern_byte(unsigned seed, size_t i) {
  return (unsigned char)(seed * 131u + i * 7u + (i >> 9));
}
/* Writes the pattern of seed into p[0..n); returns 0 on success. */
static int fill(void *p, size_t n, unsigned seed) {
  unsigned char *h = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) h[i] = pattern_byte(seed, i);
  int rc = check_mem_write(p, h, n, 0);
  free(h);
  return rc;
}
/* The first byte of p[0..n) that differs from the pattern, or (size_t)-1. */
static size_t first_mismatch(const void *p, size_t n, unsigned seed) {
  unsigned char *h = malloc(n ? n : 1);
  size_t bad = (size_t)-1;
  if (check_mem_read(h, p, n, 0) != 0) bad = 0;
  for (size_t i = 0; bad == (size_t)-1 && i < n; i++)
    if (h[i] != pattern_byte(seed, i)) bad = i;
  free(h);
  return bad;
}

static void test_roundtrip(void) {
  static const size_t sizes[] = {1,       100,     511,         512,        513,
                                 4096,    65536,   1 * MiB - 1, 1 * MiB,    1 * MiB + 1,
                                 3 * MiB, 10 * MiB + 7, 21 * MiB + 1};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *ptrs[N];
  symmem_pointer_info infos[N];
  uintptr_t heap_base = 0;
  int have_base = 0;
  symmem_clear_last_error();

  for (int i = 0; i < N; i++) {
    size_t sz = sizes[i];
    void *p = symmem_alloc(sz, 0, NULL);
    ptrs[i] = p;
    if (!CHECK(p != NULL, "alloc %zu bytes", sz)) continue;
    CHECK(((uintptr_t)p & 511) == 0, "alloc %zu bytes: aligned to 512 (%p)", sz, p);
    CHECK(fill(p, sz, (unsigned)i) == 0, "alloc %zu bytes: the whole block is writable", sz);
    symmem_pointer_info *in = &infos[i];
    memset(in, 0xA5, sizeof *in);
    CHECK_RESULT(symmem_pointer_get_info(p, in), SYMMEM_SUCCESS, "pointer_get_info(%zu-byte block)", sz);
    CHECK(in->block == p && in->offset == 0, "info of the start: block == ptr, offset 0");
    CHECK_EQ(in->requested_size, sz, "info: requested_size is the size asked for");
    CHECK(in->block_size >= sz && in->block_size % 512 == 0,
          "info: block_size %zu >= %zu and a multiple of 512", in->block_size, sz);
    CHECK_EQ(in->device, 0, "info: device 0");
    CHECK(in->heap_offset % 512 == 0, "info: heap_offset %" PRIu64 " is 512-aligned", in->heap_offset);
    uintptr_t base = (uintptr_t)p - (uintptr_t)in->heap_offset;
    if (!have_base) {
      heap_base = base;
      have_base = 1;
    } else {
      CHECK(base == heap_base,
            "info: block - heap_offset is the same heap base for every block (%#lx vs %#lx)",
            (unsigned long)base, (unsigned long)heap_base);
    }

    /* Interior pointers: the middle and the last requested byte. */
    size_t offs[] = {sz / 2, sz - 1};
    for (int k = 0; k < 2; k++) {
      symmem_pointer_info ii;
      memset(&ii, 0x5A, sizeof ii);
      const char *q = (const char *)p + offs[k];
      CHECK_RESULT(symmem_pointer_get_info(q, &ii), SYMMEM_SUCCESS,
                   "pointer_get_info(ptr + %zu) of a %zu-byte block", offs[k], sz);
      CHECK(ii.block == p && ii.offset == offs[k] && ii.heap_offset == in->heap_offset &&
                ii.block_size == in->block_size && ii.requested_size == sz,
            "interior info: same block, offset %zu (got block %p offset %zu heap_offset %" PRIu64 ")",
            offs[k], ii.block, ii.offset, ii.heap_offset);
    }
  }

  /* Live blocks never overlap, in addresses and in heap offsets. */
  int overlap = 0;
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++) {
      if (!ptrs[i] || !ptrs[j]) continue;
      uintptr_t a = (uintptr_t)ptrs[i], b = (uintptr_t)ptrs[j];
      if (a < b + infos[j].block_size && b < a + infos[i].block_size) overlap = 1;
      uint64_t ha = infos[i].heap_offset, hb = infos[j].heap_offset;
      if (ha < hb + infos[j].block_size && hb < ha + infos[i].block_size) overlap = 1;
    }
  CHECK(!overlap, "the %d live blocks do not overlap (addresses and heap offsets)", N);

  for (int i = 0; i < N; i++) {
    if (!ptrs[i]) continue;
    size_t bad = first_mismatch(ptrs[i], sizes[i], (unsigned)i);
    CHECK(bad == (size_t)-1, "block of %zu bytes kept its contents while others were written (first bad byte %zd)",
          sizes[i], bad == (size_t)-1 ? (ssize_t)-1 : (ssize_t)bad);
  }
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate with %d live blocks", N);

  for (int i = N - 1; i >= 0; i--) {
    if (!ptrs[i]) continue;
    symmem_clear_last_error();
    symmem_free(ptrs[i], sizes[i], 0, NULL);
    CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free %zu-byte block", sizes[i]);
    symmem_pointer_info gone;
    CHECK_RESULT(symmem_pointer_get_info(ptrs[i], &gone), SYMMEM_ERROR_INVALID_POINTER,
                 "pointer_get_info after free");
  }
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after freeing all");

  /* The cache hands memory back: same size again, contents writable. */
  void *again = symmem_alloc(3 * MiB, 0, NULL);
  CHECK(again != NULL, "alloc after free (from the cache)");
  if (again) {
    unsigned char last = 0;
    CHECK(check_mem_set(again, 0x3C, 3 * MiB, 0) == 0 &&
              check_mem_read(&last, (char *)again + 3 * MiB - 1, 1, 0) == 0 && last == 0x3C,
          "reused block is writable to its end");
  }
  symmem_free(again, 3 * MiB, 0, NULL);
}

/* ------------------------------------------------------------------------ */

static const char *stat_names[] = {"allocation",   "segment",        "active",
                                   "allocated_bytes", "reserved_bytes", "active_bytes",
                                   "requested_bytes", "inactive_split", "inactive_split_bytes",
                                   "paused_bytes", "thread_cache", "thread_cache_bytes"};
static const char *pool_names[] = {"all", "small_pool", "large_pool"};
static const char *kind_names[] = {"current", "peak", "allocated", "freed"};
static const char *extra_names[] = {"num_alloc_retries", "num_ooms",
                                    "num_device_alloc",  "num_device_free",
                                    "num_sync_all_streams", "memory_limit",
                                    "oversize_allocations.current", "oversize_allocations.peak",
                                    "oversize_allocations.allocated", "oversize_allocations.freed",
                                    "oversize_segments.current", "oversize_segments.peak",
                                    "oversize_segments.allocated", "oversize_segments.freed",
                                    "max_split_size"};

static int64_t S(const char *key) { return check_stat(0, key); }

static void test_stats_keys(void) {
  size_t n = symmem_stats(0, NULL, 0);
  CHECK(n > 0, "symmem_stats(0, NULL, 0) returns the count (%zu)", n);
  symmem_stat *st = calloc(n + 4, sizeof *st);
  symmem_stat *st2 = calloc(n + 4, sizeof *st2);
  for (size_t i = 0; i < n + 4; i++) st[i].key = "sentinel";
  CHECK_EQ(symmem_stats(0, st, n + 4), n, "stats with room returns the same count");
  CHECK(!strcmp(st[n].key, "sentinel"), "stats writes nothing past the count");
  int missing = 0;
  char key[128];
  for (size_t s = 0; s < sizeof stat_names / sizeof *stat_names; s++)
    for (size_t p = 0; p < 3; p++)
      for (size_t k = 0; k < 4; k++) {
        snprintf(key, sizeof key, "%s.%s.%s", stat_names[s], pool_names[p], kind_names[k]);
        int found = 0;
        for (size_t i = 0; i < n; i++)
          if (st[i].key && !strcmp(st[i].key, key)) found = 1;
        if (!found) {
          missing++;
          check_info("missing statistic %s", key);
        }
      }
  for (size_t e = 0; e < sizeof extra_names / sizeof *extra_names; e++) {
    int found = 0;
    for (size_t i = 0; i < n; i++)
      if (st[i].key && !strcmp(st[i].key, extra_names[e])) found = 1;
    if (!found) {
      missing++;
      check_info("missing statistic %s", extra_names[e]);
    }
  }
  CHECK_EQ(missing, 0, "every documented statistic key is present (%zu keys)", n);
  CHECK_EQ(n, sizeof stat_names / sizeof *stat_names * 3 * 4 + sizeof extra_names / sizeof *extra_names,
           "no key beyond the documented ones");
  CHECK_EQ(S("memory_limit"), 0, "memory_limit is 0 when there is none");
  int dup = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (st[i].key && st[j].key && !strcmp(st[i].key, st[j].key)) dup++;
  CHECK_EQ(dup, 0, "no statistic key appears twice");

  /* Same order every time; a small capacity fills only that many. */
  for (size_t i = 0; i < n + 4; i++) st2[i].key = "sentinel";
  CHECK_EQ(symmem_stats(0, st2, 3), n, "stats with capacity 3 still returns the full count");
  int same = 1;
  for (size_t i = 0; i < 3 && i < n; i++)
    if (!st2[i].key || strcmp(st2[i].key, st[i].key)) same = 0;
  CHECK(same && !strcmp(st2[3].key, "sentinel"),
        "capacity 3: the first 3 keys in the same order, nothing beyond");
  symmem_stats(0, st2, n);
  same = 1;
  for (size_t i = 0; i < n; i++)
    if (!st2[i].key || strcmp(st2[i].key, st[i].key)) same = 0;
  CHECK(same, "keys are in the same order on every call");
  free(st);
  free(st2);
}

/* all == small_pool + large_pool for every STAT.current */
static void check_pool_sums(const char *when) {
  int bad = 0;
  char k[128];
  for (size_t s = 0; s < sizeof stat_names / sizeof *stat_names; s++) {
    snprintf(k, sizeof k, "%s.all.current", stat_names[s]);
    int64_t all = S(k);
    snprintf(k, sizeof k, "%s.small_pool.current", stat_names[s]);
    int64_t sm = S(k);
    snprintf(k, sizeof k, "%s.large_pool.current", stat_names[s]);
    int64_t lg = S(k);
    if (all == INT64_MIN || sm == INT64_MIN || lg == INT64_MIN) continue; /* reported above */
    if (all != sm + lg) {
      bad++;
      check_info("%s: %s.all.current %" PRId64 " != small %" PRId64 " + large %" PRId64, when,
                 stat_names[s], all, sm, lg);
    }
  }
  CHECK_EQ(bad, 0, "%s: every STAT.all.current == small_pool + large_pool", when);
}

/* The header: "active" equals "allocated" (no block is inactive-but-pending). */
static void check_active_is_allocated(const char *when) {
  int bad = 0;
  char a[128], b[128];
  for (size_t p = 0; p < 3; p++)
    for (size_t k = 0; k < 4; k++) {
      snprintf(a, sizeof a, "active.%s.%s", pool_names[p], kind_names[k]);
      snprintf(b, sizeof b, "allocation.%s.%s", pool_names[p], kind_names[k]);
      if (S(a) != S(b)) bad++, check_info("%s: %s %" PRId64 " != %s %" PRId64, when, a, S(a), b, S(b));
      snprintf(a, sizeof a, "active_bytes.%s.%s", pool_names[p], kind_names[k]);
      snprintf(b, sizeof b, "allocated_bytes.%s.%s", pool_names[p], kind_names[k]);
      if (S(a) != S(b)) bad++, check_info("%s: %s %" PRId64 " != %s %" PRId64, when, a, S(a), b, S(b));
    }
  CHECK_EQ(bad, 0, "%s: active* equal allocation/allocated_bytes*", when);
}

static void check_peaks_equal_current(const char *when) {
  size_t n = symmem_stats(0, NULL, 0);
  symmem_stat *st = calloc(n, sizeof *st);
  symmem_stats(0, st, n);
  int bad = 0, peaks = 0;
  for (size_t i = 0; i < n; i++) {
    const char *key = st[i].key;
    size_t L = strlen(key);
    if (L > 5 && !strcmp(key + L - 5, ".peak")) {
      peaks++;
      char cur[128];
      snprintf(cur, sizeof cur, "%.*s.current", (int)(L - 5), key);
      int64_t c = S(cur);
      if (c != st[i].value) {
        bad++;
        check_info("%s: %s = %" PRId64 " but %s = %" PRId64, when, key, st[i].value, cur, c);
      }
    }
  }
  CHECK(peaks > 0 && bad == 0, "%s: all %d .peak values equal their .current", when, peaks);
  free(st);
}

static void test_stats_track(void) {
  check_pool_sums("at rest");
  int64_t a0 = S("allocated_bytes.all.current");
  int64_t n0 = S("allocation.all.current");
  int64_t nall0 = S("allocation.all.allocated");
  int64_t nfree0 = S("allocation.all.freed");
  int64_t r0 = S("requested_bytes.all.current");

  const size_t sz = 5 * MiB + 3;
  void *p = symmem_alloc(sz, 0, NULL);
  if (!CHECK(p != NULL, "alloc %zu for the statistics", sz)) return;
  symmem_pointer_info in;
  symmem_pointer_get_info(p, &in);
  int64_t a1 = S("allocated_bytes.all.current");
  CHECK_EQ(a1 - a0, (int64_t)in.block_size,
           "allocated_bytes.all.current rises by the block size");
  CHECK_EQ(S("requested_bytes.all.current") - r0, (int64_t)sz,
           "requested_bytes.all.current rises by the requested size");
  CHECK_EQ(S("allocation.all.current") - n0, 1, "allocation.all.current counts the block");
  CHECK_EQ(S("allocation.all.allocated") - nall0, 1, "allocation.all.allocated counts the alloc");
  CHECK(S("allocated_bytes.all.peak") >= a1, "allocated_bytes.all.peak >= current");
  CHECK(S("reserved_bytes.all.current") >= a1,
        "reserved_bytes.all.current (%" PRId64 ") >= allocated (%" PRId64 ")",
        S("reserved_bytes.all.current"), a1);
  CHECK(S("segment.all.current") >= 1, "segment.all.current >= 1 with a live block");
  CHECK(S("active.all.current") >= 1 && S("active_bytes.all.current") >= (int64_t)in.block_size,
        "active counts the live block");
  check_pool_sums("one live block");
  check_active_is_allocated("one live block");

  symmem_clear_last_error();
  symmem_free(p, sz, 0, NULL);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free of the statistics block");
  CHECK_EQ(S("allocated_bytes.all.current"), a0, "allocated_bytes.all.current back after free");
  CHECK_EQ(S("requested_bytes.all.current"), r0, "requested_bytes.all.current back after free");
  CHECK_EQ(S("allocation.all.current"), n0, "allocation.all.current back after free");
  CHECK_EQ(S("allocation.all.freed") - nfree0, 1, "allocation.all.freed counts the free");
  CHECK(S("allocated_bytes.all.peak") >= a1, "allocated_bytes.all.peak remembers the block");
  CHECK(S("reserved_bytes.all.current") >= S("allocated_bytes.all.current"),
        "reserved >= allocated after free (the segment stays cached)");

  CHECK_RESULT(symmem_reset_peak_stats(0), SYMMEM_SUCCESS, "reset_peak_stats(0)");
  CHECK_EQ(S("allocated_bytes.all.peak"), a0, "after reset: allocated_bytes.all.peak == current");
  check_peaks_equal_current("after reset_peak_stats");

  /* Peaks rise again with a new block and stay after its free. */
  void *q = symmem_alloc(sz, 0, NULL);
  symmem_free(q, sz, 0, NULL);
  CHECK(S("allocated_bytes.all.peak") >= a0 + (int64_t)in.block_size,
        "peak rises again after reset");
  check_active_is_allocated("after the statistics test");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after the statistics test");
}

/* ------------------------------------------------------------------------ */

static void test_empty_cache(void) {
  /* Start from an empty cache: whatever is cached is idle. */
  int64_t live0 = S("allocation.all.current");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache(0)");
  if (live0 == 0) {
    CHECK_EQ(S("reserved_bytes.all.current"), 0,
             "with nothing allocated, empty_cache leaves 0 reserved bytes");
    CHECK_EQ(S("segment.all.current"), 0, "with nothing allocated, no segment stays");
  } else {
    check_skip("%" PRId64 " blocks still live: reserved==0 check skipped", live0);
  }
  int64_t r_base = S("reserved_bytes.all.current");
  int64_t seg_base = S("segment.all.current");
  int64_t dev_free0 = S("num_device_free");

  /* X: a large block on an empty cache gets a segment of its own. */
  const size_t xs = 24 * MiB + 1;
  void *x = symmem_alloc(xs, 0, NULL);
  if (!CHECK(x != NULL, "alloc X (24 MiB + 1)")) return;
  int64_t r_x = S("reserved_bytes.all.current");
  int64_t seg_x = S("segment.all.current");
  CHECK(r_x - r_base >= (int64_t)xs, "reserved bytes grew by at least X's size");

  /* More blocks, then free them: they stay cached. */
  void *y = symmem_alloc(40 * MiB, 0, NULL);
  void *z = symmem_alloc(1000, 0, NULL);
  void *w = symmem_alloc(3 * MiB, 0, NULL);
  CHECK(y && z && w, "alloc Y (40 MiB), Z (1000 B), W (3 MiB)");
  if (y && z && w && x)
    CHECK(check_mem_set(x, 1, xs, 0) == 0 && check_mem_set(y, 2, 40 * MiB, 0) == 0 &&
              check_mem_set(z, 3, 1000, 0) == 0 && check_mem_set(w, 4, 3 * MiB, 0) == 0,
          "X, Y, Z, W written");
  symmem_free(y, 40 * MiB, 0, NULL);
  symmem_free(z, 1000, 0, NULL);
  symmem_free(w, 3 * MiB, 0, NULL);
  int64_t r_cached = S("reserved_bytes.all.current");
  CHECK(r_cached > r_x, "freed blocks stay cached: reserved %" PRId64 " > %" PRId64, r_cached, r_x);

  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache(0) with X live");
  CHECK_EQ(S("reserved_bytes.all.current"), r_x,
           "empty_cache lowers reserved_bytes to the segments still in use (X's)");
  CHECK_EQ(S("segment.all.current"), seg_x, "empty_cache keeps only X's segment(s)");
  CHECK(S("num_device_free") > dev_free0, "num_device_free counts released segments");
  CHECK(S("reserved_bytes.all.current") >= S("allocated_bytes.all.current"),
        "reserved >= allocated after empty_cache");
  {
    unsigned char *hx = malloc(xs);
    size_t bad = check_mem_read(hx, x, xs, 0) == 0 ? (size_t)-1 : 0;
    for (size_t i = 0; bad == (size_t)-1 && i < xs; i++)
      if (hx[i] != 1) bad = i;
    free(hx);
    CHECK(bad == (size_t)-1, "X's contents survive empty_cache");
  }
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after empty_cache");

  symmem_free(x, xs, 0, NULL);
  CHECK_RESULT(symmem_empty_cache(-1), SYMMEM_SUCCESS, "empty_cache(-1) (every device)");
  CHECK_EQ(S("reserved_bytes.all.current"), r_base, "after X's free + empty_cache: back to the start");
  CHECK_EQ(S("segment.all.current"), seg_base, "segments back to the start");

  /* symmem_reset is empty_cache for every device. */
  void *v = symmem_alloc(4 * MiB, 0, NULL);
  symmem_free(v, 4 * MiB, 0, NULL);
  symmem_reset();
  CHECK_EQ(S("reserved_bytes.all.current"), r_base, "symmem_reset releases the idle cache");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate at the end");
}

static void test_copy(void) {
  const size_t n = 1 * MiB;
  unsigned char *a = symmem_alloc(n, 0, NULL), *b = symmem_alloc(n, 0, NULL);
  unsigned char *h = malloc(n), *pat = malloc(5000);
  if (!CHECK(a && b, "two 1 MiB blocks for symmem_copy/memset")) return;
  CHECK_RESULT(symmem_memset(a, 0xAB, n, 0, NULL), SYMMEM_SUCCESS, "memset a block to 0xAB");
  memset(h, 0, n);
  CHECK_RESULT(symmem_copy(h, a, n, 0, NULL), SYMMEM_SUCCESS, "copy the block out to host memory");
  size_t bad = (size_t)-1;
  for (size_t i = 0; bad == (size_t)-1 && i < n; i++)
    if (h[i] != 0xAB) bad = i;
  CHECK(bad == (size_t)-1, "memset wrote every byte");
  if (host_memory) CHECK(a[0] == 0xAB && a[n - 1] == 0xAB, "memset is visible to CPU loads (host)");

  for (size_t i = 0; i < 5000; i++) pat[i] = (unsigned char)(i * 13 + 5);
  CHECK_RESULT(symmem_copy(a + 1001, pat, 5000, 0, NULL), SYMMEM_SUCCESS, "copy 5000 bytes in at offset 1001");
  CHECK_RESULT(symmem_copy(b, a, n, 0, NULL), SYMMEM_SUCCESS, "copy block to block (device to device)");
  CHECK_RESULT(symmem_copy(h, b, n, 0, NULL), SYMMEM_SUCCESS, "copy the second block out");
  int ok = memcmp(h + 1001, pat, 5000) == 0;
  for (size_t i = 0; ok && i < n; i++)
    if ((i < 1001 || i >= 6001) && h[i] != 0xAB) ok = 0;
  CHECK(ok, "the copies moved exactly the bytes asked for, at the right place");
  CHECK_RESULT(symmem_copy(NULL, NULL, 0, 0, NULL), SYMMEM_SUCCESS, "copy of 0 bytes with NULL is a no-op");
  CHECK_RESULT(symmem_memset(a, 0, 0, 0, NULL), SYMMEM_SUCCESS, "memset of 0 bytes is a no-op");
  CHECK_RESULT(symmem_copy(h, a, 1, 0, NULL), SYMMEM_SUCCESS, "copy 1 byte");
  CHECK(h[0] == 0xAB, "the 0-byte memset changed nothing");
  symmem_free(a, n, 0, NULL);
  symmem_free(b, n, 0, NULL);
  free(h);
  free(pat);
}

static void test_streams(void) {
  /* The host backend numbers streams; any pointer value is a stream. A block
   * freed on stream A is reused on A, and allocation on B works. */
  symmem_stream_t a = (symmem_stream_t)(uintptr_t)0x1000, b = (symmem_stream_t)(uintptr_t)0x2000;
  if (!host_memory) {
    check_skip("stream test uses made-up stream handles: host backend only");
    return;
  }
  void *p = symmem_alloc(8192, 0, a);
  CHECK(p != NULL, "alloc on stream A");
  symmem_clear_last_error();
  symmem_free(p, 8192, 0, a);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free on stream A");
  void *q = symmem_alloc(8192, 0, a);
  CHECK(q == p, "same size again on A reuses A's freed block (%p == %p)", q, p);
  void *r = symmem_alloc(8192, 0, b);
  CHECK(r != NULL && r != q, "alloc on stream B gets another block");
  symmem_record_stream(q, b);
  symmem_free(q, 8192, 0, a);
  symmem_free(r, 8192, 0, b);
  CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "record_stream and frees on two streams");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after streams");
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  symmem_init(1);
  test_version_and_backend();
  test_strerror();
  test_last_error();
  test_stats_keys();
  test_empty_cache();
  test_roundtrip();
  test_stats_track();
  test_copy();
  test_streams();
  test_empty_cache();
  return check_summary();
}
