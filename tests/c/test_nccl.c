/*
 * test_nccl.c - groups over an NCCL communicator (symmem_group_create_nccl)
 * and NCCL symmetric windows, against the NCCL stand-in
 * cuda/testdata/fakenccl.c (build/libnccl_fake.so; $FAKENCCL_LIB overrides,
 * build/libnccl_fake_228.so is the same without NCCL 2.29's peer pointers).
 * Ranks are child processes; each makes its communicator with the stand-in's
 * ncclCommInitRank, as a C program does with NCCL.
 *
 * The stand-in works on host memory, so the ranks run on the host backend
 * (or on the fake driver when SYMMEM_LIBCUDA is set): on a GPU machine this
 * test still checks the host path; python/tests/gpu/nccl_*.py check NCCL on
 * GPUs.
 */
#include "check.h"

#include <dlfcn.h>

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef int (*init_rank_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef int (*destroy_fn)(ncclComm_t);
typedef void (*counts_fn)(int *, int *);

static const char *fake_lib(int old) {
  static char bufs[2][4096];
  char *buf = bufs[old];
  const char *e = getenv(old ? "FAKENCCL_LIB_228" : "FAKENCCL_LIB");
  if (e != NULL && *e)
    return e;
  snprintf(buf, sizeof bufs[0], "build/%s", old ? "libnccl_fake_228.so" : "libnccl_fake.so");
  return buf;
}

/* ---- ranks ---------------------------------------------------------------- */

static void *nccl_lib;
static counts_fn fake_counts;

static ncclComm_t make_comm(const char *job, int rank, int world) {
  nccl_lib = dlopen(getenv("SYMMEM_LIBNCCL"), RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(nccl_lib != NULL, "dlopen the NCCL stand-in %s", getenv("SYMMEM_LIBNCCL")))
    return NULL;
  init_rank_fn init = (init_rank_fn)dlsym(nccl_lib, "ncclCommInitRank");
  fake_counts = (counts_fn)dlsym(nccl_lib, "fakenccl_window_counts");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "fakenccl-%s", job);
  ncclComm_t comm = NULL;
  CHECK(init != NULL && init(&comm, world, id, rank) == 0 && comm != NULL, "ncclCommInitRank (rank %d of %d)", rank, world);
  return comm;
}

static void destroy_comm(ncclComm_t comm) {
  destroy_fn d = (destroy_fn)dlsym(nccl_lib, "ncclCommDestroy");
  CHECK(d != NULL && d(comm) == 0, "ncclCommDestroy");
}

/* The group's window counts; the stand-in's counts (the whole process's)
 * too where g made every registration of the process (fake != 0). */
static void check_counts_(symmem_group *g, int64_t reg, int64_t dereg, int64_t live, const char *when, int fake) {
  int64_t r = -1, d = -1, l = -1;
  CHECK_RESULT(symmem_group_nccl_window_counts(g, &r, &d, &l), SYMMEM_SUCCESS, "window counts %s", when);
  CHECK(r == reg && d == dereg && l == live,
        "%s: %lld registered, %lld deregistered, %lld live (want %lld, %lld, %lld)", when, (long long)r,
        (long long)d, (long long)l, (long long)reg, (long long)dereg, (long long)live);
  int fr = -1, fd = -1;
  if (fake && fake_counts != NULL) {
    fake_counts(&fr, &fd);
    CHECK(fr == reg && fd == dereg, "%s: the stand-in saw %d ncclCommWindowRegister and %d Deregister calls", when, fr, fd);
  }
}

#define check_counts(g, reg, dereg, live, when) check_counts_(g, reg, dereg, live, when, 1)

/* Waits for the work queued on the legacy stream (the barrier's signals on
 * the fake driver's cuda backend; nothing on host): symmem_copy queues a
 * copy there and waits for it. */
static void sync_stream(int dev) {
  uint64_t a = 1, b = 0;
  CHECK_RESULT(symmem_copy(&b, &a, sizeof a, dev, NULL), SYMMEM_SUCCESS, "wait for the stream");
}

/* Every rank writes its mark into every peer's buffer at rank*stride, then
 * (after a barrier) checks that its own buffer holds every rank's mark. */
static void write_every_peer(symmem_handle *h, int rank, int world, uint64_t salt) {
  int dev = 0;
  size_t stride = symmem_handle_buffer_size(h) / (size_t)world;
  for (int p = 0; p < world; p++) {
    uint64_t *dst = (uint64_t *)((char *)symmem_handle_buffer_ptr(h, p) + (size_t)rank * stride);
    dst[0] = salt * 1000 + (uint64_t)rank * 10 + (uint64_t)p;
  }
  CHECK_RESULT(symmem_barrier(h, 0, 20000, NULL), SYMMEM_SUCCESS, "barrier after the writes");
  sync_stream(dev);
  int bad = 0;
  for (int w = 0; w < world; w++) {
    uint64_t *src = (uint64_t *)((char *)symmem_handle_buffer_ptr(h, rank) + (size_t)w * stride);
    bad += src[0] != salt * 1000 + (uint64_t)w * 10 + (uint64_t)rank;
  }
  CHECK_EQ(bad, 0, "every rank's write arrived in our buffer");
  CHECK_RESULT(symmem_barrier(h, 0, 20000, NULL), SYMMEM_SUCCESS, "barrier after the reads");
  sync_stream(dev);
}

static void fill(void *p, size_t n, int rank) {
  for (size_t i = 0; i < n; i++)
    ((unsigned char *)p)[i] = (unsigned char)(i * 7 + (size_t)rank * 13 + 1);
}

/* NCCL's peer pointers disagree with our mappings (FAKENCCL_PEER_SKEW):
 * the rendezvous fails with MISMATCH on every rank. */
static int rank_skew(const char *job, int rank, int world) {
  ncclComm_t comm = make_comm(job, rank, world);
  symmem_group *g = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s-g", job);
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 20000, 0, &g), SYMMEM_SUCCESS, "group over the communicator");
  void *a = symmem_alloc(1 * MiB, 0, NULL);
  fill(a, 8192, rank);
  symmem_handle *h = NULL;
  CHECK_RESULT(symmem_rendezvous(a, g, &h), SYMMEM_ERROR_MISMATCH, "rendezvous where NCCL's peer pointers are wrong");
  CHECK(strstr(symmem_last_error_message(), "NCCL's view of rank") != NULL, "the message says what differs");
  CHECK(h == NULL, "no handle");
  symmem_free(a, 1 * MiB, 0, NULL);
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy the group");
  symmem_empty_cache(0);
  destroy_comm(comm);
  return check_summary();
}

static int rank_group(const char *job, int rank, int world) {
  ncclComm_t comm = make_comm(job, rank, world);
  if (comm == NULL)
    return check_summary();
  int v = symmem_nccl_version();
  CHECK(v >= 22800, "symmem_nccl_version is %d", v);
  symmem_group *g = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s-g", job);
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 20000, 0, &g), SYMMEM_SUCCESS, "group over the communicator");
  if (g == NULL)
    return check_summary();
  CHECK_EQ(symmem_group_rank(g), rank, "the group's rank is the communicator's");
  CHECK_EQ(symmem_group_world_size(g), world, "the group's world size is the communicator's");
  int dev = symmem_group_device(g);
  CHECK_EQ(dev, 0, "the group's device is the communicator's");
  check_counts(g, 0, 0, 0, "after group creation");

  /* One segment: the first rendezvous registers it, later ones on it and on
   * other buffers in it do not. */
  size_t big = 3 * MiB;
  void *a = symmem_alloc(big, dev, NULL);
  fill(a, 8192, rank); /* what NCCL 2.29's peer pointers are checked against */
  symmem_handle *ha = NULL;
  CHECK_RESULT(symmem_rendezvous(a, g, &ha), SYMMEM_SUCCESS, "rendezvous on a buffer of %zu bytes", big);
  check_counts(g, 1, 0, 1, "after the first rendezvous");
  void *win = NULL;
  size_t off = 99;
  CHECK_RESULT(symmem_handle_nccl_window(ha, &win, &off), SYMMEM_SUCCESS, "the handle's window");
  CHECK(win != NULL && off < big, "window %p, offset %zu", win, off);
  write_every_peer(ha, rank, world, 1);
  symmem_handle *ha2 = NULL;
  CHECK_RESULT(symmem_rendezvous(a, g, &ha2), SYMMEM_SUCCESS, "a second rendezvous on the same buffer");
  void *win2 = NULL;
  symmem_handle_nccl_window(ha2, &win2, NULL);
  CHECK(win2 == win, "the same window (%p, %p)", win, win2);
  check_counts(g, 1, 0, 1, "after the second rendezvous on the segment");

  /* Small buffers share a small segment: one registration for both. */
  void *s1 = symmem_alloc(4 * KiB, dev, NULL), *s2 = symmem_alloc(8 * KiB, dev, NULL);
  symmem_handle *h1 = NULL, *h2 = NULL;
  CHECK_RESULT(symmem_rendezvous(s1, g, &h1), SYMMEM_SUCCESS, "rendezvous on a 4 KiB buffer");
  CHECK_RESULT(symmem_rendezvous(s2, g, &h2), SYMMEM_SUCCESS, "rendezvous on an 8 KiB buffer in the same segment");
  check_counts(g, 2, 0, 2, "after rendezvous on two buffers of one small segment");
  write_every_peer(h2, rank, world, 2);

  /* A group without windows on the same communicator. */
  symmem_group *nw = NULL;
  snprintf(name, sizeof name, "%s-nowin", job);
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 20000, SYMMEM_NCCL_NO_WINDOWS, &nw), SYMMEM_SUCCESS,
               "a group with SYMMEM_NCCL_NO_WINDOWS");
  symmem_handle *hn = NULL;
  CHECK_RESULT(symmem_rendezvous(a, nw, &hn), SYMMEM_SUCCESS, "rendezvous without windows");
  void *wn = (void *)1;
  CHECK_RESULT(symmem_handle_nccl_window(hn, &wn, NULL), SYMMEM_ERROR_UNAVAILABLE, "no window without windows");
  CHECK(wn == NULL, "window is NULL");
  check_counts_(nw, 0, 0, 0, "the group without windows", 0);
  symmem_handle_release(hn);
  CHECK_RESULT(symmem_group_destroy(nw), SYMMEM_SUCCESS, "destroy the group without windows");

  /* A mismatch fails on every rank (before any registration). */
  size_t mine = rank == 0 ? 1 * MiB : 2 * MiB;
  void *m = symmem_alloc(mine, dev, NULL);
  symmem_handle *hm = NULL;
  CHECK_RESULT(symmem_rendezvous(m, g, &hm), SYMMEM_ERROR_MISMATCH, "rendezvous on blocks of different sizes");
  symmem_free(m, mine, dev, NULL);
  check_counts(g, 2, 0, 2, "after the mismatch");

  /* Release: windows go before the memory (the stand-in refuses a window
   * whose memory is unmapped), once each. */
  symmem_handle_release(ha);
  symmem_handle_release(ha2);
  symmem_handle_release(h1);
  symmem_handle_release(h2);
  symmem_free(s1, 4 * KiB, dev, NULL);
  symmem_free(s2, 8 * KiB, dev, NULL);
  symmem_free(a, big, dev, NULL);
  CHECK_RESULT(symmem_empty_cache(dev), SYMMEM_SUCCESS, "empty_cache releases the segments");
  check_counts(g, 2, 2, 0, "after empty_cache");

  /* Free and allocate again in a loop: one registration per new segment,
   * and no window outlives its segment. */
  for (int i = 0; i < 3; i++) {
    void *p = symmem_alloc(big, dev, NULL);
    symmem_handle *hp = NULL;
    CHECK_RESULT(symmem_rendezvous(p, g, &hp), SYMMEM_SUCCESS, "loop %d: rendezvous", i);
    write_every_peer(hp, rank, world, 10 + (uint64_t)i);
    symmem_handle_release(hp);
    symmem_free(p, big, dev, NULL);
    CHECK_RESULT(symmem_empty_cache(dev), SYMMEM_SUCCESS, "loop %d: empty_cache", i);
  }
  check_counts(g, 5, 5, 0, "after three allocate/rendezvous/free/empty_cache rounds");

  /* Destroying the group deregisters what it still holds. */
  void *last = symmem_alloc(big, dev, NULL);
  symmem_handle *hl = NULL;
  CHECK_RESULT(symmem_rendezvous(last, g, &hl), SYMMEM_SUCCESS, "rendezvous before destroy");
  symmem_handle_release(hl);
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy the group");
  int fr = -1, fd = -1;
  if (fake_counts != NULL) {
    fake_counts(&fr, &fd);
    CHECK(fr == 6 && fd == 6, "the group's destruction deregistered its window (%d registered, %d deregistered)", fr, fd);
  }
  symmem_free(last, big, dev, NULL);
  symmem_empty_cache(dev);
  destroy_comm(comm);
  return check_summary();
}

/* Rank 1 dies after making the communicator; rank 0's group creation must
 * fail with TIMEOUT within the group's timeout. */
static int rank_dead(const char *job, int rank, int world) {
  ncclComm_t comm = make_comm(job, rank, world);
  if (comm == NULL || rank == 1)
    _exit(comm == NULL);
  symmem_group *g = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s-g", job);
  double t0 = check_now_s();
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 1500, 0, &g), SYMMEM_ERROR_TIMEOUT, "group creation with a dead rank");
  double dt = check_now_s() - t0;
  CHECK(dt < 10, "it failed after %.1f s (timeout 1.5 s)", dt);
  CHECK(g == NULL, "no group");
  fflush(stdout);
  _exit(check_summary()); /* the stand-in's all-gather may still wait */
}

/* NCCL missing or too old: UNAVAILABLE with what was found and needed. */
static int rank_unavailable(const char *what) {
  symmem_group *g = NULL;
  int v = symmem_nccl_version();
  CHECK_EQ(v, 0, "symmem_nccl_version with %s", what);
  CHECK_LAST_ERROR(SYMMEM_ERROR_UNAVAILABLE, "%s", what);
  const char *msg = symmem_last_error_message();
  const char *want = !strcmp(what, "missing") ? "/nonexistent/libnccl.so.2" : "2.27.3";
  CHECK(strstr(msg, want) != NULL && (!strcmp(what, "missing") || strstr(msg, "2.28.0") != NULL),
        "the message names what was found and what is needed: %s", msg);
  CHECK_RESULT(symmem_group_create_nccl((void *)0x1000, "x", 1000, 0, &g), SYMMEM_ERROR_UNAVAILABLE,
               "group creation with %s", what);
  return check_summary();
}

/* ---- the parent ----------------------------------------------------------- */

static void run_job(const char *self, const char *mode, int world, const char *lib, const char *extra_env) {
  char job[96];
  snprintf(job, sizeof job, "nt-%d-%s-%d", (int)getpid(), mode, world);
  check_info("job %s: %d ranks, NCCL %s%s%s", job, world, lib, extra_env ? ", " : "", extra_env ? extra_env : "");
  size_t ne = 0;
  while (environ[ne])
    ne++;
  char **env = calloc(ne + 8, sizeof *env);
  size_t k = 0;
  int fake_driver = getenv("SYMMEM_LIBCUDA") != NULL;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_LIBNCCL=", 15) && strncmp(environ[i], "SYMMEM_BACKEND=", 15))
      env[k++] = environ[i];
  char libvar[4200];
  snprintf(libvar, sizeof libvar, "SYMMEM_LIBNCCL=%s", lib);
  env[k++] = libvar;
  /* The stand-in works on host memory: the host backend, or the fake driver. */
  env[k++] = fake_driver ? "SYMMEM_BACKEND=cuda" : "SYMMEM_BACKEND=host";
  env[k++] = "FAKENCCL_TIMEOUT_MS=60000";
  env[k++] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1"; /* every rank's stand-in device is 0 */
  if (extra_env)
    env[k++] = (char *)extra_env;
  pid_t pid[8];
  int out[8];
  char rank_s[8][16], world_s[16];
  snprintf(world_s, sizeof world_s, "%d", world);
  double t0 = check_now_s();
  for (int r = 0; r < world; r++) {
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    out[r] = check_tmpfd("nccl-rank-out");
    char *argv[] = {(char *)self, "--rank", (char *)mode, job, rank_s[r], world_s, NULL};
    pid[r] = check_spawn_self(argv, env, out[r], out[r]);
    CHECK(pid[r] > 0, "job %s: spawn rank %d", job, r);
  }
  for (int r = 0; r < world; r++) {
    double left = 120.0 - (check_now_s() - t0);
    int status = pid[r] > 0 ? check_wait_pid(pid[r], left > 1 ? left : 1) : -1;
    char prefix[32], sb[128];
    snprintf(prefix, sizeof prefix, "[rank %d] ", r);
    char *o = check_read_fd(out[r]);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out[r]);
    int dead_ok = !strcmp(mode, "dead") && r == 1; /* it exits on purpose */
    CHECK(dead_ok || (status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && fails == 0),
          "job %s: rank %d finished cleanly (%s, %d failed checks)", job, r, check_status_str(status, sb, sizeof sb), fails);
  }
  check_info("job %s took %.2f s", job, check_now_s() - t0);
  free(env);
}

int main(int argc, char **argv) {
  if (argc == 6 && !strcmp(argv[1], "--rank")) {
    const char *mode = argv[2];
    if (!strcmp(mode, "group"))
      return rank_group(argv[3], atoi(argv[4]), atoi(argv[5]));
    if (!strcmp(mode, "skew"))
      return rank_skew(argv[3], atoi(argv[4]), atoi(argv[5]));
    if (!strcmp(mode, "dead"))
      return rank_dead(argv[3], atoi(argv[4]), atoi(argv[5]));
    return rank_unavailable(mode);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *lib = fake_lib(0), *lib228 = fake_lib(1);
  if (access(lib, R_OK) != 0 || access(lib228, R_OK) != 0) {
    CHECK(0, "the NCCL stand-in is built (%s, %s: make build/libnccl_fake.so build/libnccl_fake_228.so)", lib, lib228);
    return check_summary();
  }
  char abs[2][4096];
  if (realpath(lib, abs[0]) == NULL || realpath(lib228, abs[1]) == NULL)
    return 1;
  run_job(argv[0], "group", 2, abs[0], NULL);
  run_job(argv[0], "group", 4, abs[0], NULL);
  run_job(argv[0], "group", 2, abs[1], NULL);
  /* pytorch issue 188567's trap: registration as the first operation fails
   * in the stand-in; the group's all-gathers come first. */
  run_job(argv[0], "group", 2, abs[0], "FAKENCCL_STRICT_FIRST_OP=1");
  run_job(argv[0], "skew", 2, abs[0], "FAKENCCL_PEER_SKEW=8");
  run_job(argv[0], "dead", 2, abs[0], NULL);
  run_job(argv[0], "missing", 1, "/nonexistent/libnccl.so.2", NULL);
  run_job(argv[0], "old", 1, abs[0], "FAKENCCL_VERSION=22703");
  return check_summary();
}
