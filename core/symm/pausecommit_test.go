package symm

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/stretchr/testify/require"
)

// commitSeg is what the failing rank holds of one of its segments after a
// pause's commit failed there.
type commitSeg int

const (
	segReleased commitSeg = iota // paused, its window deregistered
	segKept                      // mapped, its window still registered
	segBare                      // mapped, its window deregistered before the unmap failed
)

// commitFault is one failure injected on the failing rank at a pause's
// commit, and what it leaves of the rank's segments in heap order.
type commitFault struct {
	what string
	// arm injects the failure; importUnmaps and importReleases are the
	// Unmap and Release calls the rank's commit makes for its imports of
	// the peers' segments, before its own segments'.
	arm  func(r *mmRank, fb *faultbe.Backend, importUnmaps, importReleases int)
	left []commitSeg
}

var commitFaults = []commitFault{
	{"the first segment's window deregistration", func(r *mmRank, _ *faultbe.Backend, _, _ int) { r.comm.failDeregistration(1) },
		[]commitSeg{segKept, segKept}},
	{"the second segment's window deregistration", func(r *mmRank, _ *faultbe.Backend, _, _ int) { r.comm.failDeregistration(2) },
		[]commitSeg{segReleased, segKept}},
	{"the first segment's unmap", func(_ *mmRank, fb *faultbe.Backend, unmaps, _ int) { fb.FailNth("Unmap", unmaps+1) },
		[]commitSeg{segBare, segKept}},
	{"the second segment's unmap", func(_ *mmRank, fb *faultbe.Backend, unmaps, _ int) { fb.FailNth("Unmap", unmaps+2) },
		[]commitSeg{segReleased, segBare}},
	{"the first segment's release", func(_ *mmRank, fb *faultbe.Backend, _, releases int) { fb.FailNth("Release", releases+1) },
		[]commitSeg{segReleased, segKept}},
}

// Note [Collective pause], Note [Releasing a paused tag] in core/alloc,
// Note [Window registration]: a pause whose commit fails on one rank,
// after every rank agreed, never leaves a live segment of that rank with a
// window the group thinks gone, and the group's resume brings every rank
// back to one state. A group over the test communicator, two ranks on one
// machine and one on another, holds two buffers of a tag in two segments,
// each an NCCL window. For each failure of commitFaults, injected on rank
// 1 only (a window deregistration refused by the communicator, an unmap or
// a release refused by the backend), every rank checks:
//
//   - the pause fails on every rank with rank 1's error, which names what
//     rank 1 holds and the resume as the way back;
//   - what each segment is: paused everywhere but on rank 1, where it is
//     what the failure left; a mapped segment has its window registered in
//     the communicator's view and Handle.Window gives it, unless the unmap
//     failed after the window went, where Handle.Window is ErrInvalidState
//     naming that state and the resume; a paused one has no window and
//     Handle.Window says it is paused; the rank holds no other window;
//   - a pause again is ErrInvalidState (already paused) on every rank and
//     changes nothing;
//   - the resume succeeds on every rank: every segment is mapped with a
//     new window registered (one per segment, none left over), what each
//     rank stored before the pause is there, and stores through the
//     handles and a collective give the right values.
//
// After the failures a pause and resume succeed.
func TestFailedPauseCommitKeepsEveryLiveSegmentsWindow(t *testing.T) {
	tag := fmt.Sprintf("win-commit-%d", time.Now().UnixNano()%1e9)
	id, fbs, cfg := faultyWindowGroup(t, tag)
	const faulty = 1
	requireAllOK(t, runMachines(t, cfg, func(r *mmRank) error {
		return failedCommitRank(r, fbs[r.rank], tag, id, r.rank == faulty)
	}))
	// The three backend failures; the two deregistrations are the
	// communicator's.
	require.Len(t, fbs[faulty].Injected(), 3, "%v", fbs[faulty].Injected())
	t.Logf("injected: %v and two window deregistrations", fbs[faulty].Injected())
}

func failedCommitRank(r *mmRank, fb *faultbe.Backend, tag string, id alloc.TagID, faulty bool) error {
	g, bufs, hs, done, err := windowedBuffers(r, id)
	if err != nil {
		return err
	}
	defer done()
	hub := r.comm.hub
	// pos[i] is the place of buffer i's segment in heap order.
	pos := make([]int, len(bufs))
	var offs []uint64
	for _, buf := range bufs {
		info, err := r.a.Lookup(buf)
		if err != nil {
			return err
		}
		offs = append(offs, info.Segment.HeapOff)
	}
	sorted := slices.Sorted(slices.Values(offs))
	if len(slices.Compact(slices.Clone(sorted))) != len(bufs) {
		return fmt.Errorf("the buffers share a segment (heap offsets %#x)", offs)
	}
	for i, off := range offs {
		pos[i] = slices.Index(sorted, off)
	}
	windows := func() ([]uintptr, error) {
		var ws []uintptr
		for i, h := range hs {
			w, _, err := h.Window()
			if err != nil || w == 0 || !hub.liveWindow(w) {
				return nil, fmt.Errorf("buffer %d: no registered window (%#x, %v)", i, w, err)
			}
			ws = append(ws, w)
		}
		return ws, nil
	}
	round := 0
	// resumed checks that every segment is mapped with a registered window
	// other than those of before, the only windows of this rank, and that
	// stores and a collective on the buffers give the right values.
	resumed := func(when string, before []uintptr) error {
		round++
		for i, buf := range bufs {
			if info, err := r.a.Lookup(buf); err != nil || info.Segment.Paused {
				return fmt.Errorf("%s: buffer %d's segment is paused (%v)", when, i, err)
			}
		}
		ws, err := windows()
		if err != nil {
			return fmt.Errorf("%s: %v", when, err)
		}
		for i := range ws {
			if slices.Contains(before, ws[i]) {
				return fmt.Errorf("%s: buffer %d has the window %#x of before the pause", when, i, ws[i])
			}
		}
		if n := hub.liveWindowsOf(r.rank); n != len(hs) {
			return fmt.Errorf("%s: the communicator holds %d windows of this rank, want %d (one per segment)", when, n, len(hs))
		}
		if _, _, lv := g.WindowCounts(); lv != len(hs) {
			return fmt.Errorf("%s: the group holds %d windows, want %d", when, lv, len(hs))
		}
		for i, h := range hs {
			if err := localWrites(g, h, round); err != nil {
				return fmt.Errorf("%s: buffer %d: %v", when, i, err)
			}
			if err := collCheck(h, core.AllReduce, core.Float32, core.OpSum, uintptr(64*r.world), round); err != nil {
				return fmt.Errorf("%s: buffer %d: %v", when, i, err)
			}
		}
		return nil
	}
	// left checks what each segment is after the failed commit: c.left on
	// the failing rank, paused elsewhere.
	left := func(when string, c commitFault, before []uintptr) error {
		want := make([]commitSeg, len(bufs))
		kept := 0
		for i := range bufs {
			if faulty {
				want[i] = c.left[pos[i]]
			}
			if want[i] == segKept {
				kept++
			}
		}
		for i, h := range hs {
			info, err := r.a.Lookup(bufs[i])
			if err != nil {
				return fmt.Errorf("%s: buffer %d: %v", when, i, err)
			}
			w, _, werr := h.Window()
			mapped := !info.Segment.Paused
			switch want[i] {
			case segReleased:
				if mapped {
					return fmt.Errorf("%s: buffer %d's segment is mapped, want it paused", when, i)
				}
				if w != 0 || core.CodeOf(werr) != core.ErrInvalidState || !strings.Contains(werr.Error(), "paused tag") {
					return fmt.Errorf("%s: buffer %d (paused): Window gave %#x, %v; want ErrInvalidState naming the pause", when, i, w, werr)
				}
			case segKept:
				if !mapped {
					return fmt.Errorf("%s: buffer %d's segment is paused, want it mapped with its window", when, i)
				}
				if werr != nil || w != before[i] || !hub.liveWindow(w) {
					return fmt.Errorf("%s: buffer %d (mapped): Window gave %#x, %v; want its window %#x, registered", when, i, w, werr, before[i])
				}
			case segBare:
				if !mapped {
					return fmt.Errorf("%s: buffer %d's segment is paused, want it mapped (its unmap failed)", when, i)
				}
				if w != 0 || core.CodeOf(werr) != core.ErrInvalidState || !strings.Contains(werr.Error(), "failed pause left mapped") || !strings.Contains(werr.Error(), "symmem_resume_group") {
					return fmt.Errorf("%s: buffer %d (mapped, its window gone): Window gave %#x, %v; want ErrInvalidState naming that state and the resume", when, i, w, werr)
				}
			}
			if want[i] != segKept && hub.liveWindow(before[i]) {
				return fmt.Errorf("%s: buffer %d's window %#x is still registered", when, i, before[i])
			}
		}
		if n := hub.liveWindowsOf(r.rank); n != kept {
			return fmt.Errorf("%s: the communicator holds %d windows of this rank, want %d", when, n, kept)
		}
		return nil
	}
	wins, err := windows()
	if err != nil {
		return err
	}
	if err := resumed("before any pause", nil); err != nil {
		return err
	}
	// A dry cycle counts the Unmap and Release calls of this rank's pause
	// (its imports' first, then its own segments').
	unmaps, releases := fb.Count("Unmap"), fb.Count("Release")
	if err := g.Pause(tag); err != nil {
		return fmt.Errorf("dry run: pause: %v", err)
	}
	unmaps, releases = fb.Count("Unmap")-unmaps-len(bufs), fb.Count("Release")-releases-len(bufs)
	if unmaps < 0 || releases < 0 {
		return fmt.Errorf("dry run: the pause made fewer unmaps (%d) or releases (%d) than there are segments", unmaps+len(bufs), releases+len(bufs))
	}
	if err := g.Resume(tag); err != nil {
		return fmt.Errorf("dry run: resume: %v", err)
	}
	if err := resumed("dry run", wins); err != nil {
		return err
	}
	for k, c := range commitFaults {
		what := fmt.Sprintf("failure %d (%s, on rank 1)", k, c.what)
		before, err := windows()
		if err != nil {
			return fmt.Errorf("%s: %v", what, err)
		}
		// What each rank stores now must be there after the resume.
		marks := make([]uintptr, len(bufs))
		for i, h := range hs {
			own, _ := h.BufferPtr(r.rank)
			marks[i] = own + pauseWindowSizes[i] - 8
			atomic.StoreUint64(&words(marks[i], 1)[0], val(r.rank, 1000+k, i))
		}
		if faulty {
			c.arm(r, fb, unmaps, releases)
		}
		err = g.Pause(tag)
		fb.Clear()
		if err == nil {
			return fmt.Errorf("%s: the pause succeeded", what)
		}
		if core.CodeOf(err) != core.ErrBackend || !strings.Contains(err.Error(), "failed on rank 1") || !strings.Contains(err.Error(), "resume, on every rank") {
			return fmt.Errorf("%s: the pause failed with %v, want rank 1's ErrBackend naming the resume", what, err)
		}
		if slices.Contains(c.left, segBare) && !strings.Contains(err.Error(), "still mapped but without their windows") {
			return fmt.Errorf("%s: the error does not say which segment is mapped without its window: %v", what, err)
		}
		if err := left(what, c, before); err != nil {
			return err
		}
		err = g.Pause(tag)
		if core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), "already paused") {
			return fmt.Errorf("%s: a pause again gave %v, want ErrInvalidState (already paused)", what, err)
		}
		if err := left(what+", after a pause again", c, before); err != nil {
			return err
		}
		if err := g.Resume(tag); err != nil {
			return fmt.Errorf("%s: resume: %v", what, err)
		}
		for i, m := range marks {
			if got, want := atomic.LoadUint64(&words(m, 1)[0]), val(r.rank, 1000+k, i); got != want {
				return fmt.Errorf("%s: resumed: buffer %d's last word reads %#x, want %#x (stored before the pause)", what, i, got, want)
			}
		}
		if err := resumed(what+", resumed", before); err != nil {
			return err
		}
	}
	before, err := windows()
	if err != nil {
		return err
	}
	if err := g.Pause(tag); err != nil {
		return fmt.Errorf("after the failures: pause: %v", err)
	}
	if err := g.Resume(tag); err != nil {
		return fmt.Errorf("after the failures: resume: %v", err)
	}
	return resumed("after the failures, a pause and resume", before)
}
