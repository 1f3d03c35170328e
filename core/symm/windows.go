package symm

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// Note [Window registration]
//
// What a group registers of its rendezvoused segments with its engine is
// one windowRegistry, chosen once when the group is made (New), so that the
// rendezvous, the collective pause and resume, Destroy and the statistics
// call it the same way on every group:
//
//	noWindows    groups whose segments have no windows: socket groups,
//	             groups on the caller's all-gather, groups over a
//	             communicator made with Options.NoWindows. Every step is
//	             nothing, and the statistics are zero.
//	ncclWindows  groups over a communicator: every segment a rendezvous
//	             shares is an NCCL symmetric window (Note [NCCL groups]),
//	             deregistered with its memory by a collective pause's
//	             commit and registered again by the resume.
//
// The registry names no group and no call: its steps take the segments,
// the records and the rank's verdict function (Group.shareVerdict, given
// at New), so it stands below the Group that holds it. Each step keeps
// the phases' contract: register and resume are collective and end with a
// shared verdict; pause runs the pause's commit,
// whose release hook deregisters each segment's window immediately before
// that segment's unmap (Note [Releasing a paused tag] in core/alloc) and
// keeps it, for the resume, as a paused window.
//
// A window is deregistered only together with its memory, and a
// deregistration that fails leaves the window registered and the segment
// mapped, so a live segment always has its window, with one exception: a
// pause's commit whose unmap of a segment fails after its window went.
// That segment is mapped without a window on this rank (the others have
// released theirs, so no window of it can be registered again until they
// have memory again); Handle.Window says so and names the remedy, and the
// resume registers its window again with everyone's (Note [Pause phases]).
//
// Releasing an idle segment (EmptyCache, a memory limit, not a pause) runs
// the same release hook in the same order: the window goes immediately
// before its segment's unmap, because NCCL uses the memory until its
// window is gone (the stand-in NCCL refuses to deregister unmapped
// memory), and a window left registered on an address range that the heap
// hands out again would be registered twice. A refused deregistration
// keeps the segment cached with its window; a refused unmap after it
// leaves the idle segment cached without one, which no handle holds, and
// the next rendezvous on it registers a new window
// (TestEmptyCacheDeregistersBeforeTheUnmapAsThePause).
type windowRegistry interface {
	// held is blockRecord.winHeld for seg: 1 + its ID where this rank holds
	// the segment's window, else 0.
	held(seg alloc.SegmentInfo) uint64
	// register is the rendezvous' window phase (Note [Rendezvous phases])
	// for seg, from every rank's record of the call: every rank holds a
	// window for the segment, or every rank fails alike. It returns our
	// window (nil where the group has no windows).
	register(seg alloc.SegmentInfo, recs []blockRecord, tr *phaseTrace) (*window, error)
	// checkPeers compares NCCL's view of the peers' blocks through window
	// x (the block at blockOff in its segment) with the handle's mappings
	// bufPtrs (NCCL >= 2.29), collectively: the rendezvous' checkPeers
	// phase.
	checkPeers(x *window, blockOff uintptr, bufPtrs []uintptr, bufSize uintptr, tr *phaseTrace) error
	// pause runs commit, the release of the memory of segs; on a failure
	// it returns commit's error with what became of each segment's window.
	pause(segs []alloc.SegmentInfo, commit func() error) error
	// paused lists the heap offsets of segs whose window a pause
	// deregistered (the wins of our resume record).
	paused(segs []alloc.SegmentInfo) []uint64
	// resume registers again, collectively, what the pause deregistered
	// on any rank (wins[r]: the heap offsets in rank r's resume record) of
	// our segments segs (the resume's windows phase, Note [Resume
	// phases]), replacing a window that a failed pause left registered on
	// a rank; what names the call in errors.
	resume(what string, segs []alloc.SegmentInfo, wins [][]uint64) error
	// counts are Group.WindowCounts.
	counts() (registered, deregistered, live int)
	// close deregisters every window the group holds (Destroy).
	close() error
}

// noWindows is the registry of groups without windows.
type noWindows struct{}

func (noWindows) held(alloc.SegmentInfo) uint64 { return 0 }
func (noWindows) register(alloc.SegmentInfo, []blockRecord, *phaseTrace) (*window, error) {
	return nil, nil
}
func (noWindows) checkPeers(*window, uintptr, []uintptr, uintptr, *phaseTrace) error { return nil }
func (noWindows) pause(_ []alloc.SegmentInfo, commit func() error) error             { return commit() }
func (noWindows) paused([]alloc.SegmentInfo) []uint64                                { return nil }
func (noWindows) resume(string, []alloc.SegmentInfo, [][]uint64) error               { return nil }
func (noWindows) counts() (registered, deregistered, live int)                       { return 0, 0, 0 }
func (noWindows) close() error                                                       { return nil }

// window is a segment of ours registered with the communicator. win is
// the ncclWindow_t, 0 while the segment is paused or once it is released
// (handles read it: Handle.Window), or where a failed pause left the
// segment mapped without it (mapped says which).
type window struct {
	segID uint64
	addr  uintptr
	size  uintptr
	win   atomic.Uintptr
	a     *alloc.Allocator // the segment's
}

// mapped says whether the window's segment is mapped (not paused, not
// released).
func (x *window) mapped() bool {
	info, ok := x.a.SegmentAt(x.addr)
	return ok && info.ID == x.segID && !info.Paused
}

// ncclWindows are a group's NCCL windows, by the heap offset of their
// segment, registered with comm (the communicator of the group named name,
// whose waits cg bounds).
type ncclWindows struct {
	comm Communicator
	cg   *commGather
	name string
	rank int
	// verdict shares a collective step's outcome with every rank
	// (Group.shareVerdict).
	verdict func(what string, localErr error) error
	a       *alloc.Allocator // the group's, whose segments the windows hold
	mu      lockrank.Mutex[lockrank.Windows]
	m       map[uint64]*window
	// pausedWins holds the windows of segments that a pause deregistered
	// with their memory (the release hook, told the release is a pause's),
	// by heap offset, until the resume registers them again in the same
	// window value, which handles hold (Note [Collective pause]).
	pausedWins map[uint64]*window
	// registered and deregistered count calls (tests check them).
	registered, deregistered int
	removeHook               func()
}

// newNCCLWindows is the registry of a group over comm, whose windows go
// before the memory that a's release hook is told about.
func newNCCLWindows(comm Communicator, cg *commGather, name string, rank int, verdict func(string, error) error, a *alloc.Allocator) *ncclWindows {
	w := &ncclWindows{comm: comm, cg: cg, name: name, rank: rank, verdict: verdict, a: a, m: map[uint64]*window{}, pausedWins: map[uint64]*window{}}
	w.removeHook = a.AddReleaseHook(w.onSegmentRelease)
	return w
}

func (w *ncclWindows) held(seg alloc.SegmentInfo) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	if x := w.m[seg.HeapOff]; x != nil && x.segID == seg.ID {
		return seg.ID + 1
	}
	return 0
}

func (w *ncclWindows) counts() (registered, deregistered, live int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.registered, w.deregistered, len(w.m)
}

// dropLocked deregisters x (w.mu held). A deregistration that fails
// leaves x registered and held: the caller keeps the memory it holds.
func (w *ncclWindows) dropLocked(heapOff uint64, x *window) error {
	w.deregistered++
	if err := w.comm.DeregisterWindow(x.win.Load()); err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: deregistering the window of the segment at %#x (%d bytes) failed, so the window stays registered: %v", w.name, x.addr, x.size, err)
	}
	delete(w.m, heapOff)
	x.win.Store(0)
	return nil
}

// onSegmentRelease is the allocator's release hook: the segment's window
// goes before its memory (NCCL keeps a mapping of its own); a pause's is
// kept for the resume. A failure keeps the window and fails the release.
func (w *ncclWindows) onSegmentRelease(seg alloc.SegmentInfo) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	x := w.m[seg.HeapOff]
	if x == nil || x.segID != seg.ID {
		return nil
	}
	if err := w.dropLocked(seg.HeapOff, x); err != nil {
		return err
	}
	if seg.Paused {
		w.pausedWins[seg.HeapOff] = x
	}
	return nil
}

// pause runs commit; the release hook deregisters each segment's window
// before its memory goes and keeps it for the resume. On a failure the
// error says what each of segs holds now: released, mapped with its
// window, or mapped without it.
func (w *ncclWindows) pause(segs []alloc.SegmentInfo, commit func() error) error {
	err := commit()
	if err == nil {
		return nil
	}
	// The allocator's lock comes before w.mu (the hook runs under it).
	mapped := make([]bool, len(segs))
	for i, s := range segs {
		info, ok := w.a.SegmentAt(s.Addr)
		mapped[i] = ok && info.ID == s.ID && !info.Paused
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var released, kept int
	var bare []string
	for i, s := range segs {
		x := w.m[s.HeapOff]
		switch {
		case !mapped[i]:
			released++
		case x != nil && x.segID == s.ID:
			kept++
		default:
			bare = append(bare, fmt.Sprintf("%#x", s.HeapOff))
		}
	}
	msg := fmt.Sprintf("%v; of its %d segment(s) of the tag, %d are released (their NCCL windows deregistered) and %d are still mapped with their windows registered", err, len(segs), released, kept)
	if len(bare) > 0 {
		msg += fmt.Sprintf(", and the segment(s) at heap offset %s are still mapped but without their windows (deregistered before the unmap failed)", strings.Join(bare, ", "))
	}
	return core.Errorf(core.CodeOf(err), "%s", msg)
}

func (w *ncclWindows) paused(segs []alloc.SegmentInfo) []uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var offs []uint64
	for _, s := range segs {
		if x := w.pausedWins[s.HeapOff]; x != nil && x.segID == s.ID {
			offs = append(offs, s.HeapOff)
		}
	}
	return offs
}

// close removes the release hook and deregisters every window (Destroy).
func (w *ncclWindows) close() error {
	var errs []error
	w.removeHook()
	w.mu.Lock()
	for off, x := range w.m {
		errs = append(errs, w.dropLocked(off, x))
	}
	w.mu.Unlock()
	return errors.Join(errs...)
}

// register makes sure every rank holds a window for the rendezvous'
// segment (Note [NCCL groups]), before anything is mapped, so that a
// failure here leaves nothing to undo; collective, g.coll held. It
// shares the verdict and returns our window.
func (w *ncclWindows) register(seg alloc.SegmentInfo, recs []blockRecord, tr *phaseTrace) (*window, error) {
	need := false
	for r := range recs {
		need = need || recs[r].winHeld != recs[r].segID+1
	}
	if !need {
		w.mu.Lock()
		x := w.m[seg.HeapOff]
		w.mu.Unlock()
		tr.mark("nccl-window")
		return x, nil
	}
	var localErr error
	w.mu.Lock()
	if x := w.m[seg.HeapOff]; x != nil {
		localErr = w.dropLocked(seg.HeapOff, x)
	}
	w.mu.Unlock()
	var win uintptr
	err := w.cg.bounded("ncclCommWindowRegister", func() error {
		var err error
		win, err = w.comm.RegisterWindow(seg.Addr, seg.Size)
		return err
	})
	if core.CodeOf(err) == core.ErrTimeout {
		return nil, err
	}
	if localErr == nil && err != nil {
		localErr = core.Errorf(core.CodeOf(err), "rank %d: registering its segment at %#x (%d bytes) as a window: %v", w.rank, seg.Addr, seg.Size, err)
	}
	var x *window
	if err == nil {
		x = &window{segID: seg.ID, addr: seg.Addr, size: seg.Size, a: w.a}
		x.win.Store(win)
		w.mu.Lock()
		w.registered++
		if localErr == nil {
			w.m[seg.HeapOff] = x
		} else {
			// The old window could not be deregistered and still holds
			// the segment: the new one goes, and the verdict fails.
			w.deregistered++
			w.comm.DeregisterWindow(win)
			x = nil
		}
		w.mu.Unlock()
	}
	if err := w.verdict("rendezvous (NCCL window registration)", localErr); err != nil {
		if x != nil && localErr == nil {
			w.mu.Lock()
			if w.m[seg.HeapOff] == x {
				w.dropLocked(seg.HeapOff, x)
			}
			w.mu.Unlock()
		}
		return nil, err
	}
	tr.mark("nccl-window")
	return x, nil
}

// checkPeers compares, for every peer, the first bytes of its block
// through NCCL's peer pointer of window x with the same bytes through our
// mapping (NCCL >= 2.29; Note [NCCL groups]). Collective when supported.
func (w *ncclWindows) checkPeers(x *window, blockOff uintptr, bufPtrs []uintptr, bufSize uintptr, tr *phaseTrace) error {
	if x == nil {
		return nil
	}
	win := x.win.Load()
	if _, ok, _ := w.comm.PeerPointer(win, blockOff, w.rank); !ok {
		tr.mark("nccl-peer-check")
		return nil
	}
	n := min(bufSize, 4096)
	var localErr error
	ours := make([]byte, n)
	theirs := make([]byte, n)
	for p := 0; p < len(bufPtrs) && localErr == nil; p++ {
		ptr, _, err := w.comm.PeerPointer(win, blockOff, p)
		if err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: NCCL's pointer to rank %d's window: %v", w.rank, p, err)
			break
		}
		if ptr == 0 || bufPtrs[p] == 0 {
			continue // not reachable by load/store in NCCL's view, or on another machine (Note [Local teams])
		}
		if err := errors.Join(w.cg.readBytes(ours, bufPtrs[p]), w.cg.readBytes(theirs, ptr)); err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: reading rank %d's block: %v", w.rank, p, err)
			break
		}
		if !bytes.Equal(ours, theirs) {
			localErr = core.Errorf(core.ErrMismatch, "rank %d: NCCL's view of rank %d's window (%#x) holds other bytes than libsymmem's mapping of its block (%#x): the window is not the rendezvoused buffer", w.rank, p, ptr, bufPtrs[p])
		}
	}
	if err := w.verdict("rendezvous (checking NCCL's peer pointers)", localErr); err != nil {
		return err
	}
	tr.mark("nccl-peer-check")
	return nil
}

// resume registers again, collectively, the windows that the pause of our
// segments deregistered on some rank (the union over ranks, in heap order,
// from the resume records), and shares the verdict. A rank whose failed
// pause kept a segment's window registers it too (the window is
// collective, and its peers' parts are gone) and deregisters the kept one.
func (w *ncclWindows) resume(what string, segs []alloc.SegmentInfo, wins [][]uint64) error {
	var offs []uint64
	for _, r := range wins {
		for _, off := range r {
			if !slices.Contains(offs, off) {
				offs = append(offs, off)
			}
		}
	}
	if len(offs) == 0 {
		return nil
	}
	slices.Sort(offs)
	var localErr error
	for _, off := range offs {
		i := slices.IndexFunc(segs, func(s alloc.SegmentInfo) bool { return s.HeapOff == off })
		if i < 0 {
			localErr = core.Errorf(core.ErrInternal, "rank %d: no segment of the tag at heap offset %#x to register", w.rank, off)
			break // the verdict fails every rank before it registers more
		}
		s := segs[i]
		var win uintptr
		err := w.cg.bounded("ncclCommWindowRegister", func() error {
			var err error
			win, err = w.comm.RegisterWindow(s.Addr, s.Size)
			return err
		})
		if err != nil {
			if localErr == nil {
				localErr = core.Errorf(core.CodeOf(err), "rank %d: registering its resumed segment at %#x (%d bytes) as a window again: %v", w.rank, s.Addr, s.Size, err)
			}
			if core.CodeOf(err) == core.ErrTimeout {
				return localErr
			}
			continue
		}
		w.mu.Lock()
		x := w.pausedWins[off]
		delete(w.pausedWins, off)
		var old uintptr // the window a failed pause left registered here
		if k := w.m[off]; k != nil && k.segID == s.ID {
			x, old = k, k.win.Load()
		}
		if x == nil || x.segID != s.ID {
			x = &window{segID: s.ID, addr: s.Addr, size: s.Size, a: w.a}
		}
		x.win.Store(win)
		w.m[off] = x
		w.registered++
		if old != 0 {
			// Its peers' parts were deregistered by their pause: the new
			// window replaces it, in the value the handles hold.
			w.deregistered++
			if err := w.comm.DeregisterWindow(old); err != nil && localErr == nil {
				localErr = core.Errorf(core.CodeOf(err), "rank %d: its segment at %#x has its new window, but the one a failed pause left registered could not be deregistered (it stays registered, unused): %v", w.rank, s.Addr, err)
			}
		}
		w.mu.Unlock()
	}
	return w.verdict(what+" (NCCL windows)", localErr)
}
