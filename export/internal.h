/* Declarations shared by the export package's Go and C files. Not public:
 * include/symmem.h is the contract (its types are the ones used here). */
#ifndef SYMMEM_EXPORT_INTERNAL_H
#define SYMMEM_EXPORT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include "symmem.h"

/* errors.c: the per-thread last error. */
void symmemi_set_error(int code, const char *msg, size_t len);
void symmemi_abort(const char *msg, size_t len);

/* pause.c: the per-thread stack of open regions (tag numbers; 0 is an
 * untagged region), and the process's default tag (0: none), which the
 * thread caches' fast path reads to step aside while one is set. */
int symmemi_region_push(int tag); /* new depth, -1 when full */
int symmemi_region_pop(void);     /* the tag closed, -1 when none is open */
int symmemi_region_tag(void);     /* the innermost tag, -1 when none is open */
extern __thread int symmemi_region_depth; /* open regions of this thread */
void symmemi_set_default_tag(int tag);
int symmemi_get_default_tag(void);

/* keep.c: a NUL-terminated copy of s[0..n) kept for the life of the process
 * (Note [Strings kept for the life of the process]). */
const char *symmemi_keep_string(const char *s, size_t n);

/* selfpath.c: the path of libsymmem.so as loaded (dladdr). */
const char *symmemi_self_path(void);
#endif
