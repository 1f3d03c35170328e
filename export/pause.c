// Tags and pause in C: the fronts of their functions (Note [The C front],
// front.h), and the per-thread stack of open regions. Go's exported
// functions run on the calling C thread, so a C thread-local is the
// caller's thread's region; Go reads it only while some region is open
// anywhere (export/pause.go counts them), so the allocation path without
// regions makes no call here.
#include "internal.h"
#include "front.h"

#define UNAVAILABLE SYMMEM_ERROR_UNAVAILABLE

SYMMEM_FRONT(symmem_result, region_begin, UNAVAILABLE, (const char *tag, unsigned flags), (tag, flags))
SYMMEM_FRONT(symmem_result, region_end, UNAVAILABLE, (void), ())
SYMMEM_FRONT(symmem_result, set_backup_dir, UNAVAILABLE, (const char *path), (path))
SYMMEM_FRONT(symmem_result, set_default_tag, UNAVAILABLE, (const char *tag, unsigned flags), (tag, flags))
SYMMEM_FRONT(symmem_result, pause, UNAVAILABLE, (const char *tag), (tag))
SYMMEM_FRONT(symmem_result, pause_with, UNAVAILABLE, (const char *tag, unsigned flags), (tag, flags))
SYMMEM_FRONT(symmem_result, resume, UNAVAILABLE, (const char *tag), (tag))
SYMMEM_FRONT(symmem_result, resume_with, UNAVAILABLE, (const char *tag, unsigned flags), (tag, flags))
SYMMEM_FRONT(symmem_result, tag_bytes, UNAVAILABLE, (const char *tag, size_t *live, size_t *paused), (tag, live, paused))
SYMMEM_FRONT(symmem_result, backup_pointer, UNAVAILABLE, (const void *ptr, size_t size, void **host, int *paused), (ptr, size, host, paused))
SYMMEM_FRONT(symmem_result, pause_group, UNAVAILABLE, (symmem_group *group, const char *tag), (group, tag))
SYMMEM_FRONT(symmem_result, resume_group, UNAVAILABLE, (symmem_group *group, const char *tag), (group, tag))

#define SYMMEM_REGION_DEPTH 16

static __thread int region_tags[SYMMEM_REGION_DEPTH];
__attribute__((visibility("hidden"))) __thread int symmemi_region_depth;

__attribute__((visibility("hidden"))) int symmemi_region_push(int tag) {
  if (symmemi_region_depth >= SYMMEM_REGION_DEPTH) return -1;
  region_tags[symmemi_region_depth++] = tag;
  return symmemi_region_depth;
}

__attribute__((visibility("hidden"))) int symmemi_region_pop(void) {
  if (symmemi_region_depth == 0) return -1;
  return region_tags[--symmemi_region_depth];
}

__attribute__((visibility("hidden"))) int symmemi_region_tag(void) {
  return symmemi_region_depth == 0 ? -1 : region_tags[symmemi_region_depth - 1];
}

/* The tag of allocations made outside every region (symmem_set_default_tag);
 * Go keeps its own copy, this one is for the C fast path. */
static int default_tag;

__attribute__((visibility("hidden"))) void symmemi_set_default_tag(int tag) {
  __atomic_store_n(&default_tag, tag, __ATOMIC_RELEASE);
}

__attribute__((visibility("hidden"))) int symmemi_get_default_tag(void) {
  return __atomic_load_n(&default_tag, __ATOMIC_ACQUIRE);
}
