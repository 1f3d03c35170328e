#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Note [Strings kept for the life of the process]
 *
 * Some strings the library hands to C callers live as long as the process
 * (backend names, statistic keys, strerror texts). They are malloc'ed here
 * and their addresses stored in a C global array, so that LeakSanitizer,
 * which scans C globals but not the Go heap, sees them held. Were they held
 * only from Go, every process of the C tests would report them as leaks at
 * exit, to be symbolized one by one against the suppression list: about
 * 0.4 s per process, most of the time of the multi-process tests. */
static pthread_mutex_t kept_mu = PTHREAD_MUTEX_INITIALIZER;
static char **kept;
static size_t kept_len, kept_cap;

const char *symmemi_keep_string(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p == NULL)
    return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  pthread_mutex_lock(&kept_mu);
  if (kept_len == kept_cap) {
    size_t cap = kept_cap ? 2 * kept_cap : 256;
    char **grown = realloc(kept, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&kept_mu);
      return p; /* still valid; only LeakSanitizer will call it leaked */
    }
    kept = grown;
    kept_cap = cap;
  }
  kept[kept_len++] = p;
  pthread_mutex_unlock(&kept_mu);
  return p;
}
