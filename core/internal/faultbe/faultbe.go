// Package faultbe is a fault-injecting core.Backend for tests: it wraps any
// other backend (host, or cuda on the fake driver) and can fail the Nth call
// of any method, delay calls, pretend other capabilities, and record the
// order of calls. The failure paths of core are then tested as code, not
// trusted (DESIGN "Capabilities, not names").
//
// Short results (Rule.Short) are the other way a backend call goes wrong:
// it succeeds with less than the truth. Only the methods whose results core
// can check have a short form (ShortMethods):
//   - MemoryInfo reports half the free and total memory;
//   - Export hands out a descriptor of a new sealed memfd of half the
//     exported memory's size (a page-rounded half; 0 bytes for memory of one
//     page) instead of the memory's own: what a broken or lying peer sends;
//   - ImportedSize reports half the imported memory's size.
//
// The other methods have no short form core could notice: a Create, Copy or
// Memset that did less than asked while reporting success is a backend that
// lies about its own work, which no caller can detect without re-reading
// everything; Granularity, Reserve, Map and the rest return no size.
//
// The wrapper forwards the optional interfaces core looks for
// (core.ImportedSizer, core.BoundedMemOps) to Inner, so that core takes the
// same paths over it as over Inner itself: ImportedSize answers "no limit"
// (the largest size) when Inner cannot tell, and MemsetWithin/CopyWithin
// fall back to Inner's Memset/Copy when Inner does not bound them.
package faultbe

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// Methods lists the core.Backend methods that can fail (every method that
// returns an error).
var Methods = []string{"Granularity", "MemoryInfo", "Reserve", "Unreserve", "Create", "Release", "Map", "Unmap",
	"Export", "Import", "SynchronizeDevice", "StreamWait", "Memset", "Copy", "StreamMemOps",
	"ImportedSize", "MemsetWithin", "CopyWithin"}

// ShortMethods lists the methods that have a short form (Rule.Short; see the
// package comment for what each one reports).
var ShortMethods = []string{"MemoryInfo", "Export", "ImportedSize"}

// Rule makes calls of Method misbehave.
type Rule struct {
	Method string
	// Nth fails the Nth call of Method counted from when the rule was
	// added (1 is the next call); 0 fails every call.
	Nth int
	// Delay sleeps before the call (and before failing it).
	Delay time.Duration
	// NoFail only delays, never fails.
	NoFail bool
	// Code is the failing call's code (default core.ErrBackend).
	Code core.Code
	// Short makes the call succeed with a short result instead of failing
	// (only methods of ShortMethods; others ignore the rule).
	Short bool
}

// Backend wraps Inner. Safe for concurrent use.
type Backend struct {
	Inner core.Backend
	// Caps, when set, replaces Inner's capabilities (to run a code path of
	// another backend, e.g. device pointer arrays, over host memory).
	Caps *core.Capabilities
	// Gran, when set, replaces Inner's granularity (a multiple of it: a
	// GPU's 2 MiB over host memory).
	Gran uintptr

	mu       sync.Mutex
	rules    []*armed
	counts   map[string]int
	calls    []string
	injected []string
}

type armed struct {
	Rule
	start int // the method's call count when the rule was added
}

// New wraps inner.
func New(inner core.Backend) *Backend {
	return &Backend{Inner: inner, counts: map[string]int{}}
}

// Add arms a rule.
func (b *Backend) Add(r Rule) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rules = append(b.rules, &armed{Rule: r, start: b.counts[r.Method]})
}

// FailNth fails the nth next call of method (1 = the next one).
func (b *Backend) FailNth(method string, n int) { b.Add(Rule{Method: method, Nth: n}) }

// Reset disarms every rule and forgets the calls made so far.
func (b *Backend) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rules, b.calls, b.injected = nil, nil, nil
	b.counts = map[string]int{}
}

// Clear disarms every rule.
func (b *Backend) Clear() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.rules = nil
}

// Calls returns the methods called so far, in order.
func (b *Backend) Calls() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

// Count is the number of calls of method so far.
func (b *Backend) Count(method string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.counts[method]
}

// Injected lists the failures injected so far ("Method#n").
func (b *Backend) Injected() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.injected...)
}

// enter records a call of method and returns the injected error, if any.
func (b *Backend) enter(method string) error {
	err, _ := b.enterShort(method)
	return err
}

// enterShort is enter for methods with a short form: short says that the
// call must return a short result (recorded in Injected as "Method#n
// short").
func (b *Backend) enterShort(method string) (err error, short bool) {
	b.mu.Lock()
	b.counts[method]++
	n := b.counts[method]
	b.calls = append(b.calls, method)
	var delay time.Duration
	fail := false
	code := core.ErrBackend
	for _, r := range b.rules {
		if r.Method != method || (r.Nth != 0 && n-r.start != r.Nth) {
			continue
		}
		delay = max(delay, r.Delay)
		if r.Short {
			short = slices.Contains(ShortMethods, method)
		} else if !r.NoFail {
			fail = true
			if r.Code != 0 {
				code = r.Code
			}
		}
	}
	if fail {
		b.injected = append(b.injected, fmt.Sprintf("%s#%d", method, n))
	} else if short {
		b.injected = append(b.injected, fmt.Sprintf("%s#%d short", method, n))
	}
	b.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	if fail {
		return core.Errorf(code, "faultbe: injected failure of %s (call %d)", method, n), false
	}
	return nil, short
}

// Injected failures are marked in messages with this text.
const Marker = "faultbe: injected failure"

// IsInjected says whether err is (or wraps the text of) an injected failure.
func IsInjected(err error) bool { return err != nil && strings.Contains(err.Error(), Marker) }

func (b *Backend) Name() string     { return b.Inner.Name() }
func (b *Backend) DeviceCount() int { return b.Inner.DeviceCount() }
func (b *Backend) Capabilities() core.Capabilities {
	if b.Caps != nil {
		return *b.Caps
	}
	return b.Inner.Capabilities()
}

func (b *Backend) Granularity(device int) (uintptr, error) {
	if err := b.enter("Granularity"); err != nil {
		return 0, err
	}
	if b.Gran != 0 {
		return b.Gran, nil
	}
	return b.Inner.Granularity(device)
}

func (b *Backend) MemoryInfo(device int) (uint64, uint64, error) {
	err, short := b.enterShort("MemoryInfo")
	if err != nil {
		return 0, 0, err
	}
	free, total, err := b.Inner.MemoryInfo(device)
	if short {
		free, total = free/2, total/2
	}
	return free, total, err
}

func (b *Backend) Reserve(device int, size uintptr) (uintptr, error) {
	if err := b.enter("Reserve"); err != nil {
		return 0, err
	}
	return b.Inner.Reserve(device, size)
}

func (b *Backend) Unreserve(device int, addr, size uintptr) error {
	if err := b.enter("Unreserve"); err != nil {
		return err
	}
	return b.Inner.Unreserve(device, addr, size)
}

func (b *Backend) Create(device int, size uintptr) (core.Memory, error) {
	if err := b.enter("Create"); err != nil {
		return 0, err
	}
	return b.Inner.Create(device, size)
}

func (b *Backend) Release(m core.Memory) error {
	if err := b.enter("Release"); err != nil {
		return err
	}
	return b.Inner.Release(m)
}

func (b *Backend) Map(device int, addr, size uintptr, m core.Memory) error {
	if err := b.enter("Map"); err != nil {
		return err
	}
	return b.Inner.Map(device, addr, size, m)
}

func (b *Backend) Unmap(device int, addr, size uintptr) error {
	if err := b.enter("Unmap"); err != nil {
		return err
	}
	return b.Inner.Unmap(device, addr, size)
}

func (b *Backend) Export(m core.Memory) (int, error) {
	err, short := b.enterShort("Export")
	if err != nil {
		return -1, err
	}
	fd, err := b.Inner.Export(m)
	if err != nil || !short {
		return fd, err
	}
	defer unix.Close(fd)
	return shortMemfd(fd)
}

// shortMemfd makes a sealed memfd of half fd's size (rounded down to pages).
func shortMemfd(fd int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return -1, core.Errorf(core.ErrBackend, "faultbe: fstat of an exported descriptor: %v", err)
	}
	page := int64(unix.Getpagesize())
	size := st.Size / 2 / page * page
	short, err := unix.MemfdCreate("faultbe-short", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, core.Errorf(core.ErrBackend, "faultbe: memfd_create: %v", err)
	}
	if err := unix.Ftruncate(short, size); err != nil {
		unix.Close(short)
		return -1, core.Errorf(core.ErrBackend, "faultbe: ftruncate: %v", err)
	}
	if err := core.SealSize(short); err != nil {
		unix.Close(short)
		return -1, err
	}
	return short, nil
}

// ImportedSize forwards to Inner's (core.ImportedSizer); when Inner cannot
// tell, it answers the largest size, which no announced size exceeds (Inner
// must refuse a mapping larger than the memory itself). Calls are counted
// only where Inner can tell.
func (b *Backend) ImportedSize(m core.Memory) (uint64, error) {
	sizer, ok := b.Inner.(core.ImportedSizer)
	if !ok {
		return ^uint64(0), nil
	}
	err, short := b.enterShort("ImportedSize")
	if err != nil {
		return 0, err
	}
	size, err := sizer.ImportedSize(m)
	if short {
		size /= 2
	}
	return size, err
}

// MemsetWithin forwards to Inner's (core.BoundedMemOps), or runs Inner's
// Memset on the default stream when Inner does not bound it.
func (b *Backend) MemsetWithin(device int, addr uintptr, value byte, size uintptr, timeout time.Duration) error {
	if err := b.enter("MemsetWithin"); err != nil {
		return err
	}
	if bounded, ok := b.Inner.(core.BoundedMemOps); ok {
		return bounded.MemsetWithin(device, addr, value, size, timeout)
	}
	return b.Inner.Memset(device, 0, addr, value, size)
}

// CopyWithin is MemsetWithin's twin for Copy.
func (b *Backend) CopyWithin(device int, dst, src, size uintptr, timeout time.Duration) error {
	if err := b.enter("CopyWithin"); err != nil {
		return err
	}
	if bounded, ok := b.Inner.(core.BoundedMemOps); ok {
		return bounded.CopyWithin(device, dst, src, size, timeout)
	}
	return b.Inner.Copy(device, 0, dst, src, size)
}

// Import owns fd whether or not it succeeds (core.Backend's contract), so an
// injected failure closes it.
func (b *Backend) Import(device int, fd int) (core.Memory, error) {
	if err := b.enter("Import"); err != nil {
		unix.Close(fd)
		return 0, err
	}
	return b.Inner.Import(device, fd)
}

func (b *Backend) SynchronizeDevice(device int) error {
	if err := b.enter("SynchronizeDevice"); err != nil {
		return err
	}
	return b.Inner.SynchronizeDevice(device)
}

func (b *Backend) StreamWait(device int, waiter, other core.Stream) error {
	if err := b.enter("StreamWait"); err != nil {
		return err
	}
	return b.Inner.StreamWait(device, waiter, other)
}

func (b *Backend) Memset(device int, s core.Stream, addr uintptr, value byte, size uintptr) error {
	if err := b.enter("Memset"); err != nil {
		return err
	}
	return b.Inner.Memset(device, s, addr, value, size)
}

func (b *Backend) Copy(device int, s core.Stream, dst, src uintptr, size uintptr) error {
	if err := b.enter("Copy"); err != nil {
		return err
	}
	return b.Inner.Copy(device, s, dst, src, size)
}

func (b *Backend) StreamMemOps(device int, s core.Stream, ops []core.MemOp, timeout time.Duration) error {
	if err := b.enter("StreamMemOps"); err != nil {
		return err
	}
	return b.Inner.StreamMemOps(device, s, ops, timeout)
}

var (
	_ core.Backend       = (*Backend)(nil)
	_ core.ImportedSizer = (*Backend)(nil)
	_ core.BoundedMemOps = (*Backend)(nil)
)
