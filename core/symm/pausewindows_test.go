package symm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/stretchr/testify/require"
)

// Note [Collective pause], Note [Window registration]: a pause that fails
// on one rank before its shared verdict never leaves a live segment
// without its window. A group over the test communicator, two ranks on one
// machine and one on another, holds two buffers of a tag in two segments,
// each an NCCL window. Rank 1 fails the pause at each step before the
// verdict: the gather (its list of the tag's segments differs) and every
// backend call of the prepare step (waiting for the device, the host
// copies). After each failure every rank checks that both segments are
// live, that each handle's window is the one it had before and is still
// registered with the communicator, that the window counts did not move,
// that local stores and a collective on the buffers give the right values;
// and the next pause succeeds, with the windows deregistered while paused
// (Handle.Window is ErrInvalidState naming the pause) and new ones after
// the resume.
func TestFailedPauseKeepsEveryLiveSegmentsWindow(t *testing.T) {
	tag := fmt.Sprintf("win-rollback-%d", time.Now().UnixNano()%1e9)
	id, fbs, cfg := faultyWindowGroup(t, tag)
	const faulty = 1
	// plan is rank 1's injections, set after its dry runs; every rank then
	// runs one failed pause per entry.
	var plan []faultbe.Rule
	planned := make(chan struct{})
	requireAllOK(t, runMachines(t, cfg, func(r *mmRank) error {
		return failedPauseRank(r, fbs[r.rank], tag, id, r.rank == faulty, &plan, planned)
	}))
	require.NotEmpty(t, plan)
	require.Len(t, fbs[faulty].Injected(), len(plan))
	t.Logf("%d injected failures: %v", len(plan), fbs[faulty].Injected())
}

// pauseWindowSizes are the buffers of the test: a small block and one
// large enough for a segment of its own.
var pauseWindowSizes = []uintptr{pauseBlock, 12 << 20}

// faultyWindowGroup registers tag (pinned backup) and gives the
// configuration of a group over the test communicator with windows: ranks
// 0 and 1 on one machine, rank 2 on another, each rank's backend behind a
// fault backend (fbs, by rank, filled as the ranks start).
func faultyWindowGroup(t *testing.T, tag string) (alloc.TagID, []*faultbe.Backend, mmConfig) {
	t.Helper()
	id, err := alloc.RegisterTag(tag, alloc.BackupPinned)
	require.NoError(t, err)
	machines := []int{0, 0, 1}
	fbs := make([]*faultbe.Backend, len(machines))
	wrap := func(r int, be *host.Backend) core.Backend {
		fbs[r] = faultbe.New(be)
		return fbs[r]
	}
	return id, fbs, mmConfig{machines: machines, engine: "comm", backend: wrap}
}

// windowedBuffers allocates pauseWindowSizes in tag id, makes the group
// and rendezvouses on each buffer (each segment an NCCL window); done
// releases the handles and destroys the group.
func windowedBuffers(r *mmRank, id alloc.TagID) (g *Group, bufs []uintptr, hs []*Handle, done func(), err error) {
	for _, size := range pauseWindowSizes {
		buf, err := r.a.AllocTagged(size, 0, id)
		if err != nil {
			return nil, nil, nil, nil, err
		}
		bufs = append(bufs, buf)
	}
	if g, err = New(r.o); err != nil {
		return nil, nil, nil, nil, err
	}
	done = func() {
		for _, h := range hs {
			h.Release()
		}
		g.Destroy()
	}
	for _, buf := range bufs {
		h, err := g.Rendezvous(buf)
		if err != nil {
			done()
			return nil, nil, nil, nil, err
		}
		hs = append(hs, h)
	}
	return g, bufs, hs, done, nil
}

func failedPauseRank(r *mmRank, fb *faultbe.Backend, tag string, id alloc.TagID, faulty bool, plan *[]faultbe.Rule, planned chan struct{}) error {
	g, bufs, hs, done, err := windowedBuffers(r, id)
	if err != nil {
		return err
	}
	defer done()
	hub := r.comm.hub
	windows := func() ([]uintptr, error) {
		var ws []uintptr
		for i, h := range hs {
			w, _, err := h.Window()
			if err != nil || w == 0 {
				return nil, fmt.Errorf("buffer %d: no window (%#x, %v)", i, w, err)
			}
			if !hub.liveWindow(w) {
				return nil, fmt.Errorf("buffer %d: window %#x is not registered with the communicator", i, w)
			}
			ws = append(ws, w)
		}
		return ws, nil
	}
	round := 0
	// live checks that every segment of the tag is live and holds the
	// windows wins with the window counts counts, and that stores and a
	// collective on the buffers give the right values on every rank.
	live := func(when string, wins []uintptr, counts [3]int) error {
		round++
		for i, buf := range bufs {
			info, err := r.a.Lookup(buf)
			if err != nil {
				return fmt.Errorf("%s: buffer %d: %v", when, i, err)
			}
			if info.Segment.Paused {
				return fmt.Errorf("%s: buffer %d: its segment at heap offset %#x is paused", when, i, info.Segment.HeapOff)
			}
		}
		ws, err := windows()
		if err != nil {
			return fmt.Errorf("%s: %v", when, err)
		}
		if !slices.Equal(ws, wins) {
			return fmt.Errorf("%s: the windows are %#x, want %#x (those before the pause)", when, ws, wins)
		}
		if rg, dr, lv := g.WindowCounts(); [3]int{rg, dr, lv} != counts {
			return fmt.Errorf("%s: window counts (registered, deregistered, live) %v, want %v", when, [3]int{rg, dr, lv}, counts)
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
	counts := func() [3]int {
		rg, dr, lv := g.WindowCounts()
		return [3]int{rg, dr, lv}
	}
	// cycle pauses and resumes: paused, the handles have no window (the
	// error names the pause); resumed, each has a new one, registered.
	cycle := func(when string) error {
		before, err := windows()
		if err != nil {
			return fmt.Errorf("%s: %v", when, err)
		}
		c := counts()
		if err := g.Pause(tag); err != nil {
			return fmt.Errorf("%s: pause: %v", when, err)
		}
		for i, h := range hs {
			w, _, err := h.Window()
			if w != 0 || core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), "paused") {
				return fmt.Errorf("%s: paused: buffer %d's window is %#x (%v), want ErrInvalidState naming the pause", when, i, w, err)
			}
			if hub.liveWindow(before[i]) {
				return fmt.Errorf("%s: paused: buffer %d's window %#x is still registered", when, i, before[i])
			}
		}
		if got, want := counts(), [3]int{c[0], c[1] + len(hs), 0}; got != want {
			return fmt.Errorf("%s: paused: window counts %v, want %v", when, got, want)
		}
		if err := g.Resume(tag); err != nil {
			return fmt.Errorf("%s: resume: %v", when, err)
		}
		after, err := windows()
		if err != nil {
			return fmt.Errorf("%s: resumed: %v", when, err)
		}
		for i := range after {
			if after[i] == before[i] {
				return fmt.Errorf("%s: resumed: buffer %d has the window %#x of before the pause", when, i, after[i])
			}
		}
		want := [3]int{c[0] + len(hs), c[1] + len(hs), len(hs)}
		return live(when+", after a pause and resume", after, want)
	}
	wins, err := windows()
	if err != nil {
		return err
	}
	if err := live("before any pause", wins, [3]int{len(hs), 0, len(hs)}); err != nil {
		return err
	}
	// Two dry cycles (the first makes the host copies); the calls of the
	// second's pause before its first unmap are the gather's all-gather,
	// the prepare step, and the verdict's all-gather.
	if err := cycle("dry run 1"); err != nil {
		return err
	}
	mark := len(fb.Calls())
	if err := g.shareVerdict("an all-gather to count its backend calls", nil); err != nil {
		return err
	}
	gather := fb.Calls()[mark:]
	mark = len(fb.Calls())
	if err := cycle("dry run 2"); err != nil {
		return err
	}
	calls := fb.Calls()[mark:]
	if i := slices.Index(calls, "Unmap"); i >= 0 {
		calls = calls[:i]
	}
	n := len(gather)
	if len(calls) < 2*n || !slices.Equal(calls[:n], gather) || !slices.Equal(calls[len(calls)-n:], gather) {
		return fmt.Errorf("the pause's calls before its first unmap, %v, are not an all-gather (%v), the prepare step, an all-gather", calls, gather)
	}
	if faulty {
		seen := map[string]int{}
		for i, m := range calls[:len(calls)-n] {
			seen[m]++
			if i >= n {
				*plan = append(*plan, faultbe.Rule{Method: m, Nth: seen[m]})
			}
		}
		close(planned)
	} else {
		<-planned
	}
	if wins, err = windows(); err != nil {
		return err
	}
	c := counts()
	// The gather: rank 1's list of the tag's segments has one more.
	var extra uintptr
	if faulty {
		if extra, err = r.a.AllocTagged(12<<20, 0, id); err != nil {
			return err
		}
	}
	err = g.Pause(tag)
	if core.CodeOf(err) != core.ErrMismatch || !strings.Contains(err.Error(), "segments differ") {
		return fmt.Errorf("segment lists that differ: the pause returned %v, want ErrMismatch", err)
	}
	if faulty {
		if err := r.a.Free(extra, 12<<20, 0); err != nil {
			return err
		}
		if err := r.a.EmptyCache(); err != nil {
			return err
		}
	}
	if err := live("after a pause on segment lists that differ", wins, c); err != nil {
		return err
	}
	// The prepare step: each backend call of it, failed on rank 1.
	for i, rule := range *plan {
		what := fmt.Sprintf("failure %d (%s call %d of the pause on rank 1)", i, rule.Method, rule.Nth)
		if faulty {
			fb.Add(rule)
		}
		err := g.Pause(tag)
		fb.Clear()
		if err == nil {
			return fmt.Errorf("%s: the pause succeeded", what)
		}
		if code := core.CodeOf(err); code != core.ErrBackend || !strings.Contains(err.Error(), "nothing was released") {
			return fmt.Errorf("%s: the pause failed with %v, want the injected ErrBackend before anything was released", what, err)
		}
		if err := live(what, wins, c); err != nil {
			return err
		}
	}
	return cycle("after the injected failures")
}
