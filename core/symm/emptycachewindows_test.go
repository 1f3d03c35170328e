package symm

import (
	"fmt"
	"strings"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
)

// Note [Window registration], Note [NCCL groups]: releasing an idle segment
// (EmptyCache, not a pause) takes its window in the pause's order: the
// window is deregistered immediately before its segment's unmap, while
// NCCL can still reach the memory (the stand-in NCCL refuses a
// deregistration of unmapped memory, as NCCL needs the memory until the
// window is gone). Two ranks of a group over the test communicator
// rendezvous on a buffer in a segment of its own, release the handle and
// free the buffer; then on each rank:
//
//   - the communicator refuses the deregistration: EmptyCache fails saying
//     so, no unmap was made, and the segment is cached with its window
//     registered; a buffer allocated in it again rendezvouses on that same
//     window;
//   - the backend refuses the unmap: EmptyCache fails, the window is gone
//     (it went first), the segment is cached; a buffer allocated in it
//     again rendezvouses on a new window, and a collective on it gives the
//     right values;
//   - EmptyCache then succeeds: the segment and its window are gone, and
//     the communicator holds no window of the rank.
func TestEmptyCacheDeregistersBeforeTheUnmapAsThePause(t *testing.T) {
	fbs := make([]*faultbe.Backend, 2)
	cfg := mmConfig{machines: []int{0, 0}, engine: "comm", backend: func(r int, be *host.Backend) core.Backend {
		fbs[r] = faultbe.New(be)
		return fbs[r]
	}}
	requireAllOK(t, runMachines(t, cfg, func(r *mmRank) error {
		return emptyCacheWindowRank(r, fbs[r.rank])
	}))
}

func emptyCacheWindowRank(r *mmRank, fb *faultbe.Backend) error {
	const size = 12 << 20 // a segment of its own
	hub := r.comm.hub
	g, err := New(r.o)
	if err != nil {
		return err
	}
	defer g.Destroy()
	round := 0
	// rendezvous allocates the buffer, rendezvouses on it and checks its
	// window and a collective; it returns the buffer, freed by the caller
	// after the handle's release.
	rendezvous := func(when string, wantWin uintptr) (uintptr, *Handle, uintptr, error) {
		round++
		buf, err := r.a.Alloc(size, 0)
		if err != nil {
			return 0, nil, 0, fmt.Errorf("%s: %v", when, err)
		}
		h, err := g.Rendezvous(buf)
		if err != nil {
			return 0, nil, 0, fmt.Errorf("%s: rendezvous: %v", when, err)
		}
		win, _, err := h.Window()
		if err != nil || win == 0 || !hub.liveWindow(win) {
			return 0, nil, 0, fmt.Errorf("%s: the handle's window is %#x (%v), want a registered one", when, win, err)
		}
		if wantWin != 0 && win != wantWin {
			return 0, nil, 0, fmt.Errorf("%s: the handle's window is %#x, want the segment's window %#x", when, win, wantWin)
		}
		if err := collCheck(h, core.AllReduce, core.Float32, core.OpSum, 64, round); err != nil {
			return 0, nil, 0, fmt.Errorf("%s: %v", when, err)
		}
		return buf, h, win, nil
	}
	// idle releases the handle and frees the buffer: its segment is idle,
	// cached with its window.
	idle := func(buf uintptr, h *Handle) error {
		if err := h.Release(); err != nil {
			return err
		}
		return r.a.Free(buf, size, 0)
	}
	buf, h, win, err := rendezvous("first rendezvous", 0)
	if err != nil {
		return err
	}
	if err := r.a.EmptyCache(); err != nil { // every other idle segment goes now
		return err
	}
	if err := idle(buf, h); err != nil {
		return err
	}

	// The deregistration refused: nothing unmapped, the window kept.
	unmaps := fb.Count("Unmap")
	r.comm.failDeregistration(1)
	err = r.a.EmptyCache()
	if core.CodeOf(err) != core.ErrBackend || !strings.Contains(err.Error(), "the window stays registered") {
		return fmt.Errorf("deregistration refused: EmptyCache returned %v, want the communicator's ErrBackend", err)
	}
	if n := fb.Count("Unmap") - unmaps; n != 0 {
		return fmt.Errorf("deregistration refused: %d unmap(s) made, want none (the window goes before the unmap)", n)
	}
	if !hub.liveWindow(win) || hub.liveWindowsOf(r.rank) != 1 {
		return fmt.Errorf("deregistration refused: window %#x live %v, the rank holds %d windows; want it alone, registered", win, hub.liveWindow(win), hub.liveWindowsOf(r.rank))
	}
	if buf, h, _, err = rendezvous("after the refused deregistration", win); err != nil {
		return err
	}
	if err := idle(buf, h); err != nil {
		return err
	}

	// The unmap refused: the window went first, the segment stays cached.
	fb.FailNth("Unmap", 1)
	err = r.a.EmptyCache()
	fb.Clear()
	if core.CodeOf(err) != core.ErrBackend {
		return fmt.Errorf("unmap refused: EmptyCache returned %v, want the backend's ErrBackend", err)
	}
	if hub.liveWindow(win) || hub.liveWindowsOf(r.rank) != 0 {
		return fmt.Errorf("unmap refused: window %#x live %v, the rank holds %d windows; want none (deregistered before the unmap)", win, hub.liveWindow(win), hub.liveWindowsOf(r.rank))
	}
	if _, ok := r.a.SegmentAt(buf); !ok {
		return fmt.Errorf("unmap refused: the segment at %#x left the cache", buf)
	}
	newBuf, h, newWin, err := rendezvous("after the refused unmap", 0)
	if err != nil {
		return err
	}
	if newBuf != buf || newWin == win {
		return fmt.Errorf("after the refused unmap: buffer %#x window %#x, want the cached segment's %#x with a new window", newBuf, newWin, buf)
	}
	if err := idle(newBuf, h); err != nil {
		return err
	}

	// Both steps succeed: the segment and its window are gone.
	if err := r.a.EmptyCache(); err != nil {
		return fmt.Errorf("EmptyCache: %v", err)
	}
	if _, ok := r.a.SegmentAt(buf); ok {
		return fmt.Errorf("EmptyCache: the segment at %#x is still cached", buf)
	}
	if hub.liveWindow(newWin) || hub.liveWindowsOf(r.rank) != 0 {
		return fmt.Errorf("EmptyCache: the rank holds %d windows, want none", hub.liveWindowsOf(r.rank))
	}
	if _, _, live := g.WindowCounts(); live != 0 {
		return fmt.Errorf("EmptyCache: the group counts %d live windows, want none", live)
	}
	return nil
}
