#include <stdio.h>
#include <symmem.h>

int main(void) {
  void *p = symmem_alloc(100, 0, 0);
  if (p == NULL) {
    fprintf(stderr, "alloc: %s\n", symmem_last_error_message());
    return 1;
  }
  symmem_free(p, 100, 0, 0);
  if (symmem_version() != SYMMEM_VERSION) {
    fprintf(stderr, "header %d, library %d\n", SYMMEM_VERSION, symmem_version());
    return 1;
  }
  printf("cmake app: ok (libsymmem %d)\n", symmem_version());
  return 0;
}
