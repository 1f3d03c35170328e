package symm

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// moreScenarios are rank scenarios defined outside scenario_test.go.
var moreScenarios = map[string]func(e *rankEnv, a *alloc.Allocator) error{
	"release-during-wait":       scReleaseDuringWait,
	"destroy-during-rendezvous": scDestroyDuringRendezvous,
	"release-under-load":        scReleaseUnderLoad,
}

// within runs f and fails if it takes longer than d.
func within(d time.Duration, what string, f func() error) error {
	start := time.Now()
	err := f()
	if took := time.Since(start); took > d {
		return fmt.Errorf("%s took %v (more than %v): %v", what, took, d, err)
	}
	return err
}

// expectCode says whether err has code and mentions text.
func expectCode(what string, err error, code core.Code, text string) error {
	if core.CodeOf(err) != code || err == nil || !strings.Contains(err.Error(), text) {
		return fmt.Errorf("%s: got %v, want code %v with %q", what, err, code, text)
	}
	return nil
}

// scReleaseDuringWait: rank 0 waits (host side, 60 s timeout) for a signal
// that never comes, and for a barrier, on other threads; its group is
// already destroyed and the main thread releases the handle. The waits must
// return at once with ErrInvalidState naming the release (not fault, not
// wait out their timeout), Release must succeed, and every later call on the
// handle must fail cleanly.
func scReleaseDuringWait(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 4096)
	if err != nil {
		return err
	}
	h, err := g.Rendezvous(buf)
	if err != nil {
		g.Destroy()
		return err
	}
	// The group goes first: the handle is then the last owner of the pads.
	if err := g.Destroy(); err != nil {
		return err
	}
	if e.rank != 0 { // rank 1 releases at once; rank 0 keeps its mappings
		err := h.Release()
		// Alive while rank 0's waits are cut short by its Release (a
		// process that exits would fail them first: Note [Dead peers]).
		time.Sleep(3 * time.Second)
		return err
	}
	waitErr := make(chan error, 2)
	go func() { waitErr <- h.WaitSignal(1, 0, 0, 60*time.Second) }()
	go func() { waitErr <- h.Barrier(1, 0, 60*time.Second) }()
	time.Sleep(100 * time.Millisecond) // both are waiting now
	var relErr error
	if err := within(5*time.Second, "Release during two waits", func() error { relErr = h.Release(); return relErr }); err != nil {
		return err
	}
	for i := 0; i < 2; i++ {
		select {
		case err := <-waitErr:
			if err := expectCode("a wait cut short by Release", err, core.ErrInvalidState, "released on another thread"); err != nil {
				return err
			}
		case <-time.After(5 * time.Second):
			return fmt.Errorf("a wait did not return within 5 s of Release")
		}
	}
	if err := expectCode("put on a released handle", h.PutSignal(1, 0, 0, 0), core.ErrInvalidState, "released"); err != nil {
		return err
	}
	if err := expectCode("second release", h.Release(), core.ErrInvalidState, "already released"); err != nil {
		return err
	}
	return nil
}

// scDestroyDuringRendezvous: rank 0 starts a rendezvous (timeout 60 s) that
// rank 1 never joins, and destroys the group from another thread. The
// rendezvous must fail at once with ErrInvalidState, Destroy must not wait
// for it to time out, and rank 1 (which only waits for the group to end)
// sees rank 0 leave.
func scDestroyDuringRendezvous(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 4096)
	if err != nil {
		return err
	}
	if e.rank != 0 {
		// Rank 1 stays in the group past rank 0's destroy, then tries a
		// collective: it learns that rank 0 left.
		time.Sleep(time.Second)
		_, err := g.Rendezvous(buf)
		g.Destroy()
		if err == nil {
			return fmt.Errorf("rank 1's rendezvous succeeded although rank 0 left")
		}
		return nil
	}
	res := make(chan error, 1)
	go func() {
		h, err := g.Rendezvous(buf)
		if err == nil {
			h.Release()
		}
		res <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := within(5*time.Second, "Destroy during a rendezvous", g.Destroy); err != nil {
		return err
	}
	select {
	case err := <-res:
		return expectCode("the rendezvous cut short by Destroy", err, core.ErrInvalidState, "left the group")
	case <-time.After(5 * time.Second):
		return fmt.Errorf("the rendezvous did not return within 5 s of Destroy")
	}
}

// scReleaseUnderLoad: threads put and wait on every channel while another
// thread releases the handle: every call returns success or ErrInvalidState
// (never a fault), and all of them return promptly.
func scReleaseUnderLoad(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 4096)
	if err != nil {
		return err
	}
	defer done() // destroys the group; the second release is refused
	peer := (e.rank + 1) % e.world
	var wg sync.WaitGroup
	bad := make(chan error, 64)
	for t := 0; t < 4; t++ {
		wg.Add(1)
		go func(t int) {
			defer wg.Done()
			for i := 0; ; i++ {
				var err error
				if i%2 == 0 {
					err = h.PutSignal(peer, t, 0, 0)
				} else {
					err = h.WaitSignal(peer, t, 0, 30*time.Second)
				}
				switch core.CodeOf(err) {
				case core.Success:
				case core.ErrInvalidState:
					return
				default:
					bad <- fmt.Errorf("thread %d call %d: %v", t, i, err)
					return
				}
			}
		}(t)
	}
	time.Sleep(50 * time.Millisecond)
	if err := within(10*time.Second, "Release under load", h.Release); err != nil {
		return err
	}
	wg.Wait()
	close(bad)
	for err := range bad {
		return err
	}
	return nil
}

func TestReleaseDuringWait(t *testing.T) {
	for r, err := range runInProcess(t, "release-during-wait", 2, 30*time.Second, 0) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	allOK(t, runProcs(t, "release-during-wait", 2, 30*time.Second, 0))
}

func TestDestroyDuringRendezvous(t *testing.T) {
	start := time.Now()
	for r, err := range runInProcess(t, "destroy-during-rendezvous", 2, 60*time.Second, 0) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	allOK(t, runProcs(t, "destroy-during-rendezvous", 2, 60*time.Second, 0))
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("took %v: something waited for a timeout", d)
	}
}

func TestReleaseUnderLoad(t *testing.T) {
	for r, err := range runInProcess(t, "release-under-load", 2, 30*time.Second, 0) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func TestLifetimeCounts(t *testing.T) {
	var l lifetime
	if !l.enter() || !l.enter() {
		t.Fatal("enter refused before close")
	}
	if !l.close() || l.close() {
		t.Fatal("close must succeed once")
	}
	if l.enter() {
		t.Fatal("enter admitted after close")
	}
	if n := l.drain(10 * time.Millisecond); n != 2 {
		t.Fatalf("%d in flight, want 2", n)
	}
	l.leave()
	l.leave()
	if n := l.drain(time.Second); n != 0 {
		t.Fatalf("%d in flight after both left", n)
	}
}

func init() {
	moreScenarios["mismatch-offset"] = func(e *rankEnv, a *alloc.Allocator) error {
		off := uintptr(0)
		if e.rank == 1 {
			off = 64
		}
		return rendezvousOnly(e, a, 4096, off)
	}
	moreScenarios["pad-retry"] = scPadRetry
}

// scPadRetry: the last rank sets another signal pad size; the first
// rendezvous fails on every rank with ErrMismatch; the rank sets the
// default back and the second rendezvous succeeds everywhere (the failed
// one did not fix the pad size for good).
func scPadRetry(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 4096)
	if err != nil {
		return err
	}
	defer g.Destroy()
	odd := e.rank == e.world-1
	if odd {
		if err := g.SetSignalPadSize(uintptr(8 * e.world)); err != nil {
			return err
		}
	}
	h, err := g.Rendezvous(buf)
	if err := expectCode("first rendezvous with different pad sizes", err, core.ErrMismatch, "signal pad sizes differ"); err != nil {
		if h != nil {
			h.Release()
		}
		return err
	}
	if odd {
		if err := g.SetSignalPadSize(DefaultSignalPadSize); err != nil {
			return fmt.Errorf("setting the pad size back after a failed rendezvous: %v", err)
		}
	}
	if h, err = g.Rendezvous(buf); err != nil {
		return fmt.Errorf("second rendezvous, pad sizes agreed: %v", err)
	}
	defer h.Release()
	if h.SignalPadSize() != DefaultSignalPadSize {
		return fmt.Errorf("pad size %d", h.SignalPadSize())
	}
	return writeAll(h, 0)
}

func TestProcessesMismatchedOffsets(t *testing.T) {
	allFail(t, runProcs(t, "mismatch-offset", 3, 30*time.Second, 0), core.ErrMismatch,
		"different offsets in their blocks", "ranks 0, 2: offset 0", "rank 1: offset 64")
}

func TestPadSizeMismatchDoesNotPoisonTheGroup(t *testing.T) {
	allOK(t, runProcs(t, "pad-retry", 3, 30*time.Second, 0))
	for r, err := range runInProcess(t, "pad-retry", 2, 30*time.Second, 0) {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}
