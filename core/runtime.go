package core

import (
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
)

// Runtime is the process-wide state: the backend chosen at start and one
// allocator per device, made at first use.
type Runtime struct {
	Backend Backend
	// Notes say why backends of higher priority were not chosen.
	Notes []string

	mu         sync.Mutex
	allocators []atomic.Pointer[Allocator]
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
		settings := Current()
		be, notes, err := BackendFromEnv()
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
func warnSkipped(w io.Writer, settings *Settings, notes []string) {
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
func NewRuntime(be Backend) *Runtime {
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
		return Errorf(ErrUnavailable, "no backend: %s", r.NotesText())
	}
	return Errorf(ErrInvalidDevice, "device %d is out of range: the %s backend has %d device(s)", device, r.Backend.Name(), len(r.allocators))
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
	return BlockInfo{}, nil, Errorf(ErrInvalidPointer, "%#x is not inside any live allocation of libsymmem", ptr)
}
