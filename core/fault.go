package core

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Note [Out of descriptors]
//
// The Go runtime makes its network poller (an epoll descriptor and an
// eventfd) the first time anything starts a timer or polls a descriptor,
// and if it cannot, it aborts the whole process ("netpollinit failed").
// Left to itself, under libsymmem that first time would be the first group
// creation (a rank waiting for rank 0 sleeps between connection attempts),
// so a process with one or two descriptors left would die instead of
// getting an error. The poller is started here, when the library loads, while descriptors are
// still there; running out later is then an ordinary EMFILE that the call
// that met it reports (DescribeErrno names it).
func init() { time.Sleep(time.Nanosecond) }

// DescribeErrno is err's text, with what to do about it when it says the
// process or the system ran out of descriptors or memory.
func DescribeErrno(err error) string {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return err.Error()
	}
	switch errno {
	case unix.EMFILE:
		var rl unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
		return fmt.Sprintf("%v (EMFILE: this process is out of file descriptors, its limit RLIMIT_NOFILE is %d; raise it with ulimit -n)", err, rl.Cur)
	case unix.ENFILE:
		return fmt.Sprintf("%v (ENFILE: the system is out of file descriptors)", err)
	case unix.ENOMEM:
		return fmt.Sprintf("%v (ENOMEM: out of memory)", err)
	}
	return err.Error()
}

// IsResourceExhausted says whether err is EMFILE, ENFILE or ENOMEM: a local
// shortage, never a peer's fault.
func IsResourceExhausted(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOMEM)
}

// Note [Wild pointers]
//
// symmem_copy and symmem_memset take raw pointers. Pointers the library
// knows (inside a live block, a peer's mapped segment, a signal pad) are
// checked against the bounds of what they point into, so an overrun is
// INVALID_ARGUMENT before anything is touched. Any other pointer is the
// caller's; where the copy runs on the CPU in Go (the host backend) it runs
// under GuardedAccess, which turns a fault into INVALID_ARGUMENT instead of
// a dead process (debug.SetPanicOnFault). The GPU backends hand such
// pointers to the driver, which checks device pointers itself.

// GuardedAccess runs f, which reads or writes memory Go does not manage,
// and turns a memory fault in it into ErrInvalidArgument naming what and
// the faulting address. Other panics go on.
func GuardedAccess(what string, f func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if p := recover(); p != nil {
			if fault, ok := p.(interface{ Addr() uintptr }); ok {
				err = Errorf(ErrInvalidArgument, "%s faulted at address %#x: the pointer does not point to memory this process may access there", what, fault.Addr())
				return
			}
			// Faults in the first page (near NULL) arrive as a nil
			// dereference, without an address.
			if re, ok := p.(runtime.Error); ok && strings.Contains(re.Error(), "invalid memory address") {
				err = Errorf(ErrInvalidArgument, "%s faulted (%v): a pointer is near NULL", what, re)
				return
			}
			panic(p)
		}
	}()
	f()
	return nil
}

// knownRange is memory the library mapped for the caller outside the
// allocator's blocks: a peer's segment or signal pad.
type knownRange struct {
	addr, size uintptr
	what       string
}

// knownRanges are sorted by addr and never overlap (each is its own
// reserved range).
var knownRanges struct {
	sync.Mutex
	r []knownRange
}

// RegisterRange records [addr, addr+size) as memory the library mapped, so
// that CheckRange can bound accesses into it. what names it in messages.
func RegisterRange(addr, size uintptr, what string) {
	knownRanges.Lock()
	defer knownRanges.Unlock()
	i := sort.Search(len(knownRanges.r), func(i int) bool { return knownRanges.r[i].addr >= addr })
	knownRanges.r = append(knownRanges.r, knownRange{})
	copy(knownRanges.r[i+1:], knownRanges.r[i:])
	knownRanges.r[i] = knownRange{addr, size, what}
}

// UnregisterRange forgets the range that starts at addr.
func UnregisterRange(addr uintptr) {
	knownRanges.Lock()
	defer knownRanges.Unlock()
	i := sort.Search(len(knownRanges.r), func(i int) bool { return knownRanges.r[i].addr >= addr })
	if i < len(knownRanges.r) && knownRanges.r[i].addr == addr {
		knownRanges.r = append(knownRanges.r[:i], knownRanges.r[i+1:]...)
	}
}

// CheckRegisteredRange checks [ptr, ptr+n) against the registered ranges:
// if ptr lies in one, the n bytes must stay inside it. known says whether
// ptr was in one. The allocator's blocks are its own to check
// (alloc.Runtime.CheckRange, which calls this for everything else).
func CheckRegisteredRange(ptr, n uintptr, what string) (known bool, err error) {
	knownRanges.Lock()
	defer knownRanges.Unlock()
	i := sort.Search(len(knownRanges.r), func(i int) bool { return knownRanges.r[i].addr > ptr }) - 1
	if i >= 0 {
		k := knownRanges.r[i]
		if ptr < k.addr+k.size {
			if ptr+n > k.addr+k.size {
				return true, Errorf(ErrInvalidArgument, "%s: %d bytes at %#x run %d bytes past the end of %s [%#x, %#x)", what, n, ptr, ptr+n-(k.addr+k.size), k.what, k.addr, k.addr+k.size)
			}
			return true, nil
		}
	}
	return false, nil
}

// Note [Sealed memfds]
//
// A memfd that a peer sends is checked for its size before it is mapped
// (ImportedSizer), but the peer keeps its own descriptor and could shrink
// the file afterwards: every later access past the new end would be SIGBUS
// here. So memfds the library shares are sealed (F_SEAL_SHRINK, F_SEAL_GROW,
// F_SEAL_SEAL) once they have their size, and an imported memfd that is not
// sealed against shrinking is refused like a short one.

// SealSize makes fd's size final (Note [Sealed memfds]); fd must come from
// memfd_create with MFD_ALLOW_SEALING.
func SealSize(fd int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return Errorf(ErrBackend, "sealing a memfd (F_ADD_SEALS): %s", DescribeErrno(err))
	}
	return nil
}

// PeerMemfdSize is the size of a memfd a peer sent, or ErrPeer if the peer
// could still shrink it (Note [Sealed memfds]).
func PeerMemfdSize(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, Errorf(ErrBackend, "fstat of a received descriptor: %s", DescribeErrno(err))
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
		return uint64(st.Size), Errorf(ErrPeer, "the memory (%d bytes) is not sealed against shrinking (F_SEAL_SHRINK), so its sender could cut it under our mapping", st.Size)
	}
	return uint64(st.Size), nil
}

// DescriptorShortage says, when this process has (almost) no file
// descriptors left, how many it has open and its limit, in words fit to
// append to an error; "" otherwise. Libraries that fail with an opaque code
// when they cannot open a descriptor (the CUDA driver answers
// CUDA_ERROR_OPERATING_SYSTEM) are explained with it. A process that cannot
// even open /proc/self/fd is out of descriptors by that very failure.
func DescriptorShortage() string {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &rl) != nil {
		return ""
	}
	open, err := openDescriptors()
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return fmt.Sprintf("EMFILE: this process is out of file descriptors (limit RLIMIT_NOFILE %d; raise it with ulimit -n)", rl.Cur)
	}
	if err != nil {
		return ""
	}
	// A driver call needs a few descriptors of its own (device nodes,
	// eventfds); under 8 left it is the likely cause.
	if uint64(open)+8 < rl.Cur {
		return ""
	}
	return fmt.Sprintf("EMFILE likely: this process has %d file descriptors open of its limit RLIMIT_NOFILE %d; raise it with ulimit -n", open, rl.Cur)
}

// openDescriptors counts this process's open file descriptors (not the one
// it opens to read /proc/self/fd).
func openDescriptors() (int, error) {
	fd, err := unix.Open("/proc/self/fd", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	open := -1
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		if err != nil || n <= 0 {
			return open, nil
		}
		for off := 0; off < n; {
			reclen := int(buf[off+16]) | int(buf[off+17])<<8 // struct linux_dirent64
			if buf[off+19] != '.' {
				open++
			}
			off += reclen
		}
	}
}
