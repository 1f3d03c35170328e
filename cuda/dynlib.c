/*
 * dynlib.c - see dynlib.h.
 */
#define _GNU_SOURCE
#include "dynlib.h"

#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

void *smdl_open(const char *path, int noload, char *err, size_t errlen) {
  int flags = RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0);
  (void)dlerror();
  void *h = dlopen(path, flags);
  if (h == NULL && errlen > 0) {
    const char *e = noload ? NULL : dlerror();
    snprintf(err, errlen, "%s", e != NULL ? e : "");
  }
  return h;
}

void *smdl_sym(void *h, const char *name) {
  (void)dlerror();
  return dlsym(h, name);
}

int smdl_path(void *h, char *buf, size_t len) {
  struct link_map *lm = NULL;
  if (dlinfo(h, RTLD_DI_LINKMAP, &lm) != 0 || lm == NULL || lm->l_name == NULL ||
      lm->l_name[0] == '\0')
    return -1;
  snprintf(buf, len, "%s", lm->l_name);
  return 0;
}

typedef struct smdl_list {
  char *buf;
  size_t len, need;
} smdl_list;

static int smdl_add(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  smdl_list *l = data;
  if (info->dlpi_name == NULL || info->dlpi_name[0] == '\0')
    return 0;
  size_t n = strlen(info->dlpi_name);
  if (l->need + n + 1 <= l->len) {
    memcpy(l->buf + l->need, info->dlpi_name, n);
    l->buf[l->need + n] = '\n';
  }
  l->need += n + 1;
  return 0;
}

size_t smdl_loaded_objects(char *buf, size_t len) {
  smdl_list l = {buf, len, 0};
  dl_iterate_phdr(smdl_add, &l);
  return l.need;
}
