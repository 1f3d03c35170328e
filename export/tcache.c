// The fronts of symmem_alloc and symmem_free with the thread caches' fast
// path (Note [Thread caches in C], tcache.h; Note [Thread caches] in
// core/alloc/threadcache.go).
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include "internal.h"
#include "front.h"
#include "tcache.h"

int symmemi_tc_on;

// Every bin ever made, newest first, under list_mu; never unlinked.
static symmemi_tcache *list_head;
static pthread_mutex_t list_mu = PTHREAD_MUTEX_INITIALIZER;

static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;

// This thread's bins by device (an array of SYMMEMI_TC_DEVICES, the value
// of exit_key), or NULL; exited: the thread is past its exit destructor
// and makes no more bins.
static __thread symmemi_tcache **my_bins;
static __thread int exited;

static inline void spin_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

static inline void tc_lock(symmemi_tcache *tc) {
  while (__atomic_exchange_n(&tc->lock, 1, __ATOMIC_ACQUIRE) != 0) {
    // Held by the core (syncing this bin) for a few microseconds at most;
    // on a busy machine its thread may be descheduled: yield then.
    for (int spins = 0; __atomic_load_n(&tc->lock, __ATOMIC_RELAXED) != 0; spins++) {
      if (spins < 100) spin_pause();
      else sched_yield();
    }
  }
}

static inline void tc_unlock(symmemi_tcache *tc) { __atomic_store_n(&tc->lock, 0, __ATOMIC_RELEASE); }

// The thread exits: its bins that the core does not track are free at
// once; the others are marked dead for the core to adopt. Never calls Go.
static void on_thread_exit(void *arg) {
  symmemi_tcache **bins = arg;
  exited = 1;
  my_bins = NULL;
  for (int d = 0; d < SYMMEMI_TC_DEVICES; d++) {
    symmemi_tcache *tc = bins[d];
    if (tc == NULL) continue;
    tc_lock(tc);
    tc->state = tc->registered ? SYMMEMI_TC_DEAD : SYMMEMI_TC_FREE;
    tc_unlock(tc);
  }
  free(bins);
}

static void make_exit_key(void) {
  if (pthread_key_create(&exit_key, on_thread_exit) != 0) symmemi_tc_on = 0;
}

// A bin of device for this thread: a retired one, or a new one. NULL when
// none can be had (the Go path then does without).
static __attribute__((noinline)) symmemi_tcache *tc_acquire(int device) {
  if (exited) return NULL;
  pthread_once(&exit_key_once, make_exit_key);
  if (!symmemi_tc_on) return NULL;
  if (my_bins == NULL) {
    symmemi_tcache **bins = calloc(SYMMEMI_TC_DEVICES, sizeof *bins);
    if (bins == NULL) return NULL;
    if (pthread_setspecific(exit_key, bins) != 0) {
      free(bins);
      return NULL;
    }
    my_bins = bins;
  }
  symmemi_tcache *tc = NULL;
  pthread_mutex_lock(&list_mu);
  for (symmemi_tcache *t = list_head; t != NULL && tc == NULL; t = t->next) {
    tc_lock(t);
    if (t->state == SYMMEMI_TC_FREE) {
      t->state = SYMMEMI_TC_LIVE;
      t->device = device;
      tc = t;
    }
    tc_unlock(t);
  }
  if (tc == NULL && (tc = aligned_alloc(64, (sizeof *tc + 63) / 64 * 64)) != NULL) {
    memset(tc, 0, sizeof *tc);
    tc->state = SYMMEMI_TC_LIVE;
    tc->device = device;
    tc->next = list_head;
    list_head = tc;
  }
  pthread_mutex_unlock(&list_mu);
  my_bins[device] = tc;
  return tc;
}

// The calling thread's bin of device, or NULL.
static inline symmemi_tcache *tc_mine(int device) {
  symmemi_tcache **bins = my_bins;
  if (bins == NULL || (unsigned)device >= SYMMEMI_TC_DEVICES) return NULL;
  return bins[device];
}

static inline int pool_of(uintptr_t size) { return size <= (1u << 20) ? 1 : 2; }

// count adds sign times one block (count, bytes, requested) to the pending
// counts: a hit (1) or an undo (-1).
static inline void count(symmemi_tcache *tc, uintptr_t size, uintptr_t requested, int64_t sign) {
  int p = pool_of(size);
  int64_t v[3] = {1, (int64_t)size, (int64_t)requested};
  for (int q = 0; q < 3; q++) {
    int64_t d = sign * v[q];
    tc->net[q][0] += d;
    tc->net[q][p] += d;
    if (sign > 0) {
      tc->hits[q][0] += d;
      tc->hits[q][p] += d;
      if (tc->net[q][0] > tc->high[q][0]) tc->high[q][0] = tc->net[q][0];
      if (tc->net[q][p] > tc->high[q][p]) tc->high[q][p] = tc->net[q][p];
    }
  }
}

// hit hands out the newest available block of (size, stream) in tc.
static inline void *hit(symmemi_tcache *tc, size_t size, uintptr_t stream) {
  uintptr_t rounded = size == 0 ? 512 : (size + 511) & ~(uintptr_t)511;
  void *p = NULL;
  tc_lock(tc);
  for (int i = tc->len - 1; i >= 0; i--) {
    symmemi_tc_entry *e = &tc->e[i];
    if (e->size == rounded && e->stream == stream && !e->out) {
      e->out = 1;
      e->requested = size;
      count(tc, rounded, size, 1);
      p = (void *)e->addr;
      break;
    }
  }
  tc_unlock(tc);
  return p;
}

void *symmemgo_alloc(size_t size, int device, symmem_stream_t stream);
void symmemgo_free(void *ptr, size_t size, int device, symmem_stream_t stream, symmemi_tcache *tc);

__attribute__((visibility("default"))) void *symmem_alloc(size_t size, int device, symmem_stream_t stream) {
  SYMMEMI_REFUSE_IN_CHILD(alloc, NULL);
  symmemi_tcache *tc = tc_mine(device);
  // Allocations in a region, or under a default tag, take the Go path (their
  // tag's segments; the cache holds untagged blocks only).
  if (tc != NULL && size <= SYMMEMI_TC_MAX_BLOCK && symmemi_region_depth == 0 && symmemi_get_default_tag() == 0) {
    void *p = hit(tc, size, (uintptr_t)stream);
    if (p != NULL) return p;
  }
  return symmemgo_alloc(size, device, stream);
}

// What undo found.
enum { UNDONE, NOT_IN_BIN, GO_DECIDES };

// undo takes back ptr if this thread's hit handed it out and the core has
// not synced it yet. A block of the bin that is available (a double free)
// or freed with a size other than the one asked is for Go to report.
static inline int undo(symmemi_tcache *tc, void *ptr, size_t size) {
  int r = NOT_IN_BIN;
  tc_lock(tc);
  for (int i = tc->len - 1; i >= 0; i--) {
    symmemi_tc_entry *e = &tc->e[i];
    if (e->addr != (uintptr_t)ptr) continue;
    if (!e->out || (size != 0 && size != e->requested)) {
      r = GO_DECIDES;
      break;
    }
    count(tc, e->size, e->requested, -1);
    symmemi_tc_entry back = *e;
    back.out = 0;
    back.requested = 0;
    int top = tc->len - 1;
    if (i != top) memmove(e, e + 1, (size_t)(top - i) * sizeof *e);
    tc->e[top] = back;
    r = UNDONE;
    break;
  }
  tc_unlock(tc);
  return r;
}

__attribute__((visibility("default"))) void symmem_free(void *ptr, size_t size, int device, symmem_stream_t stream) {
  SYMMEMI_REFUSE_IN_CHILD(free);
  if (ptr == NULL) return;
  symmemi_tcache *tc = tc_mine(device);
  if (tc != NULL) {
    if (undo(tc, ptr, size) == UNDONE) return;
  } else if (__builtin_expect(symmemi_tc_on, 1) && (unsigned)device < SYMMEMI_TC_DEVICES) {
    tc = tc_acquire(device);
  }
  symmemgo_free(ptr, size, device, stream, tc);
}
