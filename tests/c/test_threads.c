/*
 * test_threads.c - the allocator under 8 threads.
 *
 * Each thread keeps up to LIVE blocks, allocates random sizes (512 B to
 * 4 MiB, log-uniform, some of size 0), fills each block with a pattern
 * unique to (thread, iteration) and checks the pattern just before freeing
 * it, in random order (CPU stores on host, symmem_copy on cuda). Two live
 * blocks that overlapped would overwrite each other's pattern, so a clean
 * run proves that no two live blocks share memory. Some blocks are handed to another thread through a mailbox and
 * freed there (free from a thread that did not allocate). The validator runs
 * now and then while the others allocate, and at the end the statistics must
 * be back where they started.
 *
 * Usage: test_threads [iterations-per-thread]   (default 4000)
 */
#include "check.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define THREADS 8
#define LIVE 24
#define STRIDE 64 /* one pattern word per 64 bytes: an overlap of >= 64 bytes is seen */

static int iterations = 4000;

typedef struct {
  unsigned char *p;
  size_t size;
  uint64_t tag; /* (thread << 40) | iteration, 0 for size 0 */
} block;

/* The mailbox: blocks handed from one thread to another. */
static pthread_mutex_t mail_mu = PTHREAD_MUTEX_INITIALIZER;
static block mail[64];
static int mail_n;

static pthread_barrier_t start_barrier;

typedef struct {
  int id;
  long allocs, frees, verified, zero, handed, received;
  long alloc_failed, corrupt, free_errors, validate_errors;
  char first_problem[512];
} thread_result;

static void note(thread_result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(thread_result *r, const char *fmt, ...) {
  if (r->first_problem[0]) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->first_problem, sizeof r->first_problem, fmt, ap);
  va_end(ap);
}

static inline uint64_t word_for(uint64_t tag, size_t off) {
  return tag * 0x9e3779b97f4a7c15ull ^ (uint64_t)off;
}

/* The pattern lives in the block itself (host backend: CPU stores) or in a
 * per-thread host scratch buffer moved with symmem_copy (cuda). */
static _Thread_local unsigned char *scratch;

static void put_words(unsigned char *base, size_t size, uint64_t tag) {
  /* Words at 0, STRIDE, 2*STRIDE... that end before the last 8 bytes, then
   * the last 8 bytes (they never overlap). */
  for (size_t off = 0; off + 16 <= size; off += STRIDE) {
    uint64_t w = word_for(tag, off);
    memcpy(base + off, &w, 8);
  }
  uint64_t w = word_for(tag, size - 8);
  memcpy(base + size - 8, &w, 8);
}

static size_t check_words(const unsigned char *base, size_t size, uint64_t tag) {
  for (size_t off = 0; off + 16 <= size; off += STRIDE) {
    uint64_t w;
    memcpy(&w, base + off, 8);
    if (w != word_for(tag, off)) return off;
  }
  uint64_t w;
  memcpy(&w, base + size - 8, 8);
  if (w != word_for(tag, size - 8)) return size - 8;
  return (size_t)-1;
}

static int fill(const block *b) {
  if (b->size < 8) return 0;
  if (check_direct_access()) {
    put_words(b->p, b->size, b->tag);
    return 0;
  }
  put_words(scratch, b->size, b->tag);
  return check_mem_write(b->p, scratch, b->size, 0);
}

/* Returns the offset of the first bad word, or (size_t)-1. */
static size_t verify(const block *b) {
  if (b->size < 8) return (size_t)-1;
  if (check_direct_access()) return check_words(b->p, b->size, b->tag);
  if (check_mem_read(scratch, b->p, b->size, 0) != 0) return 0;
  return check_words(scratch, b->size, b->tag);
}

static void release(thread_result *r, block *b) {
  size_t bad = verify(b);
  if (bad != (size_t)-1) {
    r->corrupt++;
    note(r, "block %p (%zu bytes, tag %#" PRIx64 ") corrupted at offset %zu: another live "
            "block overlaps it", (void *)b->p, b->size, b->tag, bad);
  } else if (b->size >= 8) {
    r->verified++;
  }
  symmem_clear_last_error();
  symmem_free(b->p, b->size, 0, NULL);
  if (symmem_last_error() != SYMMEM_SUCCESS) {
    r->free_errors++;
    note(r, "free(%p, %zu): %s", (void *)b->p, b->size, symmem_last_error_message());
  }
  r->frees++;
}

static size_t random_size(uint64_t *rs) {
  uint64_t x = check_rand(rs);
  if (x % 16 == 0) return 0; /* about 6% are size 0 */
  /* log-uniform in [512, 4 MiB]: 2^(9 + u*13), then a random tail */
  double u = (double)(check_rand(rs) >> 11) / 9007199254740992.0;
  size_t base = (size_t)1 << (9 + (int)(u * 13.0));
  size_t s = base + (size_t)(check_rand(rs) % base);
  if (s > 4 * MiB) s = 4 * MiB;
  return s;
}

static void *worker(void *arg) {
  thread_result *r = arg;
  uint64_t rs = 0xC0FFEEull + (uint64_t)r->id * 7919;
  block live[LIVE];
  int n = 0;
  if (!check_direct_access()) scratch = malloc(4 * MiB);
  pthread_barrier_wait(&start_barrier);
  for (int it = 1; it <= iterations; it++) {
    uint64_t dice = check_rand(&rs) % 100;
    if (n < LIVE && (n == 0 || dice < 55)) {
      block b;
      b.size = random_size(&rs);
      b.tag = ((uint64_t)(r->id + 1) << 40) | (uint64_t)it;
      b.p = symmem_alloc(b.size, 0, NULL);
      if (!b.p) {
        r->alloc_failed++;
        note(r, "alloc(%zu) failed: %s", b.size, symmem_last_error_message());
        continue;
      }
      if ((uintptr_t)b.p & 511) {
        r->corrupt++;
        note(r, "alloc(%zu) = %p: not aligned to 512", b.size, (void *)b.p);
      }
      r->allocs++;
      if (b.size == 0) r->zero++;
      if (fill(&b) != 0) {
        r->corrupt++;
        note(r, "writing the pattern into %p (%zu bytes) failed: %s", (void *)b.p, b.size,
             symmem_last_error_message());
      }
      live[n++] = b;
    } else if (dice < 95 || n == LIVE) {
      int i = (int)(check_rand(&rs) % (uint64_t)n); /* random free order */
      block b = live[i];
      live[i] = live[--n];
      release(r, &b);
    } else {
      /* Hand a block to whoever looks next; take one if any. */
      int i = (int)(check_rand(&rs) % (uint64_t)n);
      block b = live[i];
      live[i] = live[--n];
      pthread_mutex_lock(&mail_mu);
      block got = {0};
      int have = 0;
      if (mail_n > 0) {
        got = mail[--mail_n];
        have = 1;
      }
      if (mail_n < 64) {
        mail[mail_n++] = b;
        r->handed++;
      } else {
        pthread_mutex_unlock(&mail_mu);
        release(r, &b);
        pthread_mutex_lock(&mail_mu);
      }
      pthread_mutex_unlock(&mail_mu);
      if (have) {
        r->received++;
        release(r, &got);
      }
    }
    if (it % 1000 == 0 && symmem_validate(0) != SYMMEM_SUCCESS) {
      r->validate_errors++;
      note(r, "validate during the run: %s", symmem_last_error_message());
    }
  }
  while (n > 0) release(r, &live[--n]);
  free(scratch);
  scratch = NULL;
  return NULL;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1) iterations = atoi(argv[1]);
  if (iterations <= 0) iterations = 4000;
  check_info("backend %s, %d threads x %d iterations, up to %d live blocks each", symmem_backend_name(),
             THREADS, iterations, LIVE);
  if (!check_direct_access())
    check_info("patterns move through symmem_copy (backend %s)", symmem_backend_name());

  int64_t a0 = check_stat(0, "allocated_bytes.all.current");
  int64_t n0 = check_stat(0, "allocation.all.current");
  int64_t r0 = check_stat(0, "requested_bytes.all.current");
  int64_t total0 = check_stat(0, "allocation.all.allocated");

  thread_result res[THREADS];
  pthread_t th[THREADS];
  memset(res, 0, sizeof res);
  pthread_barrier_init(&start_barrier, NULL, THREADS);
  double t0 = check_now_s();
  for (int i = 0; i < THREADS; i++) {
    res[i].id = i;
    pthread_create(&th[i], NULL, worker, &res[i]);
  }
  for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
  double dt = check_now_s() - t0;
  pthread_barrier_destroy(&start_barrier);

  /* Blocks left in the mailbox: verify and free them here. */
  thread_result leftover = {.id = -1};
  if (!check_direct_access()) scratch = malloc(4 * MiB);
  while (mail_n > 0) release(&leftover, &mail[--mail_n]);
  free(scratch);

  long allocs = 0, frees = leftover.frees;
  for (int i = 0; i < THREADS; i++) {
    thread_result *r = &res[i];
    allocs += r->allocs;
    frees += r->frees;
    CHECK(r->alloc_failed == 0 && r->corrupt == 0 && r->free_errors == 0 && r->validate_errors == 0,
          "thread %d: %ld allocs (%ld of size 0), %ld blocks verified, %ld handed to / %ld freed for "
          "other threads; %ld alloc failures, %ld corrupt, %ld free errors, %ld validate errors%s%s",
          i, r->allocs, r->zero, r->verified, r->handed, r->received, r->alloc_failed, r->corrupt,
          r->free_errors, r->validate_errors, r->first_problem[0] ? ": " : "", r->first_problem);
  }
  CHECK(leftover.corrupt == 0 && leftover.free_errors == 0,
        "blocks left in the mailbox verified and freed by the main thread (%ld)%s%s", leftover.frees,
        leftover.first_problem[0] ? ": " : "", leftover.first_problem);
  CHECK_EQ(allocs, frees, "every block allocated was freed (%.2f s, %.0f ops/s)", dt,
           (double)(allocs + frees) / dt);
  CHECK_EQ(check_stat(0, "allocation.all.allocated") - total0, allocs,
           "allocation.all.allocated counted every allocation");
  CHECK_EQ(check_stat(0, "allocated_bytes.all.current"), a0,
           "allocated_bytes.all.current back to its starting value");
  CHECK_EQ(check_stat(0, "requested_bytes.all.current"), r0,
           "requested_bytes.all.current back to its starting value");
  CHECK_EQ(check_stat(0, "allocation.all.current"), n0, "allocation.all.current back to its starting value");
  CHECK(check_stat(0, "allocated_bytes.all.peak") <= check_stat(0, "reserved_bytes.all.peak"),
        "allocated_bytes.all.peak <= reserved_bytes.all.peak");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after the run");
  CHECK_RESULT(symmem_empty_cache(0), SYMMEM_SUCCESS, "empty_cache after the run");
  CHECK_EQ(check_stat(0, "reserved_bytes.all.current"), 0, "nothing reserved after empty_cache");
  CHECK_RESULT(symmem_validate(0), SYMMEM_SUCCESS, "validate after empty_cache");
  return check_summary();
}
