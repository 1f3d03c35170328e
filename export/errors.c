// The per-thread last error of the C ABI. Go's exported functions run on the
// calling C thread, so a C thread-local is the caller's thread's error.
//
// Messages may be long (a group's verdict names every rank): the buffer
// grows to fit, up to SYMMEM_MSG_MAX bytes; a longer message is cut at a
// word boundary and ends with "…", never mid-word. The buffer is freed when
// its thread exits (a pthread key's destructor).
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define SYMMEM_MSG_MAX (64 * 1024)

// initial-exec: the variables live in the static TLS block, reached without
// __tls_get_addr. With the default (general dynamic) model LeakSanitizer's
// tracking of dynamic TLS blocks misread one as a 32 GiB range and scanned
// it for minutes at exit (the fake-cuda test_symm ranks "hung" there); a
// Go c-shared library already needs static TLS, so this costs nothing.
#define SYMMEM_TLS __thread __attribute__((tls_model("initial-exec")))
static SYMMEM_TLS int last_code;
static SYMMEM_TLS char *last_msg;
static SYMMEM_TLS size_t last_cap;
static char empty_msg[1];

static pthread_key_t msg_key;
static pthread_once_t msg_key_once = PTHREAD_ONCE_INIT;
static void free_msg(void *p) { free(p); }
static void make_msg_key(void) { pthread_key_create(&msg_key, free_msg); }

/* The length of msg cut to fit max bytes at a word boundary, leaving room
 * for the ellipsis; len itself when it fits. */
static size_t cut_at_word(const char *msg, size_t len, size_t max) {
  static const size_t ell = sizeof("\xe2\x80\xa6") - 1;
  if (len <= max) return len;
  size_t n = max - ell;
  size_t k = n;
  while (k > 0 && msg[k] != ' ') k--;
  if (k > n / 2) n = k; /* a word boundary not too far back */
  return n;
}

__attribute__((visibility("hidden"))) void symmemi_set_error(int code, const char *msg, size_t len) {
  static const char ell[] = "\xe2\x80\xa6"; /* … */
  size_t n = cut_at_word(msg, len, SYMMEM_MSG_MAX - 1);
  size_t need = n + (n < len ? sizeof ell - 1 : 0) + 1;
  if (need > last_cap) {
    pthread_once(&msg_key_once, make_msg_key);
    size_t cap = need < 256 ? 256 : need;
    char *p = realloc(last_msg, cap);
    if (p == NULL) { /* keep what fits in the old buffer */
      if (last_cap == 0) {
        last_code = code;
        return;
      }
      n = cut_at_word(msg, len, last_cap - 1);
    } else {
      last_msg = p;
      last_cap = cap;
      pthread_setspecific(msg_key, p);
    }
  }
  memcpy(last_msg, msg, n);
  if (n < len) {
    memcpy(last_msg + n, ell, sizeof ell - 1);
    n += sizeof ell - 1;
  }
  last_msg[n] = 0;
  last_code = code;
}

__attribute__((visibility("hidden"))) void symmemi_abort(const char *msg, size_t len) {
  fprintf(stderr, "libsymmem: SYMMEM_STRICT=1: %.*s\n", (int)len, msg);
  fflush(stderr);
  abort();
}

symmem_result symmem_last_error(void) { return (symmem_result)last_code; }

const char *symmem_last_error_message(void) { return last_msg ? last_msg : empty_msg; }

size_t symmem_copy_last_error(char *buf, size_t len) {
  const char *m = symmem_last_error_message();
  size_t n = strlen(m);
  if (buf != NULL && len > 0) {
    size_t k = n < len - 1 ? n : len - 1;
    memcpy(buf, m, k);
    buf[k] = 0;
  }
  return n;
}

void symmem_clear_last_error(void) {
  last_code = 0;
  if (last_msg) last_msg[0] = 0;
}
