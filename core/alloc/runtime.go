package alloc

import (
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// Runtime is the process-wide state: the backend chosen at start and one
// allocator per device, made at first use.
type Runtime struct {
	Backend core.Backend
	// Notes say why backends of higher priority were not chosen.
	Notes []string

	mu         lockrank.Mutex[lockrank.Allocators]
	allocators []atomic.Pointer[Allocator]

	// changing serialises PauseTag and ResumeTag: each reads the tag's
	// state on every device and changes it under this one lock (Note
	// [Pausing every device]).
	changing lockrank.Mutex[lockrank.RuntimeChanging]
}

var (
	defaultOnce sync.Once
	defaultRT   *Runtime
	defaultErr  error
)

// Default returns the process's runtime, opening the backend that
// SYMMEM_BACKEND selects (auto by default) on the first call. The error is
// the reason there is no backend, or the first unreadable setting; the
// runtime is never nil (its Backend is nil when none opened).
func Default() (*Runtime, error) {
	defaultOnce.Do(func() {
		settings := core.Current()
		be, notes, err := core.BackendFromEnv()
		warnSkipped(os.Stderr, settings, notes)
		notes = append(settings.Notes(), notes...)
		if err != nil {
			defaultErr = err
			defaultRT = &Runtime{Notes: notes}
			return
		}
		defaultRT = NewRuntime(be)
		defaultRT.Notes = notes
		// An unreadable setting fails every use of the runtime, so that it
		// is seen at the first call rather than ignored (Note [Settings]).
		defaultErr = settings.Err()
	})
	return defaultRT, defaultErr
}

// warnSkipped prints, once per process (Default runs once), the notes of
// backends that automatic selection passed over although a setting named
// what they should use (Note [Explicit settings are orders]), unless
// SYMMEM_QUIET is set.
func warnSkipped(w io.Writer, settings *core.Settings, notes []string) {
	if settings.Bool("SYMMEM_QUIET", false) {
		return
	}
	for _, n := range notes {
		if strings.HasPrefix(n, "warning: ") {
			io.WriteString(w, "symmem: "+n+" (SYMMEM_QUIET=1 silences this)\n")
		}
	}
}

// NewRuntime makes a runtime over be (tests use it with their own backends).
func NewRuntime(be core.Backend) *Runtime {
	return &Runtime{Backend: be, allocators: make([]atomic.Pointer[Allocator], be.DeviceCount())}
}

// NotesText is Notes, one per line.
func (r *Runtime) NotesText() string { return strings.Join(r.Notes, "\n") }

// Allocator returns the allocator of device, making it on first use.
func (r *Runtime) Allocator(device int) (*Allocator, error) {
	if device < 0 || device >= len(r.allocators) {
		return nil, r.badDevice(device)
	}
	if a := r.allocators[device].Load(); a != nil {
		return a, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if a := r.allocators[device].Load(); a != nil {
		return a, nil
	}
	a, err := NewAllocator(r.Backend, device)
	if err != nil {
		return nil, err
	}
	r.allocators[device].Store(a)
	return a, nil
}

func (r *Runtime) badDevice(device int) error {
	if r.Backend == nil {
		return core.Errorf(core.ErrUnavailable, "no backend: %s", r.NotesText())
	}
	return core.Errorf(core.ErrInvalidDevice, "device %d is out of range: the %s backend has %d device(s)", device, r.Backend.Name(), len(r.allocators))
}

// Allocators returns the allocators made so far.
func (r *Runtime) Allocators() []*Allocator {
	var out []*Allocator
	for i := range r.allocators {
		if a := r.allocators[i].Load(); a != nil {
			out = append(out, a)
		}
	}
	return out
}

// Lookup finds the allocated block holding ptr on any device.
func (r *Runtime) Lookup(ptr uintptr) (BlockInfo, *Allocator, error) {
	for _, a := range r.Allocators() {
		if info, err := a.Lookup(ptr); err == nil {
			return info, a, nil
		}
	}
	return BlockInfo{}, nil, core.Errorf(core.ErrInvalidPointer, "%#x is not inside any live allocation of libsymmem", ptr)
}

// CheckRange checks [ptr, ptr+n) against what the library knows of ptr: if
// ptr lies in a live block of an allocator of r, or in a range registered
// with core.RegisterRange, the n bytes must stay inside it. known says
// whether ptr was recognised (an unknown pointer is the caller's business,
// see Note [Wild pointers]).
func (r *Runtime) CheckRange(ptr, n uintptr, what string) (known bool, err error) {
	if ptr+n < ptr {
		return false, core.Errorf(core.ErrInvalidArgument, "%s: %#x + %d bytes wraps around the address space", what, ptr, n)
	}
	if b, _, lerr := r.Lookup(ptr); lerr == nil {
		if b.Segment.Paused {
			// Its physical memory is released: the access would fault
			// (host) or fail in the driver, saying nothing of the pause.
			return true, core.Errorf(core.ErrInvalidState, "%s: %#x is in a block of tag %s, which is paused: its memory comes back "+
				"when the tag is resumed (symmem_resume)", what, ptr, core.Quote(b.Segment.Tag))
		}
		if ptr+n > b.Addr+b.Size {
			return true, core.Errorf(core.ErrInvalidArgument, "%s: %d bytes at %#x run %d bytes past the end of its block [%#x, %#x)", what, n, ptr, ptr+n-(b.Addr+b.Size), b.Addr, b.Addr+b.Size)
		}
		return true, nil
	}
	return core.CheckRegisteredRange(ptr, n, what)
}
