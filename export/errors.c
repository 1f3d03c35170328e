// The per-thread last error of the C ABI. Go's exported functions run on the
// calling C thread, so a C thread-local is the caller's thread's error.
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define SYMMEM_MSG_CAP 1024

static __thread int last_code;
static __thread char last_msg[SYMMEM_MSG_CAP];

__attribute__((visibility("hidden"))) void symmemi_set_error(int code, const char *msg, size_t len) {
  if (len >= SYMMEM_MSG_CAP) len = SYMMEM_MSG_CAP - 1;
  memcpy(last_msg, msg, len);
  last_msg[len] = 0;
  last_code = code;
}

__attribute__((visibility("hidden"))) void symmemi_abort(const char *msg, size_t len) {
  fprintf(stderr, "libsymmem: SYMMEM_STRICT=1: %.*s\n", (int)len, msg);
  fflush(stderr);
  abort();
}

symmem_result symmem_last_error(void) { return (symmem_result)last_code; }

const char *symmem_last_error_message(void) { return last_msg; }

size_t symmem_copy_last_error(char *buf, size_t len) {
  size_t n = strlen(last_msg);
  if (buf != NULL && len > 0) {
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, last_msg, k);
    buf[k] = 0;
  }
  return n;
}

void symmem_clear_last_error(void) {
  last_code = 0;
  last_msg[0] = 0;
}
