/*
 * freelist.h - the floor for bench_alloc: the simplest caching allocator
 * that is still correct under threads. One mutex; for each distinct size a
 * stack of freed blocks; a miss goes to aligned_alloc (512-byte alignment,
 * like symmem_alloc). Nothing is ever returned to the system until
 * fl_destroy. A caching allocator that does real work (splitting, best fit,
 * statistics, streams) can approach this, not beat it.
 */
#ifndef SYMMEM_BENCH_FREELIST_H
#define SYMMEM_BENCH_FREELIST_H

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define FL_MAX_SIZES 64

typedef struct {
  size_t size;
  void **items;
  size_t n, cap;
} fl_stack;

typedef struct {
  pthread_mutex_t mu;
  fl_stack stacks[FL_MAX_SIZES];
  int nstacks;
} freelist;

static inline void fl_init(freelist *fl) {
  memset(fl, 0, sizeof *fl);
  pthread_mutex_init(&fl->mu, NULL);
}

/* The stack for size; created on first use. Called with the lock held. */
static inline fl_stack *fl_find(freelist *fl, size_t size) {
  for (int i = 0; i < fl->nstacks; i++)
    if (fl->stacks[i].size == size) return &fl->stacks[i];
  if (fl->nstacks == FL_MAX_SIZES) return NULL;
  fl_stack *s = &fl->stacks[fl->nstacks++];
  s->size = size;
  return s;
}

static inline void *fl_alloc(freelist *fl, size_t size) {
  if (size == 0) size = 1;
  pthread_mutex_lock(&fl->mu);
  fl_stack *s = fl_find(fl, size);
  if (s && s->n > 0) {
    void *p = s->items[--s->n];
    pthread_mutex_unlock(&fl->mu);
    return p;
  }
  pthread_mutex_unlock(&fl->mu);
  return aligned_alloc(512, (size + 511) & ~(size_t)511);
}

static inline void fl_free(freelist *fl, void *p, size_t size) {
  if (!p) return;
  if (size == 0) size = 1;
  pthread_mutex_lock(&fl->mu);
  fl_stack *s = fl_find(fl, size);
  if (s && s->n == s->cap) {
    size_t cap = s->cap ? 2 * s->cap : 64;
    void **items = realloc(s->items, cap * sizeof *items);
    if (items) {
      s->items = items;
      s->cap = cap;
    }
  }
  if (s && s->n < s->cap) {
    s->items[s->n++] = p;
    pthread_mutex_unlock(&fl->mu);
    return;
  }
  pthread_mutex_unlock(&fl->mu);
  free(p);
}

static inline void fl_destroy(freelist *fl) {
  for (int i = 0; i < fl->nstacks; i++) {
    for (size_t k = 0; k < fl->stacks[i].n; k++) free(fl->stacks[i].items[k]);
    free(fl->stacks[i].items);
  }
  pthread_mutex_destroy(&fl->mu);
  memset(fl, 0, sizeof *fl);
}

#endif /* SYMMEM_BENCH_FREELIST_H */
