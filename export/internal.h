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

typedef struct symmem_kernel_info {
  int arch;
  int from_cache;
  double compile_ms;
  double load_ms;
  char compiler[256];
  char cache_path[512];
} symmem_kernel_info;

/* errors.c: the per-thread last error. */
void symmemi_set_error(int code, const char *msg, size_t len);
void symmemi_abort(const char *msg, size_t len);
#endif
