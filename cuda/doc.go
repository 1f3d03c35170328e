// Package cuda is libsymmem's CUDA backend: core.Backend on the CUDA driver
// API's virtual memory management (cuMemCreate, cuMemAddressReserve,
// cuMemMap, cuMemSetAccess, cuMemExportToShareableHandle, ...).
//
// The driver is loaded at run time (dynlib.go, Note [Libraries loaded at
// run time]: the copy already loaded, else $SYMMEM_LIBCUDA, else
// libcuda.so.1) and every function is resolved once into a C table of function pointers (shim.c), called through small C trampolines.
// Nothing links against libcuda or libcudart and nothing needs the CUDA
// toolkit to build: the few driver types used are declared by hand in
// driver.h and checked against the real cuda.h by abicheck/ on a GPU
// machine. Importing the package registers the backend as "cuda" with
// priority 100, ahead of the host backend.
//
// # Note [contexts]
//
// Driver calls act on the calling OS thread's current context. The backend
// uses each device's primary context (the one the CUDA runtime and PyTorch
// use), retained lazily on the first use of the device and released by
// Close. Callers are PyTorch threads that already have the right context
// current, other PyTorch threads working on another device, and C programs
// that never touched CUDA. So every call that needs a context goes through a
// C trampoline that, within the one cgo call, checks cuCtxGetCurrent, makes
// the device's primary context current only if it is not already, calls the
// driver, and puts the previous context back. It must be one cgo call:
// goroutines move between OS threads between cgo calls. Putting the previous
// context back matters because the CUDA runtime takes the thread's current
// context as its current device.
//
// # Note [streams]
//
// A core.Stream is a CUstream handle; 0 is the legacy default stream (the
// non-_ptsz driver entry points are used, as the CUDA runtime does without
// --default-stream per-thread). Memset and Copy enqueue and then wait for
// the stream. WriteValue32 and WaitValue32 are only enqueued; WaitValue32's
// timeout cannot be enforced by the GPU, so it is ignored: a stream whose
// awaited value never arrives blocks until the value is written (make the
// host-side waits that follow it, such as Synchronize, the place where a
// timeout is applied).
//
// # Note [handle types]
//
// Physical memory is created exportable as a POSIX file descriptor. When a
// device reports fabric handle support, the first Create on it asks for
// FABRIC|POSIX_FD; if the driver refuses (it says "operation not permitted"
// when no IMEX channel is set up, as on the H200 machines this was written
// for), the backend falls back to POSIX_FD and remembers the decision for
// the device. Export always hands out a POSIX file descriptor.
package cuda
