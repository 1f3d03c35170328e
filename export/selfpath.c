#define _GNU_SOURCE
#include <dlfcn.h>

#include "internal.h"

/* The path of the shared object that holds this function: libsymmem itself,
 * for the diagnostic report. */
const char *symmemi_self_path(void) {
  Dl_info info;
  if (dladdr((void *)symmemi_self_path, &info) && info.dli_fname != NULL)
    return info.dli_fname;
  return "";
}
