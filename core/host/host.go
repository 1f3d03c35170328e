// Package host is the backend on CPU memory: a memfd is physical memory,
// mmap(PROT_NONE) reserves address space, mmap(MAP_FIXED|MAP_SHARED) maps a
// memfd into it, and the memfd itself is the shareable handle that travels to
// other processes. It is the embedded default where no GPU driver loads, and
// symmetric shared memory for CPU processes in its own right.
//
// There are no streams: every operation is complete when it returns, so the
// stream operations are no-ops or run on the calling thread.
package host

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"golang.org/x/sys/unix"
)

func init() {
	core.RegisterBackend("host", 0, func() (core.Backend, error) { return New() })
	// The host memory this process may use bounds the host copies pinned
	// ahead, whatever the backend (core's pinAheadDefault).
	core.HostMemoryLimit = func() uint64 {
		b, err := New()
		if err != nil {
			return 0
		}
		return b.total
	}
}

// Backend is the host backend. It has one device, 0.
type Backend struct {
	page uintptr
	// total is the device's size: the machine's RAM, or the memory cgroup's
	// limit where that is smaller (Note [Memory of a container]).
	total uint64
	cg    cgroupFS
	// cgDirs are the memory cgroups whose limits apply (resolved once).
	cgDirs []limitDir
}

// New opens the host backend.
func New() (*Backend, error) { return newBackend(cgroupFS{}) }

func newBackend(cg cgroupFS) (*Backend, error) {
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return nil, core.Errorf(core.ErrBackend, "host: sysinfo: %v", err)
	}
	b := &Backend{page: uintptr(os.Getpagesize()), total: uint64(si.Totalram) * uint64(si.Unit), cg: cg, cgDirs: cg.limitDirs()}
	if l := cg.limitOf(b.cgDirs); l.limit != 0 && l.limit < b.total {
		b.total = l.limit
	}
	return b, nil
}

func (b *Backend) Name() string     { return "host" }
func (b *Backend) DeviceCount() int { return 1 }

// Capabilities: CPU memory, read by kernels and threads alike, and one
// device that every process shares.
func (b *Backend) Capabilities() core.Capabilities {
	return core.Capabilities{SharedDevice: true}
}

func (b *Backend) check(device int) error {
	if device != 0 {
		return core.Errorf(core.ErrInvalidDevice, "host: device %d is out of range: the host backend has one device, 0", device)
	}
	return nil
}

// Granularity is the page size.
func (b *Backend) Granularity(device int) (uintptr, error) { return b.page, b.check(device) }

// MemoryInfo reports the machine's available and total memory.
func (b *Backend) MemoryInfo(device int) (uint64, uint64, error) {
	if err := b.check(device); err != nil {
		return 0, 0, err
	}
	var si unix.Sysinfo_t
	if err := unix.Sysinfo(&si); err != nil {
		return 0, 0, core.Errorf(core.ErrBackend, "host: sysinfo: %v", err)
	}
	free := (uint64(si.Freeram) + uint64(si.Bufferram)) * uint64(si.Unit)
	if l := b.cg.limitOf(b.cgDirs); l.limit != 0 {
		free = min(free, l.limit-min(l.usage, l.limit))
	}
	return free, b.total, nil
}

func sysErr(call string, err error) error {
	if err == unix.ENOMEM || err == unix.ENOSPC || err == unix.EFBIG {
		return core.Errorf(core.ErrOutOfMemory, "host: %s: %s", call, core.DescribeErrno(err))
	}
	return core.Errorf(core.ErrBackend, "host: %s: %s", call, core.DescribeErrno(err))
}

// Note [Fork]
//
// Every range the backend maps (reservations, segments, peers' segments,
// signal pads) is marked MADV_DONTFORK: a child forked from this process
// inherits none of it, so a child that touches an address of the library's
// heap faults instead of writing into memory it would share with the parent
// (a MAP_SHARED memfd mapping is otherwise inherited, and parent and child
// would overwrite each other's data). The library's calls in a child are
// refused before that (UNAVAILABLE, naming fork).
func dontFork(addr, size uintptr) error {
	if err := unix.Madvise(unsafe.Slice((*byte)(unmanaged.Pointer(addr)), size), unix.MADV_DONTFORK); err != nil {
		return sysErr("madvise(MADV_DONTFORK)", err)
	}
	return nil
}

// Reserve maps size bytes of inaccessible, uncommitted address space.
func (b *Backend) Reserve(device int, size uintptr) (uintptr, error) {
	if err := b.check(device); err != nil {
		return 0, err
	}
	p, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return 0, sysErr("mmap(PROT_NONE) reserving address space", err)
	}
	if err := dontFork(uintptr(p), size); err != nil {
		unix.MunmapPtr(p, size)
		return 0, err
	}
	return uintptr(p), nil
}

// Unreserve unmaps the range.
func (b *Backend) Unreserve(device int, addr, size uintptr) error {
	if err := unix.MunmapPtr(unmanaged.Pointer(addr), size); err != nil {
		return sysErr("munmap of a reserved range", err)
	}
	return nil
}

// Create makes a memfd of size bytes and allocates its pages up front
// (fallocate), so that running out of memory is an error here rather than
// a SIGBUS at first touch.
func (b *Backend) Create(device int, size uintptr) (core.Memory, error) {
	if err := b.check(device); err != nil {
		return 0, err
	}
	if uint64(size) > b.total {
		return 0, core.Errorf(core.ErrOutOfMemory, "host: %d bytes is more than the %d bytes of memory this process may use (the machine's RAM or its memory cgroup's limit)", size, b.total)
	}
	if l := b.cg.limitOf(b.cgDirs); l.limit != 0 && uint64(size)+cgroupHeadroom > l.limit-min(l.usage, l.limit) {
		return 0, core.Errorf(core.ErrOutOfMemory, "host: %d bytes do not fit in the memory cgroup (%s is %d bytes, %d are in use, %d are kept free for the process): the kernel would kill the process rather than fail",
			size, l.file, l.limit, l.usage, cgroupHeadroom)
	}
	fd, err := unix.MemfdCreate("symmem-segment", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return 0, sysErr("memfd_create", err)
	}
	if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
		unix.Close(fd)
		return 0, sysErr("fallocate of a new segment", err)
	}
	if err := core.SealSize(fd); err != nil { // Note [Sealed memfds]
		unix.Close(fd)
		return 0, err
	}
	return core.Memory(fd), nil
}

// Release closes the memfd; the pages go when the last mapping goes.
func (b *Backend) Release(m core.Memory) error {
	if err := unix.Close(int(m)); err != nil {
		return sysErr("close of a segment's memfd", err)
	}
	return nil
}

// Map maps the memfd over [addr, addr+size), which must be reserved.
func (b *Backend) Map(device int, addr, size uintptr, m core.Memory) error {
	if err := b.check(device); err != nil {
		return err
	}
	_, err := unix.MmapPtr(int(m), 0, unmanaged.Pointer(addr), size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return sysErr("mmap(MAP_FIXED|MAP_SHARED) of a segment", err)
	}
	return dontFork(addr, size)
}

// Unmap puts an inaccessible reservation back over the range, so that it
// stays reserved for the heap.
func (b *Backend) Unmap(device int, addr, size uintptr) error {
	_, err := unix.MmapPtr(-1, 0, unmanaged.Pointer(addr), size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED)
	if err != nil {
		return sysErr("mmap(PROT_NONE) over an unmapped segment", err)
	}
	return dontFork(addr, size)
}

// Export duplicates the memfd (close-on-exec); the caller owns the copy.
func (b *Backend) Export(m core.Memory) (int, error) {
	fd, err := unix.FcntlInt(uintptr(m), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, sysErr("dup of a segment's memfd", err)
	}
	return fd, nil
}

// Import takes ownership of a peer's memfd.
func (b *Backend) Import(device int, fd int) (core.Memory, error) {
	if err := b.check(device); err != nil {
		unix.Close(fd)
		return 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return 0, sysErr("fstat of an imported descriptor", err)
	}
	return core.Memory(fd), nil
}

// ImportedSize is the size of a peer's memfd (core.ImportedSizer); one the
// peer could still shrink is refused (Note [Sealed memfds] in core).
func (b *Backend) ImportedSize(m core.Memory) (uint64, error) { return core.PeerMemfdSize(int(m)) }

func (b *Backend) SynchronizeDevice(device int) error                     { return b.check(device) }
func (b *Backend) StreamWait(device int, waiter, other core.Stream) error { return b.check(device) }

// Memset fills the range on the calling thread; a fault is an error
// (Note [Wild pointers] in core).
func (b *Backend) Memset(device int, s core.Stream, addr uintptr, value byte, size uintptr) error {
	if err := b.check(device); err != nil {
		return err
	}
	return core.GuardedAccess(fmt.Sprintf("host: memset of %d bytes at %#x", size, addr), func() {
		buf := unsafe.Slice((*byte)(unmanaged.Pointer(addr)), size)
		for i := range buf {
			buf[i] = value
		}
	})
}

// Copy copies on the calling thread; a fault is an error (Note [Wild
// pointers] in core).
func (b *Backend) Copy(device int, s core.Stream, dst, src, size uintptr) error {
	if err := b.check(device); err != nil {
		return err
	}
	return core.GuardedAccess(fmt.Sprintf("host: copy of %d bytes from %#x to %#x", size, src, dst), func() {
		copy(unsafe.Slice((*byte)(unmanaged.Pointer(dst)), size), unsafe.Slice((*byte)(unmanaged.Pointer(src)), size))
	})
}

// StreamMemOps runs the operations one by one on the calling thread: a store
// is atomic (sequentially consistent); a wait spins briefly, then yields,
// then sleeps in growing steps up to 50 µs. The timeout bounds the batch.
func (b *Backend) StreamMemOps(device int, s core.Stream, ops []core.MemOp, timeout time.Duration) error {
	if err := b.check(device); err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	for _, op := range ops {
		if !op.Wait {
			atomic.StoreUint32((*uint32)(unmanaged.Pointer(op.Addr)), op.Value)
			continue
		}
		if err := waitWord((*uint32)(unmanaged.Pointer(op.Addr)), op.Value, op.AtLeast, time.Until(deadline), op.Addr); err != nil {
			return err
		}
	}
	return nil
}

// waitWord waits until *word == v (atLeast: until the count *word has
// reached v, core.Reached), failing with ErrTimeout after timeout (addr is
// word's address, for the message).
func waitWord(word *uint32, v uint32, atLeast bool, timeout time.Duration, addr uintptr) error {
	deadline := time.Now().Add(timeout)
	sleep := time.Microsecond
	for i := 0; ; i++ {
		if w := atomic.LoadUint32(word); w == v || atLeast && core.Reached(w, v) {
			return nil
		}
		switch {
		case i < 200:
		case i < 400:
			runtime.Gosched()
		default:
			if time.Now().After(deadline) {
				want := "become"
				if atLeast {
					want = "reach"
				}
				return core.Errorf(core.ErrTimeout, "host: the word at %#x did not %s %d within %v (it holds %d)", addr, want, v, timeout, atomic.LoadUint32(word))
			}
			core.Nap(sleep)
			if sleep < 50*time.Microsecond {
				sleep *= 2
			}
		}
	}
}
