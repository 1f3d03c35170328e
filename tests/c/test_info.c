/*
 * test_info.c - the diagnostic and snapshot documents from C:
 * symmem_info_json and symmem_memory_snapshot_json size their buffer like
 * snprintf (length returned, truncated copies NUL-terminated), name the
 * version, the backend and the blocks allocated; the context hook numbers
 * allocations while recording is on, and the history names them.
 */
#include "check.h"

static uint64_t calls;
static uint64_t hook(void *user) {
  calls++;
  return *(uint64_t *)user;
}

static char *doc(size_t (*fn)(char *, size_t)) {
  size_t n = fn(NULL, 0);
  CHECK(n > 2, "document length %zu", n);
  char *buf = malloc(n + 64);
  size_t m = fn(buf, n + 64);
  CHECK(m < n + 64 && strlen(buf) == m, "full copy: %zu bytes, strlen %zu", m, strlen(buf));
  return buf;
}

int main(void) {
  char *info = doc(symmem_info_json);
  char want[64];
  snprintf(want, sizeof want, "\"version_number\": %d", SYMMEM_VERSION);
  CHECK(strstr(info, want) != NULL, "info names the header's version (%s)", want);
  snprintf(want, sizeof want, "\"name\": \"%s\"", symmem_backend_name());
  CHECK(strstr(info, want) != NULL, "info names the backend (%s)", want);
  CHECK(strstr(info, "\"socket_dir\"") && strstr(info, "\"settings\"") && strstr(info, "\"nccl\""),
        "info has the socket directory, settings and library sections");
  char small[8];
  size_t n = symmem_info_json(small, sizeof small);
  CHECK(n == strlen(info) && strlen(small) == sizeof small - 1, "truncated copy NUL-terminated, full length returned");
  free(info);

  uint64_t ctx = 4242;
  CHECK_RESULT(symmem_set_context_hook(hook, &ctx), SYMMEM_SUCCESS, "set_context_hook");
  void *before = symmem_alloc(1000, 0, NULL);
  CHECK(calls == 0, "no hook calls while not recording (%llu)", (unsigned long long)calls);
  CHECK_RESULT(symmem_record_history(100), SYMMEM_SUCCESS, "record_history(100)");
  void *p = symmem_alloc(3000, 0, NULL);
  CHECK(p != NULL && calls == 1, "one hook call per allocation while recording");
  char *s = doc(symmem_memory_snapshot_json);
  char blk[160];
  snprintf(blk, sizeof blk, "{\"address\":%llu,\"size\":3072,\"requested_size\":3000,\"state\":\"active_allocated\",\"context\":4242}",
           (unsigned long long)(uintptr_t)p);
  CHECK(strstr(s, blk) != NULL, "the snapshot lists the block with its context: %s", blk);
  snprintf(blk, sizeof blk, "\"action\":\"alloc\",\"addr\":%llu,\"size\":3000", (unsigned long long)(uintptr_t)p);
  CHECK(strstr(s, blk) != NULL, "the history has its alloc event");
  snprintf(blk, sizeof blk, "\"action\":\"alloc\",\"addr\":%llu,", (unsigned long long)(uintptr_t)before);
  CHECK(strstr(s, blk) == NULL, "nothing was recorded before recording started");
  free(s);
  symmem_free(p, 3000, 0, NULL);
  symmem_free(before, 1000, 0, NULL);
  CHECK_RESULT(symmem_record_history(0), SYMMEM_SUCCESS, "record_history(0) stops it");
  s = doc(symmem_memory_snapshot_json);
  CHECK(strstr(s, "\"recording\":false") != NULL, "not recording");
  free(s);
  CHECK_RESULT(symmem_record_history((size_t)1 << 40), SYMMEM_ERROR_INVALID_ARGUMENT, "absurd ring size refused");
  symmem_set_context_hook(NULL, NULL);
  return check_summary();
}
