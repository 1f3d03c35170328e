/*
 * test_fakenccl.c - the NCCL stand-in (cuda/testdata/fakenccl.c) checked
 * directly, under AddressSanitizer: the semantics libsymmem's engine between
 * machines relies on (cuda/nccl.go, Note [NCCL as the engine]) must be
 * NCCL's, or the suites that run on it prove nothing.
 *
 *   - typed collectives: 16-bit types accumulated in float in rank order and
 *     rounded once, int32 wrapping, max/min as fmaxf/fminf, in place, and
 *     messages past the stand-in's 256 KiB pieces (ASan checks every copy);
 *   - ranks disagreeing on a collective fail with ncclInvalidUsage;
 *   - ncclCommSplit by color and key, NCCL_SPLIT_NOCOLOR;
 *   - point-to-point transfers in groups: every pair (self included)
 *     moving at once, past the 32 KiB pieces, matched in the order posted;
 *     a size that differs from the send fails the receive, a peer that
 *     never sends fails it after the timeout;
 *   - the one-sided signals: counts, a bounded wait, NCCL 2.29's rule that
 *     the signal index is 0;
 *   - machines: ranks with different SYMMEM_MACHINE_ID (processes) get
 *     separate LSA teams and NULL peer pointers across;
 *   - the 2.28 stand-in exports none of 2.29's functions;
 *   - with the stand-in driver (build/libcuda_fake.so) in the process, a call
 *     runs after the work queued before it on its stream.
 *
 * Ranks are threads of this process (each with its own communicator), or
 * processes where the machine identity must differ.
 */
#include "check.h"

#include <dlfcn.h>
#include <math.h>

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWin *ncclWindow_t;
typedef struct {
  int opCnt, peer, sigIdx, ctx;
} ncclWaitSignalDesc_t;
typedef struct {
  int nRanks, rank, stride;
} ncclTeam_t;

enum { ncclInt32 = 2, ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9 };
enum { ncclSum = 0, ncclMax = 2, ncclMin = 3 };
enum { ncclSystemError = 2, ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6 };

static struct {
  int (*version)(int *);
  int (*init)(ncclComm_t *, int, ncclUniqueId, int);
  int (*destroy)(ncclComm_t);
  const char *(*last)(ncclComm_t);
  int (*all_reduce)(const void *, void *, size_t, int, int, ncclComm_t, void *);
  int (*reduce_scatter)(const void *, void *, size_t, int, int, ncclComm_t, void *);
  int (*all_gather)(const void *, void *, size_t, int, ncclComm_t, void *);
  int (*split)(ncclComm_t, int, int, ncclComm_t *, void *);
  int (*count)(ncclComm_t, int *);
  int (*user_rank)(ncclComm_t, int *);
  int (*signal)(int, int, int, unsigned, ncclComm_t, void *);
  int (*wait_signal)(int, ncclWaitSignalDesc_t *, ncclComm_t, void *);
  int (*reg)(ncclComm_t, void *, size_t, ncclWindow_t *, int);
  int (*dereg)(ncclComm_t, ncclWindow_t);
  int (*peer_ptr)(ncclWindow_t, size_t, int, void **);
  ncclTeam_t (*team_lsa)(ncclComm_t);
  int (*send)(const void *, size_t, int, int, ncclComm_t, void *);
  int (*recv)(void *, size_t, int, int, ncclComm_t, void *);
  int (*group_start)(void);
  int (*group_end)(void);
} nc;

static void *load(const char *path) {
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(h != NULL, "dlopen %s", path))
    return NULL;
#define SYM(field, name) *(void **)&nc.field = dlsym(h, name)
  SYM(version, "ncclGetVersion");
  SYM(init, "ncclCommInitRank");
  SYM(destroy, "ncclCommDestroy");
  SYM(last, "ncclGetLastError");
  SYM(all_reduce, "ncclAllReduce");
  SYM(reduce_scatter, "ncclReduceScatter");
  SYM(all_gather, "ncclAllGather");
  SYM(split, "ncclCommSplit");
  SYM(count, "ncclCommCount");
  SYM(user_rank, "ncclCommUserRank");
  SYM(signal, "ncclSignal");
  SYM(wait_signal, "ncclWaitSignal");
  SYM(reg, "ncclCommWindowRegister");
  SYM(dereg, "ncclCommWindowDeregister");
  SYM(peer_ptr, "ncclGetPeerDevicePointer");
  SYM(team_lsa, "ncclTeamLsa");
  SYM(send, "ncclSend");
  SYM(recv, "ncclRecv");
  SYM(group_start, "ncclGroupStart");
  SYM(group_end, "ncclGroupEnd");
#undef SYM
  return h;
}

static ncclUniqueId make_id(const char *what) {
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "fakenccl-tf-%d-%s", (int)getpid(), what);
  return id;
}

/* ---- thread ranks ---------------------------------------------------------- */

typedef struct rank_arg {
  int rank, world;
  ncclUniqueId id;
  void (*body)(struct rank_arg *, ncclComm_t);
} rank_arg;

static void *rank_main(void *p) {
  rank_arg *a = p;
  ncclComm_t c = NULL;
  if (CHECK(nc.init(&c, a->world, a->id, a->rank) == 0 && c != NULL, "rank %d: ncclCommInitRank", a->rank)) {
    a->body(a, c);
    CHECK(nc.destroy(c) == 0, "rank %d: ncclCommDestroy", a->rank);
  }
  return NULL;
}

static void run_threads(const char *what, int world, void (*body)(rank_arg *, ncclComm_t)) {
  pthread_t th[8];
  rank_arg args[8];
  ncclUniqueId id = make_id(what);
  for (int r = 0; r < world; r++) {
    args[r] = (rank_arg){r, world, id, body};
    pthread_create(&th[r], NULL, rank_main, &args[r]);
  }
  for (int r = 0; r < world; r++)
    pthread_join(th[r], NULL);
}

static uint16_t u16(const void *p, size_t i) { return ((const uint16_t *)p)[i]; }

/* Three ranks: rank 0 gives a large value, the others a value under half
 * its unit in the last place. Rounding once: 2048+1+1 = 2050 in float16,
 * 256+1+1 = 258 in bfloat16; rounding after each step would keep 2048 and
 * 256. */
static void body_rounding(rank_arg *a, ncclComm_t c) {
  uint16_t f16 = a->rank == 0 ? 0x6800 /* 2048 */ : 0x3c00 /* 1 */, f16_out = 0;
  uint16_t bf16 = a->rank == 0 ? 0x4380 /* 256 */ : 0x3f80 /* 1 */, bf16_out = 0;
  CHECK(nc.all_reduce(&f16, &f16_out, 1, ncclFloat16, ncclSum, c, NULL) == 0, "float16 sum");
  CHECK_EQ(f16_out, 0x6801, "rank %d: 2048 + 1 + 1 in float16, rounded once, is 2050", a->rank);
  CHECK(nc.all_reduce(&bf16, &bf16_out, 1, ncclBfloat16, ncclSum, c, NULL) == 0, "bfloat16 sum");
  CHECK_EQ(bf16_out, 0x4381, "rank %d: 256 + 1 + 1 in bfloat16, rounded once, is 258", a->rank);
  /* int32 wraps; max/min as fmaxf/fminf (a NaN yields the other value). */
  int32_t iv = a->rank == 0 ? INT32_MAX : 1, isum = 0;
  CHECK(nc.all_reduce(&iv, &isum, 1, ncclInt32, ncclSum, c, NULL) == 0, "int32 sum");
  CHECK_EQ(isum, (int32_t)((uint32_t)INT32_MAX + 2u), "rank %d: INT32_MAX + 1 + 1 wraps", a->rank);
  float fv[2] = {a->rank == 1 ? NAN : (float)a->rank, (float)-a->rank}, fmx[2], fmn[2];
  CHECK(nc.all_reduce(fv, fmx, 2, ncclFloat32, ncclMax, c, NULL) == 0, "float32 max");
  CHECK(nc.all_reduce(fv, fmn, 2, ncclFloat32, ncclMin, c, NULL) == 0, "float32 min");
  CHECK(fmx[0] == 2.0f && fmx[1] == 0.0f && fmn[0] == 0.0f && fmn[1] == -2.0f,
        "rank %d: max (%g, %g) and min (%g, %g) step over the NaN", a->rank, fmx[0], fmx[1], fmn[0], fmn[1]);
  (void)u16;
}

/* Past 256 KiB per rank, in place: reduce-scatter and all-gather. */
static void body_large(rank_arg *a, ncclComm_t c) {
  const size_t n = 100000; /* float32 elements per rank: 390 KiB */
  int w = a->world, me = a->rank;
  float *buf = malloc((size_t)w * n * sizeof *buf);
  for (size_t i = 0; i < (size_t)w * n; i++)
    buf[i] = (float)(me + 1) * (float)(i % 1000);
  int r = nc.reduce_scatter(buf, buf + (size_t)me * n, n, ncclFloat32, ncclSum, c, NULL);
  CHECK(r == 0, "rank %d: reduce-scatter in place of %zu floats per rank", me, n);
  float sumw = (float)(w * (w + 1) / 2);
  size_t bad = 0;
  for (size_t i = 0; i < n; i++)
    bad += buf[(size_t)me * n + i] != sumw * (float)((me * n + i) % 1000);
  CHECK_EQ(bad, 0, "rank %d: every reduced element is right", me);
  r = nc.all_gather(buf + (size_t)me * n, buf, n, ncclFloat32, c, NULL);
  CHECK(r == 0, "rank %d: all-gather in place", me);
  bad = 0;
  for (size_t i = 0; i < (size_t)w * n; i++)
    bad += buf[i] != sumw * (float)(i % 1000);
  CHECK_EQ(bad, 0, "rank %d: every gathered element is right", me);
  /* Out of place, exactly the size asked: ASan sees any overrun. */
  float *small = malloc(3 * sizeof *small), *out = malloc((size_t)w * 3 * sizeof *out);
  for (int i = 0; i < 3; i++)
    small[i] = (float)(10 * me + i);
  CHECK(nc.all_gather(small, out, 3, ncclFloat32, c, NULL) == 0 && out[3 * (w - 1) + 2] == (float)(10 * (w - 1) + 2),
        "rank %d: all-gather of 3 floats", me);
  free(small);
  free(out);
  free(buf);
}

/* Ranks disagreeing: NCCL's invalid usage on every rank, with a message. */
static void body_mismatch(rank_arg *a, ncclComm_t c) {
  float v[4] = {0};
  int r = nc.all_reduce(v, v, 2 + (size_t)a->rank, ncclFloat32, ncclSum, c, NULL);
  CHECK_EQ(r, ncclInvalidUsage, "rank %d: counts differ: %s", a->rank, nc.last(c));
  r = nc.all_reduce(v, v, 1, ncclFloat32, 4 /* ncclAvg */, c, NULL);
  CHECK_EQ(r, ncclInvalidArgument, "rank %d: the stand-in has no ncclAvg: %s", a->rank, nc.last(c));
  r = nc.all_reduce(v, v, 1, ncclFloat32, a->rank == 0 ? ncclMax : ncclMin, c, NULL);
  CHECK_EQ(r, ncclInvalidUsage, "rank %d: reductions differ: %s", a->rank, nc.last(c));
}

/* Byte i of the n-th message from rank `from` to rank `to`. */
static unsigned char p2p_byte(int from, int to, int n, size_t i) { return (unsigned char)(from * 31 + to * 7 + n * 101 + i); }

/* Every rank sends two messages to every rank (itself included) in one
 * group: 100 KiB + to (more than three pieces), then 5 bytes, into buffers of
 * exactly their size (ASan sees an overrun). Then a lone send and receive,
 * sizes that differ, a peer that never sends, a send of 0 elements. */
static void body_p2p(rank_arg *a, ncclComm_t c) {
  int w = a->world, me = a->rank;
  unsigned char *out[8][2], *in[8][2];
  size_t size[2] = {100 << 10, 5};
  for (int p = 0; p < w; p++)
    for (int k = 0; k < 2; k++) {
      size_t n = size[k] + (k == 0 ? (size_t)p : 0), m = size[k] + (k == 0 ? (size_t)me : 0);
      out[p][k] = malloc(n);
      in[p][k] = malloc(m);
      for (size_t i = 0; i < n; i++)
        out[p][k][i] = p2p_byte(me, p, k, i);
    }
  int refused = nc.group_start() != 0;
  for (int p = 0; p < w; p++)
    for (int k = 0; k < 2; k++) {
      refused += nc.send(out[p][k], size[k] + (k == 0 ? (size_t)p : 0), 0, p, c, NULL) != 0;
      refused += nc.recv(in[p][k], size[k] + (k == 0 ? (size_t)me : 0), 0, p, c, NULL) != 0;
    }
  CHECK_EQ(refused, 0, "rank %d: ncclGroupStart and every ncclSend and ncclRecv of the group", me);
  int r = nc.group_end();
  CHECK(r == 0, "rank %d: ncclGroupEnd: %d %s", me, r, nc.last(c));
  for (int p = 0; p < w; p++)
    for (int k = 0; k < 2; k++) {
      size_t m = size[k] + (k == 0 ? (size_t)me : 0), bad = 0;
      for (size_t i = 0; i < m; i++)
        bad += in[p][k][i] != p2p_byte(p, me, k, i);
      CHECK_EQ(bad, 0, "rank %d: message %d from rank %d arrived whole and in order", me, k, p);
      free(out[p][k]);
      free(in[p][k]);
    }
  /* A lone send (a group of one) from rank 0 to rank 1. */
  int v = 1234 + me, got = 0;
  if (me == 0)
    CHECK(nc.send(&v, 1, ncclInt32, 1, c, NULL) == 0, "a lone ncclSend");
  if (me == 1) {
    r = nc.recv(&got, 1, ncclInt32, 0, c, NULL);
    CHECK(r == 0 && got == 1234, "a lone ncclRecv: %d, got %d", r, got);
  }
  /* Rank 0 sends 10 bytes to rank 1, which expects 12: its receive fails
   * naming both, the send completes. */
  unsigned char ten[10] = {0}, twelve[12] = {0};
  if (me == 0)
    CHECK(nc.send(ten, 10, 0, 1, c, NULL) == 0, "a send that the receiver refuses still completes");
  if (me == 1) {
    r = nc.recv(twelve, 12, 0, 0, c, NULL);
    CHECK(r == ncclInvalidUsage && strstr(nc.last(c), "ncclRecv of 12 bytes from rank 0, which sends 10") != NULL,
          "sizes that differ: %d %s", r, nc.last(c));
  }
  /* Rank 2 waits for rank 1, which sends nothing: ncclRemoteError after
   * the timeout, naming the peer. */
  if (me == 2) {
    r = nc.recv(&got, 1, ncclInt32, 1, c, NULL);
    CHECK(r == ncclRemoteError && strstr(nc.last(c), "ncclRecv of 4 bytes from rank 1 did not complete") != NULL,
          "a peer that never sends: %d %s", r, nc.last(c));
  }
  CHECK(nc.send(NULL, 0, ncclInt32, (me + 1) % w, c, NULL) == 0, "rank %d: a send of 0 elements moves nothing", me);
  CHECK(nc.group_end() == ncclInvalidUsage, "rank %d: ncclGroupEnd without ncclGroupStart", me);
  CHECK(nc.send(&v, 1, ncclInt32, w, c, NULL) == ncclInvalidArgument, "rank %d: a peer out of range", me);
}

/* Split by parity, keys reversing the order; rank 3 takes no color. */
static void body_split(rank_arg *a, ncclComm_t c) {
  ncclComm_t child = NULL;
  int color = a->rank == 3 ? -1 : a->rank % 2;
  CHECK(nc.split(c, color, -a->rank, &child, NULL) == 0, "rank %d: ncclCommSplit", a->rank);
  if (a->rank == 3) {
    CHECK(child == NULL, "NCCL_SPLIT_NOCOLOR gives no communicator");
    return;
  }
  int n = -1, r = -1;
  nc.count(child, &n);
  nc.user_rank(child, &r);
  int want_n = a->rank % 2 == 0 ? 2 : 1, want_r = a->rank == 0 ? 1 : 0;
  CHECK(n == want_n && r == want_r, "rank %d: child of %d ranks, rank %d (want %d, %d)", a->rank, n, r, want_n, want_r);
  int32_t v = a->rank, g[2] = {-1, -1};
  CHECK(nc.all_gather(&v, g, 1, ncclInt32, child, NULL) == 0, "all-gather on the child");
  if (a->rank % 2 == 0)
    CHECK(g[0] == 2 && g[1] == 0, "rank %d: the child's order is by key: %d, %d", a->rank, g[0], g[1]);
  CHECK(nc.destroy(child) == 0, "destroy the child");
}

static void body_signals(rank_arg *a, ncclComm_t c) {
  int w = a->world, me = a->rank, next = (me + 1) % w, prev = (me + w - 1) % w;
  for (int i = 0; i < 3; i++)
    CHECK(nc.signal(next, 0, 0, 0, c, NULL) == 0, "rank %d: signal %d to %d", me, i, next);
  ncclWaitSignalDesc_t d = {3, prev, 0, 0};
  CHECK(nc.wait_signal(1, &d, c, NULL) == 0, "rank %d: three signals from %d", me, prev);
  d.opCnt = 1;
  double t0 = check_now_s();
  int r = nc.wait_signal(1, &d, c, NULL);
  CHECK(r == ncclRemoteError && strstr(nc.last(c), "waited") != NULL && check_now_s() - t0 < 10,
        "rank %d: a fourth never comes: a bounded wait (%.1f s): %s", me, check_now_s() - t0, nc.last(c));
  CHECK_EQ(nc.signal(next, 1, 0, 0, c, NULL), ncclInvalidArgument, "rank %d: signal index 1: %s", me, nc.last(c));
  CHECK_EQ(nc.signal(w, 0, 0, 0, c, NULL), ncclInvalidArgument, "rank %d: no peer %d", me, w);
}

/* ---- process ranks: machines -------------------------------------------- */

static int rank_machines(const char *name, int rank, int world) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  check_prefix_ = prefix;
  if (load(getenv("FAKENCCL_LIB_UNDER_TEST")) == NULL)
    return check_summary();
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "fakenccl-%s", name);
  ncclComm_t c = NULL;
  if (!CHECK(nc.init(&c, world, id, rank) == 0, "ncclCommInitRank"))
    return check_summary();
  /* Every rank's machine through an all-gather, as a group learns it. */
  char mine[16] = {0}, all[8][16];
  snprintf(mine, sizeof mine, "%s", getenv("SYMMEM_MACHINE_ID"));
  CHECK(nc.all_gather(mine, all, sizeof mine, 1, c, NULL) == 0, "all-gather the machines");
  int lo = rank, hi = rank;
  while (lo > 0 && !strcmp(all[lo - 1], mine))
    lo--;
  while (hi + 1 < world && !strcmp(all[hi + 1], mine))
    hi++;
  ncclTeam_t t = nc.team_lsa(c);
  CHECK(t.nRanks == hi - lo + 1 && t.rank == rank - lo && t.stride == 1, "machine %s: LSA team of %d ranks, rank %d, stride %d",
        mine, t.nRanks, t.rank, t.stride);
  size_t size = 8192;
  int fd = memfd_create("fakenccl-win", 0);
  CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0, "memfd");
  int32_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  mem[0] = 1000 + rank;
  ncclWindow_t win = NULL;
  CHECK(nc.reg(c, mem, size, &win, 1) == 0, "register a window");
  for (int p = 0; p < world; p++) {
    void *ptr = (void *)1;
    CHECK(nc.peer_ptr(win, 0, p, &ptr) == 0, "peer pointer of %d", p);
    if (strcmp(all[p], mine))
      CHECK(ptr == NULL, "rank %d is on machine %s: no pointer from %s", p, all[p], mine);
    else
      CHECK(ptr != NULL && *(int32_t *)ptr == 1000 + p, "rank %d on this machine: its bytes through the pointer", p);
  }
  CHECK(nc.dereg(c, win) == 0, "deregister");
  int32_t one = 1, sum = 0;
  CHECK(nc.all_reduce(&one, &sum, 1, ncclInt32, ncclSum, c, NULL) == 0 && sum == world, "a sum across machines");
  munmap(mem, size);
  close(fd);
  nc.destroy(c);
  return check_summary();
}

static void run_machines(const char *self, const char *lib, const char *const machines[], int world) {
  char name[64];
  snprintf(name, sizeof name, "tfm-%d-%d", (int)getpid(), world);
  size_t ne = 0;
  while (environ[ne])
    ne++;
  char **env = calloc(ne + 4, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_MACHINE_ID=", 18))
      env[k++] = environ[i];
  char libvar[4200], mvar[8][64], rank_s[8][16], world_s[16];
  snprintf(libvar, sizeof libvar, "FAKENCCL_LIB_UNDER_TEST=%s", lib);
  env[k++] = libvar;
  env[k++] = "FAKENCCL_TIMEOUT_MS=20000";
  snprintf(world_s, sizeof world_s, "%d", world);
  pid_t pid[8];
  int out[8];
  for (int r = 0; r < world; r++) {
    snprintf(mvar[r], sizeof mvar[r], "SYMMEM_MACHINE_ID=%s", machines[r]);
    env[k] = mvar[r];
    env[k + 1] = NULL;
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    out[r] = check_tmpfd("fakenccl-out");
    char *argv[] = {(char *)self, "--machines", name, rank_s[r], world_s, NULL};
    pid[r] = check_spawn_self(argv, env, out[r], out[r]);
  }
  for (int r = 0; r < world; r++) {
    int status = pid[r] > 0 ? check_wait_pid(pid[r], 60) : -1;
    char prefix[32], sb[128];
    snprintf(prefix, sizeof prefix, "[rank %d] ", r);
    char *o = check_read_fd(out[r]);
    int fails = check_count_output(o ? o : "", prefix);
    if (fails)
      fputs(o, stdout);
    free(o);
    close(out[r]);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && fails == 0,
          "machines job %s: rank %d on %s (%s, %d failed checks)", name, r, machines[r],
          check_status_str(status, sb, sizeof sb), fails);
  }
  free(env);
}

/* ---- stream order with the stand-in driver ------------------------------ */

static uint32_t order_flag;

static void *release_flag(void *arg) {
  (void)arg;
  usleep(200 * 1000);
  __atomic_store_n(&order_flag, 1, __ATOMIC_SEQ_CST);
  return NULL;
}

/* A stream waits for a flag, then sets the input; the all-reduce enqueued
 * after them must see the input set, however late the flag comes. */
static void check_stream_order(const char *cuda_path) {
  void *cu = dlopen(cuda_path, RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(cu != NULL, "dlopen the stand-in driver %s", cuda_path))
    return;
  setenv("SYMMEM_LIBCUDA", cuda_path, 1); /* where the NCCL stand-in finds it */
  int (*init)(unsigned) = (int (*)(unsigned))dlsym(cu, "cuInit");
  int (*dev_get)(int *, int) = (int (*)(int *, int))dlsym(cu, "cuDeviceGet");
  int (*retain)(void **, int) = (int (*)(void **, int))dlsym(cu, "cuDevicePrimaryCtxRetain");
  int (*set_cur)(void *) = (int (*)(void *))dlsym(cu, "cuCtxSetCurrent");
  int (*stream_create)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(cu, "cuStreamCreate");
  int (*wait32)(void *, unsigned long long, uint32_t, unsigned) =
      (int (*)(void *, unsigned long long, uint32_t, unsigned))dlsym(cu, "cuStreamWaitValue32_v2");
  int (*memset8)(unsigned long long, unsigned char, size_t, void *) =
      (int (*)(unsigned long long, unsigned char, size_t, void *))dlsym(cu, "cuMemsetD8Async");
  int (*sync)(void *) = (int (*)(void *))dlsym(cu, "cuStreamSynchronize");
  int d = -1;
  void *ctx = NULL, *stream = NULL;
  if (!CHECK(init && dev_get && retain && set_cur && stream_create && wait32 && memset8 && sync &&
                 init(0) == 0 && dev_get(&d, 0) == 0 && retain(&ctx, d) == 0 && set_cur(ctx) == 0 &&
                 stream_create(&stream, 0) == 0,
             "the stand-in driver gives a context and a stream"))
    return;
  ncclComm_t c = NULL;
  if (!CHECK(nc.init(&c, 1, make_id("order"), 0) == 0, "a communicator of one rank"))
    return;
  int32_t in[4] = {0}, out[4] = {0};
  order_flag = 0;
  CHECK(wait32(stream, (unsigned long long)(uintptr_t)&order_flag, 1, 0 /* GEQ */) == 0 &&
            memset8((unsigned long long)(uintptr_t)in, 1, sizeof in, stream) == 0,
        "queue a wait for the flag, then the input");
  pthread_t th;
  pthread_create(&th, NULL, release_flag, NULL);
  double t0 = check_now_s();
  int r = nc.all_reduce(in, out, 4, ncclInt32, ncclSum, c, stream);
  double waited = check_now_s() - t0;
  CHECK(r == 0 && out[0] == 0x01010101 && out[3] == 0x01010101,
        "the all-reduce ran after the queued work (out %#x, waited %.2f s)", (unsigned)out[0], waited);
  CHECK(waited > 0.1, "it waited for the flag (%.2f s)", waited);
  pthread_join(th, NULL);
  sync(stream);
  nc.destroy(c);
  unsetenv("SYMMEM_LIBCUDA");
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--machines"))
    return rank_machines(argv[2], atoi(argv[3]), atoi(argv[4]));
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *e = getenv("FAKENCCL_LIB"), *e228 = getenv("FAKENCCL_LIB_228");
  char lib[4096], lib228[4096];
  if (realpath(e && *e ? e : "build/libnccl_fake.so", lib) == NULL ||
      realpath(e228 && *e228 ? e228 : "build/libnccl_fake_228.so", lib228) == NULL) {
    CHECK(0, "the NCCL stand-ins are built (make build/libnccl_fake.so build/libnccl_fake_228.so)");
    return check_summary();
  }
  setenv("FAKENCCL_TIMEOUT_MS", "1500", 1); /* the signal test's bounded wait */

  /* The 2.28 stand-in first (its own copy: a library loads once). */
  void *old = dlopen(lib228, RTLD_NOW | RTLD_LOCAL);
  if (CHECK(old != NULL, "dlopen %s", lib228)) {
    int (*ver)(int *) = (int (*)(int *))dlsym(old, "ncclGetVersion");
    int v = 0;
    CHECK(ver != NULL && ver(&v) == 0 && v == 22809, "the 2.28 stand-in is NCCL 2.28.9 (%d)", v);
    const char *later[] = {"ncclGetPeerDevicePointer", "ncclSignal", "ncclWaitSignal", "ncclPutSignal", "ncclTeamLsa"};
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++)
      CHECK(dlsym(old, later[i]) == NULL, "the 2.28 stand-in has no %s", later[i]);
    CHECK(dlsym(old, "ncclAllReduce") != NULL && dlsym(old, "ncclCommSplit") != NULL,
          "the 2.28 stand-in has the collectives and splits");
    dlclose(old);
  }

  if (load(lib) == NULL)
    return check_summary();
  int v = 0;
  CHECK(nc.version(&v) == 0 && v == 22900, "the stand-in is NCCL 2.29.0 (%d)", v);
  CHECK(nc.signal && nc.wait_signal && nc.peer_ptr && nc.team_lsa, "it has 2.29's functions");
  run_threads("rounding", 3, body_rounding);
  run_threads("large", 3, body_large);
  run_threads("mismatch", 2, body_mismatch);
  run_threads("split", 4, body_split);
  run_threads("signals", 3, body_signals);
  run_threads("p2p", 3, body_p2p);

  const char *cu = getenv("SYMMEM_LIBCUDA");
  char cuda_path[4096];
  if (realpath(cu && *cu ? cu : "build/libcuda_fake.so", cuda_path) != NULL)
    check_stream_order(cuda_path);
  else
    CHECK(0, "the stand-in driver is built (make build/libcuda_fake.so)");

  const char *two_by_two[] = {"a", "a", "b", "b"}, *three[] = {"a", "b", "c"};
  run_machines(argv[0], lib, two_by_two, 4);
  run_machines(argv[0], lib, three, 3);
  return check_summary();
}
