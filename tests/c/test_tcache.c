/*
 * test_tcache.c - the thread caches of symmem_alloc/symmem_free (Note
 * [Thread caches in C], export/tcache.h): placement per thread with the
 * cache on and best-fit placement with SYMMEM_THREAD_CACHE=0 (children run with each
 * setting), exact statistics, threads freeing each other's blocks, threads
 * exiting with full bins, double frees in the caller's bin and another
 * thread's, foreign and interior pointers, empty_cache while other threads
 * cache, memory limits and the OOM retry, tagged regions, and fork after
 * caching. Run under AddressSanitizer by `make test-c`.
 */
#include "check.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

static int64_t S(const char *key) { return check_stat(0, key); }

/* The host backend's memory is the process's: contents are checked there
 * only (device memory is not readable from the CPU). */
static int host_memory;

static uint64_t heap_off(void *p) {
  symmem_pointer_info info;
  if (symmem_pointer_get_info(p, &info) != SYMMEM_SUCCESS) return UINT64_MAX;
  return info.heap_offset;
}

/* The environment with SYMMEM_THREAD_CACHE set to value. */
static char **env_with_cache(const char *value) {
  static char buf[2][64];
  static int which;
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 2, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_THREAD_CACHE=", 20)) env[k++] = environ[i];
  char *b = buf[which++ % 2];
  snprintf(b, sizeof buf[0], "SYMMEM_THREAD_CACHE=%s", value);
  env[k++] = b;
  env[k] = NULL;
  return env;
}

/* Runs this program as a child with argv[1] = mode and the cache setting;
 * returns its stdout (malloc'd) or NULL. */
static char *run_child(const char *self, const char *mode, const char *cache) {
  char **env = env_with_cache(cache);
  int out = check_tmpfd("tcache-out");
  char *argv[] = {(char *)self, (char *)mode, NULL};
  pid_t pid = check_spawn_self(argv, env, out, 2);
  free(env);
  if (pid <= 0) return NULL;
  int st = check_wait_pid(pid, 120);
  char *o = check_read_fd(out);
  close(out);
  if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    char sbuf[128];
    check_info("child %s (SYMMEM_THREAD_CACHE=%s): %s; output: %s", mode, cache, check_status_str(st, sbuf, sizeof sbuf), o ? o : "");
    free(o);
    return NULL;
  }
  return o;
}

/* Child: two 512-byte blocks A < B, both freed, then one allocation: says
 * which one it got. */
static int child_placement(void) {
  char *a = symmem_alloc(512, 0, NULL), *b = symmem_alloc(512, 0, NULL);
  symmem_free(a, 512, 0, NULL);
  symmem_free(b, 512, 0, NULL);
  char *c = symmem_alloc(512, 0, NULL);
  printf("%s cached=%lld\n", c == a ? "first" : c == b ? "second" : "other", (long long)S("thread_cache.all.current"));
  symmem_free(c, 512, 0, NULL);
  return 0;
}

/* Child: three threads, one after another, each a fixed random sequence of
 * allocations and frees; prints a hash of the heap offsets each received. */
typedef struct {
  unsigned seed;
  uint64_t hash;
} seq_job;

static void *seq_thread(void *arg) {
  seq_job *j = arg;
  static const size_t sizes[] = {0, 100, 512, 4096, 70000, 1 * MiB, 3 * MiB};
  void *held[64] = {0};
  size_t held_size[64];
  unsigned r = j->seed;
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < 3000; i++) {
    r = r * 1103515245u + 12345u;
    int slot = (int)((r >> 8) % 64);
    if (held[slot]) {
      symmem_free(held[slot], held_size[slot], 0, NULL);
      held[slot] = NULL;
    } else {
      size_t sz = sizes[(r >> 16) % 7];
      held[slot] = symmem_alloc(sz, 0, NULL);
      held_size[slot] = sz;
      h = (h ^ heap_off(held[slot])) * 1099511628211ull;
    }
  }
  for (int s = 0; s < 64; s++)
    if (held[s]) symmem_free(held[s], held_size[s], 0, NULL);
  j->hash = h;
  return NULL;
}

static int child_sequence(void) {
  for (unsigned t = 0; t < 3; t++) {
    seq_job j = {.seed = 17 + t};
    pthread_t th;
    pthread_create(&th, NULL, seq_thread, &j);
    pthread_join(th, NULL);
    printf("thread %u %016llx\n", t, (unsigned long long)j.hash);
  }
  return symmem_validate(0) == SYMMEM_SUCCESS ? 0 : 1;
}

/* Child: one rank of a 2-rank group; rank 0 allocates and frees scratch
 * memory (its bin keeps it) before the group (mode "before": group creation
 * gives it back) or after it (mode "drain": symmem_thread_caches_drain
 * gives it back; mode "keep": nothing does). The rendezvous on the next
 * allocation then finds the same heap offsets on both ranks, except in
 * "keep", where it must fail with the placement diverged (the exit status
 * says which happened). */
static int child_rank(int rank, const char *name, const char *mode) {
  int before = !strcmp(mode, "before"), drain = !strcmp(mode, "drain");
  if (rank == 0 && before) {
    void *scratch = symmem_alloc(1 * MiB, 0, NULL);
    symmem_free(scratch, 1 * MiB, 0, NULL);
    if (S("thread_cache.all.current") != 1) return 2;
  }
  symmem_group *g = NULL;
  symmem_handle *h = NULL;
  if (symmem_group_create(name, rank, 2, 0, 30000, &g) != SYMMEM_SUCCESS) return 3;
  if (S("thread_cache.all.current") != 0) return 4;
  if (rank == 0 && !before) {
    void *scratch = symmem_alloc(1 * MiB, 0, NULL);
    symmem_free(scratch, 1 * MiB, 0, NULL);
    if (S("thread_cache.all.current") != 1) return 2;
  }
  if (drain) {
    if (symmem_thread_caches_drain(0) != SYMMEM_SUCCESS) return 6;
    if (S("thread_cache.all.current") != 0) return 7;
  }
  void *buf = symmem_alloc(4096, 0, NULL);
  symmem_result r = symmem_rendezvous(buf, g, &h);
  int rc = r == SYMMEM_SUCCESS ? 0 : r == SYMMEM_ERROR_MISMATCH ? 10 : 5;
  if (rc && !(rc == 10 && !strcmp(mode, "keep"))) fprintf(stderr, "rank %d: %s\n", rank, symmem_last_error_message());
  if (h) symmem_handle_release(h);
  symmem_free(buf, 4096, 0, NULL);
  symmem_group_destroy(g);
  return rc;
}

static void test_group_after_scratch(const char *self, const char *mode, int want, const char *what) {
  char name[64];
  snprintf(name, sizeof name, "tcache-%s-%ld", mode, (long)getpid());
  char **env = env_with_cache("1");
  size_t n = 0;
  while (env[n]) n++;
  char **env2 = calloc(n + 2, sizeof *env2);
  memcpy(env2, env, n * sizeof *env2);
  env2[n] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
  pid_t pid[2];
  for (int r = 0; r < 2; r++) {
    char *argv[] = {(char *)self, "--rank", r ? "1" : "0", name, (char *)mode, NULL};
    pid[r] = check_spawn_self(argv, env2, 1, 2);
  }
  for (int r = 0; r < 2; r++) {
    int st = pid[r] > 0 ? check_wait_pid(pid[r], 60) : -1;
    char sbuf[128];
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == want, "rank %d: %s (%s, want exit %d)", r, what,
          check_status_str(st, sbuf, sizeof sbuf), want);
  }
  free(env2);
  free(env);
}

static void test_placement(const char *self) {
  char *on = run_child(self, "--placement", "1");
  char *off = run_child(self, "--placement", "0");
  CHECK(on && !strcmp(on, "second cached=1\n"), "cache on: the thread gets back the block it freed last, the other stays cached (%s)", on ? on : "no child");
  CHECK(off && !strcmp(off, "first cached=0\n"), "SYMMEM_THREAD_CACHE=0: the best fit, as without caches (%s)", off ? off : "no child");
  free(on);
  free(off);
  for (int c = 0; c < 2; c++) {
    const char *v = c ? "0" : "1";
    char *x = run_child(self, "--sequence", v), *y = run_child(self, "--sequence", v);
    CHECK(x && y && !strcmp(x, y), "SYMMEM_THREAD_CACHE=%s: the same calls twice give every thread the same heap offsets", v);
    if (x) check_info("SYMMEM_THREAD_CACHE=%s: %s", v, x);
    free(x);
    free(y);
  }
}

static void test_hits_and_statistics(void) {
  symmem_empty_cache(0);
  symmem_reset_peak_stats(0);
  int64_t alloc0 = S("allocation.all.allocated"), freed0 = S("allocation.all.freed");
  int64_t req0 = S("requested_bytes.all.allocated");
  char *p = symmem_alloc(1000, 0, NULL);
  symmem_free(p, 1000, 0, NULL); /* enters Go, which keeps the block */
  CHECK_EQ(S("thread_cache.all.current"), 1, "the freed block is in the thread's bin");
  CHECK_EQ(S("thread_cache_bytes.small_pool.current"), 1024, "thread_cache_bytes counts its size");
  CHECK_EQ(S("allocated_bytes.all.current"), 0, "and it is freed for the user");
  for (int i = 0; i < 1000; i++) { /* hits and undos: no Go call */
    char *q = symmem_alloc(600 + (size_t)i % 300, 0, NULL);
    if (q != p) {
      CHECK(0, "hit %d returns the cached block (%p, not %p)", i, (void *)q, (void *)p);
      break;
    }
    symmem_free(q, 600 + (size_t)i % 300, 0, NULL);
  }
  char *q = symmem_alloc(700, 0, NULL);
  CHECK(q == p, "a request of the same rounded size gets the cached block");
  CHECK_EQ(S("allocation.all.current"), 1, "a hit not yet seen by Go counts as allocated when read");
  CHECK_EQ(S("requested_bytes.all.current"), 700, "with its requested size");
  CHECK_EQ(S("thread_cache.all.current"), 0, "and left the bin");
  CHECK_EQ(S("allocation.all.allocated") - alloc0, 1002, "every hit counts as an allocation");
  CHECK_EQ(S("allocation.all.freed") - freed0, 1001, "every undo as a free");
  int64_t want_req = 1000 + 700;
  for (int i = 0; i < 1000; i++) want_req += 600 + i % 300;
  CHECK_EQ(S("requested_bytes.all.allocated") - req0, want_req, "requested_bytes.allocated adds every hit's size");
  CHECK_EQ(S("requested_bytes.all.peak"), 1000, "peaks are exact (1000 asked first, at most 899 after)");
  symmem_pointer_info info;
  CHECK_RESULT(symmem_pointer_get_info(p, &info), SYMMEM_SUCCESS, "the hit block is known as allocated");
  CHECK_EQ((long long)info.requested_size, 700LL, "with the size of the hit");
  symmem_free(q, 700, 0, NULL);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "the validator agrees");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache");
  CHECK_EQ(S("thread_cache.all.current"), 0, "empty_cache drains the bin");
  CHECK_EQ(S("reserved_bytes.all.current"), 0, "and releases the segment");

  /* Streams: a block is reused only on its stream. The handles are made up:
   * the host backend only (as test_alloc.c's stream test). */
  if (!host_memory) {
    check_skip("stream and record_stream checks use made-up stream handles: host backend only");
  } else {
    symmem_stream_t s1 = (symmem_stream_t)(uintptr_t)0x1000;
    char *a = symmem_alloc(512, 0, s1);
    symmem_free(a, 512, 0, s1);
    char *b = symmem_alloc(512, 0, NULL);
    CHECK(b != a, "a block cached for one stream is not handed out on another");
    char *c = symmem_alloc(512, 0, s1);
    CHECK(c == a, "but on its own stream it is");
    symmem_free(b, 512, 0, NULL);
    symmem_free(c, 512, 0, s1);

    /* record_stream: such a block never enters a bin. */
    symmem_empty_cache(0);
    char *r = symmem_alloc(512, 0, NULL);
    symmem_record_stream(r, s1);
    symmem_free(r, 512, 0, NULL);
    CHECK_EQ(S("thread_cache.all.current"), 0, "a block given to record_stream is not cached");
  }

  /* A tagged region's allocations take the Go path. */
  char *d = symmem_alloc(512, 0, NULL);
  symmem_free(d, 512, 0, NULL);
  CHECK_RESULT(symmem_region_begin("tcache-tag", 0), SYMMEM_SUCCESS, "open a tagged region");
  char *e = symmem_alloc(512, 0, NULL);
  CHECK(e != NULL && e != d, "an allocation in a tagged region does not take the untagged cached block");
  symmem_free(e, 512, 0, NULL);
  CHECK_RESULT(symmem_region_end(), SYMMEM_SUCCESS, "close it");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid");
  symmem_empty_cache(0);
}

static void test_bad_frees(void) {
  symmem_empty_cache(0);
  char *p = symmem_alloc(4096, 0, NULL);
  symmem_free(p, 4096, 0, NULL);
  symmem_clear_last_error();
  symmem_free(p, 4096, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "a double free of a block in the caller's bin");
  CHECK(strstr(symmem_last_error_message(), "double free") && strstr(symmem_last_error_message(), "symmem_free(ptr="),
        "says double free, as without caches: %s", symmem_last_error_message());
  char *q = symmem_alloc(4096, 0, NULL); /* a hit */
  symmem_free(q, 4096, 0, NULL);          /* an undo */
  symmem_clear_last_error();
  symmem_free(q, 4096, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "a double free after a hit and an undo");
  symmem_clear_last_error();
  symmem_free(q + 512, 0, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "an interior pointer of a cached block");
  char *live = symmem_alloc(4096, 0, NULL);
  CHECK(live == q, "the cached block is still handed out");
  symmem_clear_last_error();
  symmem_free(live + 16, 0, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "an interior pointer of a block a hit handed out");
  CHECK(strstr(symmem_last_error_message(), "not its start") != NULL, "is named as such: %s", symmem_last_error_message());
  int x;
  symmem_clear_last_error();
  symmem_free(&x, 4, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_POINTER, "a foreign pointer");
  symmem_clear_last_error();
  symmem_free(live, 100, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "a size other than the hit's is reported (the block is freed anyway)");
  CHECK_EQ(S("allocation.all.current"), 0, "nothing is allocated");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid after the bad frees");
  symmem_empty_cache(0);
}

/* Another thread's bin. */
typedef struct {
  void *ptr;
  int op; /* 0: allocate 4096 into ptr (a hit when cached); 1: free ptr */
  symmem_result err;
  char msg[512];
} one_call;

static void *do_one_call(void *arg) {
  one_call *c = arg;
  symmem_clear_last_error();
  if (c->op == 0) {
    c->ptr = symmem_alloc(4096, 0, NULL);
  } else {
    symmem_free(c->ptr, 4096, 0, NULL);
  }
  c->err = symmem_last_error();
  snprintf(c->msg, sizeof c->msg, "%s", symmem_last_error_message());
  return NULL;
}

static void on_thread(one_call *c) {
  pthread_t t;
  pthread_create(&t, NULL, do_one_call, c);
  pthread_join(t, NULL);
}

/* Fills its bin (40 frees: 32 kept), then takes one back by a hit and
 * exits without freeing it. */
static void *fill_then_hit(void *arg) {
  void *blocks[40];
  for (int i = 0; i < 40; i++) blocks[i] = symmem_alloc(4096, 0, NULL);
  for (int i = 0; i < 40; i++) symmem_free(blocks[i], 4096, 0, NULL);
  int64_t cached = S("thread_cache.all.current");
  void *p = symmem_alloc(4096, 0, NULL);
  *(void **)arg = cached == 32 && p == blocks[39] ? p : NULL;
  return NULL;
}

static void test_other_threads_bins(void) {
  symmem_empty_cache(0);
  char *p = symmem_alloc(4096, 0, NULL);
  symmem_free(p, 4096, 0, NULL); /* in the main thread's bin */
  one_call c = {.ptr = p, .op = 1};
  on_thread(&c);
  CHECK(c.err == SYMMEM_ERROR_INVALID_POINTER && strstr(c.msg, "double free"),
        "another thread freeing a block in this thread's bin is a double free (%d: %.200s)", c.err, c.msg);
  char *q = symmem_alloc(4096, 0, NULL); /* a hit Go has not seen */
  CHECK(q == p, "a hit");
  c = (one_call){.ptr = q, .op = 1};
  on_thread(&c);
  CHECK_EQ(c.err, SYMMEM_SUCCESS, "another thread frees a block this thread's hit handed out (%.200s)", c.msg);
  CHECK_EQ(S("allocation.all.current"), 0, "it is freed");
  CHECK_EQ(S("thread_cache.all.current"), 0, "and the exited thread's bin was adopted");

  /* A thread exits with a full bin and holding a hit Go has not seen. */
  pthread_t t;
  void *held = NULL;
  pthread_create(&t, NULL, fill_then_hit, &held);
  pthread_join(t, NULL);
  CHECK(held != NULL, "the thread's last allocation was a hit");
  CHECK_EQ(S("thread_cache.all.current"), 0, "its bin was adopted at the next call: its 31 available blocks went back");
  CHECK_EQ(S("allocation.all.current"), 1, "and its hit counts as allocated");
  symmem_clear_last_error();
  symmem_free(held, 4096, 0, NULL);
  CHECK_LAST_ERROR(SYMMEM_SUCCESS, "the main thread frees the exited thread's block");
  CHECK_EQ(S("allocation.all.current"), 0, "nothing allocated");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid");
  symmem_empty_cache(0);
  CHECK_EQ(S("reserved_bytes.all.current"), 0, "every segment released");
}

static void *cache_one_block(void *arg) {
  void *p = symmem_alloc(512, 0, NULL);
  symmem_free(p, 512, 0, NULL); /* kept in this thread's bin */
  *(int64_t *)arg = S("thread_cache.all.current");
  return NULL;
}

/* Many short-lived threads, one after another, each exiting with a block in
 * its bin: the next call adopts the dead bin, and new threads reuse the
 * retired structs. */
static void test_short_lived_threads(void) {
  symmem_empty_cache(0);
  int bad = 0;
  for (int i = 0; i < 300; i++) {
    int64_t seen = -1;
    pthread_t t;
    pthread_create(&t, NULL, cache_one_block, &seen);
    pthread_join(t, NULL);
    /* The thread saw its own block cached, plus none left by the previous
     * thread (adopted at this thread's first call). */
    bad += seen != 1;
  }
  CHECK_EQ(bad, 0, "300 threads in turn: each saw exactly its own cached block");
  CHECK_EQ(S("thread_cache.all.current"), 0, "the last one's bin was adopted");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid");
  symmem_empty_cache(0);
}

/* Threads that fill their bins and exit; threads that free each other's
 * blocks; empty_cache and validate meanwhile. */
#define NT 6
static void *exchange[NT][64];

typedef struct {
  int id;
  int rounds;
  int failures;
} churn_job;

static void *churn(void *arg) {
  churn_job *j = arg;
  unsigned r = (unsigned)j->id * 7919u + 1;
  static const size_t sizes[] = {512, 1000, 4096, 65536, 1 * MiB, 2 * MiB};
  for (int round = 0; round < j->rounds; round++) {
    void *mine[64];
    size_t msz[64];
    for (int i = 0; i < 64; i++) {
      r = r * 1103515245u + 12345u;
      msz[i] = sizes[(r >> 16) % 6];
      mine[i] = symmem_alloc(msz[i], 0, NULL);
      if (mine[i] == NULL) j->failures++;
      else if (host_memory) memset(mine[i], j->id, msz[i] < 4096 ? msz[i] : 4096);
    }
    for (int i = 0; i < 64; i++) {
      if (mine[i] == NULL) continue;
      unsigned char *b = mine[i];
      if (host_memory && (b[0] != (unsigned char)j->id || b[msz[i] < 4096 ? msz[i] - 1 : 4095] != (unsigned char)j->id))
        j->failures++;
      if (i % 4 == 0) {
        /* hand it to the next thread (it frees it with size 0) */
        void *old = __atomic_exchange_n(&exchange[(j->id + 1) % NT][i / 4], mine[i], __ATOMIC_ACQ_REL);
        if (old) {
          symmem_clear_last_error();
          symmem_free(old, 0, 0, NULL);
          if (symmem_last_error() != SYMMEM_SUCCESS) j->failures++;
        }
      } else {
        symmem_clear_last_error();
        symmem_free(mine[i], msz[i], 0, NULL);
        if (symmem_last_error() != SYMMEM_SUCCESS) j->failures++;
      }
    }
  }
  return NULL;
}

static void test_threads(void) {
  symmem_empty_cache(0);
  for (int wave = 0; wave < 3; wave++) {
    pthread_t t[NT];
    churn_job jobs[NT];
    for (int i = 0; i < NT; i++) {
      jobs[i] = (churn_job){.id = i + 1, .rounds = 30};
      pthread_create(&t[i], NULL, churn, &jobs[i]);
    }
    int bad = 0;
    for (int k = 0; k < 20; k++) {
      if (symmem_empty_cache(0) != SYMMEM_SUCCESS) bad++;
      if (symmem_validate(0) != SYMMEM_SUCCESS) {
        bad++;
        check_info("validate: %s", symmem_last_error_message());
      }
      int64_t cur = S("allocation.all.current");
      if (cur < 0 || S("allocation.all.peak") < cur) bad++;
    }
    int failures = 0;
    for (int i = 0; i < NT; i++) {
      pthread_join(t[i], NULL);
      failures += jobs[i].failures;
    }
    CHECK_EQ(bad, 0, "wave %d: empty_cache, validate and statistics while %d threads cache", wave, NT);
    CHECK_EQ(failures, 0, "wave %d: every allocation, its contents and every free (own and others') succeeded", wave);
  }
  CHECK_EQ(S("thread_cache.all.current"), 0, "the exited threads' bins were adopted");
  int leftovers = 0;
  for (int i = 0; i < NT; i++)
    for (int k = 0; k < 64; k++)
      if (exchange[i][k]) {
        symmem_clear_last_error();
        symmem_free(exchange[i][k], 0, 0, NULL);
        leftovers += symmem_last_error() != SYMMEM_SUCCESS;
        exchange[i][k] = NULL;
      }
  CHECK_EQ(leftovers, 0, "the blocks left in the exchange free cleanly");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid after the threads exited with full bins");
  CHECK_EQ(S("allocation.all.current"), 0, "nothing allocated");
  CHECK_EQ(S("requested_bytes.all.current"), 0, "nothing requested");
  CHECK_EQ(S("allocation.all.allocated"), S("allocation.all.freed"), "allocated == freed");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache");
  CHECK_EQ(S("reserved_bytes.all.current"), 0, "every segment released");
}

static void test_limit_and_oom_retry(void) {
  symmem_empty_cache(0);
  void *b[4];
  for (int i = 0; i < 4; i++) b[i] = symmem_alloc(1 * MiB, 0, NULL);
  for (int i = 0; i < 4; i++) symmem_free(b[i], 1 * MiB, 0, NULL);
  CHECK_EQ(S("thread_cache_bytes.all.current"), (int64_t)(4 * MiB), "4 MiB cached in the bin");
  CHECK_EQ(S("reserved_bytes.all.current"), (int64_t)(4 * MiB), "in two small segments");
  CHECK_RESULT(symmem_set_memory_limit(0, 20 * MiB), SYMMEM_SUCCESS, "a 20 MiB limit");
  int64_t retries = S("num_alloc_retries");
  void *big = symmem_alloc(18 * MiB, 0, NULL);
  CHECK(big != NULL, "18 MiB fit once the cached blocks went back and their segments were released (%s)",
        big ? "" : symmem_last_error_message());
  CHECK_EQ(S("num_alloc_retries") - retries, 1, "through the retry");
  CHECK_EQ(S("thread_cache.all.current"), 0, "the bin was drained");
  symmem_free(big, 18 * MiB, 0, NULL);
  CHECK_RESULT(symmem_set_memory_limit(0, 0), SYMMEM_SUCCESS, "no limit");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid");
  symmem_empty_cache(0);
}

static void test_fork_after_caching(void) {
  char *p = symmem_alloc(512, 0, NULL);
  symmem_free(p, 512, 0, NULL);
  CHECK_EQ(S("thread_cache.all.current"), 1, "a block cached before the fork");
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    symmem_clear_last_error();
    void *q = symmem_alloc(512, 0, NULL);
    int ok = q == NULL && symmem_last_error() == SYMMEM_ERROR_UNAVAILABLE;
    symmem_clear_last_error();
    symmem_free(p, 512, 0, NULL);
    ok = ok && symmem_last_error() == SYMMEM_ERROR_UNAVAILABLE;
    _exit(ok ? 0 : 1);
  }
  int st = -1;
  if (pid > 0) waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a forked child is refused even where its bin could serve it (status %#x)", st);
  char *q = symmem_alloc(512, 0, NULL);
  CHECK(q == p, "the parent's bin is intact");
  symmem_free(q, 512, 0, NULL);
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "valid");
  symmem_empty_cache(0);
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--placement")) return child_placement();
  if (argc > 1 && !strcmp(argv[1], "--sequence")) return child_sequence();
  if (argc > 4 && !strcmp(argv[1], "--rank")) return child_rank(atoi(argv[2]), argv[3], argv[4]);
  const char *on = getenv("SYMMEM_THREAD_CACHE");
  if (on && (!strcmp(on, "0") || !strcasecmp(on, "false") || !strcasecmp(on, "off") || !strcasecmp(on, "no"))) {
    check_info("SYMMEM_THREAD_CACHE=%s here: the in-process checks need the caches; the children still run both ways", on);
    test_placement(argv[0]);
    return check_summary();
  }
  host_memory = strcmp(symmem_backend_name(), "host") == 0;
  test_placement(argv[0]);
  test_group_after_scratch(argv[0], "before", 0,
                           "scratch memory a rank freed into its bin before the group does not move its symmetric buffer");
  test_group_after_scratch(argv[0], "drain", 0,
                           "scratch freed after the group, then symmem_thread_caches_drain: the symmetric buffer does not move");
  test_group_after_scratch(argv[0], "keep", 10,
                           "scratch freed after the group and left in the bin moves the symmetric buffer: MISMATCH (the limit "
                           "symmem_thread_caches_drain exists for)");
  test_hits_and_statistics();
  test_bad_frees();
  test_other_threads_bins();
  test_short_lived_threads();
  test_threads();
  test_limit_and_oom_retry();
  test_fork_after_caching();
  return check_summary();
}
