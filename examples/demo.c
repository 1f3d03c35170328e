/*
 * demo.c - symmetric memory in one page of C.
 *
 *     build/demo [ranks]        (default 4; `make demo`)
 *
 * The program starts `ranks` copies of itself (posix_spawn of /proc/self/exe;
 * a process that has loaded libsymmem runs a Go runtime and must not fork).
 * Every rank then:
 *
 *   1. joins the group "demo-<pid of the launcher>" (symmem_group_create);
 *   2. allocates a 4 MiB symmetric buffer (symmem_alloc) and fills its own
 *      slot with its pattern;
 *   3. rendezvous: now it can load and store every peer's buffer directly;
 *   4. writes its pattern into its slot of every peer's buffer;
 *   5. barrier (through the signal pads), then verifies that every peer's
 *      pattern arrived in its own buffer;
 *   6. publishes its result in its buffer; rank 0 reads every rank's result
 *      straight from their buffers and prints the table.
 *
 * Buffer layout (the same on every rank, world = number of ranks):
 *     [ result: 64 bytes ][ slot 0 ][ slot 1 ] ... [ slot world-1 ]
 * Slot r is written by rank r only.
 *
 * On the host backend the buffers are shared CPU memory and plain loads and
 * stores are the transport. On the cuda backend they are GPU memory and the
 * demo moves bytes with symmem_copy (a device copy: no CUDA runtime needed),
 * which runs on the same stream as the barrier, so it is ordered after it.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "symmem.h"

extern char **environ;

#define BUFFER_BYTES (4u << 20)
#define RESULT_BYTES 64
#define TIMEOUT_MS 20000
#define MAX_RANKS 64

/* What each rank publishes at the start of its buffer for rank 0. */
typedef struct {
  uint64_t magic; /* RESULT_MAGIC once written */
  uint64_t bytes_verified;
  uint64_t errors;
  double rendezvous_ms;
} rank_result;
#define RESULT_MAGIC 0x73796d6d656d4f4bull /* "symmemOK" */

static int on_host;
static int device;

/* Copies between this process's memory and a (local or peer) symmetric
 * buffer: plain memcpy on the host backend, symmem_copy (device copy) on
 * cuda. Returns 0 on success. */
static int copy_to_buffer(void *dst, const void *src, size_t n) {
  if (on_host) {
    memcpy(dst, src, n);
    return 0;
  }
  return symmem_copy(dst, src, n, device, NULL) == SYMMEM_SUCCESS ? 0 : -1;
}
static int copy_from_buffer(void *dst, const void *src, size_t n) {
  return copy_to_buffer(dst, src, n);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Rank r's pattern for its slot in owner's buffer: 8-byte words. */
static void make_pattern(uint64_t *words, size_t n, int writer, int owner) {
  for (size_t i = 0; i < n; i++)
    words[i] = ((uint64_t)writer << 56) ^ ((uint64_t)owner << 48) ^ (i * 0x9e3779b97f4a7c15ull);
}

#define FAIL(...)                                                              \
  do {                                                                         \
    fprintf(stderr, "[rank %d] ", rank);                                       \
    fprintf(stderr, __VA_ARGS__);                                              \
    fprintf(stderr, ": %s\n", symmem_last_error_message());                    \
    return 1;                                                                  \
  } while (0)

static int rank_main(int rank, int world, const char *name) {
  on_host = strcmp(symmem_backend_name(), "host") == 0;
  const size_t slot = ((BUFFER_BYTES - RESULT_BYTES) / (size_t)world) & ~(size_t)7;
  const size_t words = slot / 8;
  uint64_t *mine = malloc(slot), *got = malloc(slot);
  if (!mine || !got) return 1;

  /* 1. Join the group. */
  symmem_group *group = NULL;
  const int ndev = symmem_device_count();
  if (ndev < 1) FAIL("no device (backend %s)", symmem_backend_name());
  device = rank % ndev; /* one GPU per rank where there are enough */
  if (symmem_group_create(name, rank, world, device, TIMEOUT_MS, &group) != SYMMEM_SUCCESS)
    FAIL("symmem_group_create");

  /* 2. Allocate the symmetric buffer; fill our own slot. */
  char *buf = symmem_alloc(BUFFER_BYTES, device, NULL);
  if (!buf) FAIL("symmem_alloc");
  make_pattern(mine, words, rank, rank);
  if (copy_to_buffer(buf + RESULT_BYTES + (size_t)rank * slot, mine, slot) != 0) FAIL("filling our slot");

  /* 3. Rendezvous: map every peer's buffer here. */
  symmem_handle *h = NULL;
  double t0 = now_ms();
  if (symmem_rendezvous(buf, group, &h) != SYMMEM_SUCCESS) FAIL("symmem_rendezvous");
  double rendezvous_ms = now_ms() - t0;
  void *const *peers = symmem_handle_buffer_ptrs(h);

  /* 4. Write our slot in every peer's buffer. */
  for (int q = 0; q < world; q++) {
    if (q == rank) continue;
    make_pattern(mine, words, rank, q);
    if (copy_to_buffer((char *)peers[q] + RESULT_BYTES + (size_t)rank * slot, mine, slot) != 0)
      FAIL("writing into rank %d's buffer", q);
  }

  /* 5. Barrier: every rank's stores are done. Verify what arrived. */
  if (symmem_barrier(h, 0, TIMEOUT_MS, NULL) != SYMMEM_SUCCESS) FAIL("symmem_barrier");
  rank_result res = {RESULT_MAGIC, 0, 0, rendezvous_ms};
  for (int w = 0; w < world; w++) {
    make_pattern(mine, words, w, rank);
    if (copy_from_buffer(got, buf + RESULT_BYTES + (size_t)w * slot, slot) != 0 ||
        memcmp(got, mine, slot) != 0) {
      res.errors++;
      fprintf(stderr, "[rank %d] slot of rank %d: wrong data\n", rank, w);
    } else if (w != rank) {
      res.bytes_verified += slot;
    }
  }

  /* 6. Publish the result in our buffer; rank 0 reads everyone's. */
  int failed = res.errors != 0;
  if (copy_to_buffer(buf, &res, sizeof res) != 0) FAIL("publishing the result");
  if (symmem_barrier(h, 0, TIMEOUT_MS, NULL) != SYMMEM_SUCCESS) FAIL("symmem_barrier");
  if (rank == 0) {
    uint64_t bytes = 0;
    int ok = 0;
    double max_ms = 0;
    for (int q = 0; q < world; q++) {
      rank_result r;
      if (copy_from_buffer(&r, peers[q], sizeof r) != 0) continue;
      if (r.magic == RESULT_MAGIC && r.errors == 0) ok++;
      bytes += r.bytes_verified;
      if (r.rendezvous_ms > max_ms) max_ms = r.rendezvous_ms;
    }
    if (ok != world) failed = 1;
    printf("| backend | ranks | buffer | rendezvous (ms, slowest rank) | bytes verified | result |\n");
    printf("|---------|------:|-------:|------------------------------:|---------------:|--------|\n");
    printf("| %s | %d | %u MiB | %.2f | %" PRIu64 " (%.1f MiB) | %s |\n", symmem_backend_name(), world,
           BUFFER_BYTES >> 20, max_ms, bytes, (double)bytes / (1 << 20), failed ? "FAILED" : "OK");
  }
  /* Nobody unmaps while rank 0 is still reading. */
  if (symmem_barrier(h, 0, TIMEOUT_MS, NULL) != SYMMEM_SUCCESS) FAIL("symmem_barrier");

  symmem_handle_release(h);
  symmem_free(buf, BUFFER_BYTES, device, NULL);
  symmem_group_destroy(group);
  free(mine);
  free(got);
  return failed;
}

/* The launcher: start the ranks, wait for them, report. */
int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--rank") == 0)
    return rank_main(atoi(argv[2]), atoi(argv[3]), argv[4]);

  int world = 4;
  if (argc > 1) {
    const char *a = argv[1];
    if (strncmp(a, "ranks=", 6) == 0) a += 6;
    world = atoi(a);
  }
  if (world < 1 || world > MAX_RANKS) {
    fprintf(stderr, "usage: %s [ranks]   (1..%d, default 4)\n", argv[0], MAX_RANKS);
    return 2;
  }
  char name[64], world_s[16], rank_s[MAX_RANKS][16];
  snprintf(name, sizeof name, "demo-%d", (int)getpid());
  snprintf(world_s, sizeof world_s, "%d", world);

  /* Fewer GPUs than ranks: let ranks share a device (fine for a demo). */
  char **env = environ, *shared_env[512];
  if (strcmp(symmem_backend_name(), "host") != 0 && symmem_device_count() < world) {
    size_t n = 0;
    while (environ[n] && n < 510) {
      shared_env[n] = environ[n];
      n++;
    }
    shared_env[n++] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
    shared_env[n] = NULL;
    env = shared_env;
  }

  pid_t pids[MAX_RANKS];
  for (int r = 0; r < world; r++) {
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    char *args[] = {argv[0], "--rank", rank_s[r], world_s, name, NULL};
    int rc = posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, args, env);
    if (rc != 0) {
      fprintf(stderr, "demo: cannot start rank %d: %s\n", r, strerror(rc));
      for (int q = 0; q < r; q++) kill(pids[q], SIGTERM);
      for (int q = 0; q < r; q++) waitpid(pids[q], NULL, 0);
      return 1;
    }
  }
  int failed = 0;
  for (int r = 0; r < world; r++) {
    int status;
    if (waitpid(pids[r], &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      failed = 1;
      if (WIFSIGNALED(status))
        fprintf(stderr, "demo: rank %d killed by signal %d\n", r, WTERMSIG(status));
      else
        fprintf(stderr, "demo: rank %d failed (exit %d)\n", r, WEXITSTATUS(status));
    }
  }
  return failed;
}
