/*
 * nvrtc.h - the few NVRTC functions libsymmem calls (the NVRTC API reference,
 * nvrtc.h of CUDA 11.1+), declared by hand so that nothing needs a toolkit
 * to build, and the trampoline that Go calls. The library itself is found
 * and opened at run time (dynlib.go) and its functions resolved into
 * smnv_table (nvrtc.go's nvrtcSymbols, same order).
 */
#ifndef SYMMEM_CUDA_NVRTC_H
#define SYMMEM_CUDA_NVRTC_H

#include <stddef.h>

typedef int sm_nvrtcResult; /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *sm_nvrtcProgram;

typedef struct smnv_table {
  sm_nvrtcResult (*nvrtcVersion)(int *major, int *minor);
  const char *(*nvrtcGetErrorString)(sm_nvrtcResult result);
  sm_nvrtcResult (*nvrtcCreateProgram)(sm_nvrtcProgram *prog, const char *src, const char *name,
                                       int numHeaders, const char *const *headers,
                                       const char *const *includeNames);
  sm_nvrtcResult (*nvrtcDestroyProgram)(sm_nvrtcProgram *prog);
  sm_nvrtcResult (*nvrtcCompileProgram)(sm_nvrtcProgram prog, int numOptions, const char *const *options);
  sm_nvrtcResult (*nvrtcGetProgramLogSize)(sm_nvrtcProgram prog, size_t *logSizeRet);
  sm_nvrtcResult (*nvrtcGetProgramLog)(sm_nvrtcProgram prog, char *log);
  sm_nvrtcResult (*nvrtcGetCUBINSize)(sm_nvrtcProgram prog, size_t *cubinSizeRet);
  sm_nvrtcResult (*nvrtcGetCUBIN)(sm_nvrtcProgram prog, char *cubin);
} smnv_table;

/* The result of smnv_compile: res is 0 or the failing call's nvrtcResult,
 * call its name; image (malloc'ed, image_len bytes) the cubin on success;
 * log (malloc'ed, NUL-terminated, or NULL) the compiler's log either way.
 * The caller frees image and log. */
typedef struct smnv_output {
  int res;
  const char *call;
  const char *res_text;
  char *image;
  size_t image_len;
  char *log;
} smnv_output;

/* Compiles src (named name) with nheaders in-memory headers (contents and
 * the names #include uses) and nopts options into a cubin, through t. */
void smnv_compile(const smnv_table *t, const char *src, const char *name, int nheaders,
                  const char *const *headers, const char *const *names, int nopts,
                  const char *const *opts, smnv_output *out);

#endif /* SYMMEM_CUDA_NVRTC_H */
