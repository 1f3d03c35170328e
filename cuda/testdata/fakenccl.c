/*
 * fakenccl.c - a stand-in for libnccl.so.2, for running libsymmem's NCCL path
 * on machines without a GPU (with the host backend or fakecuda.c). It exports
 * the functions libsymmem calls (cuda/nccl.h) plus the few a test needs to
 * make a communicator, with nccl.h's signatures, on host memory:
 *
 *   - ncclGetUniqueId / ncclCommInitRank / ncclCommDestroy / ncclCommAbort:
 *     a communicator is a shared file, $TMPDIR/fakenccl-<unique id>, that the
 *     ranks (processes) map; ncclCommCuDevice is $FAKENCCL_DEVICE (default 0);
 *   - ncclAllGather, ncclAllReduce, ncclReduceScatter through that file, on
 *     the calling thread: the data is there when the call returns. Where the
 *     stand-in driver is in the process ($SYMMEM_LIBCUDA, loaded), a call
 *     first waits for the work already queued on its stream
 *     (cuStreamSynchronize), so that it sees what came before it in stream
 *     order as NCCL's kernel would. Types: all-gather takes any; the
 *     reductions (sum, max, min) take ncclInt32 (wrapping), ncclFloat16,
 *     ncclFloat32 and ncclBfloat16: every rank reduces every element in
 *     rank order, the 16-bit types accumulated in float and rounded to
 *     nearest even once, max and min as fmaxf/fminf. In place as NCCL
 *     defines it. Messages of any size travel in pieces of at most 256 KiB
 *     per rank. A rank that does not arrive within $FAKENCCL_TIMEOUT_MS
 *     (default 120000) makes it fail with ncclRemoteError ("remote process
 *     exited or there was a network error", what NCCL reports for a peer
 *     that is gone) and a last error naming the rank;
 *     ranks passing different counts, types or reductions fail with
 *     ncclInvalidUsage;
 *   - ncclCommSplit: collective; ranks of one color (NCCL_SPLIT_NOCOLOR -1:
 *     none) get a new communicator ordered by (key, rank), on the parent's
 *     device; the config argument is ignored;
 *   - every rank publishes its machine at ncclCommInitRank: $SYMMEM_MACHINE_ID
 *     when set (how tests imitate several machines on one host), else the
 *     host name and boot id;
 *   - the one-sided API of NCCL 2.29 (ncclSignal, ncclWaitSignal,
 *     ncclPutSignal), with NCCL 2.29's rule that signal index, context and
 *     flags are 0: a count of signals per (receiver, sender) in the shared
 *     file; ncclWaitSignal waits (on the calling thread) until opCnt more
 *     signals than it consumed before have arrived, or fails with
 *     ncclRemoteError after $FAKENCCL_TIMEOUT_MS; ncclPutSignal copies into
 *     the peer's window (the source must lie in a window of the
 *     communicator, as NCCL requires) before its signal;
 *     $FAKENCCL_NO_HOST_RMA=1 refuses all three with ncclInvalidArgument, as
 *     NCCL 2.29 does on a communicator without host RMA support;
 *   - ncclSend / ncclRecv between ncclGroupStart and ncclGroupEnd (NCCL 2.7),
 *     or alone (a group of one): bytes of any datatype travel through a
 *     mailbox per (sender, receiver) in the shared file, in pieces of at
 *     most 32 KiB; ncclGroupEnd moves every transfer of the group at once
 *     (a sender writes into an empty mailbox, a receiver empties a full
 *     one, round after round), so that no transfer waits for another of
 *     its group, and between two ranks the transfers match in the order
 *     posted, as in NCCL; a rank may send to itself. A receive whose size
 *     differs from its send fails with ncclInvalidUsage naming both (the
 *     message is drained, so the sender finishes); a peer that does not
 *     take part within $FAKENCCL_TIMEOUT_MS fails it with ncclRemoteError
 *     naming the peer. A send or receive of 0 elements moves nothing;
 *   - ncclTeamLsa: the consecutive ranks around this one on its machine;
 *     ncclTeamWorld: every rank;
 *   - ncclCommWindowRegister: collective (an all-gather of address, size and
 *     flags); refuses addresses or sizes not multiples of 4096 and sizes that
 *     differ between ranks, as NCCL's symmetric registration does; with
 *     $FAKENCCL_STRICT_FIRST_OP=1 it fails when it is the first operation on
 *     the communicator (pytorch issue 188567's trap);
 *     ncclCommWindowDeregister: local; a second deregistration of a window is
 *     ncclInvalidUsage, and so is a window whose memory is no longer mapped
 *     (released before its deregistration). Every registration and deregistration is appended to
 *     $FAKENCCL_LOG when set ("register <rank> <addr> <size> <win>",
 *     "deregister <rank> <win>"), and fakenccl_window_counts() reports them;
 *   - ncclGetPeerDevicePointer (NCCL 2.29): a peer's window, mapped here by
 *     opening the memfd behind it through /proc/<pid>/fd (the host
 *     backend's and fakecuda's memory are memfds); NULL for a peer on
 *     another machine, as NCCL gives for a peer outside its LSA team;
 *     $FAKENCCL_PEER_SKEW=n makes the pointers n bytes wrong, as a broken
 *     NCCL would;
 *   - ncclGetVersion is $FAKENCCL_VERSION, else 22900.
 *
 * Built with -DFAKENCCL_NO_PEER_POINTER it is NCCL 2.28.9: none of the
 * functions that came with 2.29 (ncclGetPeerDevicePointer, ncclSignal,
 * ncclWaitSignal, ncclPutSignal) nor ncclTeamLsa are exported, and the
 * version is 22809.
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl_fake.so fakenccl.c -lpthread
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#ifdef FAKENCCL_NO_PEER_POINTER
#define FAKENCCL_228 1
#endif

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6
} ncclResult_t;

typedef struct {
  char internal[128];
} ncclUniqueId;

#define FAKE_MAX_RANKS 64
#define FAKE_SLOT_BYTES (256 << 10) /* the most one rank posts per exchange */
#define FAKE_MAX_WINDOWS 1024
#define FAKE_MACHINE_BYTES 160
#define FAKE_BOX_BYTES (32 << 10) /* one piece of a point-to-point transfer */

/* One rank's part of the shared file. Gen k's data is in data[k % 2];
 * posted = k+1 once written, consumed = k+1 once every rank's gen k was
 * read. Gen k may be written once every rank has consumed gen k-2. */
typedef struct fake_slot {
  volatile uint64_t posted, consumed;
  uint64_t len[2];
  char data[2][FAKE_SLOT_BYTES];
} fake_slot;

/* The shared file. machine[r] is written by rank r before it counts itself
 * in joined, and read only once joined == nranks. signals[to][from] counts
 * the signals rank `from` sent to rank `to` (only ever incremented). */
typedef struct fake_shared {
  volatile int32_t joined;
  int32_t nranks;
  char machine[FAKE_MAX_RANKS][FAKE_MACHINE_BYTES];
  volatile uint64_t signals[FAKE_MAX_RANKS][FAKE_MAX_RANKS];
  fake_slot slot[];
} fake_shared;

/* The mailbox of one (sender, receiver) pair, after the slots: piece k is
 * written when posted == consumed == k and read when posted == k+1;
 * total is the whole transfer's size, len the piece's. */
typedef struct fake_box {
  volatile uint64_t posted, consumed;
  uint64_t total, len;
  char data[FAKE_BOX_BYTES];
} fake_box;

typedef struct fake_window {
  struct ncclComm *comm;
  char *addr;
  size_t size;
  int live;
  /* every rank's window as published at registration */
  struct {
    int32_t pid, fd;
    uint64_t off, size;
  } peer[FAKE_MAX_RANKS];
  void *mapped[FAKE_MAX_RANKS]; /* peers' memory mapped here, lazily */
} fake_window;

struct ncclComm {
  fake_shared *sh;
  size_t shsize;
  int rank, nranks, device;
  char id[128]; /* its unique id, for naming the communicators split from it */
  int splits;   /* ncclCommSplit calls so far */
  uint64_t consumed[FAKE_MAX_RANKS]; /* signals from each rank a wait has counted */
  uint64_t gen; /* exchanges so far */
  fake_window *windows[FAKE_MAX_WINDOWS]; /* every window made, freed with the comm */
  int nwindows;
  char last[512];
};
typedef struct ncclComm *ncclComm_t;
typedef fake_window *ncclWindow_t;
typedef struct CUstream_st *cudaStream_t;

typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

typedef struct {
  int nRanks, rank, stride;
} ncclTeam_t;

/* ncclDataType_t and ncclRedOp_t values used here. */
enum { fakeInt32 = 2, fakeFloat16 = 6, fakeFloat32 = 7, fakeBfloat16 = 9 };
enum { fakeSum = 0, fakeMax = 2, fakeMin = 3 };

static char fake_global_last[512];
static int fake_registered, fake_deregistered;

static int fake_version(void) {
  const char *s = getenv("FAKENCCL_VERSION");
  if (s != NULL && *s)
    return atoi(s);
#ifdef FAKENCCL_228
  return 22809;
#else
  return 22900;
#endif
}

static ncclResult_t fail(ncclComm_t c, ncclResult_t r, const char *fmt, const char *what) {
  char *buf = c != NULL ? c->last : fake_global_last;
  snprintf(buf, 512, fmt, what);
  return r;
}

/* fail with a formatted message. */
__attribute__((format(printf, 3, 4))) static ncclResult_t failf(ncclComm_t c, ncclResult_t r, const char *fmt, ...) {
  char *buf = c != NULL ? c->last : fake_global_last;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, 512, fmt, ap);
  va_end(ap);
  return r;
}

static void logf_(const char *line) {
  const char *p = getenv("FAKENCCL_LOG");
  if (p == NULL || !*p)
    return;
  int fd = open(p, O_WRONLY | O_APPEND | O_CREAT, 0600);
  if (fd < 0)
    return;
  (void)!write(fd, line, strlen(line));
  close(fd);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long timeout_ms(void) {
  const char *s = getenv("FAKENCCL_TIMEOUT_MS");
  return s != NULL && *s ? atol(s) : 120000;
}

/* This process's machine: $SYMMEM_MACHINE_ID, else host name and boot id. */
static void machine_identity(char *buf, size_t len) {
  const char *m = getenv("SYMMEM_MACHINE_ID");
  if (m != NULL && *m) {
    snprintf(buf, len, "id:%s", m);
    return;
  }
  char host[64] = "", boot[48] = "";
  gethostname(host, sizeof host - 1);
  int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, boot, sizeof boot - 1);
    boot[n > 0 ? n : 0] = 0;
    close(fd);
    boot[strcspn(boot, "\n")] = 0;
  }
  snprintf(buf, len, "host:%s/%s", host, boot);
}

/* Whether ranks a and b published the same machine. */
__attribute__((unused)) static int same_machine(ncclComm_t c, int a, int b) {
  return strncmp(c->sh->machine[a], c->sh->machine[b], FAKE_MACHINE_BYTES) == 0;
}

/* Waits for the work queued on stream before a call when the stand-in
 * driver is loaded ($SYMMEM_LIBCUDA): NCCL's work runs in stream order. */
typedef int (*fake_cu_sync_fn)(cudaStream_t);
static pthread_mutex_t fake_cu_mu = PTHREAD_MUTEX_INITIALIZER;
static fake_cu_sync_fn fake_cu_sync;

static ncclResult_t stream_order(ncclComm_t c, cudaStream_t stream, const char *call) {
  pthread_mutex_lock(&fake_cu_mu);
  if (fake_cu_sync == NULL) {
    const char *p = getenv("SYMMEM_LIBCUDA");
    void *h = p != NULL && *p ? dlopen(p, RTLD_LAZY | RTLD_NOLOAD) : NULL;
    if (h != NULL)
      fake_cu_sync = (fake_cu_sync_fn)dlsym(h, "cuStreamSynchronize"); /* h stays open: the driver stays */
  }
  fake_cu_sync_fn sync = fake_cu_sync;
  pthread_mutex_unlock(&fake_cu_mu);
  if (sync == NULL)
    return ncclSuccess;
  int r = sync(stream);
  if (r != 0)
    return failf(c, ncclUnhandledCudaError, "fake: %s: cuStreamSynchronize(%p) of the call's stream failed with %d", call,
                 (void *)stream, r);
  return ncclSuccess;
}

/* ---- the public functions ------------------------------------------------ */

ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL)
    return ncclInvalidArgument;
  *version = fake_version();
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
  case ncclSuccess: return "no error";
  case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
  case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
  case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
  case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
  case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
  case ncclRemoteError: return "remote process exited or there was a network error";
  default: return "unknown result code";
  }
}

const char *ncclGetLastError(ncclComm_t comm) { return comm != NULL ? comm->last : fake_global_last; }

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == NULL)
    return ncclInvalidArgument;
  memset(id, 0, sizeof *id);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(id->internal, sizeof id->internal, "fakenccl-%d-%ld-%ld", (int)getpid(), (long)ts.tv_sec, ts.tv_nsec);
  return ncclSuccess;
}

static void shared_path(const ncclUniqueId *id, char *buf, size_t len) {
  const char *dir = getenv("TMPDIR");
  snprintf(buf, len, "%s/%.100s", dir != NULL && *dir ? dir : "/tmp", id->internal);
}

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
  if (out == NULL || nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks ||
      strncmp(id.internal, "fakenccl-", 9) != 0)
    return fail(NULL, ncclInvalidArgument, "fake: ncclCommInitRank: bad arguments%s", "");
  char path[256];
  shared_path(&id, path, sizeof path);
  size_t size = sizeof(fake_shared) + (size_t)nranks * sizeof(fake_slot) + (size_t)nranks * nranks * sizeof(fake_box);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
    if (fd >= 0)
      close(fd);
    return fail(NULL, ncclSystemError, "fake: cannot create %s", path);
  }
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return fail(NULL, ncclSystemError, "fake: cannot map %s", path);
  ncclComm_t c = calloc(1, sizeof *c);
  c->sh = p;
  c->shsize = size;
  c->rank = rank;
  c->nranks = nranks;
  snprintf(c->id, sizeof c->id, "%.127s", id.internal);
  const char *d = getenv("FAKENCCL_DEVICE");
  c->device = d != NULL && *d ? atoi(d) : 0;
  machine_identity(c->sh->machine[rank], FAKE_MACHINE_BYTES);
  __atomic_fetch_add(&c->sh->joined, 1, __ATOMIC_SEQ_CST);
  /* Like NCCL, initialisation is collective: wait for every rank. */
  double end = now_ms() + timeout_ms();
  while (__atomic_load_n(&c->sh->joined, __ATOMIC_SEQ_CST) < nranks) {
    if (now_ms() > end) {
      munmap(p, size);
      free(c);
      return fail(NULL, ncclSystemError, "fake: ncclCommInitRank: not every rank joined%s", "");
    }
    usleep(100);
  }
  if (rank == 0)
    unlink(path); /* everyone has it mapped */
  *out = c;
  return ncclSuccess;
}

static void unmap_peers(fake_window *w);

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == NULL)
    return ncclSuccess;
  for (int i = 0; i < c->nwindows; i++) {
    if (c->windows[i]->live)
      unmap_peers(c->windows[i]);
    free(c->windows[i]);
  }
  munmap(c->sh, c->shsize);
  free(c);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }

ncclResult_t ncclCommUserRank(const ncclComm_t c, int *rank) {
  if (c == NULL || rank == NULL)
    return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int *count) {
  if (c == NULL || count == NULL)
    return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int *device) {
  if (c == NULL || device == NULL)
    return ncclInvalidArgument;
  *device = c->device;
  return ncclSuccess;
}

/* Waits until every rank's field reaches v. */
static int wait_all(ncclComm_t c, int consumed, uint64_t v) {
  double end = now_ms() + timeout_ms();
  for (int r = 0; r < c->nranks; r++) {
    fake_slot *s = &c->sh->slot[r];
    while ((consumed ? __atomic_load_n(&s->consumed, __ATOMIC_ACQUIRE)
                     : __atomic_load_n(&s->posted, __ATOMIC_ACQUIRE)) < v) {
      if (now_ms() > end) {
        snprintf(c->last, sizeof c->last, "fake: rank %d did not arrive at collective %" PRIu64 " within %ld ms",
                 r, v, timeout_ms());
        return -1;
      }
      usleep(50);
    }
  }
  return 0;
}

/* The bytes every rank contributed to one collective. */
static ncclResult_t gather(ncclComm_t c, const void *send, size_t n, void *recv) {
  if (n > FAKE_SLOT_BYTES)
    return fail(c, ncclInvalidArgument, "fake: an all-gather of more than 256 KiB per rank%s", "");
  uint64_t k = c->gen++;
  fake_slot *me = &c->sh->slot[c->rank];
  if (k >= 2 && wait_all(c, 1, k - 1) != 0)
    return ncclRemoteError;
  memcpy(me->data[k % 2], send, n);
  me->len[k % 2] = n;
  __atomic_store_n(&me->posted, k + 1, __ATOMIC_RELEASE);
  if (wait_all(c, 0, k + 1) != 0)
    return ncclRemoteError;
  ncclResult_t res = ncclSuccess;
  for (int r = 0; r < c->nranks; r++) {
    fake_slot *s = &c->sh->slot[r];
    if (s->len[k % 2] != n) {
      snprintf(c->last, sizeof c->last, "fake: rank %d gathers %" PRIu64 " bytes, rank %d %zu", r,
               s->len[k % 2], c->rank, n);
      res = ncclInvalidUsage;
      continue;
    }
    memcpy((char *)recv + (size_t)r * n, s->data[k % 2], n);
  }
  __atomic_store_n(&me->consumed, k + 1, __ATOMIC_RELEASE);
  return res;
}

/* ---- typed collectives --------------------------------------------------- */

static size_t type_size(int t) {
  switch (t) {
  case 0: case 1: case 10: case 11: return 1; /* int8, uint8, fp8 e4m3, e5m2 */
  case 6: case 9: return 2;                   /* float16, bfloat16 */
  case 2: case 3: case 7: return 4;           /* int32, uint32, float32 */
  case 4: case 5: case 8: return 8;           /* int64, uint64, float64 */
  default: return 0;
  }
}

static float f32_of(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static uint32_t bits_of(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

static float bf16_to_float(uint16_t h) { return f32_of((uint32_t)h << 16); }

/* Round to nearest even; NaN stays a quiet NaN. */
static uint16_t float_to_bf16(float f) {
  uint32_t b = bits_of(f);
  if ((b & 0x7fffffff) > 0x7f800000)
    return (uint16_t)((b >> 16) | 0x40);
  b += 0x7fff + ((b >> 16) & 1);
  return (uint16_t)(b >> 16);
}

static float f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f)
    return f32_of(sign | 0x7f800000 | man << 13);
  if (exp == 0) { /* zero or subnormal: man * 2^-24 */
    float f = (float)man * (1.0f / 16777216.0f);
    return sign ? -f : f;
  }
  return f32_of(sign | (exp + 112) << 23 | man << 13);
}

/* Round to nearest even, overflow to infinity, NaN stays a quiet NaN. */
static uint16_t float_to_f16(float f) {
  uint32_t b = bits_of(f);
  uint16_t sign = (uint16_t)((b >> 16) & 0x8000);
  int exp = (int)((b >> 23) & 0xff);
  uint32_t man = b & 0x7fffff;
  if (exp == 0xff)
    return sign | (man != 0 ? 0x7e00 : 0x7c00);
  int e = exp - 127 + 15;
  if (e >= 31)
    return sign | 0x7c00;
  if (e <= 0) {
    int shift = 14 - e;
    if (shift > 24)
      return sign;
    man |= 0x800000;
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1)))
      h++;
    return sign | (uint16_t)h;
  }
  uint32_t h = (uint32_t)e << 10 | man >> 13, rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
    h++;
  return sign | (uint16_t)h;
}

/* op on two floats, max and min as fmaxf/fminf (a NaN yields the other). */
static float reduce_float(int op, float a, float b) {
  switch (op) {
  case fakeMax: return (a != a || b > a) ? b : a;
  case fakeMin: return (a != a || b < a) ? b : a;
  default: return a + b;
  }
}

static int32_t reduce_int(int op, int32_t a, int32_t b) {
  switch (op) {
  case fakeMax: return b > a ? b : a;
  case fakeMin: return b < a ? b : a;
  default: return (int32_t)((uint32_t)a + (uint32_t)b); /* wraps */
  }
}

static float load_float(int t, const char *p) {
  uint16_t h;
  uint32_t b;
  switch (t) {
  case fakeFloat16: memcpy(&h, p, 2); return f16_to_float(h);
  case fakeBfloat16: memcpy(&h, p, 2); return bf16_to_float(h);
  default: memcpy(&b, p, 4); return f32_of(b);
  }
}

static void store_float(int t, char *p, float v) {
  uint16_t h;
  switch (t) {
  case fakeFloat16: h = float_to_f16(v); memcpy(p, &h, 2); break;
  case fakeBfloat16: h = float_to_bf16(v); memcpy(p, &h, 2); break;
  default: memcpy(p, &v, 4); break;
  }
}

/* out[i] = op over ranks r in order of in[r*rank_stride + i*es], for m
 * elements: float accumulation for the floating types, rounded once. */
static void reduce_ranks(int t, int op, int nranks, const char *in, size_t rank_stride, size_t m, char *out) {
  size_t es = type_size(t);
  for (size_t i = 0; i < m; i++) {
    if (t == fakeInt32) {
      int32_t acc, v;
      memcpy(&acc, in + i * 4, 4);
      for (int r = 1; r < nranks; r++) {
        memcpy(&v, in + (size_t)r * rank_stride + i * 4, 4);
        acc = reduce_int(op, acc, v);
      }
      memcpy(out + i * 4, &acc, 4);
      continue;
    }
    float acc = load_float(t, in + i * es);
    for (int r = 1; r < nranks; r++)
      acc = reduce_float(op, acc, load_float(t, in + (size_t)r * rank_stride + i * es));
    store_float(t, out + i * es, acc);
  }
}

enum { kindAllGather = 1, kindAllReduce = 2, kindReduceScatter = 3 };

/* Checks a collective's arguments against every rank's: an exchange of
 * (kind, count, type, op), the same number of exchanges on every rank. */
static ncclResult_t agree(ncclComm_t c, const char *call, int kind, size_t count, int t, int op) {
  struct {
    int32_t kind, type, op, pad;
    uint64_t count;
  } mine = {kind, t, op, 0, count}, all[FAKE_MAX_RANKS];
  ncclResult_t r = gather(c, &mine, sizeof mine, all);
  if (r != ncclSuccess)
    return r;
  for (int i = 0; i < c->nranks; i++)
    if (all[i].kind != kind || all[i].count != count || all[i].type != t || all[i].op != op)
      return failf(c, ncclInvalidUsage,
                   "fake: %s: rank %d calls collective %d with %" PRIu64 " elements of type %d, op %d; rank %d "
                   "collective %d with %zu of type %d, op %d",
                   call, i, all[i].kind, all[i].count, all[i].type, all[i].op, c->rank, kind, count, t, op);
  return ncclSuccess;
}

/* Common checks of the three collectives. */
static ncclResult_t coll_args(ncclComm_t c, const char *call, const void *send, const void *recv, size_t count, int t,
                              int op, int reduces, cudaStream_t stream) {
  if (c == NULL)
    return failf(NULL, ncclInvalidArgument, "fake: %s: the communicator is NULL", call);
  if (count > 0 && (send == NULL || recv == NULL))
    return failf(c, ncclInvalidArgument, "fake: %s: NULL buffer", call);
  if (type_size(t) == 0)
    return failf(c, ncclInvalidArgument, "fake: %s: datatype %d is not an ncclDataType_t", call, t);
  if (reduces && t != fakeInt32 && t != fakeFloat16 && t != fakeFloat32 && t != fakeBfloat16)
    return failf(c, ncclInvalidArgument, "fake: %s: the stand-in reduces ncclInt32, ncclFloat16, ncclFloat32 and ncclBfloat16 only (got %d)",
                 call, t);
  if (reduces && op != fakeSum && op != fakeMax && op != fakeMin)
    return failf(c, ncclInvalidArgument, "fake: %s: the stand-in has ncclSum, ncclMax and ncclMin only (got %d)", call, op);
  return stream_order(c, stream, call);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype, ncclComm_t c,
                           cudaStream_t stream) {
  ncclResult_t r = coll_args(c, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, 0, 0, stream);
  if (r != ncclSuccess || (r = agree(c, "ncclAllGather", kindAllGather, sendcount, datatype, 0)) != ncclSuccess)
    return r;
  size_t bytes = sendcount * type_size(datatype);
  char *tmp = bytes > 0 ? malloc((size_t)c->nranks * FAKE_SLOT_BYTES) : NULL;
  if (bytes > 0 && tmp == NULL)
    return failf(c, ncclSystemError, "fake: ncclAllGather: out of host memory");
  for (size_t off = 0; off < bytes && r == ncclSuccess; off += FAKE_SLOT_BYTES) {
    size_t m = bytes - off < FAKE_SLOT_BYTES ? bytes - off : FAKE_SLOT_BYTES;
    r = gather(c, (const char *)sendbuff + off, m, tmp);
    for (int k = 0; k < c->nranks && r == ncclSuccess; k++)
      memcpy((char *)recvbuff + (size_t)k * bytes + off, tmp + (size_t)k * m, m);
  }
  free(tmp);
  return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, int datatype, int op, ncclComm_t c,
                           cudaStream_t stream) {
  ncclResult_t r = coll_args(c, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 1, stream);
  if (r != ncclSuccess || (r = agree(c, "ncclAllReduce", kindAllReduce, count, datatype, op)) != ncclSuccess)
    return r;
  size_t es = type_size(datatype), per = FAKE_SLOT_BYTES / es;
  char *tmp = count > 0 ? malloc((size_t)c->nranks * FAKE_SLOT_BYTES) : NULL;
  if (count > 0 && tmp == NULL)
    return failf(c, ncclSystemError, "fake: ncclAllReduce: out of host memory");
  for (size_t off = 0; off < count && r == ncclSuccess; off += per) {
    size_t m = count - off < per ? count - off : per;
    r = gather(c, (const char *)sendbuff + off * es, m * es, tmp);
    if (r == ncclSuccess)
      reduce_ranks(datatype, op, c->nranks, tmp, m * es, m, (char *)recvbuff + off * es);
  }
  free(tmp);
  return r;
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, int datatype, int op,
                               ncclComm_t c, cudaStream_t stream) {
  ncclResult_t r = coll_args(c, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, op, 1, stream);
  if (r != ncclSuccess || (r = agree(c, "ncclReduceScatter", kindReduceScatter, recvcount, datatype, op)) != ncclSuccess)
    return r;
  /* Each exchange carries, from every rank, m elements of every rank's slice. */
  size_t es = type_size(datatype), n = (size_t)c->nranks, per = FAKE_SLOT_BYTES / (n * es);
  char *pack = recvcount > 0 ? malloc(FAKE_SLOT_BYTES) : NULL;
  char *tmp = recvcount > 0 ? malloc(n * FAKE_SLOT_BYTES) : NULL;
  if (recvcount > 0 && (pack == NULL || tmp == NULL)) {
    free(pack);
    free(tmp);
    return failf(c, ncclSystemError, "fake: ncclReduceScatter: out of host memory");
  }
  for (size_t off = 0; off < recvcount && r == ncclSuccess; off += per) {
    size_t m = recvcount - off < per ? recvcount - off : per;
    for (size_t d = 0; d < n; d++)
      memcpy(pack + d * m * es, (const char *)sendbuff + (d * recvcount + off) * es, m * es);
    r = gather(c, pack, n * m * es, tmp);
    if (r == ncclSuccess)
      reduce_ranks(datatype, op, c->nranks, tmp + (size_t)c->rank * m * es, n * m * es, m,
                   (char *)recvbuff + off * es);
  }
  free(pack);
  free(tmp);
  return r;
}

/* ---- point-to-point transfers ----------------------------------------------- */

/* The mailbox from rank `from` to rank `to`. */
static fake_box *box_of(ncclComm_t c, int from, int to) {
  fake_box *boxes = (fake_box *)((char *)c->sh + sizeof(fake_shared) + (size_t)c->nranks * sizeof(fake_slot));
  return &boxes[(size_t)from * c->nranks + to];
}

/* One posted transfer of the calling thread's group. */
typedef struct fake_p2p {
  ncclComm_t comm;
  cudaStream_t stream;
  char *buf;
  size_t bytes, done;
  size_t total; /* a receive: the sender's size, once seen */
  int peer, recv, finished;
} fake_p2p;

static __thread int p2p_depth;         /* ncclGroupStart calls not yet ended */
static __thread fake_p2p *p2p_ops;     /* the group's transfers */
static __thread int p2p_n, p2p_cap;
static __thread ncclResult_t p2p_err;  /* the first failed ncclSend/ncclRecv of the group */
static __thread ncclComm_t p2p_err_comm;

ncclResult_t ncclGroupStart(void) {
  p2p_depth++;
  return ncclSuccess;
}

/* Moves every transfer of the group, round after round, until all are
 * done, one fails or the timeout passes. */
static ncclResult_t run_p2p(fake_p2p *ops, int n) {
  for (int k = 0; k < n; k++) {
    if (k == 0 || ops[k].comm != ops[k - 1].comm || ops[k].stream != ops[k - 1].stream) {
      ncclResult_t r = stream_order(ops[k].comm, ops[k].stream, ops[k].recv ? "ncclRecv" : "ncclSend");
      if (r != ncclSuccess)
        return r;
    }
  }
  ncclResult_t res = ncclSuccess;
  double end = now_ms() + timeout_ms();
  for (int left = n; left > 0;) {
    int moved = 0;
    for (int k = 0; k < n; k++) {
      fake_p2p *op = &ops[k];
      if (op->finished)
        continue;
      /* Between two ranks, transfers go in the order posted. */
      int blocked = 0;
      for (int q = 0; q < k && !blocked; q++)
        blocked = !ops[q].finished && ops[q].comm == op->comm && ops[q].peer == op->peer && ops[q].recv == op->recv;
      if (blocked)
        continue;
      ncclComm_t c = op->comm;
      if (!op->recv) {
        fake_box *b = box_of(c, c->rank, op->peer);
        uint64_t p = __atomic_load_n(&b->posted, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&b->consumed, __ATOMIC_ACQUIRE) != p)
          continue; /* the receiver has not taken the last piece */
        size_t m = op->bytes - op->done < FAKE_BOX_BYTES ? op->bytes - op->done : FAKE_BOX_BYTES;
        memcpy(b->data, op->buf + op->done, m);
        b->total = op->bytes;
        b->len = m;
        __atomic_store_n(&b->posted, p + 1, __ATOMIC_RELEASE);
        op->done += m;
      } else {
        fake_box *b = box_of(c, op->peer, c->rank);
        uint64_t k2 = __atomic_load_n(&b->consumed, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(&b->posted, __ATOMIC_ACQUIRE) == k2)
          continue; /* nothing new */
        if (op->done == 0 && op->total == 0) {
          op->total = b->total;
          if (op->total != op->bytes && res == ncclSuccess)
            res = failf(c, ncclInvalidUsage, "fake: ncclRecv of %zu bytes from rank %d, which sends %zu", op->bytes,
                        op->peer, op->total);
        }
        size_t m = b->len;
        if (op->total == op->bytes)
          memcpy(op->buf + op->done, b->data, m);
        __atomic_store_n(&b->consumed, k2 + 1, __ATOMIC_RELEASE);
        op->done += m;
      }
      moved = 1;
      size_t want = op->recv ? op->total : op->bytes;
      if (op->done >= want) {
        op->finished = 1;
        left--;
      }
    }
    if (moved)
      continue;
    if (now_ms() > end) {
      for (int k = 0; k < n; k++)
        if (!ops[k].finished)
          return failf(ops[k].comm, ncclRemoteError,
                       "fake: rank %d's %s of %zu bytes %s rank %d did not complete within %ld ms (%zu bytes moved)",
                       ops[k].comm->rank, ops[k].recv ? "ncclRecv" : "ncclSend", ops[k].bytes,
                       ops[k].recv ? "from" : "to", ops[k].peer, timeout_ms(), ops[k].done);
    }
    usleep(20);
  }
  return res;
}

ncclResult_t ncclGroupEnd(void) {
  if (p2p_depth == 0)
    return failf(NULL, ncclInvalidUsage, "fake: ncclGroupEnd without ncclGroupStart");
  if (--p2p_depth > 0)
    return ncclSuccess;
  ncclResult_t r = p2p_err;
  if (r != ncclSuccess) {
    char why[512];
    snprintf(why, sizeof why, "%s", p2p_err_comm != NULL ? p2p_err_comm->last : fake_global_last);
    failf(p2p_err_comm, r, "fake: ncclGroupEnd: a transfer of the group was refused: %s", why);
  } else if (p2p_n > 0)
    r = run_p2p(p2p_ops, p2p_n);
  /* The list goes with the group: a thread that ends leaves nothing. */
  free(p2p_ops);
  p2p_ops = NULL;
  p2p_n = p2p_cap = 0;
  p2p_err = ncclSuccess;
  p2p_err_comm = NULL;
  return r;
}

/* Adds a transfer to the thread's group (a group of one outside one). */
static ncclResult_t post_p2p(const char *call, void *buf, size_t count, int datatype, int peer, ncclComm_t c,
                             cudaStream_t stream, int recv) {
  ncclResult_t r = ncclSuccess;
  size_t es = type_size(datatype);
  if (c == NULL)
    r = failf(NULL, ncclInvalidArgument, "fake: %s: the communicator is NULL", call);
  else if (es == 0)
    r = failf(c, ncclInvalidArgument, "fake: %s: datatype %d is not an ncclDataType_t", call, datatype);
  else if (peer < 0 || peer >= c->nranks)
    r = failf(c, ncclInvalidArgument, "fake: %s: peer %d of a communicator of %d ranks", call, peer, c->nranks);
  else if (count > 0 && buf == NULL)
    r = failf(c, ncclInvalidArgument, "fake: %s: NULL buffer", call);
  if (r != ncclSuccess) {
    if (p2p_depth > 0 && p2p_err == ncclSuccess)
      p2p_err = r, p2p_err_comm = c;
    return r;
  }
  if (count == 0)
    return ncclSuccess;
  int alone = p2p_depth == 0;
  if (alone)
    ncclGroupStart();
  if (p2p_n == p2p_cap) {
    int cap = p2p_cap ? 2 * p2p_cap : 64;
    fake_p2p *ops = realloc(p2p_ops, (size_t)cap * sizeof *ops);
    if (ops == NULL) {
      r = failf(c, ncclSystemError, "fake: %s: out of host memory", call);
      if (p2p_err == ncclSuccess)
        p2p_err = r, p2p_err_comm = c;
      if (alone)
        ncclGroupEnd();
      return r;
    }
    p2p_ops = ops, p2p_cap = cap;
  }
  fake_p2p op = {c, stream, buf, count * es, 0, 0, peer, recv, 0};
  p2p_ops[p2p_n++] = op;
  return alone ? ncclGroupEnd() : ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, int datatype, int peer, ncclComm_t c, cudaStream_t stream) {
  return post_p2p("ncclSend", (void *)sendbuff, count, datatype, peer, c, stream, 0);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, int datatype, int peer, ncclComm_t c, cudaStream_t stream) {
  return post_p2p("ncclRecv", recvbuff, count, datatype, peer, c, stream, 1);
}

/* ---- splits ---------------------------------------------------------------- */

ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank);

ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t *newcomm, void *config) {
  (void)config;
  if (c == NULL || newcomm == NULL)
    return failf(c, ncclInvalidArgument, "fake: ncclCommSplit: NULL argument");
  *newcomm = NULL;
  if (color < 0 && color != -1)
    return failf(c, ncclInvalidArgument, "fake: ncclCommSplit: color %d (a color is >= 0 or NCCL_SPLIT_NOCOLOR)", color);
  struct {
    int32_t color, key;
  } mine = {color, key}, all[FAKE_MAX_RANKS];
  ncclResult_t r = gather(c, &mine, sizeof mine, all);
  if (r != ncclSuccess)
    return r;
  int split = ++c->splits;
  if (color == -1)
    return ncclSuccess;
  /* The new rank: the place of (key, rank) among the ranks of this color. */
  int n = 0, newrank = 0;
  for (int i = 0; i < c->nranks; i++) {
    if (all[i].color != color)
      continue;
    n++;
    if (all[i].key < key || (all[i].key == key && i < c->rank))
      newrank++;
  }
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  int len = snprintf(id.internal, sizeof id.internal, "%s-s%d-c%d", c->id, split, color);
  if (len < 0 || len > 100)
    return failf(c, ncclInternalError, "fake: ncclCommSplit: the child's id %s... is longer than the stand-in allows", c->id);
  r = ncclCommInitRank(newcomm, n, id, newrank);
  if (r != ncclSuccess) {
    failf(c, r, "fake: ncclCommSplit: %s", fake_global_last);
    return r;
  }
  (*newcomm)->device = c->device;
  return ncclSuccess;
}

/* The memfd behind addr in this process: its fd number and file offset. */
static int find_memfd(const void *addr, int *fd, uint64_t *off) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL)
    return -1;
  char line[512];
  unsigned long ino = 0, start = 0, end = 0, foff = 0;
  int found = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long s, e, o, i;
    char perms[8], dev[16];
    if (sscanf(line, "%lx-%lx %7s %lx %15s %lu", &s, &e, perms, &o, dev, &i) != 6)
      continue;
    if ((unsigned long)(uintptr_t)addr >= s && (unsigned long)(uintptr_t)addr < e) {
      start = s, end = e, foff = o, ino = i, found = 1;
      break;
    }
  }
  fclose(f);
  (void)end;
  if (!found || ino == 0)
    return -1;
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL)
    return -1;
  struct dirent *de;
  int res = -1;
  while ((de = readdir(d)) != NULL) {
    int n = atoi(de->d_name);
    struct stat st;
    if (de->d_name[0] == '.' || fstat(n, &st) != 0)
      continue;
    if ((unsigned long)st.st_ino == ino && S_ISREG(st.st_mode)) {
      *fd = n;
      *off = foff + ((uintptr_t)addr - start);
      res = 0;
      break;
    }
  }
  closedir(d);
  return res;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buff, size_t size, ncclWindow_t *win, int winFlags) {
  if (c == NULL || win == NULL || buff == NULL || size == 0)
    return fail(c, ncclInvalidArgument, "fake: ncclCommWindowRegister: bad arguments%s", "");
  const char *strict = getenv("FAKENCCL_STRICT_FIRST_OP");
  if (strict != NULL && strcmp(strict, "1") == 0 && c->gen == 0)
    return fail(c, ncclInvalidUsage,
                "fake: window registration as the first operation on a communicator fails (pytorch issue 188567)%s", "");
  struct {
    uint64_t addr, size;
    int32_t flags, pid, fd, ok;
    uint64_t off;
  } mine = {(uintptr_t)buff, size, winFlags, (int32_t)getpid(), -1, 0, 0}, all[FAKE_MAX_RANKS];
  mine.ok = (uintptr_t)buff % 4096 == 0 && size % 4096 == 0;
  find_memfd(buff, &mine.fd, &mine.off);
  ncclResult_t r = gather(c, &mine, sizeof mine, all);
  if (r != ncclSuccess)
    return r;
  for (int i = 0; i < c->nranks; i++) {
    if (!all[i].ok)
      return fail(c, ncclInvalidArgument, "fake: a window's address and size must be multiples of 4096%s", "");
    if (all[i].size != size || all[i].flags != winFlags)
      return fail(c, ncclInvalidUsage, "fake: the ranks register windows of different sizes or flags%s", "");
  }
  if (c->nwindows == FAKE_MAX_WINDOWS)
    return fail(c, ncclInternalError, "fake: too many windows%s", "");
  fake_window *w = calloc(1, sizeof *w);
  c->windows[c->nwindows++] = w;
  w->comm = c;
  w->addr = buff;
  w->size = size;
  w->live = 1;
  for (int i = 0; i < c->nranks; i++) {
    w->peer[i].pid = all[i].pid;
    w->peer[i].fd = all[i].fd;
    w->peer[i].off = all[i].off;
    w->peer[i].size = all[i].size;
  }
  *win = w;
  fake_registered++;
  char line[160];
  snprintf(line, sizeof line, "register %d %p %zu %p\n", c->rank, buff, size, (void *)w);
  logf_(line);
  return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t w) {
  if (c == NULL || w == NULL || w->comm != c)
    return fail(c, ncclInvalidArgument, "fake: ncclCommWindowDeregister: not a window of this communicator%s", "");
  if (!w->live)
    return fail(c, ncclInvalidUsage, "fake: window deregistered twice%s", "");
  /* NCCL needs the memory until the window is gone: the memory must still
   * be mapped (msync fails with ENOMEM on an unmapped range). */
  if (msync(w->addr, 4096, MS_ASYNC) != 0 && errno == ENOMEM)
    return fail(c, ncclInvalidUsage, "fake: the window's memory was unmapped before its deregistration%s", "");
  w->live = 0;
  unmap_peers(w);
  fake_deregistered++;
  char line[160];
  snprintf(line, sizeof line, "deregister %d %p\n", c->rank, (void *)w);
  logf_(line);
  /* The struct stays allocated (until the communicator goes) so that a
   * second deregistration is caught. */
  return ncclSuccess;
}

/* Unmaps the peers' memory a window mapped here. */
static void unmap_peers(fake_window *w) {
  for (int i = 0; i < w->comm->nranks; i++) {
    if (w->mapped[i] != NULL && i != w->comm->rank)
      munmap(w->mapped[i], w->peer[i].size);
    w->mapped[i] = NULL;
  }
}

/* Peer's memory of window w, mapped here (lazily, through the memfd the
 * peer published at registration); NULL with a last error on failure. */
__attribute__((unused)) static char *map_peer(fake_window *w, int peer) {
  ncclComm_t c = w->comm;
  if (peer == c->rank)
    return w->addr;
  if (w->mapped[peer] == NULL) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", w->peer[peer].pid, w->peer[peer].fd);
    int fd = w->peer[peer].fd >= 0 ? open(path, O_RDWR | O_CLOEXEC) : -1;
    if (fd < 0) {
      failf(c, ncclSystemError, "fake: cannot open rank %d's memory (%s)", peer, path);
      return NULL;
    }
    void *p = mmap(NULL, w->peer[peer].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)w->peer[peer].off);
    close(fd);
    if (p == MAP_FAILED) {
      failf(c, ncclSystemError, "fake: cannot map rank %d's memory (%s)", peer, path);
      return NULL;
    }
    w->mapped[peer] = p;
  }
  return w->mapped[peer];
}

#ifndef FAKENCCL_228
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t w, size_t offset, int peer, void **out) {
  if (w == NULL || out == NULL || !w->live || peer < 0 || peer >= w->comm->nranks || offset >= w->size)
    return fail(w != NULL ? w->comm : NULL, ncclInvalidArgument, "fake: ncclGetPeerDevicePointer: bad arguments%s", "");
  ncclComm_t c = w->comm;
  /* A peer on another machine is outside the LSA team: no pointer. */
  if (!same_machine(c, c->rank, peer)) {
    *out = NULL;
    return ncclSuccess;
  }
  char *base = map_peer(w, peer);
  if (base == NULL)
    return ncclSystemError;
  /* FAKENCCL_PEER_SKEW=n: a broken NCCL whose peer pointers are n bytes off. */
  const char *skew = getenv("FAKENCCL_PEER_SKEW");
  *out = base + offset + (peer != c->rank && skew != NULL ? atol(skew) : 0);
  return ncclSuccess;
}

/* ---- the one-sided API (NCCL 2.29) ----------------------------------------- */

/* NCCL 2.29 takes signal index 0, context 0 and flags 0 only. */
static ncclResult_t one_sided_args(ncclComm_t c, const char *call, int peer, int sigIdx, int ctx, unsigned flags) {
  if (c == NULL)
    return failf(NULL, ncclInvalidArgument, "fake: %s: the communicator is NULL", call);
  if (peer < 0 || peer >= c->nranks)
    return failf(c, ncclInvalidArgument, "fake: %s: peer %d of a communicator of %d ranks", call, peer, c->nranks);
  if (sigIdx != 0 || ctx != 0 || flags != 0)
    return failf(c, ncclInvalidArgument, "fake: %s: signal index %d, context %d, flags %u: NCCL 2.29 takes 0, 0, 0", call,
                 sigIdx, ctx, flags);
  const char *no_rma = getenv("FAKENCCL_NO_HOST_RMA");
  if (no_rma != NULL && strcmp(no_rma, "1") == 0)
    return failf(c, ncclInvalidArgument, "fake: %s: the communicator has no host RMA support", call);
  return ncclSuccess;
}

static void post_signal(ncclComm_t c, int peer) {
  __atomic_fetch_add(&c->sh->signals[peer][c->rank], 1, __ATOMIC_RELEASE);
}

ncclResult_t ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t c, cudaStream_t stream) {
  ncclResult_t r = one_sided_args(c, "ncclSignal", peer, sigIdx, ctx, flags);
  if (r != ncclSuccess || (r = stream_order(c, stream, "ncclSignal")) != ncclSuccess)
    return r;
  post_signal(c, peer);
  return ncclSuccess;
}

ncclResult_t ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *descs, ncclComm_t c, cudaStream_t stream) {
  if (c == NULL || nDesc < 0 || (nDesc > 0 && descs == NULL))
    return failf(c, ncclInvalidArgument, "fake: ncclWaitSignal: bad arguments (%d descriptors)", nDesc);
  for (int i = 0; i < nDesc; i++) {
    ncclResult_t r = one_sided_args(c, "ncclWaitSignal", descs[i].peer, descs[i].sigIdx, descs[i].ctx, 0);
    if (r != ncclSuccess)
      return r;
    if (descs[i].opCnt < 0)
      return failf(c, ncclInvalidArgument, "fake: ncclWaitSignal: %d signals", descs[i].opCnt);
  }
  ncclResult_t r = stream_order(c, stream, "ncclWaitSignal");
  if (r != ncclSuccess)
    return r;
  double end = now_ms() + timeout_ms();
  for (int i = 0; i < nDesc; i++) {
    int p = descs[i].peer;
    uint64_t want = c->consumed[p] + (uint64_t)descs[i].opCnt;
    uint64_t got;
    while ((got = __atomic_load_n(&c->sh->signals[c->rank][p], __ATOMIC_ACQUIRE)) < want) {
      if (now_ms() > end)
        return failf(c, ncclRemoteError,
                     "fake: ncclWaitSignal: rank %d waited %ld ms for %d signal(s) from rank %d; %" PRIu64
                     " of them arrived",
                     c->rank, timeout_ms(), descs[i].opCnt, p, got - c->consumed[p]);
      usleep(50);
    }
    c->consumed[p] = want;
  }
  return ncclSuccess;
}

/* The live window of c holding [p, p+n), or NULL. */
static fake_window *window_of(ncclComm_t c, const void *p, size_t n) {
  for (int i = 0; i < c->nwindows; i++) {
    fake_window *w = c->windows[i];
    if (w->live && (const char *)p >= w->addr && (size_t)((const char *)p - w->addr) + n <= w->size)
      return w;
  }
  return NULL;
}

ncclResult_t ncclPutSignal(const void *localbuff, size_t count, int datatype, int peer, ncclWindow_t peerWin,
                           size_t peerWinOffset, int sigIdx, int ctx, unsigned int flags, ncclComm_t c,
                           cudaStream_t stream) {
  ncclResult_t r = one_sided_args(c, "ncclPutSignal", peer, sigIdx, ctx, flags);
  if (r != ncclSuccess)
    return r;
  size_t es = type_size(datatype), bytes = count * es;
  if (es == 0)
    return failf(c, ncclInvalidArgument, "fake: ncclPutSignal: datatype %d is not an ncclDataType_t", datatype);
  if (peerWin == NULL || peerWin->comm != c || !peerWin->live)
    return failf(c, ncclInvalidArgument, "fake: ncclPutSignal: not a live window of this communicator");
  if (peerWinOffset > peerWin->peer[peer].size || bytes > peerWin->peer[peer].size - peerWinOffset)
    return failf(c, ncclInvalidArgument, "fake: ncclPutSignal: %zu bytes at offset %zu of rank %d's window of %" PRIu64 " bytes",
                 bytes, peerWinOffset, peer, peerWin->peer[peer].size);
  if (bytes > 0 && (localbuff == NULL || window_of(c, localbuff, bytes) == NULL))
    return failf(c, ncclInvalidArgument, "fake: ncclPutSignal: the source %p (%zu bytes) is not inside a window of this communicator",
                 localbuff, bytes);
  if ((r = stream_order(c, stream, "ncclPutSignal")) != ncclSuccess)
    return r;
  if (bytes > 0) {
    char *dst = map_peer(peerWin, peer);
    if (dst == NULL)
      return ncclSystemError;
    memmove(dst + peerWinOffset, localbuff, bytes);
  }
  post_signal(c, peer); /* release: the data is visible before the signal */
  return ncclSuccess;
}

/* The consecutive ranks around this one that share its machine. */
ncclTeam_t ncclTeamLsa(ncclComm_t c) {
  ncclTeam_t t = {0, 0, 1};
  if (c == NULL)
    return t;
  int lo = c->rank, hi = c->rank;
  while (lo > 0 && same_machine(c, lo - 1, c->rank))
    lo--;
  while (hi + 1 < c->nranks && same_machine(c, hi + 1, c->rank))
    hi++;
  t.nRanks = hi - lo + 1;
  t.rank = c->rank - lo;
  return t;
}
#endif

ncclTeam_t ncclTeamWorld(ncclComm_t c) {
  ncclTeam_t t = {0, 0, 1};
  if (c != NULL) {
    t.nRanks = c->nranks;
    t.rank = c->rank;
  }
  return t;
}

/* For tests: the registrations and deregistrations this process made. */
void fakenccl_window_counts(int *registered, int *deregistered) {
  *registered = fake_registered;
  *deregistered = fake_deregistered;
}
