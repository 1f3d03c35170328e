/*
 * test_symm.c - symmetric memory across real processes.
 *
 * The parent checks argument handling in one process, then runs two jobs of
 * WORLD ranks each. Ranks are this program re-executed (posix_spawn of
 * /proc/self/exe --rank ...; never fork: the library carries a Go runtime):
 *
 *   job "socket":    symmem_group_create (the built-in Unix socket exchange)
 *   job "allgather": symmem_group_create_with_allgather, with an all-gather
 *                    written here over a memfd the parent shares with its
 *                    ranks (a sense-counting barrier in shared memory)
 *
 * Each rank: allocates the same sizes, fills them, rendezvous, reads every
 * peer's buffer, writes a rank-specific pattern into its slot of every
 * peer's buffer, barrier, verifies all; a put/wait signal ping-pong of 1000
 * rounds carrying data; bad ranks and channels; a wait that times out;
 * mismatched sizes and mismatched heap offsets (MISMATCH on every rank).
 * The parent prints every rank's lines and counts their checks.
 *
 * Data moves with CPU loads and stores on the host backend and with
 * symmem_copy on cuda (SYMMEM_TEST_VIA_COPY=1 forces the copy path on host).
 * Ranks use device rank % device_count; with fewer GPUs than ranks the
 * parent sets SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 for them.
 *
 * Until the library exports the symmetric API this test FAILS (it names the
 * missing functions); it never skips.
 */
#include "check.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define WORLD 4
#define TIMEOUT_MS 20000
#define ROUNDS 1000

/* Weak references: the test links and reports clearly before the library
 * has the symmetric part. */
#pragma weak symmem_group_create
#pragma weak symmem_group_create_with_allgather
#pragma weak symmem_group_destroy
#pragma weak symmem_group_rank
#pragma weak symmem_group_world_size
#pragma weak symmem_group_device
#pragma weak symmem_group_set_signal_pad_size
#pragma weak symmem_rendezvous
#pragma weak symmem_handle_release
#pragma weak symmem_handle_rank
#pragma weak symmem_handle_world_size
#pragma weak symmem_handle_buffer_size
#pragma weak symmem_handle_offset
#pragma weak symmem_handle_signal_pad_size
#pragma weak symmem_handle_buffer_ptr
#pragma weak symmem_handle_signal_pad_ptr
#pragma weak symmem_handle_buffer_ptrs
#pragma weak symmem_handle_signal_pad_ptrs
#pragma weak symmem_handle_buffer_ptrs_dev
#pragma weak symmem_handle_signal_pad_ptrs_dev
#pragma weak symmem_handle_describe
#pragma weak symmem_put_signal
#pragma weak symmem_wait_signal
#pragma weak symmem_barrier

static int missing_exports(void) {
  struct {
    const char *name;
    int present;
  } f[] = {
#define E(fn) {#fn, fn != NULL}
      E(symmem_group_create),          E(symmem_group_create_with_allgather),
      E(symmem_group_destroy),         E(symmem_group_rank),
      E(symmem_group_world_size),      E(symmem_group_device),
      E(symmem_group_set_signal_pad_size), E(symmem_rendezvous),
      E(symmem_handle_release),        E(symmem_handle_rank),
      E(symmem_handle_world_size),     E(symmem_handle_buffer_size),
      E(symmem_handle_offset),         E(symmem_handle_signal_pad_size),
      E(symmem_handle_buffer_ptr),     E(symmem_handle_signal_pad_ptr),
      E(symmem_handle_buffer_ptrs),    E(symmem_handle_signal_pad_ptrs),
      E(symmem_handle_buffer_ptrs_dev), E(symmem_handle_signal_pad_ptrs_dev),
      E(symmem_handle_describe),
      E(symmem_put_signal),            E(symmem_wait_signal),
      E(symmem_barrier),
#undef E
  };
  int missing = 0;
  char list[2048] = "";
  for (size_t i = 0; i < sizeof f / sizeof *f; i++)
    if (!f[i].present) {
      missing++;
      if (strlen(list) + strlen(f[i].name) + 3 < sizeof list) {
        if (*list) strcat(list, ", ");
        strcat(list, f[i].name);
      }
    }
  CHECK(missing == 0, "libsymmem.so exports the symmetric-memory API%s%s",
        missing ? "; missing: " : "", list);
  return missing;
}

static int host_memory;

/* ---------------------------------------------------------------------------
 * Patterns. 8-byte words; a tail shorter than a word gets the low bytes.
 * ------------------------------------------------------------------------- */

static inline uint64_t pat(uint64_t seed, size_t off) {
  return (seed + 1) * 0x9e3779b97f4a7c15ull ^ (uint64_t)off;
}
static uint64_t seed_of(int phase, int buf, int writer, int owner) {
  return ((uint64_t)phase << 48) | ((uint64_t)buf << 32) | ((uint64_t)writer << 16) | (uint64_t)owner;
}
static int g_dev; /* this rank's device */

/* Fills base[from, to) with the pattern of seed: CPU stores on host, a host
 * buffer and symmem_copy on cuda. */
static void pat_fill(void *base, size_t from, size_t to, uint64_t seed) {
  int direct = check_direct_access();
  unsigned char *p = direct ? (unsigned char *)base : malloc(to - from + 8);
  unsigned char *q = direct ? p : p - from; /* q[off] addresses offset off */
  size_t off = from;
  for (; off + 8 <= to; off += 8) {
    uint64_t w = pat(seed, off);
    memcpy(q + off, &w, 8);
  }
  for (; off < to; off++) q[off] = (unsigned char)pat(seed, off);
  if (!direct) {
    if (check_mem_write((char *)base + from, p, to - from, g_dev) != 0)
      check_info("symmem_copy into %p failed: %s", base, symmem_last_error_message());
    free(p);
  }
}
/* First bad offset in [from, to), or (size_t)-1. */
static size_t pat_check(const void *base, size_t from, size_t to, uint64_t seed) {
  int direct = check_direct_access();
  unsigned char *p = direct ? (unsigned char *)base : malloc(to - from + 8);
  const unsigned char *q = direct ? p : p - from;
  size_t bad = (size_t)-1;
  if (!direct && check_mem_read(p, (const char *)base + from, to - from, g_dev) != 0) bad = from;
  size_t off = from;
  for (; bad == (size_t)-1 && off + 8 <= to; off += 8) {
    uint64_t w;
    memcpy(&w, q + off, 8);
    if (w != pat(seed, off)) bad = off;
  }
  for (; bad == (size_t)-1 && off < to; off++)
    if (q[off] != (unsigned char)pat(seed, off)) bad = off;
  if (!direct) free(p);
  return bad;
}

/* ---------------------------------------------------------------------------
 * The all-gather over shared memory, for symmem_group_create_with_allgather.
 * The parent creates a memfd of sizeof(ag_shared) and the ranks map it.
 * ------------------------------------------------------------------------- */

#define AG_SLOT (256 * KiB)
typedef struct {
  _Atomic uint32_t arrived; /* ranks arrived at the current barrier */
  _Atomic uint32_t gen;     /* barrier generation */
  _Atomic uint64_t bytes[WORLD];
  _Atomic int failed;       /* a rank gave up: the others stop waiting */
  unsigned char data[WORLD][AG_SLOT];
} ag_shared;

typedef struct {
  ag_shared *sh;
  int rank;
  long calls;
  size_t last_bytes;
} ag_ctx;

static int ag_barrier(ag_shared *sh) {
  uint32_t gen = atomic_load(&sh->gen);
  if (atomic_fetch_add(&sh->arrived, 1) == WORLD - 1) {
    atomic_store(&sh->arrived, 0);
    atomic_fetch_add(&sh->gen, 1);
    return 0;
  }
  double deadline = check_now_s() + TIMEOUT_MS / 1000.0;
  while (atomic_load(&sh->gen) == gen) {
    if (atomic_load(&sh->failed)) return -1;
    if (check_now_s() > deadline) {
      atomic_store(&sh->failed, 1);
      return -1;
    }
    struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
  }
  return 0;
}

static int shm_allgather(const void *send, void *recv, size_t bytes_per_rank, void *user) {
  ag_ctx *c = user;
  c->calls++;
  c->last_bytes = bytes_per_rank;
  if (bytes_per_rank > AG_SLOT) {
    fprintf(stderr, "[rank %d] allgather: %zu bytes per rank > %zu\n", c->rank, bytes_per_rank,
            (size_t)AG_SLOT);
    atomic_store(&c->sh->failed, 1);
    return -1;
  }
  memcpy(c->sh->data[c->rank], send, bytes_per_rank);
  atomic_store(&c->sh->bytes[c->rank], bytes_per_rank);
  if (ag_barrier(c->sh)) return -1;
  for (int r = 0; r < WORLD; r++) {
    if (atomic_load(&c->sh->bytes[r]) != bytes_per_rank) {
      fprintf(stderr, "[rank %d] allgather: rank %d gave %zu bytes, we %zu\n", c->rank, r,
              (size_t)atomic_load(&c->sh->bytes[r]), bytes_per_rank);
      atomic_store(&c->sh->failed, 1);
      return -1;
    }
    memcpy((unsigned char *)recv + (size_t)r * bytes_per_rank, c->sh->data[r], bytes_per_rank);
  }
  /* Nobody writes the next round before everyone has read this one. */
  return ag_barrier(c->sh);
}

/* ---------------------------------------------------------------------------
 * One rank
 * ------------------------------------------------------------------------- */

static const size_t buf_sizes[] = {1 * MiB, 64 * KiB + 123, 3 * MiB + 512};
enum { NBUF = sizeof buf_sizes / sizeof buf_sizes[0] };

static int rank_main(const char *mode, int rank, const char *name, int shm_fd) {
  static char prefix[32];
  snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  check_prefix_ = prefix;
  setvbuf(stdout, NULL, _IOLBF, 0);
  host_memory = !strcmp(symmem_backend_name(), "host");
  int peer_ok = 1;
  /* One device per rank where there are enough; else they share (the
   * parent then sets SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 on cuda). */
  const int dev = rank % (symmem_device_count() > 0 ? symmem_device_count() : 1);
  g_dev = dev;

  ag_ctx ag = {.rank = rank};
  if (!strcmp(mode, "allgather")) {
    ag.sh = mmap(NULL, sizeof(ag_shared), PROT_READ | PROT_WRITE, MAP_SHARED, shm_fd, 0);
    if (!CHECK(ag.sh != MAP_FAILED, "map the all-gather memfd %d", shm_fd)) return check_summary();
  }

  /* --- group ------------------------------------------------------------ */
  symmem_group *g = NULL;
  double t0 = check_now_s();
  symmem_result rc;
  if (ag.sh)
    rc = symmem_group_create_with_allgather(name, rank, WORLD, dev, TIMEOUT_MS, shm_allgather, &ag, &g);
  else
    rc = symmem_group_create(name, rank, WORLD, dev, TIMEOUT_MS, &g);
  double t_create = check_now_s() - t0;
  CHECK_RESULT(rc, SYMMEM_SUCCESS, "group_create(%s, %s) in %.1f ms", name, mode, t_create * 1e3);
  if (rc != SYMMEM_SUCCESS || !g) return check_summary();
  CHECK_EQ(symmem_group_rank(g), rank, "group_rank");
  CHECK_EQ(symmem_group_world_size(g), WORLD, "group_world_size");
  CHECK_EQ(symmem_group_device(g), dev, "group_device");
  if (ag.sh) CHECK(ag.calls > 0, "group_create used the caller's all-gather (%ld calls)", ag.calls);

  /* Signal pad size: bad values refused before the first rendezvous. */
  CHECK_RESULT(symmem_group_set_signal_pad_size(g, 4 * WORLD + 2), SYMMEM_ERROR_INVALID_ARGUMENT,
               "set_signal_pad_size(not a multiple of 4)");
  CHECK_RESULT(symmem_group_set_signal_pad_size(g, 4 * WORLD - 4), SYMMEM_ERROR_INVALID_ARGUMENT,
               "set_signal_pad_size(< 4*world)");
  /* A real change (the default is 64 KiB): the pads made with the group go,
   * and the first rendezvous makes and exchanges pads of 32 KiB (and, on
   * cuda, puts the handles' device pointer arrays in the new pad). */
  CHECK_RESULT(symmem_group_set_signal_pad_size(g, 32 * KiB), SYMMEM_SUCCESS,
               "set_signal_pad_size(32 KiB) before the first rendezvous");

  /* --- buffers, rendezvous ---------------------------------------------- */
  void *p[NBUF];
  symmem_handle *h[NBUF] = {0};
  for (int i = 0; i < NBUF; i++) {
    p[i] = symmem_alloc(buf_sizes[i], dev, NULL);
    CHECK(p[i] != NULL, "alloc buffer %d (%zu bytes)", i, buf_sizes[i]);
    if (!p[i]) return check_summary();
    pat_fill(p[i], 0, buf_sizes[i], seed_of(0, i, rank, rank));
  }
  long calls_before = ag.calls;
  double t_rdv[NBUF];
  for (int i = 0; i < NBUF; i++) {
    /* Buffer 1 is rendezvoused through an interior pointer. */
    size_t off = i == 1 ? 512 : 0;
    t0 = check_now_s();
    rc = symmem_rendezvous((char *)p[i] + off, g, &h[i]);
    t_rdv[i] = check_now_s() - t0;
    CHECK_RESULT(rc, SYMMEM_SUCCESS, "rendezvous on buffer %d (%zu bytes%s) in %.2f ms", i, buf_sizes[i],
                 off ? ", interior pointer" : "", t_rdv[i] * 1e3);
    if (rc != SYMMEM_SUCCESS || !h[i]) {
      symmem_group_destroy(g);
      return check_summary();
    }
    symmem_pointer_info in;
    symmem_pointer_get_info(p[i], &in);
    CHECK(symmem_handle_rank(h[i]) == rank && symmem_handle_world_size(h[i]) == WORLD,
          "handle %d: rank %d, world %d", i, symmem_handle_rank(h[i]), symmem_handle_world_size(h[i]));
    CHECK_EQ(symmem_handle_buffer_size(h[i]), in.block_size, "handle %d: buffer size is the block size", i);
    CHECK_EQ(symmem_handle_offset(h[i]), off, "handle %d: offset of the rendezvous pointer", i);
    size_t pad = symmem_handle_signal_pad_size(h[i]);
    CHECK(pad == 32 * KiB, "handle %d: signal pad size %zu (32 KiB set)", i, pad);
    void *const *bp = symmem_handle_buffer_ptrs(h[i]);
    void *const *sp = symmem_handle_signal_pad_ptrs(h[i]);
    int consistent = bp && sp;
    for (int r = 0; consistent && r < WORLD; r++) {
      if (!bp[r] || bp[r] != symmem_handle_buffer_ptr(h[i], r)) consistent = 0;
      if (!sp[r] || sp[r] != symmem_handle_signal_pad_ptr(h[i], r)) consistent = 0;
    }
    CHECK(consistent, "handle %d: buffer_ptrs/signal_pad_ptrs agree with buffer_ptr/signal_pad_ptr", i);
    symmem_handle_desc d;
    memset(&d, 0xab, sizeof d);
    CHECK_RESULT(symmem_handle_describe(h[i], &d), SYMMEM_SUCCESS, "handle %d: describe", i);
    CHECK(d.rank == rank && d.world_size == WORLD && d.buffer_size == in.block_size && d.offset == off &&
              d.signal_pad_size == pad && d.buffer_ptrs == bp && d.signal_pad_ptrs == sp &&
              d.buffer_ptrs_dev == symmem_handle_buffer_ptrs_dev(h[i]) &&
              d.signal_pad_ptrs_dev == symmem_handle_signal_pad_ptrs_dev(h[i]),
          "handle %d: describe gives what the getters give (rank %d world %d size %zu offset %zu pad %zu)", i, d.rank,
          d.world_size, d.buffer_size, d.offset, d.signal_pad_size);
    CHECK_RESULT(symmem_handle_describe(h[i], NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "handle %d: describe into NULL", i);
    int distinct = 1;
    for (int r = 0; bp && r < WORLD; r++)
      for (int q = r + 1; q < WORLD; q++)
        if (bp[r] == bp[q]) distinct = 0;
    CHECK(distinct, "handle %d: every rank's buffer is mapped at its own address", i);
    if (host_memory) {
      CHECK(symmem_handle_buffer_ptrs_dev(h[i]) == bp && symmem_handle_signal_pad_ptrs_dev(h[i]) == sp,
            "handle %d: on the host backend the _dev arrays are the host arrays", i);
    } else {
      CHECK(symmem_handle_buffer_ptrs_dev(h[i]) && symmem_handle_signal_pad_ptrs_dev(h[i]),
            "handle %d: device pointer arrays exist", i);
    }
  }
  if (ag.sh) CHECK(ag.calls > calls_before, "rendezvous used the caller's all-gather (%ld calls)",
                   ag.calls - calls_before);
  CHECK_RESULT(symmem_group_set_signal_pad_size(g, 128 * KiB), SYMMEM_ERROR_INVALID_STATE,
               "set_signal_pad_size after the first rendezvous");

  /* --- data: what peers wrote before the rendezvous is visible ------------ */
  {
    int bad = 0;
    for (int i = 0; i < NBUF; i++)
      for (int q = 0; q < WORLD; q++) {
        const void *peer = symmem_handle_buffer_ptr(h[i], q);
        size_t at = pat_check(peer, 0, buf_sizes[i], seed_of(0, i, q, q));
        if (at != (size_t)-1) {
          bad++;
          check_info("buffer %d of rank %d: bad at offset %zu", i, q, at);
        }
      }
    CHECK_EQ(bad, 0, "every peer's buffer, read through its mapping, holds what the peer wrote");
  }
  CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier after reading");

  /* --- data: each rank writes its slot of every peer's buffer ------------- */
  {
    for (int i = 0; i < NBUF; i++) {
      size_t slot = (buf_sizes[i] / WORLD) & ~(size_t)7;
      for (int q = 0; q < WORLD; q++)
        pat_fill(symmem_handle_buffer_ptr(h[i], q), (size_t)rank * slot, (size_t)(rank + 1) * slot,
                 seed_of(1, i, rank, q));
    }
  }
  t0 = check_now_s();
  CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier after writing (%.2f ms)",
               (check_now_s() - t0) * 1e3);
  {
    int bad = 0;
    size_t bytes = 0;
    for (int i = 0; i < NBUF; i++) {
      size_t slot = (buf_sizes[i] / WORLD) & ~(size_t)7;
      for (int w = 0; w < WORLD; w++) {
        size_t at = pat_check(p[i], (size_t)w * slot, (size_t)(w + 1) * slot, seed_of(1, i, w, rank));
        bytes += slot;
        if (at != (size_t)-1) {
          bad++;
          check_info("buffer %d, slot of rank %d: bad at offset %zu", i, w, at);
        }
      }
      /* The tail beyond the slots still holds our own first pattern. */
      size_t at = pat_check(p[i], WORLD * slot, buf_sizes[i], seed_of(0, i, rank, rank));
      if (at != (size_t)-1) {
        bad++;
        check_info("buffer %d: tail bad at offset %zu", i, at);
      }
    }
    CHECK_EQ(bad, 0, "every rank's slot in our buffers holds what it wrote (%zu bytes)", bytes);
  }
  CHECK_RESULT(symmem_barrier(h[1], 3, TIMEOUT_MS, NULL), SYMMEM_SUCCESS,
               "barrier on another handle and channel");

  /* --- bad ranks and channels (local checks, no peer involved) ------------ */
  size_t nch = symmem_handle_signal_pad_size(h[0]) / (4 * WORLD);
  struct {
    int peer, ch;
  } bad_args[] = {{-1, 0}, {WORLD, 0}, {INT32_MIN, 0}, {0, -1}, {0, (int)nch}, {1, INT32_MAX}};
  for (size_t k = 0; k < sizeof bad_args / sizeof *bad_args; k++) {
    int pr = bad_args[k].peer, ch = bad_args[k].ch;
    CHECK_RESULT(symmem_put_signal(h[0], pr, ch, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "put_signal(rank %d, channel %d)", pr, ch);
    CHECK_RESULT(symmem_wait_signal(h[0], pr, ch, 100, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "wait_signal(rank %d, channel %d)", pr, ch);
  }
  CHECK_RESULT(symmem_barrier(h[0], -1, 100, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "barrier(channel -1)");
  /* timeout_ms: 0 is the group's timeout, a negative count is refused
   * (include/symmem.h), not read as the default. */
  CHECK_RESULT(symmem_barrier(h[0], 0, -1, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "barrier(timeout_ms -1)");
  CHECK_RESULT(symmem_wait_signal(h[0], 0, 0, INT64_MIN, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "wait_signal(timeout_ms INT64_MIN)");
  CHECK_RESULT(symmem_barrier(h[0], (int)nch, 100, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "barrier(channel %zu = pad/(4*world))", nch);
  int bad_ranks[] = {-1, WORLD, INT32_MAX};
  for (size_t k = 0; k < 3; k++) {
    symmem_clear_last_error();
    CHECK(symmem_handle_buffer_ptr(h[0], bad_ranks[k]) == NULL, "buffer_ptr(rank %d) is NULL", bad_ranks[k]);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "buffer_ptr(rank %d)", bad_ranks[k]);
    symmem_clear_last_error();
    CHECK(symmem_handle_signal_pad_ptr(h[0], bad_ranks[k]) == NULL, "signal_pad_ptr(rank %d) is NULL",
          bad_ranks[k]);
    CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "signal_pad_ptr(rank %d)", bad_ranks[k]);
  }

  /* --- put/wait ping-pong with data -------------------------------------- */
  {
    /* Each round the sender stores a word into the receiver's buffer, then
     * signals; the receiver waits, then loads it. On cuda the signal ops are
     * stream operations on the NULL stream and symmem_copy (also on it) is
     * ordered after them. */
    int partner = rank ^ 1; /* pairs (0,1) and (2,3) */
    char *mine = (char *)p[0] + 8 * KiB;
    char *theirs = (char *)symmem_handle_buffer_ptr(h[0], partner) + 8 * KiB;
    int errors = 0, wrong = 0;
    const int ch = 1;
    const int rounds = host_memory ? ROUNDS : ROUNDS / 10;
    t0 = check_now_s();
    for (int round = 1; round <= rounds && errors == 0; round++) {
      uint64_t v = ((uint64_t)rank << 32) | (uint64_t)round;
      uint64_t expect = ((uint64_t)partner << 32) | (uint64_t)round, got = 0;
      if ((rank & 1) == 0) {
        if (check_mem_write(theirs, &v, 8, dev) != 0) errors++;
        if (symmem_put_signal(h[0], partner, ch, NULL) != SYMMEM_SUCCESS) errors++;
        if (symmem_wait_signal(h[0], partner, ch, TIMEOUT_MS, NULL) != SYMMEM_SUCCESS) errors++;
        if (check_mem_read(&got, mine, 8, dev) != 0) errors++;
        if (got != expect) wrong++;
      } else {
        if (symmem_wait_signal(h[0], partner, ch, TIMEOUT_MS, NULL) != SYMMEM_SUCCESS) errors++;
        if (check_mem_read(&got, mine, 8, dev) != 0) errors++;
        if (got != expect) wrong++;
        if (check_mem_write(theirs, &v, 8, dev) != 0) errors++;
        if (symmem_put_signal(h[0], partner, ch, NULL) != SYMMEM_SUCCESS) errors++;
      }
    }
    double dt = check_now_s() - t0;
    CHECK(errors == 0 && wrong == 0,
          "ping-pong with rank %d: %d rounds, %d errors, %d wrong values (%.1f us per round trip)", partner,
          rounds, errors, wrong, dt * 1e6 / rounds);
    if (errors) peer_ok = 0;
  }
  /* --- a collective: int32 all-reduce in place, and bad arguments --------- */
  const char *libcuda = getenv("SYMMEM_LIBCUDA");
  if (!host_memory && libcuda && strstr(libcuda, "fake")) {
    check_skip("collectives: the fake CUDA driver runs no kernels");
  } else {
    enum { N = 1001 };
    static int32_t vals[N], saved[N]; /* buffer 0's pattern there is checked later: put back */
    CHECK(check_mem_read(saved, p[0], sizeof saved, dev) == 0, "the pattern under the all-reduce saved");
    CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier before the all-reduce");
    for (int i = 0; i < N; i++)
      vals[i] = (rank + 1) * 1000 + i;
    CHECK(check_mem_write(p[0], vals, sizeof vals, dev) == 0, "input of the all-reduce written");
    CHECK_RESULT(symmem_all_reduce(h[0], SYMMEM_INT32, SYMMEM_SUM, N, NULL, NULL), SYMMEM_SUCCESS,
                 "all_reduce(int32, sum, %d, in place)", N);
    CHECK(check_mem_read(vals, p[0], sizeof vals, dev) == 0, "result of the all-reduce read");
    int wrong = 0;
    for (int i = 0; i < N; i++)
      wrong += vals[i] != (WORLD * (WORLD + 1) / 2) * 1000 + WORLD * i;
    CHECK_EQ(wrong, 0, "every element of the all-reduce is the sum over %d ranks", WORLD);
    /* The same on the copy engines (memcpy on the host backend). */
    for (int i = 0; i < N; i++)
      vals[i] = (rank + 1) * 1000 + i;
    CHECK(check_mem_write(p[0], vals, sizeof vals, dev) == 0, "input of the copy-engine all-reduce written");
    CHECK_RESULT(symmem_collective(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, NULL, SYMMEM_ALGO_COPY_ENGINE, 0,
                                   NULL),
                 SYMMEM_SUCCESS, "all_reduce(int32, sum, %d, in place, SYMMEM_ALGO_COPY_ENGINE)", N);
    CHECK(check_mem_read(vals, p[0], sizeof vals, dev) == 0, "result of the copy-engine all-reduce read");
    wrong = 0;
    for (int i = 0; i < N; i++)
      wrong += vals[i] != (WORLD * (WORLD + 1) / 2) * 1000 + WORLD * i;
    CHECK_EQ(wrong, 0, "every element of the copy-engine all-reduce is the sum over %d ranks", WORLD);
    /* An input outside the block (symmem_collective_from): the low-latency
     * path reads it where it lies on a GPU; the host backend has no such
     * path and refuses, naming why; NULL is the rendezvous pointer. */
    size_t ll_bytes = symmem_low_latency_max_bytes(h[0]);
    const size_t out_at = (sizeof vals + 15) & ~(size_t)15; /* 16-byte aligned, as the kernels need */
    void *elsewhere = symmem_alloc(out_at + sizeof vals, dev, NULL);
    CHECK(elsewhere != NULL, "memory outside the block allocated");
    for (int i = 0; i < N; i++)
      vals[i] = (rank + 1) * 1000 + i;
    CHECK(check_mem_write(elsewhere, vals, sizeof vals, dev) == 0, "input outside the block written");
    if (host_memory) {
      CHECK_EQ(ll_bytes, (size_t)0, "the host backend has no low-latency path");
      CHECK_RESULT(symmem_collective_from(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, elsewhere, NULL,
                                          SYMMEM_ALGO_AUTO, 0, NULL),
                   SYMMEM_ERROR_INVALID_ARGUMENT, "all_reduce from outside the block on the host backend");
      CHECK(strstr(symmem_last_error_message(), "outside the rendezvoused block") &&
                strstr(symmem_last_error_message(), "runs no kernels"),
            "the refusal says why: %s", symmem_last_error_message());
      CHECK(check_mem_write(p[0], vals, sizeof vals, dev) == 0, "input at the rendezvous pointer written");
      CHECK_RESULT(symmem_collective_from(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, NULL, NULL,
                                          SYMMEM_ALGO_AUTO, 0, NULL),
                   SYMMEM_SUCCESS, "collective_from with in NULL: the rendezvous pointer");
      CHECK(check_mem_read(vals, p[0], sizeof vals, dev) == 0, "its result read");
    } else {
      CHECK(ll_bytes >= sizeof vals, "the low-latency path takes %zu bytes per peer", ll_bytes);
      char *out2 = (char *)elsewhere + out_at;
      CHECK_RESULT(symmem_collective_from(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, elsewhere, out2,
                                          SYMMEM_ALGO_AUTO, 0, NULL),
                   SYMMEM_SUCCESS, "all_reduce(int32, sum, %d) from outside the block into another buffer", N);
      CHECK_RESULT(symmem_collective_from(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, elsewhere, NULL,
                                          SYMMEM_ALGO_AUTO, 0, NULL),
                   SYMMEM_SUCCESS, "all_reduce(int32, sum, %d) from outside the block, in place", N);
      CHECK_RESULT(symmem_collective_from(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, elsewhere, NULL,
                                          SYMMEM_ALGO_ONE_SHOT, 0, NULL),
                   SYMMEM_ERROR_INVALID_ARGUMENT, "one_shot from outside the block");
      CHECK(strstr(symmem_last_error_message(), "reads the peers' inputs"), "the refusal says why: %s",
            symmem_last_error_message());
      static int32_t out_vals[N];
      CHECK(check_mem_read(out_vals, out2, sizeof out_vals, dev) == 0, "the all-reduce into another buffer read");
      CHECK(check_mem_read(vals, elsewhere, sizeof vals, dev) == 0, "the in-place all-reduce read");
      wrong = 0;
      for (int i = 0; i < N; i++)
        wrong += out_vals[i] != (WORLD * (WORLD + 1) / 2) * 1000 + WORLD * i;
      CHECK_EQ(wrong, 0, "every element of the all-reduce from outside the block is the sum over %d ranks", WORLD);
    }
    wrong = 0;
    for (int i = 0; i < N; i++)
      wrong += vals[i] != (WORLD * (WORLD + 1) / 2) * 1000 + WORLD * i;
    CHECK_EQ(wrong, 0, "every element of the in-place all-reduce is the sum over %d ranks", WORLD);
    symmem_free(elsewhere, out_at + sizeof vals, dev, NULL);
    CHECK_RESULT(symmem_collective(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, NULL, (symmem_algo)7, 0, NULL),
                 SYMMEM_ERROR_INVALID_ARGUMENT, "all_reduce with an unknown algorithm");
    CHECK(strstr(symmem_last_error_message(), "unknown algorithm 7") &&
              strstr(symmem_last_error_message(), "6 copy_engine"),
          "the message names the known algorithms: %s", symmem_last_error_message());
    CHECK(check_mem_write(p[0], saved, sizeof saved, dev) == 0, "the pattern put back");
    CHECK_RESULT(symmem_all_reduce(h[0], (symmem_dtype)7, SYMMEM_SUM, N, NULL, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "all_reduce with an unknown dtype");
    CHECK_RESULT(symmem_all_reduce(h[0], SYMMEM_INT32, (symmem_op)9, N, NULL, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "all_reduce with an unknown op");
    CHECK_RESULT(symmem_all_reduce(h[0], SYMMEM_FLOAT32, SYMMEM_SUM, symmem_handle_buffer_size(h[0]) / 4 + 1, NULL, NULL),
                 SYMMEM_ERROR_INVALID_ARGUMENT, "all_reduce with a count past the buffer");
    CHECK_RESULT(symmem_all_gather(h[0], SYMMEM_INT32, N, NULL, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
                 "all_gather without out");
    CHECK_RESULT(symmem_collective(h[0], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, N, NULL, SYMMEM_ALGO_AUTO,
                                   SYMMEM_COLL_CHANNELS, NULL),
                 SYMMEM_ERROR_INVALID_ARGUMENT, "collective on channel %d", SYMMEM_COLL_CHANNELS);
    uint32_t flag = 1;
    CHECK_RESULT(symmem_handle_device_error(h[0], &flag), SYMMEM_SUCCESS, "device_error");
    CHECK_EQ(flag, 0u, "no kernel wait gave up");
    /* The last rank passes another count: MISMATCH on every rank, naming
     * both calls, nothing moved, and the device error flag says so. */
    for (int i = 0; i < N; i++)
      vals[i] = (rank + 1) * 1000 + i;
    CHECK(check_mem_write(p[0], vals, sizeof vals, dev) == 0, "input of the mismatched all-reduce written");
    symmem_result mrc = symmem_all_reduce(h[0], SYMMEM_INT32, SYMMEM_SUM, rank == WORLD - 1 ? N - 1 : N, NULL, NULL);
    if (host_memory) {
      CHECK_EQ(mrc, SYMMEM_ERROR_MISMATCH, "all_reduce with rank %d's count %d", WORLD - 1, N - 1);
      const char *msg = symmem_last_error_message();
      CHECK(strstr(msg, "ranks 0, 1, 2: all_reduce(int32, sum, count 1001, one_shot)") &&
                strstr(msg, "rank 3: all_reduce(int32, sum, count 1000, one_shot)"),
            "the message names every rank's call: %s", msg);
    } else {
      /* On GPUs the kernels compare the arguments (Note [Collective
       * agreement]): the call is only enqueued, and the device error flag
       * reports the mismatch once the stream has run (the read below is
       * ordered after it on the default stream). */
      CHECK_EQ(mrc, SYMMEM_SUCCESS, "all_reduce with rank %d's count %d is enqueued", WORLD - 1, N - 1);
    }
    CHECK(check_mem_read(vals, p[0], sizeof vals, dev) == 0, "input after the mismatch read");
    wrong = 0;
    for (int i = 0; i < N; i++)
      wrong += vals[i] != (rank + 1) * 1000 + i;
    CHECK_EQ(wrong, 0, "the mismatched all-reduce moved nothing");
    CHECK_RESULT(symmem_handle_device_error(h[0], &flag), SYMMEM_ERROR_MISMATCH, "device_error after a mismatch");
    /* This rank's kernel compared the arguments (cause 5), or found the
     * group stopped by a peer's that had (cause 7, why 1 in bits 12-13):
     * on GPUs which comes first is a race. */
    CHECK((flag >> 29 == 5 && strstr(symmem_last_error_message(), "called a collective with other arguments")) ||
              (flag >> 29 == 7 && (flag >> 12 & 3) == 1 &&
               strstr(symmem_last_error_message(), "found other collective arguments")),
          "the flag %#x records a mismatch: %s", flag, symmem_last_error_message());
    CHECK(check_mem_write(p[0], saved, sizeof saved, dev) == 0, "the pattern put back");
    flag = 0;
    CHECK(check_mem_write((char *)symmem_handle_signal_pad_ptr(h[0], rank) + symmem_handle_signal_pad_size(h[0]),
                          &flag, 4, dev) == 0, "device error flag cleared");
  }
  {
    /* The flag's causes as symmem_handle_device_error reports them (the
     * kernels' codes, include/symmem_device.cuh), on any backend: written
     * into word 0 of our device region by hand. */
    char *word0 = (char *)symmem_handle_signal_pad_ptr(h[0], rank) + symmem_handle_signal_pad_size(h[0]);
    struct {
      uint32_t flag;
      symmem_result want;
      const char *says;
    } causes[] = {{0x80000000u | 1u << 16 | 5u, SYMMEM_SUCCESS, ""},
                  {0xA0000000u | 2u << 16 | 65u, SYMMEM_ERROR_MISMATCH, "rank 2 called a collective with other arguments"},
                  {0xC0000000u | 3u << 16 | 7u, SYMMEM_ERROR_PEER, "rank 3's process exited"}};
    for (size_t k = 0; k < sizeof causes / sizeof *causes; k++) {
      uint32_t flag = causes[k].flag, got = 0;
      CHECK(check_mem_write(word0, &flag, 4, dev) == 0, "flag %#x written", flag);
      CHECK_RESULT(symmem_handle_device_error(h[0], &got), causes[k].want, "device_error with flag %#x", flag);
      CHECK(got == flag && strstr(symmem_last_error_message(), causes[k].says), "flag %#x read back (%#x): %s", flag,
            got, symmem_last_error_message());
    }
    uint32_t zero = 0;
    CHECK(check_mem_write(word0, &zero, 4, dev) == 0, "device error flag cleared");
  }
  if (host_memory) {
    /* A wait nobody answers times out, within bounds. */
    t0 = check_now_s();
    rc = symmem_wait_signal(h[0], (rank + 1) % WORLD, 2, 300, NULL);
    double waited = check_now_s() - t0;
    CHECK_RESULT(rc, SYMMEM_ERROR_TIMEOUT, "wait_signal with nobody signalling (%.0f ms)", waited * 1e3);
    CHECK(waited >= 0.25 && waited < 5.0, "the 300 ms wait lasted %.0f ms", waited * 1e3);
  } else {
    check_skip("backend %s: signal waits are stream operations; the host-side timeout is not tested",
               symmem_backend_name());
  }
  CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier after the ping-pong");

  /* --- a handle outlives the free of its block ---------------------------- */
  symmem_free(p[2], buf_sizes[2], dev, NULL);
  p[2] = NULL;
  {
    size_t slot = (buf_sizes[2] / WORLD) & ~(size_t)7;
    int q = (rank + 1) % WORLD;
    size_t at = pat_check(symmem_handle_buffer_ptr(h[2], q), (size_t)rank * slot, (size_t)(rank + 1) * slot,
                          seed_of(1, 2, rank, q));
    CHECK(at == (size_t)-1, "after freeing our block, the handle still maps rank %d's buffer", q);
  }
  CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier");
  CHECK_RESULT(symmem_handle_release(h[2]), SYMMEM_SUCCESS, "release handle 2 (block already freed)");
  {
    symmem_handle_desc d = {.rank = -7};
    CHECK_RESULT(symmem_handle_describe(h[2], &d), SYMMEM_ERROR_INVALID_ARGUMENT, "describe a released handle");
    CHECK(d.rank == -7, "a failed describe leaves desc untouched");
    CHECK_EQ(symmem_low_latency_max_bytes(h[2]), (size_t)0, "low_latency_max_bytes of a released handle");
    CHECK(symmem_last_error() == SYMMEM_ERROR_INVALID_ARGUMENT, "and the last error says so: %s",
          symmem_last_error_message());
    int32_t one = 1;
    CHECK_RESULT(symmem_collective_from(h[2], SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, 1, &one, NULL,
                                        SYMMEM_ALGO_AUTO, 0, NULL),
                 SYMMEM_ERROR_INVALID_ARGUMENT, "collective_from on a released handle");
  }
  h[2] = NULL;

  /* --- mismatch: sizes --------------------------------------------------- */
  if (peer_ok) {
    size_t msz = rank == 2 ? 2 * MiB : 1 * MiB;
    void *m = symmem_alloc(msz, dev, NULL);
    symmem_handle *mh = NULL;
    t0 = check_now_s();
    rc = symmem_rendezvous(m, g, &mh);
    double dt = check_now_s() - t0;
    CHECK_RESULT(rc, SYMMEM_ERROR_MISMATCH, "rendezvous with rank 2's size different (%.0f ms)", dt * 1e3);
    CHECK(mh == NULL || rc == SYMMEM_SUCCESS, "no handle on a mismatch");
    CHECK(dt < TIMEOUT_MS / 1000.0, "the mismatch is reported before the timeout");
    if (rc == SYMMEM_SUCCESS) symmem_handle_release(mh);
    symmem_free(m, msz, dev, NULL);
    CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS,
                 "barrier after the size mismatch (signal pads still work)");

    /* --- mismatch: heap offsets (rank 3 allocates one more block first) ---- */
    void *extra = rank == 3 ? symmem_alloc(8 * MiB, dev, NULL) : NULL;
    void *o = symmem_alloc(8 * MiB, dev, NULL);
    symmem_pointer_info oi;
    symmem_pointer_get_info(o, &oi);
    check_info("8 MiB block at heap offset %" PRIu64 "%s", oi.heap_offset, extra ? " (after an extra block)" : "");
    t0 = check_now_s();
    rc = symmem_rendezvous(o, g, &mh);
    dt = check_now_s() - t0;
    CHECK_RESULT(rc, SYMMEM_ERROR_MISMATCH, "rendezvous with rank 3's heap offset different (%.0f ms)",
                 dt * 1e3);
    if (rc == SYMMEM_SUCCESS) symmem_handle_release(mh);
    symmem_free(o, 8 * MiB, dev, NULL);
    if (extra) symmem_free(extra, 8 * MiB, dev, NULL);
    CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "barrier after the offset mismatch");

    /* The group still works after the mismatches: buffer 0 again (its
     * offsets agree; new blocks might not, the call sequences differed). */
    symmem_handle *again = NULL;
    CHECK_RESULT(symmem_rendezvous(p[0], g, &again), SYMMEM_SUCCESS,
                 "a matching rendezvous (buffer 0 again) after the mismatches");
    if (again) {
      void *const *a = symmem_handle_buffer_ptrs(again);
      size_t slot = (buf_sizes[0] / WORLD) & ~(size_t)7;
      int q = (rank + 3) % WORLD;
      CHECK(a && pat_check(a[q], (size_t)q * slot, (size_t)q * slot + 4 * KiB, seed_of(1, 0, q, q)) == (size_t)-1,
            "the new handle maps rank %d's buffer with its data", q);
    }
    symmem_handle_release(again);
  } else {
    check_skip("mismatch tests skipped: the signal ping-pong failed, ranks may be out of step");
  }

  /* --- teardown ----------------------------------------------------------- */
  CHECK_RESULT(symmem_barrier(h[0], 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "final barrier");
  for (int i = 0; i < NBUF; i++) {
    if (h[i]) CHECK_RESULT(symmem_handle_release(h[i]), SYMMEM_SUCCESS, "release handle %d", i);
    if (p[i]) {
      symmem_clear_last_error();
      symmem_free(p[i], buf_sizes[i], dev, NULL);
      CHECK_EQ(symmem_last_error(), SYMMEM_SUCCESS, "free buffer %d", i);
    }
  }
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "group_destroy");
  CHECK_RESULT(symmem_validate(dev), SYMMEM_SUCCESS, "validate at the end");
  CHECK_EQ(check_stat(dev, "allocation.all.current"), 0, "every block freed");
  if (ag.sh) munmap(ag.sh, sizeof(ag_shared));
  return check_summary();
}

/* ---------------------------------------------------------------------------
 * The parent
 * ------------------------------------------------------------------------- */

static void single_process_checks(void) {
  symmem_group *g = (symmem_group *)(uintptr_t)1;
  char name[96];
  snprintf(name, sizeof name, "ctest-%d-args", (int)getpid());
  double t0 = check_now_s();
  CHECK_RESULT(symmem_group_create(name, 0, WORLD, 0, 1000, NULL), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(out NULL)");
  CHECK_RESULT(symmem_group_create(NULL, 0, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(name NULL)");
  CHECK_RESULT(symmem_group_create("", 0, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(name \"\")");
  CHECK_RESULT(symmem_group_create("a/b", 0, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(name with '/')");
  CHECK_RESULT(symmem_group_create("sp ace", 0, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(name with a space)");
  char longname[80];
  memset(longname, 'x', 65);
  longname[65] = '\0';
  CHECK_RESULT(symmem_group_create(longname, 0, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(65-character name)");
  CHECK_RESULT(symmem_group_create(name, -1, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(rank -1)");
  CHECK_RESULT(symmem_group_create(name, WORLD, WORLD, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(rank == world_size)");
  CHECK_RESULT(symmem_group_create(name, 0, 0, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(world_size 0)");
  CHECK_RESULT(symmem_group_create(name, 0, -3, 0, 1000, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(world_size -3)");
  CHECK_RESULT(symmem_group_create(name, 0, WORLD, -1, 1000, &g), SYMMEM_ERROR_INVALID_DEVICE,
               "group_create(device -1)");
  CHECK_RESULT(symmem_group_create(name, 0, WORLD, 0, -1, &g), SYMMEM_ERROR_INVALID_ARGUMENT,
               "group_create(timeout_ms -1)");
  CHECK_RESULT(symmem_group_create(name, 0, WORLD, symmem_device_count(), 1000, &g),
               SYMMEM_ERROR_INVALID_DEVICE, "group_create(device == device_count)");
  CHECK_RESULT(symmem_group_create_with_allgather(name, 0, WORLD, 0, 1000, NULL, NULL, &g),
               SYMMEM_ERROR_INVALID_ARGUMENT, "group_create_with_allgather(allgather NULL)");
  CHECK(check_now_s() - t0 < 2.0, "bad group_create calls return at once (%.0f ms), without waiting for peers",
        (check_now_s() - t0) * 1e3);

  CHECK_RESULT(symmem_group_destroy(NULL), SYMMEM_SUCCESS, "group_destroy(NULL) is a no-op");
  CHECK_RESULT(symmem_handle_release(NULL), SYMMEM_SUCCESS, "handle_release(NULL) is a no-op");
  symmem_clear_last_error();
  CHECK_EQ(symmem_group_rank(NULL), -1, "group_rank(NULL)");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "group_rank(NULL)");
  symmem_clear_last_error();
  CHECK_EQ(symmem_group_world_size(NULL), -1, "group_world_size(NULL)");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "group_world_size(NULL)");
  symmem_clear_last_error();
  CHECK_EQ(symmem_group_device(NULL), -1, "group_device(NULL)");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "group_device(NULL)");

  /* A group of one: everything works without peers. */
  snprintf(name, sizeof name, "ctest-%d-solo", (int)getpid());
  symmem_group *solo = NULL;
  symmem_result rc = symmem_group_create(name, 0, 1, 0, TIMEOUT_MS, &solo);
  CHECK_RESULT(rc, SYMMEM_SUCCESS, "group_create of a group of one");
  if (rc != SYMMEM_SUCCESS) return;
  symmem_handle *h = NULL;
  void *p = symmem_alloc(1 * MiB, 0, NULL);
  CHECK_RESULT(symmem_rendezvous(p, NULL, &h), SYMMEM_ERROR_INVALID_ARGUMENT, "rendezvous(group NULL)");
  CHECK_RESULT(symmem_rendezvous(p, solo, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "rendezvous(out NULL)");
  CHECK_RESULT(symmem_rendezvous(NULL, solo, &h), SYMMEM_ERROR_INVALID_POINTER, "rendezvous(ptr NULL)");
  int x;
  CHECK_RESULT(symmem_rendezvous(&x, solo, &h), SYMMEM_ERROR_INVALID_POINTER, "rendezvous(stack address)");
  rc = symmem_rendezvous(p, solo, &h);
  CHECK_RESULT(rc, SYMMEM_SUCCESS, "rendezvous in a group of one");
  if (rc == SYMMEM_SUCCESS) {
    CHECK_EQ(symmem_handle_world_size(h), 1, "handle of a group of one: world size 1");
    CHECK(symmem_handle_buffer_ptr(h, 0) != NULL, "own buffer is mapped");
    CHECK_RESULT(symmem_barrier(h, 0, 1000, NULL), SYMMEM_SUCCESS, "barrier in a group of one");
    if (host_memory) {
      CHECK_RESULT(symmem_put_signal(h, 0, 0, NULL), SYMMEM_SUCCESS, "put_signal to ourselves");
      CHECK_RESULT(symmem_wait_signal(h, 0, 0, 1000, NULL), SYMMEM_SUCCESS, "wait_signal from ourselves");
    }
    CHECK_RESULT(symmem_handle_release(h), SYMMEM_SUCCESS, "release the handle");
  }
  symmem_free(p, 1 * MiB, 0, NULL);
  CHECK_RESULT(symmem_group_destroy(solo), SYMMEM_SUCCESS, "group_destroy of the group of one");
}

static void run_job(const char *self, const char *mode) {
  char name[96];
  snprintf(name, sizeof name, "ctest-%d-%s", (int)getpid(), mode);
  int shm_fd = -1;
  if (!strcmp(mode, "allgather")) {
    shm_fd = check_tmpfd("symm-allgather");
    if (!CHECK(shm_fd >= 0 && ftruncate(shm_fd, sizeof(ag_shared)) == 0, "memfd for the all-gather"))
      return;
  }
  check_info("job %s: group %s, %d ranks", mode, name, WORLD);
  /* Ranks share a GPU when there are fewer GPUs than ranks: allow it. */
  char **child_env = NULL;
  if (!host_memory && symmem_device_count() < WORLD) {
    size_t ne = 0;
    while (environ[ne]) ne++;
    child_env = calloc(ne + 2, sizeof *child_env);
    memcpy(child_env, environ, ne * sizeof *child_env);
    child_env[ne] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
    check_info("%d devices for %d ranks: SYMMEM_ALLOW_OVERLAPPING_DEVICES=1", symmem_device_count(), WORLD);
  }
  pid_t pid[WORLD];
  int out[WORLD];
  char rank_s[WORLD][16], fd_s[16];
  snprintf(fd_s, sizeof fd_s, "%d", shm_fd);
  double t0 = check_now_s();
  for (int r = 0; r < WORLD; r++) {
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    out[r] = check_tmpfd("symm-rank-out");
    char *argv[] = {(char *)self, "--rank", (char *)mode, rank_s[r], name, fd_s, NULL};
    pid[r] = check_spawn_self(argv, child_env, out[r], out[r]);
    CHECK(pid[r] > 0, "job %s: spawn rank %d", mode, r);
  }
  int status[WORLD];
  for (int r = 0; r < WORLD; r++) {
    double left = 120.0 - (check_now_s() - t0);
    status[r] = pid[r] > 0 ? check_wait_pid(pid[r], left > 1 ? left : 1) : -1;
  }
  double dt = check_now_s() - t0;
  for (int r = 0; r < WORLD; r++) {
    char prefix[32], sb[128];
    snprintf(prefix, sizeof prefix, "[rank %d] ", r);
    char *o = check_read_fd(out[r]);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out[r]);
    CHECK(status[r] != -1 && WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0 && fails == 0,
          "job %s: rank %d finished cleanly (%s, %d failed checks)", mode, r,
          check_status_str(status[r], sb, sizeof sb), fails);
  }
  check_info("job %s took %.2f s", mode, dt);
  free(child_env);
  if (shm_fd >= 0) close(shm_fd);
}

int main(int argc, char **argv) {
  if (argc == 6 && !strcmp(argv[1], "--rank")) {
    if (missing_exports()) return check_summary();
    return rank_main(argv[2], atoi(argv[3]), argv[4], atoi(argv[5]));
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  host_memory = !strcmp(symmem_backend_name(), "host");
  check_info("backend %s", symmem_backend_name());
  if (missing_exports()) return check_summary();
  single_process_checks();
  run_job(argv[0], "socket");
  run_job(argv[0], "allgather");
  return check_summary();
}
