// symmem_alloc_or_throw: the alloc_fn for PyTorch when libsymmem is the global
// allocator. PyTorch's CUDAPluggableAllocator does not check the pointer that
// alloc_fn returns, so a NULL would become a tensor at address 0; an exception
// thrown here unwinds into PyTorch's C++ and reaches Python as RuntimeError.
// C callers use symmem_alloc: no exception ever crosses into C from there.
#include <cstddef>
#include <stdexcept>
#include <string>

struct CUstream_st;
extern "C" void *symmem_alloc(size_t size, int device, CUstream_st *stream);
extern "C" const char *symmem_last_error_message(void);

extern "C" void *symmem_alloc_or_throw(size_t size, int device, CUstream_st *stream) {
  void *p = symmem_alloc(size, device, stream);
  if (p == nullptr) {
    throw std::runtime_error(std::string("libsymmem: ") + symmem_last_error_message());
  }
  return p;
}
