/*
 * test_lifetimes.c - releasing and destroying while other threads use the
 * objects, and a peer that dies while we wait for it, through the C ABI on whatever backend runs (host in CI, the fake
 * driver, GPUs in scripts/gpu_suite.sh). Two ranks, spawned as processes
 * (never forked):
 *   A. rank 0 destroys a group while another thread waits in a rendezvous
 *      that rank 1 never joins: the rendezvous returns INVALID_STATE at once;
 *   B. (host-side waits) rank 0 releases a handle, its group already
 *      destroyed, while two threads wait on it (wait_signal, barrier): they
 *      return INVALID_STATE at once, nothing faults, later calls fail;
 *   C. rank 1 dies without a word; rank 0 waits for its signal: on the host
 *      the wait times out naming rank 1; on a GPU the wait is enqueued and
 *      the release that follows cannot synchronise the device, so it leaves
 *      the memory mapped and says so (TIMEOUT) instead of unmapping what the
 *      stuck stream may still touch.
 */
#include "check.h"

#define KiB 1024

static int host_memory;

struct waiter {
  symmem_handle *h;
  symmem_group *g;
  void *ptr;
  int what; /* 0: wait_signal, 1: barrier, 2: rendezvous */
  symmem_result rc;
  char msg[512];
  double took;
};

static void *wait_thread(void *arg) {
  struct waiter *w = arg;
  double t0 = check_now_s();
  symmem_handle *out = NULL;
  switch (w->what) {
  case 0: w->rc = symmem_wait_signal(w->h, 1, 0, 60000, NULL); break;
  case 1: w->rc = symmem_barrier(w->h, 1, 60000, NULL); break;
  default:
    w->rc = symmem_rendezvous(w->ptr, w->g, &out);
    if (out) symmem_handle_release(out);
  }
  w->took = check_now_s() - t0;
  snprintf(w->msg, sizeof w->msg, "%s", symmem_last_error_message());
  return NULL;
}

static int rank_main(int rank, const char *name) {
  char prefix[16];
  snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
  check_prefix_ = prefix;
  host_memory = !strcmp(symmem_backend_name(), "host");
  int dev = host_memory ? 0 : rank % symmem_device_count();
  char name2[128];
  snprintf(name2, sizeof name2, "%s-two", name);
  symmem_group *g = NULL, *g2 = NULL;
  CHECK_RESULT(symmem_group_create(name, rank, 2, dev, 30000, &g), SYMMEM_SUCCESS, "group_create");
  if (!g) return check_summary();
  void *p = symmem_alloc(64 * KiB, dev, NULL);
  symmem_handle *h = NULL, *h2 = NULL;
  CHECK_RESULT(symmem_rendezvous(p, g, &h), SYMMEM_SUCCESS, "rendezvous 1");
  CHECK_RESULT(symmem_rendezvous(p, g, &h2), SYMMEM_SUCCESS, "rendezvous 2");
  CHECK_RESULT(symmem_group_create(name2, rank, 2, dev, 60000, &g2), SYMMEM_SUCCESS, "second group_create");
  if (!h || !h2 || !g2) return check_summary();

  if (rank == 1) {
    /* Stays in the second group without joining rank 0's rendezvous,
     * then dies without releasing anything: no destroy, no signal. */
    sleep(2);
    fflush(stdout);
    _exit(check_summary());
  }

  /* A. Destroy during a rendezvous in flight on another thread. */
  struct waiter rv = {.g = g2, .ptr = p, .what = 2};
  pthread_t t;
  pthread_create(&t, NULL, wait_thread, &rv);
  usleep(300 * 1000);
  double t0 = check_now_s();
  CHECK_RESULT(symmem_group_destroy(g2), SYMMEM_SUCCESS, "destroy a group while a rendezvous waits in it");
  pthread_join(t, NULL);
  CHECK(check_now_s() - t0 < 5, "destroy and the rendezvous returned within 5 s (%.2f s)", check_now_s() - t0);
  CHECK(rv.rc == SYMMEM_ERROR_INVALID_STATE && strstr(rv.msg, "left the group"),
        "the rendezvous cut short by destroy: INVALID_STATE (%d: %s)", rv.rc, rv.msg);

  /* B. Release during host-side waits, the group already destroyed. */
  CHECK_RESULT(symmem_group_destroy(g), SYMMEM_SUCCESS, "destroy the first group (its handles stay)");
  if (host_memory) {
    struct waiter w[2] = {{.h = h, .what = 0}, {.h = h, .what = 1}};
    pthread_t tw[2];
    for (int i = 0; i < 2; i++) pthread_create(&tw[i], NULL, wait_thread, &w[i]);
    usleep(300 * 1000);
    t0 = check_now_s();
    CHECK_RESULT(symmem_handle_release(h), SYMMEM_SUCCESS, "release a handle while two threads wait on it");
    for (int i = 0; i < 2; i++) pthread_join(tw[i], NULL);
    for (int i = 0; i < 2; i++)
      CHECK(w[i].rc == SYMMEM_ERROR_INVALID_STATE && strstr(w[i].msg, "released") && w[i].took < 5,
            "%s cut short by release: INVALID_STATE in %.2f s (%d: %s)", i ? "barrier" : "wait_signal", w[i].took,
            w[i].rc, w[i].msg);
    CHECK_RESULT(symmem_put_signal(h, 1, 0, NULL), SYMMEM_ERROR_INVALID_ARGUMENT, "put_signal on the released handle");
  } else {
    check_skip("B: signal waits are stream operations on this backend (no host-side wait to cut short)");
    CHECK_RESULT(symmem_handle_release(h), SYMMEM_SUCCESS, "release the first handle");
  }

  /* C. Rank 1 is dead (it exits 2 s after the groups were made). */
  sleep(2);
  t0 = check_now_s();
  symmem_result rc = symmem_wait_signal(h2, 1, 2, 500, NULL);
  if (host_memory) {
    double took = check_now_s() - t0;
    CHECK(rc == SYMMEM_ERROR_PEER && strstr(symmem_last_error_message(), "rank 1 (pid ") &&
              strstr(symmem_last_error_message(), "exited") && took < 0.4,
          "waiting for a dead peer's signal fails at once naming it (%d in %.0f ms: %s)", rc, took * 1e3,
          symmem_last_error_message());
    CHECK_RESULT(symmem_handle_release(h2), SYMMEM_SUCCESS, "release after the dead peer");
  } else {
    CHECK_RESULT(rc, SYMMEM_SUCCESS, "a wait for the dead peer's signal is enqueued");
    /* Where stream signals run as a kernel (NVRTC found, SYMMEM_SIGNAL_KERNEL
     * not 0: Note [Signals as a kernel]), the wait gives up when the
     * dead-peer watch sets the abort word, so the release's synchronisation
     * ends and the memory goes; with the driver's stream operations the
     * stream stays stuck and the memory is left mapped, which the error
     * says. */
    const char *sk = getenv("SYMMEM_SIGNAL_KERNEL");
    int signal_kernel = symmem_collectives_load(0, NULL) == SYMMEM_SUCCESS && !(sk && strcmp(sk, "0") == 0);
    rc = symmem_handle_release(h2);
    if (signal_kernel)
      CHECK_RESULT(rc, SYMMEM_SUCCESS, "release behind a signal kernel that gave up on the dead peer");
    else
      CHECK(rc == SYMMEM_ERROR_TIMEOUT && strstr(symmem_last_error_message(), "deliberately leaked"),
            "release behind a stream stuck on the dead peer leaves the memory mapped and says so (%d: %s)", rc,
            symmem_last_error_message());
  }
  CHECK(check_now_s() - t0 < 30, "C took %.1f s (bounded by SYMMEM_TIMEOUT_MS)", check_now_s() - t0);
  if (host_memory) {
    symmem_free(p, 64 * KiB, dev, NULL);
    CHECK_RESULT(symmem_validate(dev), SYMMEM_SUCCESS, "the allocator is valid at the end");
  }
  fflush(stdout);
  /* On a GPU the default stream stays blocked for good: leave at once. */
  _exit(check_summary());
}

int main(int argc, char **argv) {
  if (argc == 4 && !strcmp(argv[1], "--rank")) return rank_main(atoi(argv[2]), argv[3]);
  setvbuf(stdout, NULL, _IOLBF, 0);
  check_info("backend %s", symmem_backend_name());
  char name[64];
  snprintf(name, sizeof name, "lifetimes-%d", (int)getpid());
  /* Short group waits: the GPU case C waits one SYMMEM_TIMEOUT_MS. */
  size_t ne = 0;
  while (environ[ne]) ne++;
  char **env = calloc(ne + 3, sizeof *env);
  size_t k = 0;
  for (size_t i = 0; i < ne; i++)
    if (strncmp(environ[i], "SYMMEM_TIMEOUT_MS=", 18)) env[k++] = environ[i];
  env[k++] = "SYMMEM_TIMEOUT_MS=5000";
  if (strcmp(symmem_backend_name(), "host") && symmem_device_count() < 2) env[k++] = "SYMMEM_ALLOW_OVERLAPPING_DEVICES=1";
  pid_t pid[2];
  int out[2];
  for (int r = 0; r < 2; r++) {
    char rs[8];
    snprintf(rs, sizeof rs, "%d", r);
    out[r] = check_tmpfd("lifetimes-out");
    char *av[] = {argv[0], "--rank", rs, name, NULL};
    pid[r] = check_spawn_self(av, env, out[r], out[r]);
    CHECK(pid[r] > 0, "spawn rank %d", r);
  }
  for (int r = 0; r < 2; r++) {
    int status = pid[r] > 0 ? check_wait_pid(pid[r], 90) : -1;
    char prefix[16], sb[128];
    snprintf(prefix, sizeof prefix, "[rank %d] ", r);
    char *o = check_read_fd(out[r]);
    int fails = check_count_output(o ? o : "", prefix);
    free(o);
    close(out[r]);
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0 && fails == 0,
          "rank %d finished cleanly (%s, %d failed checks)", r, check_status_str(status, sb, sizeof sb), fails);
  }
  free(env);
  return check_summary();
}
