/*
 * bench_alloc.c - latency of one alloc+free pair through the C ABI.
 *
 * Three allocators measured in the same run, interleaved, repeated, medians
 * reported:
 *   libsymmem   symmem_alloc / symmem_free (the backend in use; `make bench`
 *               sets SYMMEM_BACKEND=host)
 *   free-list   bench/freelist.h: a mutex and a stack per size, the floor
 *               for any caching allocator with a global lock
 *   glibc       malloc / free
 * Sizes 512 B, 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB; 1 thread and 8 threads.
 * Each thread allocates and frees the same size in a loop (the cached path:
 * warm-up pairs run before timing). The figure is nanoseconds per pair as
 * seen by each thread (its wall time / its pairs), averaged over the threads
 * of a run; the table shows the median over repetitions. With more threads
 * than cores the per-thread figure includes time spent descheduled; the
 * header line says how many cores there were.
 *
 * Usage: bench_alloc [--reps N] [--ms M] [--json] [--threads a,b] [--quick]
 *   --reps N     repetitions of every figure (default 7)
 *   --ms M       target milliseconds per thread per run (default 20)
 *   --json       also print one JSON line per figure
 *   --threads    thread counts (default 1,8)
 *   --quick      --reps 3 --ms 5
 * Prints a Markdown table ready for the README.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "freelist.h"
#include "symmem.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)

enum { A_SYMMEM, A_FREELIST, A_GLIBC, NALLOC };
static const char *alloc_names[NALLOC] = {"libsymmem", "free-list", "glibc malloc"};
static const char *alloc_keys[NALLOC] = {"libsymmem", "freelist", "glibc"};

static const size_t sizes[] = {512, 4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 64 * MiB};
enum { NSIZE = sizeof sizes / sizeof sizes[0] };
#define MAX_THREADS 64
#define MAX_TC 8
#define MAX_REPS 101

static freelist fl;
/* Keeps the compiler from eliding malloc/free pairs. Per thread: one
 * variable that every thread stores to on every pair bounces its cache line
 * between the cores and measured that, not the allocators (8 threads cost
 * 140-2000 ns per pair for every allocator, glibc included, on 32 CPUs). */
static __thread void *volatile sink;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct {
  int alloc;
  size_t size;
  long pairs;
  pthread_barrier_t *start;
  double ns; /* out: wall time of the timed loop */
  int failed;
} job;

static inline void *do_alloc(int a, size_t size) {
  switch (a) {
  case A_SYMMEM:
    return symmem_alloc(size, 0, NULL);
  case A_FREELIST:
    return fl_alloc(&fl, size);
  default:
    return malloc(size);
  }
}
static inline void do_free(int a, void *p, size_t size) {
  switch (a) {
  case A_SYMMEM:
    symmem_free(p, size, 0, NULL);
    break;
  case A_FREELIST:
    fl_free(&fl, p, size);
    break;
  default:
    free(p);
  }
}

static void *worker(void *arg) {
  job *j = arg;
  const int a = j->alloc;
  const size_t size = j->size;
  /* Warm-up: fill the cache and the code paths. */
  for (int i = 0; i < 16; i++) {
    void *p = do_alloc(a, size);
    if (!p) j->failed = 1;
    sink = p;
    do_free(a, p, size);
  }
  pthread_barrier_wait(j->start);
  double t0 = now_ns();
  for (long i = 0; i < j->pairs; i++) {
    void *p = do_alloc(a, size);
    sink = p;
    if (__builtin_expect(p == NULL, 0)) {
      j->failed = 1;
      break;
    }
    do_free(a, p, size);
  }
  j->ns = now_ns() - t0;
  return NULL;
}

/* One run: threads threads, pairs pairs each. Returns mean ns per pair over
 * the threads, or -1 on an allocation failure. */
static double run(int a, size_t size, int threads, long pairs) {
  pthread_t th[MAX_THREADS];
  job jobs[MAX_THREADS];
  pthread_barrier_t start;
  pthread_barrier_init(&start, NULL, (unsigned)threads);
  for (int t = 0; t < threads; t++) {
    jobs[t] = (job){.alloc = a, .size = size, .pairs = pairs, .start = &start};
    pthread_create(&th[t], NULL, worker, &jobs[t]);
  }
  double sum = 0;
  int failed = 0;
  for (int t = 0; t < threads; t++) {
    pthread_join(th[t], NULL);
    sum += jobs[t].ns / (double)pairs;
    failed |= jobs[t].failed;
  }
  pthread_barrier_destroy(&start);
  if (failed) {
    fprintf(stderr, "bench_alloc: %s failed to allocate %zu bytes (%d threads)%s%s\n", alloc_names[a], size,
            threads, a == A_SYMMEM ? ": " : "", a == A_SYMMEM ? symmem_last_error_message() : "");
    return -1;
  }
  return sum / threads;
}

/* The cost of one call from C into the Go runtime and back: the part of
 * every libsymmem call that no allocator design can remove (symmem_version
 * is a Go function; some others, like symmem_last_error, are plain C). */
static double cgo_call_ns(void) {
  const long n = 200000;
  volatile int acc = 0;
  for (long i = 0; i < 1000; i++) acc += symmem_version();
  double t0 = now_ns();
  for (long i = 0; i < n; i++) acc += symmem_version();
  return (now_ns() - t0) / (double)n;
}

static int cmp_double(const void *x, const void *y) {
  double a = *(const double *)x, b = *(const double *)y;
  return a < b ? -1 : a > b;
}

static void cpu_model(char *buf, size_t len) {
  snprintf(buf, len, "unknown CPU");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (!strncmp(line, "model name", 10)) {
      char *c = strchr(line, ':');
      if (c) {
        c++;
        while (*c == ' ' || *c == '\t') c++;
        c[strcspn(c, "\n")] = '\0';
        snprintf(buf, len, "%s", c);
      }
      break;
    }
  }
  fclose(f);
}

static const char *size_str(size_t s, char *buf, size_t len) {
  if (s >= MiB && s % MiB == 0)
    snprintf(buf, len, "%zu MiB", s / MiB);
  else if (s >= KiB && s % KiB == 0)
    snprintf(buf, len, "%zu KiB", s / KiB);
  else
    snprintf(buf, len, "%zu B", s);
  return buf;
}

int main(int argc, char **argv) {
  int reps = 7, json = 0;
  double target_ms = 20;
  int tcounts[MAX_TC] = {1, 8}, ntc = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--ms") && i + 1 < argc)
      target_ms = atof(argv[++i]);
    else if (!strcmp(argv[i], "--json"))
      json = 1;
    else if (!strcmp(argv[i], "--quick")) {
      reps = 3;
      target_ms = 5;
    } else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
      ntc = 0;
      for (char *s = strtok(argv[++i], ","); s && ntc < MAX_TC; s = strtok(NULL, ",")) {
        int t = atoi(s);
        if (t >= 1 && t <= MAX_THREADS) tcounts[ntc++] = t;
      }
      if (ntc == 0) tcounts[ntc++] = 1;
    } else {
      fprintf(stderr, "usage: %s [--reps N] [--ms M] [--json] [--threads a,b] [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (reps < 1) reps = 1;
  if (reps > MAX_REPS) reps = MAX_REPS;

  fl_init(&fl);
  const char *backend = symmem_backend_name();
  char cpu[256];
  cpu_model(cpu, sizeof cpu);
  cpu_set_t set;
  int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
  int usable = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : ncpu;
  struct utsname un;
  uname(&un);

  /* Calibrate: pairs per thread so that one run lasts about target_ms. */
  static long pairs[NALLOC][NSIZE][MAX_TC];
  for (int a = 0; a < NALLOC; a++)
    for (int s = 0; s < NSIZE; s++)
      for (int t = 0; t < ntc; t++) {
        /* Grow the run until it lasts a fifth of the target, then scale:
         * the first runs include one-time costs (new segments, page faults). */
        long k = 100;
        for (;;) {
          double ns = run(a, sizes[s], tcounts[t], k);
          if (ns < 0) return 1;
          double per = ns > 1 ? ns : 1;
          if (per * (double)k >= target_ms * 1e6 / 5 || k >= 20000000) {
            k = (long)(target_ms * 1e6 / per);
            break;
          }
          k *= 4;
        }
        if (k < 100) k = 100;
        if (k > 20000000) k = 20000000;
        pairs[a][s][t] = k;
      }

  /* Measure: interleaved, the allocator order rotating every repetition. */
  static double res[NALLOC][NSIZE][MAX_TC][MAX_REPS];
  double cgo[MAX_REPS];
  for (int r = 0; r < reps; r++) {
    cgo[r] = cgo_call_ns();
    for (int s = 0; s < NSIZE; s++)
      for (int t = 0; t < ntc; t++)
        for (int k = 0; k < NALLOC; k++) {
          int a = (k + r) % NALLOC;
          double ns = run(a, sizes[s], tcounts[t], pairs[a][s][t]);
          if (ns < 0) return 1;
          res[a][s][t][r] = ns;
        }
  }

  qsort(cgo, (size_t)reps, sizeof *cgo, cmp_double);
  double cgo_med = cgo[reps / 2];

  double med[NALLOC][NSIZE][MAX_TC], lo[NALLOC][NSIZE][MAX_TC], hi[NALLOC][NSIZE][MAX_TC];
  for (int a = 0; a < NALLOC; a++)
    for (int s = 0; s < NSIZE; s++)
      for (int t = 0; t < ntc; t++) {
        double v[MAX_REPS];
        memcpy(v, res[a][s][t], (size_t)reps * sizeof *v);
        qsort(v, (size_t)reps, sizeof *v, cmp_double);
        med[a][s][t] = reps % 2 ? v[reps / 2] : (v[reps / 2 - 1] + v[reps / 2]) / 2;
        lo[a][s][t] = v[0];
        hi[a][s][t] = v[reps - 1];
      }

  printf("### alloc+free pair latency (ns per pair per thread, median of %d)\n\n", reps);
  printf("CPU: %s; %d CPUs online, %d usable by this process; %s %s; libsymmem %d (backend %s)\n\n", cpu,
         ncpu, usable, un.sysname, un.release, symmem_version(), backend);
  printf("| size | threads | libsymmem (%s) | free-list floor | glibc malloc | libsymmem / floor |\n", backend);
  printf("|-----:|--------:|---------------:|----------------:|-------------:|------------------:|\n");
  for (int t = 0; t < ntc; t++)
    for (int s = 0; s < NSIZE; s++) {
      char sb[32];
      printf("| %s | %d | %.0f | %.0f | %.0f | %.1fx |\n", size_str(sizes[s], sb, sizeof sb), tcounts[t],
             med[A_SYMMEM][s][t], med[A_FREELIST][s][t], med[A_GLIBC][s][t],
             med[A_SYMMEM][s][t] / (med[A_FREELIST][s][t] > 0 ? med[A_FREELIST][s][t] : 1));
    }
  printf("\nEach thread allocates and frees one size in a loop (the cached path); figures are the\n"
         "median over %d interleaved repetitions of each thread's wall time per pair.\n"
         "free-list = bench/freelist.h (one mutex, a stack per size). glibc malloc is 16-byte aligned\n"
         "and maps/unmaps blocks above its mmap threshold (32 MiB at most) on every pair.\n"
         "One call from C into libsymmem's Go runtime and back (symmem_version) costs %.0f ns;\n"
         "a pair that enters Go makes two such calls; one served by the calling thread's cache\n"
         "(blocks up to 128 MiB; SYMMEM_THREAD_CACHE, on by default) makes none.\n",
         reps, cgo_med);
  if (usable < 8)
    printf("Note: %d usable CPUs: with 8 threads each thread waits for a core part of the time.\n", usable);

  if (json)
    printf("{\"bench\":\"cgo_call\",\"call\":\"symmem_version\",\"ns_median\":%.1f,\"reps\":%d,"
           "\"cpu\":\"%s\",\"cpus\":%d}\n", cgo_med, reps, cpu, usable);
  if (json)
    for (int a = 0; a < NALLOC; a++)
      for (int s = 0; s < NSIZE; s++)
        for (int t = 0; t < ntc; t++)
          printf("{\"bench\":\"alloc_free_pair\",\"allocator\":\"%s\",\"backend\":\"%s\",\"size\":%zu,"
                 "\"threads\":%d,\"ns_per_pair_median\":%.1f,\"ns_min\":%.1f,\"ns_max\":%.1f,"
                 "\"reps\":%d,\"pairs_per_thread\":%ld,\"cpu\":\"%s\",\"cpus\":%d}\n",
                 alloc_keys[a], a == A_SYMMEM ? backend : "cpu", sizes[s], tcounts[t], med[a][s][t],
                 lo[a][s][t], hi[a][s][t], reps, pairs[a][s][t], cpu, usable);
  fl_destroy(&fl);
  return 0;
}
