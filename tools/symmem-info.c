/* symmem-info: what libsymmem finds on this machine (symmem_info_json), then
 * a self-test: allocate and free, and a 2-process group (this process and a
 * copy of it started with posix_spawn) that rendezvous and pass a barrier.
 * Prints "self-test: PASS" and exits 0, or "self-test: FAIL" and exits 1.
 * Installed by `make install`; `python -m symmem` prints the same from Python.
 *
 *   symmem-info                  report and self-test
 *   symmem-info --no-self-test   report only
 *   symmem-info --json           the report alone: one JSON document
 *   symmem-info --help           this usage
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <symmem.h>

extern char **environ;

/* One rank of the self-test group: create, rendezvous on 4 KiB, barrier. */
static int run_rank(const char *name, int rank) {
  symmem_group *g = NULL;
  symmem_handle *h = NULL;
  void *buf = NULL;
  int ok = 0;
  if (symmem_group_create(name, rank, 2, 0, 30000, &g) != SYMMEM_SUCCESS) {
    fprintf(stderr, "rank %d: group_create: %s\n", rank, symmem_last_error_message());
    return 1;
  }
  buf = symmem_alloc(4096, 0, NULL);
  if (buf == NULL) {
    fprintf(stderr, "rank %d: alloc: %s\n", rank, symmem_last_error_message());
  } else if (symmem_rendezvous(buf, g, &h) != SYMMEM_SUCCESS) {
    fprintf(stderr, "rank %d: rendezvous: %s\n", rank, symmem_last_error_message());
  } else if (symmem_barrier(h, 0, 30000, NULL) != SYMMEM_SUCCESS) {
    fprintf(stderr, "rank %d: barrier: %s\n", rank, symmem_last_error_message());
  } else {
    ok = 1;
  }
  symmem_handle_release(h);
  symmem_free(buf, 4096, 0, NULL);
  symmem_group_destroy(g);
  return ok ? 0 : 1;
}

static int self_test(const char *argv0) {
  int pass = 1;
  void *p = symmem_alloc(1 << 20, 0, NULL);
  if (p == NULL) {
    printf("  FAIL allocate and free: %s\n", symmem_last_error_message());
    printf("self-test: FAIL\n");
    return 1;
  }
  symmem_free(p, 1 << 20, 0, NULL);
  int v = symmem_validate(0);
  printf("  %s allocate and free: 1 MiB at %p%s\n", v == SYMMEM_SUCCESS ? "PASS" : "FAIL", p,
         v == SYMMEM_SUCCESS ? "" : symmem_last_error_message());
  pass &= v == SYMMEM_SUCCESS;

  char name[64];
  snprintf(name, sizeof name, "symmem-info-%ld-%ld", (long)getpid(), (long)time(NULL));
  char *args[] = {(char *)argv0, "--rank", "1", name, NULL};
  setenv("SYMMEM_ALLOW_OVERLAPPING_DEVICES", "1", 1);
  pid_t child;
  const char *exe = "/proc/self/exe";
  if (posix_spawn(&child, exe, NULL, NULL, args, environ) != 0) {
    printf("  FAIL 2-process group: cannot start a second process\n");
    printf("self-test: FAIL\n");
    return 1;
  }
  int r0 = run_rank(name, 0);
  int status = 0;
  waitpid(child, &status, 0);
  int ok = r0 == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("  %s 2-process group, rendezvous, barrier\n", ok ? "PASS" : "FAIL");
  pass &= ok;
  printf("self-test: %s\n", pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

static const char usage[] =
    "usage: symmem-info [--json | --no-self-test | --help]\n"
    "  (no option)     what libsymmem finds here (JSON), then a self-test:\n"
    "                  allocate and free, a 2-process group, rendezvous, barrier\n"
    "  --json          the report alone, as one JSON document (no self-test)\n"
    "  --no-self-test  the report, without the self-test\n"
    "  --help          this text\n"
    "Exit status: 0, or 1 when the report or the self-test fails, 2 on a bad option.\n";

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--rank") == 0)
    return run_rank(argv[3], atoi(argv[2]));
  int report_only = 0;
  if (argc > 2) {
    fprintf(stderr, "symmem-info: one option at most\n%s", usage);
    return 2;
  }
  if (argc == 2) {
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    }
    if (strcmp(argv[1], "--json") != 0 && strcmp(argv[1], "--no-self-test") != 0) {
      fprintf(stderr, "symmem-info: unknown option %s\n%s", argv[1], usage);
      return 2;
    }
    report_only = 1;
  }
  size_t n = symmem_info_json(NULL, 0);
  char *json = malloc(n + 1);
  if (json == NULL || symmem_info_json(json, n + 1) != n) {
    fprintf(stderr, "symmem_info_json failed: %s\n", symmem_last_error_message());
    free(json);
    return 1;
  }
  printf("%s\n", json);
  free(json);
  if (report_only)
    return 0;
  printf("self-test:\n");
  fflush(stdout);
  return self_test(argv[0]);
}
