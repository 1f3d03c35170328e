package core

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Stream is a backend stream (a CUstream on the cuda backend; 0 is the legacy
// default stream). The host backend runs everything synchronously and ignores
// streams except for numbering them.
type Stream uintptr

// Memory is a backend's handle on one piece of physical memory: a
// CUmemGenericAllocationHandle on cuda, a memfd on host.
type Memory uint64

// Backend is the only way core touches memory. Every address is a virtual
// address in this process; every size is a multiple of Granularity unless
// stated otherwise. Implementations must be safe for concurrent use.
type Backend interface {
	// Name names the backend for people ("host", "cuda"): messages, notes,
	// and the check that every rank of a group runs the same backend. Code
	// never decides by it: differences are Capabilities.
	Name() string
	// Capabilities says what the backend's memory and operations can do.
	Capabilities() Capabilities
	// DeviceCount is the number of devices (the host backend has one, device 0).
	DeviceCount() int
	// Granularity is the size that physical memory and mappings are
	// multiples of on device.
	Granularity(device int) (uintptr, error)
	// MemoryInfo reports free and total physical memory of device.
	MemoryInfo(device int) (free, total uint64, err error)

	// Reserve reserves size bytes of address space for device (no memory).
	Reserve(device int, size uintptr) (uintptr, error)
	// Unreserve gives back a reserved range; nothing may be mapped in it.
	Unreserve(device int, addr, size uintptr) error
	// Create makes size bytes of physical memory on device, exportable.
	Create(device int, size uintptr) (Memory, error)
	// Release frees physical memory once it is unmapped everywhere here.
	Release(m Memory) error
	// Map maps m (size bytes from its start) at addr, inside a reserved
	// range, and grants device read/write access to it.
	Map(device int, addr, size uintptr, m Memory) error
	// Unmap removes the mapping at [addr, addr+size).
	Unmap(device int, addr, size uintptr) error
	// Export returns a new file descriptor for m that the caller owns.
	Export(m Memory) (fd int, err error)
	// Import turns a peer's exported descriptor into local Memory. The
	// backend takes ownership of fd whether or not it succeeds.
	Import(device int, fd int) (Memory, error)

	// SynchronizeDevice waits until all work on device is done.
	SynchronizeDevice(device int) error
	// StreamWait makes later work on waiter wait for the work queued on
	// other so far (event record on other + wait on waiter). No polling.
	StreamWait(device int, waiter, other Stream) error
	// Memset sets size bytes at addr to value, in stream order on s, and
	// waits for it to finish.
	Memset(device int, s Stream, addr uintptr, value byte, size uintptr) error
	// Copy copies size bytes from src to dst (device or host addresses,
	// unified addressing), in stream order on s, and waits for it.
	Copy(device int, s Stream, dst, src uintptr, size uintptr) error
	// StreamMemOps runs ops in order on s (32-bit stores and waits), in one
	// batch where the backend can (cuda: cuStreamBatchMemOp, one driver call
	// for a whole barrier). Backends whose Capabilities say StreamSignals
	// enqueue the operations and return (the GPU does not bound the waits);
	// the others run them on the calling thread and give up on a wait after
	// timeout with a *Error of code ErrTimeout.
	StreamMemOps(device int, s Stream, ops []MemOp, timeout time.Duration) error
}

// OwnDeviceMapper is implemented by backends whose Map also grants access
// to the other devices that can reach the memory directly (cuda: every
// peer GPU, so that a copy between GPUs in one process can read it): it
// maps m for device alone. Granting a peer builds its page tables too,
// about 20 ms per 4 GiB and peer on an H200 against under 1 ms for the
// device alone, which a tag that is paused and resumed pays every cycle
// (Note [Own-device tags] in core/alloc).
type OwnDeviceMapper interface {
	MapOwnDevice(device int, addr, size uintptr, m Memory) error
}

// ImportedSizer is implemented by backends that can tell how many bytes an
// imported piece of memory really has (host: fstat of the memfd). Peers are
// not trusted: before mapping a peer's memory for the size it announced,
// core checks it against this, so that a short memfd is refused instead of
// faulting (SIGBUS) at the first touch past its end. Backends without it
// must refuse a mapping larger than the memory themselves (the CUDA
// driver's cuMemMap does).
type ImportedSizer interface {
	ImportedSize(m Memory) (uint64, error)
}

// Capabilities are the differences between backends that core acts on
// (DESIGN "Capabilities, not names").
type Capabilities struct {
	// StreamSignals: StreamMemOps enqueues on a stream and returns; the
	// operations run later, in stream order (cuda). Otherwise the mapped
	// memory is ordinary CPU memory and signals run on the calling thread,
	// with atomics (host).
	StreamSignals bool
	// DevicePointerArrays: kernels cannot read host memory, so the pointer
	// arrays of a symmetric handle need a copy in device memory (cuda). The
	// host arrays serve both otherwise.
	DevicePointerArrays bool
	// SharedDevice: every process of the machine uses the same device by
	// design (host memory), so ranks of a group need not have distinct
	// devices.
	SharedDevice bool
}

// BoundedMemOps is implemented by backends whose Memset and Copy wait for a
// device that may be stuck (cuda: a stream blocked on a peer that died).
// These variants run on a stream of the library's own and give up after
// timeout with ErrTimeout; the operation may still complete later, so after
// a timeout the caller must not free the memory it writes (leak it, and
// say so). Backends that run on the calling thread (host) need not have it.
type BoundedMemOps interface {
	MemsetWithin(device int, addr uintptr, value byte, size uintptr, timeout time.Duration) error
	CopyWithin(device int, dst, src, size uintptr, timeout time.Duration) error
}

// WordWriter is implemented by backends that can store 32-bit words into
// device memory from the device itself (cuda: the stream write-value
// operation on the library's own stream), waited for up to timeout. No host
// memory takes part: a copy from the host goes through the driver's
// staging, which a synchronous copy of another thread holds while it waits
// behind the very stream wait that the words are to release (an abort, a
// dead peer's abort word). Every op is a write (MemOp.Wait false).
type WordWriter interface {
	WriteWordsWithin(device int, ops []MemOp, timeout time.Duration) error
}

// FillOrCopy is one operation of a batch (BatchMemOps): copy Size bytes
// from Src to Dst, or, with Fill, set Size bytes at Dst to Value.
type FillOrCopy struct {
	Dst, Src, Size uintptr
	Fill           bool
	Value          byte
}

// BatchMemOps is implemented by backends that can queue many fills and
// copies on the library's own stream and wait for them once (a pause's
// backups, a resume's restores): one wait instead of one per segment.
// Like BoundedMemOps, the wait gives up after timeout with ErrTimeout, and
// the operations may still complete later (the caller must not free their
// memory then). Callers without it run Memset/Copy one by one.
type BatchMemOps interface {
	FillOrCopyWithin(device int, ops []FillOrCopy, timeout time.Duration) error
}

// MemOp is one 32-bit stream memory operation: store Value at Addr; or,
// with Wait, wait until the word there equals Value; or, with Wait and
// AtLeast, until the word read as a count has reached Value:
// int32(word-Value) >= 0, which stays right when the count wraps around
// (CU_STREAM_WAIT_VALUE_GEQ compares the same way).
type MemOp struct {
	Addr    uintptr
	Value   uint32
	Wait    bool
	AtLeast bool
}

// KernelMemOps is implemented by backends that can run a batch of
// StreamMemOps' operations as one kernel on s (cuda with NVRTC), with
// every wait bounded: a wait that gives up records the failure in the
// word at Flag (Note [Pad partition] in pad.go) and lets the stream go
// on. ErrUnavailable means the caller should use StreamMemOps instead.
type KernelMemOps interface {
	LaunchMemOps(device int, s Stream, ops []MemOp, w MemOpWatch) error
}

// MemOpWatch is what bounds the waits of a LaunchMemOps batch: the
// timeout, the error flag and abort words of the caller's device region,
// and for each op the rank it concerns (named in the flag).
type MemOpWatch struct {
	TimeoutNs   uint64
	Flag, Abort uintptr
	Peers       []int
}

// Reached says whether the count word has reached v (MemOp.AtLeast).
func Reached(word, v uint32) bool { return int32(word-v) >= 0 }

// HostMemory is implemented by backends that allocate host memory suited to
// copies with their devices (pinned memory on cuda). Pinned backups use it
// where it exists, and anonymous memory otherwise.
type HostMemory interface {
	AllocHost(device int, size uintptr) (uintptr, error)
	FreeHost(device int, addr, size uintptr) error
}

// Factory opens a backend. It returns an error that says why when the
// backend cannot run here (no driver, no device).
type Factory func() (Backend, error)

type registration struct {
	name     string
	priority int
	open     Factory
}

var (
	registryMu sync.Mutex
	registry   []registration
)

// RegisterBackend makes a backend selectable by name. Automatic selection
// tries backends in decreasing priority and takes the first that opens.
// Backend packages call this from init.
func RegisterBackend(name string, priority int, open Factory) {
	registryMu.Lock()
	defer registryMu.Unlock()
	registry = append(registry, registration{name, priority, open})
	sort.SliceStable(registry, func(i, j int) bool { return registry[i].priority > registry[j].priority })
}

// Note [Explicit settings are orders]
//
// A setting that names what a backend must use (SYMMEM_LIBCUDA=path) is an
// order, not a hint. When the backend cannot open because of it (the path
// does not load), automatic selection must not pass to the next backend
// silently: a job that set the driver's path and got the host backend would
// run, slowly or wrongly, without anyone seeing why. So a backend's factory
// wraps such a failure with Explicit, and automatic selection
//   - with SYMMEM_BACKEND unset, fails: no backend is opened and every call
//     says which setting could not be used and why (the loader's error);
//   - with SYMMEM_BACKEND=auto set explicitly, goes on to the next backend
//     and warns once on stderr, naming the setting and the error
//     (SYMMEM_QUIET=1 silences it; backend_notes keep the line).

// ExplicitError is a backend's failure to use what a setting named
// explicitly (Note [Explicit settings are orders]).
type ExplicitError struct {
	Setting string // the variable, "SYMMEM_LIBCUDA"
	Err     error
}

func (e *ExplicitError) Error() string { return e.Err.Error() }
func (e *ExplicitError) Unwrap() error { return e.Err }

// Explicit marks err as the failure of what setting named explicitly.
func Explicit(setting string, err error) error {
	if err == nil {
		return nil
	}
	return &ExplicitError{Setting: setting, Err: err}
}

// OpenBackend opens the backend named by want, or when want is "" or
// "auto", the first registered backend that opens. The returned notes say
// why higher-priority backends were skipped. A backend that fails for an
// explicit setting stops an automatic selection when want is "" (the
// variable unset); with want "auto" it is skipped and the note that says
// so begins with "warning: " (Note [Explicit settings are orders]).
func OpenBackend(want string) (Backend, []string, error) {
	registryMu.Lock()
	regs := append([]registration(nil), registry...)
	registryMu.Unlock()
	var notes []string
	for _, r := range regs {
		if want != "" && want != "auto" && want != r.name {
			continue
		}
		b, err := r.open()
		if err == nil {
			return b, notes, nil
		}
		var explicit *ExplicitError
		if (want == "" || want == "auto") && errors.As(err, &explicit) {
			if want == "" {
				e := Errorf(ErrUnavailable, "%s is set, but the %s backend cannot use it: %v; fix or unset %s, "+
					"or set SYMMEM_BACKEND=auto to fall back to the next backend with a warning",
					explicit.Setting, r.name, err, explicit.Setting)
				return nil, append(notes, e.Error()), e
			}
			notes = append(notes, fmt.Sprintf("warning: %s is set, but the %s backend cannot use it: %v; "+
				"SYMMEM_BACKEND=auto goes on to the next backend", explicit.Setting, r.name, err))
			continue
		}
		notes = append(notes, fmt.Sprintf("%s backend unavailable: %v", r.name, err))
		if want == r.name {
			return nil, notes, Errorf(ErrUnavailable, "backend %s: %v", Quote(want), err)
		}
	}
	if want != "" && want != "auto" {
		err := Errorf(ErrUnavailable, "SYMMEM_BACKEND=%s names no known backend (known: auto, %s): no backend was opened; unset it or pick one of these", Quote(want), backendNames(regs))
		return nil, append(notes, err.Error()), err
	}
	return nil, notes, Errorf(ErrUnavailable, "no backend could be opened: %v", notes)
}

func backendNames(regs []registration) string {
	s := ""
	for i, r := range regs {
		if i > 0 {
			s += ", "
		}
		s += r.name
	}
	return s
}

// BackendFromEnv opens the backend that SYMMEM_BACKEND names (automatic
// selection when unset, "" to OpenBackend, which then refuses to pass over
// an explicit setting that failed).
func BackendFromEnv() (Backend, []string, error) {
	return OpenBackend(Current().Text("SYMMEM_BACKEND", ""))
}

// HostMemoryLimit, set by the host backend's package, returns the host
// memory this process may use: the RAM, or the memory cgroup's limit where
// that is smaller (0: unknown). It bounds the host copies that the
// allocator pins ahead, whatever the backend.
var HostMemoryLimit func() uint64
