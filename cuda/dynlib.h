/*
 * dynlib.h - the C half of the run-time library loader (dynlib.go): the
 * dlopen/dlsym/dlinfo/dl_iterate_phdr calls that Go cannot make itself.
 * Handles cross into Go as void * and are never dlclose'd (see dynlib.go,
 * Note [Libraries loaded at run time]).
 */
#ifndef SYMMEM_CUDA_DYNLIB_H
#define SYMMEM_CUDA_DYNLIB_H

#include <stddef.h>

/* dlopen(path, RTLD_NOW | RTLD_LOCAL), or with noload != 0
 * dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD): the copy already in the
 * process or NULL. On NULL, err holds dlerror()'s text (empty for noload). */
void *smdl_open(const char *path, int noload, char *err, size_t errlen);

/* dlsym(h, name), or NULL. */
void *smdl_sym(void *h, const char *name);

/* The file h was loaded from (dlinfo RTLD_DI_LINKMAP: l_name) into buf;
 * returns 0, or -1 when unknown. */
int smdl_path(void *h, char *buf, size_t len);

/* The paths of every object loaded in the process (dl_iterate_phdr), each
 * followed by '\n', into buf; returns the bytes needed (more than len means
 * the list was cut). */
size_t smdl_loaded_objects(char *buf, size_t len);

#endif /* SYMMEM_CUDA_DYNLIB_H */
