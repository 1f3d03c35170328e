/*
 * fakenccl.c - a stand-in for libnccl.so.2, for running libsymmem's NCCL path
 * on machines without a GPU (with the host backend or fakecuda.c). It exports
 * the functions libsymmem calls (cuda/nccl.h) plus the few a test needs to
 * make a communicator, with nccl.h's signatures, on host memory:
 *
 *   - ncclGetUniqueId / ncclCommInitRank / ncclCommDestroy / ncclCommAbort:
 *     a communicator is a shared file, $TMPDIR/fakenccl-<unique id>, that the
 *     ranks (processes) map; ncclCommCuDevice is $FAKENCCL_DEVICE (default 0);
 *   - ncclAllGather (bytes only: ncclInt8/ncclUint8) through that file, on
 *     the calling thread (the stream is ignored: the data is there when the
 *     call returns); a rank that does not arrive within $FAKENCCL_TIMEOUT_MS
 *     (default 120000) makes it fail with ncclSystemError and a last error;
 *     ranks passing different counts fail with ncclInvalidUsage;
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
 *   - ncclGetPeerDevicePointer (NCCL 2.29; left out when built with
 *     -DFAKENCCL_NO_PEER_POINTER): a peer's window, mapped here by opening
 *     the memfd behind it through /proc/<pid>/fd (the host backend's and
 *     fakecuda's memory are memfds); $FAKENCCL_PEER_SKEW=n makes the
 *     pointers n bytes wrong, as a broken NCCL would;
 *   - ncclGetVersion is $FAKENCCL_VERSION, else 22900 (22809 when built
 *     without the peer pointer).
 *
 * Build: gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o libnccl_fake.so fakenccl.c -lpthread
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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
#define FAKE_SLOT_BYTES (256 << 10) /* the most one rank gathers per call */
#define FAKE_MAX_WINDOWS 1024

/* One rank's part of the shared file. Gen k's data is in data[k % 2];
 * posted = k+1 once written, consumed = k+1 once every rank's gen k was
 * read. Gen k may be written once every rank has consumed gen k-2. */
typedef struct fake_slot {
  volatile uint64_t posted, consumed;
  uint64_t len[2];
  char data[2][FAKE_SLOT_BYTES];
} fake_slot;

typedef struct fake_shared {
  volatile int32_t joined;
  int32_t nranks;
  fake_slot slot[];
} fake_shared;

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
  uint64_t gen; /* collectives so far */
  fake_window *windows[FAKE_MAX_WINDOWS]; /* every window made, freed with the comm */
  int nwindows;
  char last[512];
};
typedef struct ncclComm *ncclComm_t;
typedef fake_window *ncclWindow_t;
typedef struct CUstream_st *cudaStream_t;

static char fake_global_last[512];
static int fake_registered, fake_deregistered;

static int fake_version(void) {
  const char *s = getenv("FAKENCCL_VERSION");
  if (s != NULL && *s)
    return atoi(s);
#ifdef FAKENCCL_NO_PEER_POINTER
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
  size_t size = sizeof(fake_shared) + (size_t)nranks * sizeof(fake_slot);
  int fd = open(path, O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0)
    return fail(NULL, ncclSystemError, "fake: cannot create %s", path);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED)
    return fail(NULL, ncclSystemError, "fake: cannot map %s", path);
  ncclComm_t c = calloc(1, sizeof *c);
  c->sh = p;
  c->shsize = size;
  c->rank = rank;
  c->nranks = nranks;
  const char *d = getenv("FAKENCCL_DEVICE");
  c->device = d != NULL && *d ? atoi(d) : 0;
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

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == NULL)
    return ncclSuccess;
  for (int i = 0; i < c->nwindows; i++)
    free(c->windows[i]);
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
    return ncclSystemError;
  memcpy(me->data[k % 2], send, n);
  me->len[k % 2] = n;
  __atomic_store_n(&me->posted, k + 1, __ATOMIC_RELEASE);
  if (wait_all(c, 0, k + 1) != 0)
    return ncclSystemError;
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

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, int datatype,
                           ncclComm_t c, cudaStream_t stream) {
  (void)stream;
  if (c == NULL || (sendcount > 0 && (sendbuff == NULL || recvbuff == NULL)))
    return fail(c, ncclInvalidArgument, "fake: ncclAllGather: NULL argument%s", "");
  if (datatype != 0 && datatype != 1)
    return fail(c, ncclInvalidArgument, "fake: ncclAllGather gathers bytes only (ncclInt8, ncclUint8)%s", "");
  return gather(c, sendbuff, sendcount, recvbuff);
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
  for (int i = 0; i < c->nranks; i++)
    if (w->mapped[i] != NULL && i != c->rank)
      munmap(w->mapped[i], w->peer[i].size);
  fake_deregistered++;
  char line[160];
  snprintf(line, sizeof line, "deregister %d %p\n", c->rank, (void *)w);
  logf_(line);
  /* The struct stays allocated (until the communicator goes) so that a
   * second deregistration is caught. */
  return ncclSuccess;
}

#ifndef FAKENCCL_NO_PEER_POINTER
ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t w, size_t offset, int peer, void **out) {
  if (w == NULL || out == NULL || !w->live || peer < 0 || peer >= w->comm->nranks || offset >= w->size)
    return fail(w != NULL ? w->comm : NULL, ncclInvalidArgument, "fake: ncclGetPeerDevicePointer: bad arguments%s", "");
  ncclComm_t c = w->comm;
  if (peer == c->rank) {
    *out = w->addr + offset;
    return ncclSuccess;
  }
  if (w->mapped[peer] == NULL) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", w->peer[peer].pid, w->peer[peer].fd);
    int fd = w->peer[peer].fd >= 0 ? open(path, O_RDWR) : -1;
    if (fd < 0)
      return fail(c, ncclSystemError, "fake: cannot open the peer's memory (%s)", path);
    void *p = mmap(NULL, w->peer[peer].size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)w->peer[peer].off);
    close(fd);
    if (p == MAP_FAILED)
      return fail(c, ncclSystemError, "fake: cannot map the peer's memory (%s)", path);
    w->mapped[peer] = p;
  }
  /* FAKENCCL_PEER_SKEW=n: a broken NCCL whose peer pointers are n bytes off. */
  const char *skew = getenv("FAKENCCL_PEER_SKEW");
  *out = (char *)w->mapped[peer] + offset + (skew != NULL ? atol(skew) : 0);
  return ncclSuccess;
}
#endif

/* For tests: the registrations and deregistrations this process made. */
void fakenccl_window_counts(int *registered, int *deregistered) {
  *registered = fake_registered;
  *deregistered = fake_deregistered;
}
