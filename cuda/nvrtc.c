/* nvrtc.c - see nvrtc.h. */
#include "nvrtc.h"

#include <stdlib.h>
#include <string.h>

static void smnv_fail(const smnv_table *t, smnv_output *out, sm_nvrtcResult r, const char *call) {
  out->res = r;
  out->call = call;
  out->res_text = t->nvrtcGetErrorString != NULL ? t->nvrtcGetErrorString(r) : NULL;
}

void smnv_compile(const smnv_table *t, const char *src, const char *name, int nheaders,
                  const char *const *headers, const char *const *names, int nopts,
                  const char *const *opts, smnv_output *out) {
  memset(out, 0, sizeof *out);
  sm_nvrtcProgram prog = NULL;
  sm_nvrtcResult r = t->nvrtcCreateProgram(&prog, src, name, nheaders, headers, names);
  if (r != 0) {
    smnv_fail(t, out, r, "nvrtcCreateProgram");
    return;
  }
  sm_nvrtcResult cr = t->nvrtcCompileProgram(prog, nopts, opts);
  size_t n = 0;
  if (t->nvrtcGetProgramLogSize(prog, &n) == 0 && n > 1) {
    out->log = malloc(n + 1);
    if (out->log != NULL && t->nvrtcGetProgramLog(prog, out->log) == 0)
      out->log[n] = 0;
    else if (out->log != NULL)
      out->log[0] = 0;
  }
  if (cr != 0) {
    smnv_fail(t, out, cr, "nvrtcCompileProgram");
  } else if ((r = t->nvrtcGetCUBINSize(prog, &n)) != 0 || n == 0) {
    smnv_fail(t, out, r != 0 ? r : 1, "nvrtcGetCUBINSize");
  } else if ((out->image = malloc(n)) == NULL) {
    smnv_fail(t, out, 1, "malloc");
  } else if ((r = t->nvrtcGetCUBIN(prog, out->image)) != 0) {
    free(out->image);
    out->image = NULL;
    smnv_fail(t, out, r, "nvrtcGetCUBIN");
  } else {
    out->image_len = n;
  }
  t->nvrtcDestroyProgram(&prog);
}
