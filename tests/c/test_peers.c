/*
 * test_peers.c - ranks that die or disagree, with real processes (this
 * program re-executed, never forked):
 *
 *   dead peer:   the last rank exits (status 3) 150 ms after a barrier. On
 *                the host backend the others' next barrier fails with
 *                SYMMEM_ERROR_PEER naming the rank, its pid and its exit
 *                status within 100 ms of the exit (500 ms allowed here). On
 *                cuda, where barriers are stream operations and collectives
 *                kernels, the library writes the abort word of each rank's
 *                device region (include/symmem_device.cuh), which kernels'
 *                waits read: checked here on the stand-in driver.
 *   two rank 0s: two processes both started as rank 0 fail at once with
 *                SYMMEM_ERROR_MISMATCH naming both pids.
 */
#include "check.h"

static int host_memory;

static char **child_env(void) {
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 2, sizeof *env);
  memcpy(env, environ, ne * sizeof *env);
  env[ne] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1"; /* ranks may share the device */
  return env;
}

static int dead_peer_rank(const char *name, int rank, int world) {
  const int last = world - 1;
  symmem_group *g = NULL;
  symmem_handle *h = NULL;
  void *p = symmem_alloc(64 << 10, 0, NULL);
  if (!CHECK(p != NULL, "alloc")) return check_summary();
  symmem_result rc = symmem_group_create(name, rank, world, 0, 20000, &g);
  CHECK_RESULT(rc, SYMMEM_SUCCESS, "group_create");
  if (rc != SYMMEM_SUCCESS) return check_summary();
  rc = symmem_rendezvous(p, g, &h);
  CHECK_RESULT(rc, SYMMEM_SUCCESS, "rendezvous");
  if (rc != SYMMEM_SUCCESS) return check_summary();
  CHECK_RESULT(symmem_barrier(h, 0, 20000, NULL), SYMMEM_SUCCESS, "barrier with every rank alive");
  if (rank == last) {
    /* On cuda the barrier's arrivals are stream operations: they land
     * before this rank leaves (a copy on the same stream waits for them),
     * so that the peers' barrier completes and the exit is the only fault. */
    uint32_t drained = 0;
    CHECK_RESULT(symmem_copy(&drained, p, sizeof drained, 0, NULL), SYMMEM_SUCCESS, "the barrier's stream work done");
    struct timespec ts = {0, 150 * 1000 * 1000};
    nanosleep(&ts, NULL);
    fflush(stdout);
    _exit(3);
  }
  if (host_memory) {
    double t0 = check_now_s();
    rc = symmem_barrier(h, 1, 20000, NULL);
    double waited = check_now_s() - t0;
    char want[64];
    snprintf(want, sizeof want, "rank %d (pid ", last);
    const char *msg = symmem_last_error_message();
    CHECK_RESULT(rc, SYMMEM_ERROR_PEER, "barrier while rank %d exits", last);
    CHECK(strstr(msg, want) && strstr(msg, "exited with status 3"), "the error names rank %d, its pid and status: %s",
          last, msg);
    CHECK(waited < 0.15 + 0.5, "noticed after %.0f ms (the peer left 150 ms after the barrier began)", waited * 1e3);
  } else {
    /* The abort word (word 1 of our device region) names the rank. */
    uint32_t *abort_word = (uint32_t *)((char *)symmem_handle_signal_pad_ptr(h, rank) +
                                        symmem_handle_signal_pad_size(h) + 4);
    uint32_t v = 0;
    double t0 = check_now_s();
    while (check_now_s() - t0 < 5.0) {
      if (symmem_copy(&v, abort_word, 4, 0, NULL) != SYMMEM_SUCCESS || v != 0) break;
      struct timespec ts = {0, 5 * 1000 * 1000};
      nanosleep(&ts, NULL);
    }
    double waited = check_now_s() - t0;
    CHECK(v == (0xC0000000u | (uint32_t)last << 16), "the abort word says rank %d exited: %#x", last, v);
    CHECK(waited < 0.15 + 0.5, "written %.0f ms after the barrier (the peer left at 150 ms)", waited * 1e3);
  }
  symmem_handle_release(h);
  symmem_group_destroy(g);
  symmem_free(p, 64 << 10, 0, NULL);
  return check_summary();
}

static int rank0_rank(const char *name) {
  symmem_group *g = NULL;
  double t0 = check_now_s();
  symmem_result rc = symmem_group_create(name, 0, 2, 0, 20000, &g);
  double waited = check_now_s() - t0;
  const char *msg = symmem_last_error_message();
  CHECK_RESULT(rc, SYMMEM_ERROR_MISMATCH, "group_create as a second rank 0");
  CHECK(strstr(msg, "two processes claim rank 0: pid ") && strstr(msg, " and pid "), "named as such: %s", msg);
  CHECK(waited < 10.0, "at once (%.0f ms; the timeout is 20 s)", waited * 1e3);
  symmem_group_destroy(g);
  return check_summary();
}

/* Runs one job of n processes with the given ranks and counts the checks;
 * exits[r] is the exit status expected of process r. */
static void run_job(const char *self, const char *what, int world, const int *ranks, const int *exits) {
  char name[96], world_s[16], rank_s[8][16];
  snprintf(name, sizeof name, "cpeers-%d-%s-%d", (int)getpid(), what, world);
  snprintf(world_s, sizeof world_s, "%d", world);
  char **env = child_env();
  pid_t pid[8];
  int out[8];
  for (int i = 0; i < world; i++) {
    snprintf(rank_s[i], sizeof rank_s[i], "%d", ranks[i]);
    out[i] = check_tmpfd("peers-out");
    char *argv[] = {(char *)self, "--rank", (char *)what, rank_s[i], name, world_s, NULL};
    pid[i] = check_spawn_self(argv, env, out[i], out[i]);
    CHECK(pid[i] > 0, "%s: spawn process %d", what, i);
  }
  for (int i = 0; i < world; i++) {
    int st = pid[i] > 0 ? check_wait_pid(pid[i], 60) : -1;
    char prefix[32], sb[64];
    snprintf(prefix, sizeof prefix, "[rank %d] ", ranks[i]);
    char *o = check_read_fd(out[i]);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out[i]);
    CHECK(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == exits[i] && fails == 0,
          "%s, %d processes: process %d (rank %d) ended as expected (%s, %d failed checks)", what, world, i, ranks[i],
          check_status_str(st, sb, sizeof sb), fails);
  }
  free(env);
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  host_memory = !strcmp(symmem_backend_name(), "host");
  if (argc == 6 && !strcmp(argv[1], "--rank")) {
    static char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", atoi(argv[3]));
    check_prefix_ = prefix;
    if (!strcmp(argv[2], "dead"))
      return dead_peer_rank(argv[4], atoi(argv[3]), atoi(argv[5]));
    return rank0_rank(argv[4]);
  }
  check_info("backend %s", symmem_backend_name());
  for (int world = 2; world <= 4; world += 2) {
    int ranks[4] = {0, 1, 2, 3}, exits[4] = {0, 0, 0, 0};
    exits[world - 1] = 3;
    run_job(argv[0], "dead", world, ranks, exits);
  }
  int zeros[2] = {0, 0}, ok[2] = {0, 0};
  run_job(argv[0], "rank0", 2, zeros, ok);
  return check_summary();
}
