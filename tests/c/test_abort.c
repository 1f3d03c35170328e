/*
 * test_abort.c - symmem_group_abort with a peer that is gone mid-barrier.
 *
 * Two ranks (this program re-executed, check_spawn_self). After a first
 * barrier rank 1 leaves the job: "killed" (SIGKILL of itself) or "stopped"
 * (SIGSTOP of itself: a hung peer, which the dead-peer watch cannot see).
 * Rank 0 enters a second barrier that rank 1 never enters and, 300 ms
 * later, another thread calls symmem_group_abort:
 *
 *   host backend: the barrier waits on the calling thread and returns
 *     ABORTED (or, for a killed peer, PEER if it noticed the exit first);
 *   cuda (the stand-in driver in the c-fakecuda suite): the barrier is a
 *     stream wait and returns at once; a symmem_copy on the same stream
 *     waits behind it, and returns once the abort has released it.
 *
 * Either way the wait must end within a few seconds of the abort (the
 * group's timeout is 20 s). Then every call on the group and its handle
 * returns ABORTED, symmem_handle_device_error still answers, and release
 * and destroy succeed.
 */
#include "check.h"

#define TIMEOUT_MS 20000
#define ABORT_AFTER_S 0.3

static symmem_group *abort_group;

static void *abort_later(void *arg) {
  (void)arg;
  struct timespec ts = {0, (long)(ABORT_AFTER_S * 1e9)};
  nanosleep(&ts, NULL);
  CHECK_RESULT(symmem_group_abort(abort_group), SYMMEM_SUCCESS, "group_abort from another thread");
  return NULL;
}

static int rank_main(const char *mode, int rank, const char *name) {
  char prefix[32];
  snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  check_prefix_ = prefix;
  int host = check_is_host();
  symmem_group *g = NULL;
  symmem_result rc = symmem_group_create(name, rank, 2, host ? 0 : rank % symmem_device_count(), TIMEOUT_MS, &g);
  if (!CHECK(rc == SYMMEM_SUCCESS, "group_create: %s", symmem_last_error_message()))
    return check_summary();
  int device = symmem_group_device(g);
  void *buf = symmem_alloc(64 * 1024, device, NULL);
  symmem_handle *h = NULL;
  if (!CHECK(buf != NULL, "alloc"))
    return check_summary();
  rc = symmem_rendezvous(buf, g, &h);
  if (!CHECK(rc == SYMMEM_SUCCESS, "rendezvous: %s", symmem_last_error_message()))
    return check_summary();
  CHECK_RESULT(symmem_barrier(h, 0, TIMEOUT_MS, NULL), SYMMEM_SUCCESS, "first barrier");
  if (!host) {
    uint32_t v = 0;
    check_mem_read(&v, buf, sizeof v, device); /* waits for the barrier's stream */
  }
  if (rank == 1) {
    fflush(stdout);
    kill(getpid(), !strcmp(mode, "killed") ? SIGKILL : SIGSTOP);
    for (;;) pause(); /* stopped until the parent kills it */
  }
  /* Rank 0: a barrier that rank 1 never enters, released by the abort. */
  abort_group = g;
  pthread_t th;
  pthread_create(&th, NULL, abort_later, NULL);
  double t0 = check_now_s();
  rc = symmem_barrier(h, 1, TIMEOUT_MS, NULL);
  if (host) {
    CHECK(rc == SYMMEM_ERROR_ABORTED || (rc == SYMMEM_ERROR_PEER && !strcmp(mode, "killed")),
          "the barrier with rank 1 %s returns ABORTED (or PEER for a killed peer): %d (%s)", mode, (int)rc,
          symmem_last_error_message());
  } else {
    CHECK_RESULT(rc, SYMMEM_SUCCESS, "the barrier is enqueued");
    uint32_t v = 0;
    CHECK_RESULT(symmem_copy(&v, buf, sizeof v, device, NULL), SYMMEM_SUCCESS,
                 "a copy on the stream behind the barrier's wait returns once the abort released it");
  }
  double took = check_now_s() - t0;
  CHECK(took < ABORT_AFTER_S + 5, "the wait ended %.2f s after the abort (the timeout is %d s)", took - ABORT_AFTER_S,
        TIMEOUT_MS / 1000);
  pthread_join(th, NULL);
  CHECK_RESULT(symmem_barrier(h, 0, TIMEOUT_MS, NULL), SYMMEM_ERROR_ABORTED, "barrier after the abort");
  CHECK_RESULT(symmem_put_signal(h, 1, 0, NULL), SYMMEM_ERROR_ABORTED, "put_signal after the abort");
  CHECK_RESULT(symmem_wait_signal(h, 1, 0, TIMEOUT_MS, NULL), SYMMEM_ERROR_ABORTED, "wait_signal after the abort");
  CHECK_RESULT(symmem_all_reduce(h, SYMMEM_FLOAT32, SYMMEM_SUM, 16, NULL, NULL), SYMMEM_ERROR_ABORTED,
               "all_reduce after the abort");
  symmem_handle *h2 = NULL;
  CHECK_RESULT(symmem_rendezvous(buf, g, &h2), SYMMEM_ERROR_ABORTED, "rendezvous after the abort");
  CHECK_RESULT(symmem_pause_group(g, NULL), SYMMEM_ERROR_ABORTED, "pause_group after the abort");
  uint32_t flag = 1;
  rc = symmem_handle_device_error(h, &flag);
  CHECK(rc == SYMMEM_SUCCESS || rc == SYMMEM_ERROR_PEER || rc == SYMMEM_ERROR_ABORTED,
        "device_error still answers after the abort: %d", (int)rc);
  CHECK_RESULT(symmem_group_abort(g), SYMMEM_SUCCESS, "a second abort");
  CHECK_RESULT(symmem_handle_release(h), SYMMEM_SUCCESS, "release after the abort");
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy after the abort");
  symmem_free(buf, 64 * 1024, device, NULL);
  return check_summary();
}

static void run(const char *self, const char *mode) {
  char name[96];
  snprintf(name, sizeof name, "ctest-abort-%d-%s", (int)getpid(), mode);
  check_info("mode %s: group %s", mode, name);
  char **child_env = NULL;
  if (!check_is_host() && symmem_device_count() < 2) {
    size_t ne = 0;
    while (environ[ne]) ne++;
    child_env = calloc(ne + 2, sizeof *child_env);
    memcpy(child_env, environ, ne * sizeof *child_env);
    child_env[ne] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
  }
  pid_t pid[2];
  int out[2];
  char rank_s[2][8];
  for (int r = 0; r < 2; r++) {
    snprintf(rank_s[r], sizeof rank_s[r], "%d", r);
    out[r] = check_tmpfd("abort-rank-out");
    char *argv[] = {(char *)self, "--rank", (char *)mode, rank_s[r], name, NULL};
    pid[r] = check_spawn_self(argv, child_env, out[r], out[r]);
    CHECK(pid[r] > 0, "spawn rank %d", r);
  }
  int st0 = pid[0] > 0 ? check_wait_pid(pid[0], 60) : -1;
  if (pid[1] > 0) kill(pid[1], SIGKILL); /* the stopped one */
  int st1 = pid[1] > 0 ? check_wait_pid(pid[1], 10) : -1;
  char sb[128];
  for (int r = 0; r < 2; r++) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, "[rank %d] ", r);
    char *o = check_read_fd(out[r]);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out[r]);
    CHECK(fails == 0, "mode %s: rank %d had no failed checks", mode, r);
  }
  CHECK(st0 != -1 && WIFEXITED(st0) && WEXITSTATUS(st0) == 0, "mode %s: rank 0 finished cleanly (%s)", mode,
        check_status_str(st0, sb, sizeof sb));
  CHECK(st1 != -1 && WIFSIGNALED(st1) && WTERMSIG(st1) == SIGKILL, "mode %s: rank 1 was killed (%s)", mode,
        check_status_str(st1, sb, sizeof sb));
  free(child_env);
}

int main(int argc, char **argv) {
  if (argc == 5 && !strcmp(argv[1], "--rank"))
    return rank_main(argv[2], atoi(argv[3]), argv[4]);
  setvbuf(stdout, NULL, _IOLBF, 0);
  check_info("backend %s", symmem_backend_name());
  CHECK_RESULT(symmem_group_abort(NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "group_abort(NULL)");
  run(argv[0], "killed");
  run(argv[0], "stopped");
  return check_summary();
}
