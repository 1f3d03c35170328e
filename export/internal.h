/* Declarations shared by the export package's Go and C files. Not public:
 * include/symmem.h is the contract; these mirror its types exactly. */
#ifndef SYMMEM_EXPORT_INTERNAL_H
#define SYMMEM_EXPORT_INTERNAL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

struct CUstream_st;

typedef struct symmem_stat {
  const char *key;
  int64_t value;
} symmem_stat;

typedef struct symmem_pointer_info {
  void *block;
  size_t block_size;
  size_t requested_size;
  size_t offset;
  uint64_t heap_offset;
  int device;
  int reserved_;
} symmem_pointer_info;

/* symmem.h's context hook type (snapshot.go). */
typedef uint64_t (*symmem_context_fn)(void *user);

/* errors.c: the per-thread last error. */
void symmemi_set_error(int code, const char *msg, size_t len);
void symmemi_abort(const char *msg, size_t len);

/* keep.c: a NUL-terminated copy of s[0..n) kept for the life of the process
 * (Note [Strings kept for the life of the process]). */
const char *symmemi_keep_string(const char *s, size_t n);

/* selfpath.c: the path of libsymmem.so as loaded (dladdr). */
const char *symmemi_self_path(void);
#endif
