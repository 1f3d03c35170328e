/*
 * test_machines.c - groups whose ranks are on several machines, imitated on
 * one host: each rank is a child process started with SYMMEM_MACHINE_ID
 * naming its machine and SYMMEM_SOCKET_DIR that machine's socket directory.
 * Layouts 2 x 2 and 3 x 1, on the host backend or the stand-in driver
 * (SYMMEM_LIBCUDA), over the NCCL stand-in (cuda/testdata/fakenccl.c).
 *
 * Always checked: the local team (symmem_group_local_rank/_local_size/
 * _is_local/_machine), NULL pointers for remote ranks, mapped peers, writes
 * read by a local peer, and the refusal of a socket group spanning machines.
 * Also: collectives against references (algo auto, hierarchical and nccl),
 * barriers and signals across
 * machines (the stand-in's typed collectives and one-sided signals; the 2.28
 * stand-in for UNAVAILABLE remote signals) and a dead rank on the other
 * machine.
 */
#include "check.h"

#include <dlfcn.h>
#include <sys/stat.h>

typedef struct {
  char internal[128];
} ncclUniqueId;
typedef struct ncclComm *ncclComm_t;
typedef int (*init_rank_fn)(ncclComm_t *, int, ncclUniqueId, int);
typedef int (*destroy_fn)(ncclComm_t);

static void *nccl_lib;

static ncclComm_t make_comm(const char *job, int rank, int world) {
  nccl_lib = dlopen(getenv("SYMMEM_LIBNCCL"), RTLD_NOW | RTLD_LOCAL);
  if (!CHECK(nccl_lib != NULL, "dlopen the NCCL stand-in %s", getenv("SYMMEM_LIBNCCL")))
    return NULL;
  init_rank_fn init = (init_rank_fn)dlsym(nccl_lib, "ncclCommInitRank");
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  snprintf(id.internal, sizeof id.internal, "fakenccl-%s", job);
  ncclComm_t comm = NULL;
  CHECK(init != NULL && init(&comm, world, id, rank) == 0 && comm != NULL, "ncclCommInitRank (rank %d of %d)", rank, world);
  return comm;
}

/* machines[r] of the layout named by argv: "2x2" or "3x1". */
static int machine_of(const char *layout, int r) { return !strcmp(layout, "2x2") ? r / 2 : r; }

/* The fabric job: every rank's device is in one NVLink domain (the stand-in
 * driver's FAKECUDA_FABRIC_CLUSTER), so the team is the whole group. */
static int fabric_job(void) { return getenv("FAKECUDA_FABRIC_CLUSTER") != NULL; }
static int team_of(const char *layout, int r) { return fabric_job() ? 0 : machine_of(layout, r); }

/* Waits for the work queued on the legacy stream. */
static void sync_stream(int dev) {
  uint64_t a = 1, b = 0;
  CHECK_RESULT(symmem_copy(&b, &a, sizeof a, dev, NULL), SYMMEM_SUCCESS, "wait for the stream");
}

/* A barrier of this machine's ranks through the signal pads. */
static void local_barrier(symmem_group *g, symmem_handle *h, int channel) {
  int world = symmem_group_world_size(g), me = symmem_group_rank(g);
  for (int p = 0; p < world; p++)
    if (p != me && symmem_group_is_local(g, p) == 1)
      CHECK_RESULT(symmem_put_signal(h, p, channel, NULL), SYMMEM_SUCCESS, "local signal to %d", p);
  for (int p = 0; p < world; p++)
    if (p != me && symmem_group_is_local(g, p) == 1)
      CHECK_RESULT(symmem_wait_signal(h, p, channel, 20000, NULL), SYMMEM_SUCCESS, "local wait for %d", p);
  sync_stream(0);
}

/* The team, pointers and local writes. */
static void check_team(symmem_group *g, symmem_handle *h, const char *layout) {
  int world = symmem_group_world_size(g), me = symmem_group_rank(g), dev = symmem_group_device(g);
  int mine = team_of(layout, me), local_size = 0, local_rank = -1;
  for (int r = 0; r < world; r++) {
    if (team_of(layout, r) == mine) {
      if (r == me)
        local_rank = local_size;
      local_size++;
    }
  }
  CHECK_EQ(symmem_group_local_rank(g), local_rank, "local rank");
  CHECK_EQ(symmem_group_local_size(g), local_size, "local size");
  CHECK_EQ(symmem_group_is_local(g, world), -1, "is_local of a rank out of range");
  CHECK_LAST_ERROR(SYMMEM_ERROR_INVALID_ARGUMENT, "is_local out of range");
  CHECK_EQ(symmem_group_local_rank(NULL), -1, "local_rank(NULL)");
  char name[256], want[32];
  size_t n = symmem_group_machine(g, me, name, sizeof name);
  snprintf(want, sizeof want, "machine \"m%d\"", machine_of(layout, me));
  CHECK(n > 0 && n < sizeof name && strstr(name, want) != NULL, "symmem_group_machine names %s: %s", want, name);
  CHECK_EQ(symmem_handle_mapped_peers(h), local_size - 1, "mapped peers");
  void *const *bufs = symmem_handle_buffer_ptrs(h);
  void *const *pads = symmem_handle_signal_pad_ptrs(h);
  for (int r = 0; r < world; r++) {
    int local = team_of(layout, r) == mine;
    CHECK_EQ(symmem_group_is_local(g, r), local, "is_local(%d)", r);
    CHECK((symmem_handle_buffer_ptr(h, r) != NULL) == local, "rank %d's buffer pointer is %s", r, local ? "mapped" : "NULL");
    CHECK((symmem_handle_signal_pad_ptr(h, r) != NULL) == local, "rank %d's pad pointer is %s", r, local ? "mapped" : "NULL");
    CHECK((bufs[r] != NULL) == local && (pads[r] != NULL) == local, "the pointer arrays agree for rank %d", r);
  }
  /* Every rank writes its mark into each local peer's block. */
  local_barrier(g, h, 1);
  for (int p = 0; p < world; p++) {
    char *dst = symmem_handle_buffer_ptr(h, p);
    if (dst != NULL) {
      uint64_t v = 1000 * (uint64_t)me + (uint64_t)p;
      CHECK_RESULT(symmem_copy(dst + 8 * me, &v, 8, dev, NULL), SYMMEM_SUCCESS, "write into rank %d", p);
    }
  }
  local_barrier(g, h, 1);
  for (int w = 0; w < world; w++) {
    if (team_of(layout, w) != mine)
      continue;
    uint64_t got = 0;
    symmem_copy(&got, (char *)symmem_handle_buffer_ptr(h, me) + 8 * w, 8, dev, NULL);
    CHECK_EQ(got, 1000 * (uint64_t)w + (uint64_t)me, "rank %d's mark in our block", w);
  }
  local_barrier(g, h, 1);
}

static int input(int r, int i, int call) { return (r * 7 + i * 3 + call) % 23 - 11; }

/* Every collective in int32 and float32 against integer references, at
 * sizes from one element per rank to past the one-shot limit and past
 * SYMMEM_HIER_MIN_BYTES (lowered to 64 KiB for these jobs, so that auto
 * runs large all-reduces hierarchically), with algo, all-reduce also in
 * place. Where the hierarchical all-reduce cannot run its steps inside the
 * machine (no_local: the stand-in driver launches no kernels), explicit
 * hierarchical must say so with UNAVAILABLE; with one rank per machine it
 * has no such steps and runs. */
static void check_collectives(symmem_handle *h, char *buf, size_t nbytes, int me, int world, symmem_algo algo, int no_local) {
  int call = 0;
  size_t counts[] = {(size_t)world, 7 * (size_t)world, 1000 * (size_t)world + 5, 40000 * (size_t)world};
  for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
    size_t count = counts[ci];
    for (int dt = 0; dt < 2; dt++) {
      symmem_dtype dtype = dt ? SYMMEM_FLOAT32 : SYMMEM_INT32;
      for (int kind = 0; kind < 4; kind++) { /* 3: all_reduce in place */
        if (kind == SYMMEM_REDUCE_SCATTER && count % world)
          continue;
        for (int op = 0; op < (kind == SYMMEM_ALL_GATHER ? 1 : 3); op++) {
          call++;
          int32_t *in = malloc(count * 4);
          for (size_t i = 0; i < count; i++) {
            int v = input(me, (int)i, call);
            if (dt) {
              float f = (float)v;
              memcpy(&in[i], &f, 4);
            } else {
              in[i] = v;
            }
          }
          symmem_copy(buf, in, count * 4, 0, NULL);
          char *out = kind == 3 ? buf : buf + nbytes / 2;
          size_t n = kind == SYMMEM_ALL_GATHER ? count * world : kind == SYMMEM_REDUCE_SCATTER ? count / world : count;
          symmem_coll coll = kind == 3 ? SYMMEM_ALL_REDUCE : (symmem_coll)kind;
          if (coll == SYMMEM_ALL_REDUCE && algo == SYMMEM_ALGO_HIERARCHICAL && no_local) {
            CHECK_RESULT(symmem_collective(h, coll, dtype, op, count, out, algo, 0, NULL), SYMMEM_ERROR_UNAVAILABLE,
                         "hierarchical all_reduce where the machine's steps cannot run, count %zu", count);
            CHECK(strstr(symmem_last_error_message(), "hierarchical") != NULL, "the message names the algorithm: %s",
                  symmem_last_error_message());
            free(in);
            continue;
          }
          CHECK_RESULT(symmem_collective(h, coll, dtype, op, count, out, algo, 0, NULL), SYMMEM_SUCCESS,
                       "collective %d (3: in place) dtype %d op %d count %zu algo %d", kind, dtype, op, count, algo);
          int32_t *got = malloc(n * 4);
          symmem_copy(got, out, n * 4, 0, NULL);
          size_t bad = 0;
          for (size_t j = 0; j < n; j++) {
            long want;
            if (kind == SYMMEM_ALL_GATHER) {
              want = input((int)(j / count), (int)(j % count), call);
            } else {
              size_t i = kind == SYMMEM_REDUCE_SCATTER ? (size_t)me * (count / world) + j : j;
              want = input(0, (int)i, call);
              for (int r = 1; r < world; r++) {
                long v = input(r, (int)i, call);
                want = op == SYMMEM_SUM ? want + v : op == SYMMEM_MAX ? (v > want ? v : want) : (v < want ? v : want);
              }
            }
            long g;
            if (dt) {
              float f;
              memcpy(&f, &got[j], 4);
              g = (long)f;
            } else {
              g = got[j];
            }
            bad += g != want;
          }
          CHECK_EQ(bad, (size_t)0, "collective %d dtype %d op %d count %zu algo %d: every element equals the reference", kind, dtype, op,
                   count, algo);
          free(in);
          free(got);
        }
      }
    }
  }
}

static int rank_nccl(const char *job, const char *layout, int rank, int world, int engine, int old) {
  ncclComm_t comm = make_comm(job, rank, world);
  if (comm == NULL)
    return check_summary();
  symmem_group *g = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s-g", job);
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 20000, 0, &g), SYMMEM_SUCCESS, "group over the communicator");
  if (g == NULL)
    return check_summary();
  size_t nbytes = 16 << 20; /* inputs below 8 MiB, outputs (all-gather: world x input) above */
  char *buf = symmem_alloc(nbytes, 0, NULL);
  symmem_handle *h = NULL;
  CHECK_RESULT(symmem_rendezvous(buf, g, &h), SYMMEM_SUCCESS, "rendezvous across machines");
  if (h == NULL)
    return check_summary();
  void *win = NULL;
  CHECK_RESULT(symmem_handle_nccl_window(h, &win, NULL), SYMMEM_SUCCESS, "the buffer is an NCCL window");
  check_team(g, h, layout);
  int remote = -1;
  for (int r = 0; r < world && remote < 0; r++)
    if (symmem_group_is_local(g, r) == 0)
      remote = r;
  if (engine) {
    /* The stand-in driver launches no kernels: the hierarchical all-reduce
     * has no steps inside the machine there (3 x 1 needs none). */
    const char *be = getenv("SYMMEM_BACKEND");
    int no_local = be != NULL && !strcmp(be, "cuda") && symmem_group_local_size(g) > 1;
    symmem_algo algos[] = {SYMMEM_ALGO_AUTO, SYMMEM_ALGO_HIERARCHICAL, SYMMEM_ALGO_NCCL};
    for (int a = 0; a < 3; a++)
      check_collectives(h, buf, nbytes, rank, world, algos[a], no_local);
    if (!no_local && symmem_group_local_size(g) > 1) {
      /* Hierarchical needs out inside the block (the machine's all-gather
       * reads the peers' out): refused with the reason. */
      int32_t *priv = symmem_alloc(4096, 0, NULL);
      CHECK_RESULT(symmem_collective(h, SYMMEM_ALL_REDUCE, SYMMEM_INT32, SYMMEM_SUM, 1024, priv, SYMMEM_ALGO_HIERARCHICAL, 0, NULL),
                   SYMMEM_ERROR_INVALID_ARGUMENT, "hierarchical all_reduce with out outside the block");
      CHECK(strstr(symmem_last_error_message(), "inside the rendezvoused block") != NULL, "the message says why: %s",
            symmem_last_error_message());
      symmem_free(priv, 4096, 0, NULL);
    }
    CHECK_RESULT(symmem_barrier(h, 0, 20000, NULL), SYMMEM_SUCCESS, "barrier across machines");
    if (old) {
      CHECK_RESULT(symmem_put_signal(h, remote, 0, NULL), SYMMEM_ERROR_UNAVAILABLE, "a remote signal on NCCL 2.28");
      CHECK(strstr(symmem_last_error_message(), "2.29") != NULL, "the message names 2.29: %s", symmem_last_error_message());
    } else {
      /* Three signals to every rank of the other machines, then three waits
       * for each (NCCL 2.29 has one signal slot per peer: channel 0). */
      for (int r = 0; r < world; r++)
        for (int i = 0; i < 3 && symmem_group_is_local(g, r) == 0; i++)
          CHECK_RESULT(symmem_put_signal(h, r, 0, NULL), SYMMEM_SUCCESS, "signal %d to rank %d", i, r);
      for (int r = 0; r < world; r++)
        for (int i = 0; i < 3 && symmem_group_is_local(g, r) == 0; i++)
          CHECK_RESULT(symmem_wait_signal(h, r, 0, 20000, NULL), SYMMEM_SUCCESS, "wait %d for rank %d", i, r);
      CHECK_RESULT(symmem_put_signal(h, remote, 1, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "a remote signal on a channel NCCL has no slot for");
      CHECK(strstr(symmem_last_error_message(), "signal slot") != NULL, "the message names NCCL's slots: %s", symmem_last_error_message());
      /* A barrier on a channel without a slot runs through an all-reduce. */
      CHECK_RESULT(symmem_barrier(h, 3, 20000, NULL), SYMMEM_SUCCESS, "barrier on channel 3 across machines");
    }
    CHECK_RESULT(symmem_barrier(h, 0, 20000, NULL), SYMMEM_SUCCESS, "barrier across machines");
    sync_stream(0);
  } else {
    local_barrier(g, h, 1);
  }
  CHECK_RESULT(symmem_handle_release(h), SYMMEM_SUCCESS, "release");
  symmem_free(buf, nbytes, 0, NULL);
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy");
  symmem_empty_cache(0);
  destroy_fn d = (destroy_fn)dlsym(nccl_lib, "ncclCommDestroy");
  CHECK(d != NULL && d(comm) == 0, "ncclCommDestroy");
  return check_summary();
}

/* The last rank (on the other machine than rank 0) never makes the
 * collective: the others fail with TIMEOUT or PEER within the timeout,
 * naming it or its machine. */
static int rank_dead(const char *job, const char *layout, int rank, int world) {
  (void)layout;
  ncclComm_t comm = make_comm(job, rank, world);
  symmem_group *g = NULL;
  char name[96];
  snprintf(name, sizeof name, "%s-g", job);
  CHECK_RESULT(symmem_group_create_nccl(comm, name, 3000, 0, &g), SYMMEM_SUCCESS, "group over the communicator");
  char *buf = symmem_alloc(1 << 20, 0, NULL);
  symmem_handle *h = NULL;
  CHECK_RESULT(symmem_rendezvous(buf, g, &h), SYMMEM_SUCCESS, "rendezvous");
  if (rank == world - 1) {
    fflush(stdout);
    _exit(check_summary());
  }
  double t0 = check_now_s();
  symmem_result rc = symmem_collective(h, SYMMEM_ALL_REDUCE, SYMMEM_FLOAT32, SYMMEM_SUM, 64, NULL, SYMMEM_ALGO_AUTO, 0, NULL);
  if (rc == SYMMEM_SUCCESS)
    rc = symmem_barrier(h, 0, 3000, NULL);
  if (rc == SYMMEM_SUCCESS) { /* enqueued: the wait for the stream fails */
    uint64_t a = 1, b = 0;
    rc = symmem_copy(&b, &a, sizeof a, 0, NULL);
  }
  double dt = check_now_s() - t0;
  CHECK(rc == SYMMEM_ERROR_TIMEOUT || rc == SYMMEM_ERROR_PEER, "a collective with a dead rank fails with TIMEOUT or PEER (got %d: %s)", rc,
        symmem_last_error_message());
  CHECK(dt < 30, "within the timeout (%.1f s)", dt);
  fflush(stdout);
  _exit(check_summary()); /* the stand-in may still wait for the dead rank */
}

/* symmem_group_create across machines that share a socket directory. */
static int rank_sockets(const char *job, int rank, int world) {
  symmem_group *g = NULL;
  CHECK_RESULT(symmem_group_create(job, rank, world, 0, 20000, &g), SYMMEM_ERROR_MISMATCH, "a socket group across machines");
  const char *msg = symmem_last_error_message();
  CHECK(strstr(msg, "different machines") && strstr(msg, "ranks 0, 1: machine \"m0\"") && strstr(msg, "rank 2: machine \"m1\""),
        "the message names the machines: %s", msg);
  return check_summary();
}

/* ---- the parent ----------------------------------------------------------- */

static char sock_root[4096];

static void run_job(const char *self, const char *mode, const char *layout, int world, const char *lib, int shared_dir) {
  int fabric = !strcmp(mode, "fabric");
  char job[96];
  snprintf(job, sizeof job, "mt-%d-%s-%s", (int)getpid(), mode, layout);
  check_info("job %s: %d ranks (%s), NCCL %s", job, world, layout, lib);
  size_t ne = 0;
  while (environ[ne])
    ne++;
  char **env = calloc(ne + 9, sizeof *env);
  size_t k = 0;
  int fake_driver = getenv("SYMMEM_LIBCUDA") != NULL;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_LIBNCCL=", 15) && strncmp(environ[i], "SYMMEM_BACKEND=", 15) &&
        strncmp(environ[i], "FAKECUDA_FABRIC", 15) &&
        strncmp(environ[i], "SYMMEM_MACHINE_ID=", 18) && strncmp(environ[i], "SYMMEM_SOCKET_DIR=", 18))
      env[k++] = environ[i];
  char libvar[4200];
  snprintf(libvar, sizeof libvar, "SYMMEM_LIBNCCL=%s", lib);
  env[k++] = libvar;
  env[k++] = fake_driver ? "SYMMEM_BACKEND=cuda" : "SYMMEM_BACKEND=host";
  env[k++] = !strcmp(mode, "dead") ? "FAKENCCL_TIMEOUT_MS=3000" : "FAKENCCL_TIMEOUT_MS=60000";
  env[k++] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
  env[k++] = "SYMMEM_HIER_MIN_BYTES=64K";
  if (fabric) {
    env[k++] = "FAKECUDA_FABRIC_OK=1";
    env[k++] = "FAKECUDA_FABRIC_CLUSTER=rack-1";
  }
  size_t fixed = k;
  pid_t pid[8];
  int out[8];
  char rank_s[8][16], world_s[16], machine[8][64], dir[8][4200];
  snprintf(world_s, sizeof world_s, "%d", world);
  double t0 = check_now_s();
  for (int r = 0; r < world; r++) {
    int m = machine_of(layout, r);
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    snprintf(machine[r], sizeof machine[r], "SYMMEM_MACHINE_ID=m%d", m);
    if (shared_dir)
      snprintf(dir[r], sizeof dir[r], "SYMMEM_SOCKET_DIR=%s/shared", sock_root);
    else
      snprintf(dir[r], sizeof dir[r], "SYMMEM_SOCKET_DIR=%s/m%d", sock_root, m);
    mkdir(dir[r] + strlen("SYMMEM_SOCKET_DIR="), 0700);
    k = fixed;
    env[k++] = machine[r];
    env[k++] = dir[r];
    env[k] = NULL;
    out[r] = check_tmpfd("machines-rank-out");
    char *argv[] = {(char *)self, "--rank", (char *)mode, job, (char *)layout, rank_s[r], world_s, NULL};
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
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && fails == 0,
          "job %s: rank %d finished cleanly (%s, %d failed checks)", job, r, check_status_str(status, sb, sizeof sb), fails);
  }
  check_info("job %s took %.2f s", job, check_now_s() - t0);
  free(env);
}

int main(int argc, char **argv) {
  if (argc == 7 && !strcmp(argv[1], "--rank")) {
    const char *mode = argv[2], *job = argv[3], *layout = argv[4];
    int rank = atoi(argv[5]), world = atoi(argv[6]);
    static char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    check_prefix_ = prefix;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(mode, "sockets"))
      return rank_sockets(job, rank, world);
    if (!strcmp(mode, "dead"))
      return rank_dead(job, layout, rank, world);
    int engine = !fabric_job();
    return rank_nccl(job, layout, rank, world, engine, !strcmp(mode, "nccl228"));
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  char lib[2][4096];
  if (realpath("build/libnccl_fake.so", lib[0]) == NULL || realpath("build/libnccl_fake_228.so", lib[1]) == NULL) {
    CHECK(0, "the NCCL stand-in is built (make build/libnccl_fake.so build/libnccl_fake_228.so)");
    return check_summary();
  }
  snprintf(sock_root, sizeof sock_root, "/tmp/symmem-machines-%d", (int)getpid());
  CHECK(mkdir(sock_root, 0700) == 0, "make %s", sock_root);
  run_job(argv[0], "nccl", "2x2", 4, lib[0], 0);
  run_job(argv[0], "nccl", "3x1", 3, lib[0], 0);
  run_job(argv[0], "sockets", "2x2", 3, lib[0], 1);
  if (getenv("SYMMEM_LIBCUDA") != NULL) {
    /* The stand-in driver with fabric handles and one NVLink domain: the
     * ranks of both machines form one team and map each other. */
    run_job(argv[0], "fabric", "2x2", 4, lib[0], 0);
  } else {
    check_info("the fabric job runs on the stand-in driver (SYMMEM_LIBCUDA): make test's c-fakecuda suite");
  }
  run_job(argv[0], "nccl228", "2x2", 4, lib[1], 0);
  run_job(argv[0], "dead", "2x2", 4, lib[0], 0);
  char cmd[4300];
  snprintf(cmd, sizeof cmd, "rm -rf %s", sock_root);
  CHECK(system(cmd) == 0, "remove %s", sock_root);
  return check_summary();
}
