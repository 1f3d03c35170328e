package symm

import (
	"bufio"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
)

// The collective pause scenarios (runScenario finds them in moreScenarios).
func init() {
	moreScenarios["pause"] = scPause
	moreScenarios["pause-dies"] = scPauseDies
	moreScenarios["pause-errors"] = scPauseErrors
}

// pauseBlock is the size of the tagged buffer: its 2 MiB segment is what a
// pause gives back, and what the footprint check measures.
const pauseBlock = 1 << 20

// rssShmem is this process's resident shared memory, as the kernel counts it.
func rssShmem() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "RssShmem:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no RssShmem in /proc/self/status")
}

// joinTagged allocates a pauseBlock buffer in tag (with backup) and creates
// the world group and a handle on it.
func joinTagged(e *rankEnv, a *alloc.Allocator, tag string) (*Group, *Handle, error) {
	id, err := alloc.RegisterTag(tag, alloc.BackupPinned)
	if err != nil {
		return nil, nil, err
	}
	buf, err := a.AllocTagged(pauseBlock, 0, id)
	if err != nil {
		return nil, nil, err
	}
	g, err := New(e.opts(e.name, e.rank, e.world))
	if err != nil {
		return nil, nil, err
	}
	h, err := g.Rendezvous(buf)
	if err != nil {
		g.Destroy()
		return nil, nil, err
	}
	return g, h, nil
}

// fillAndTouch fills this rank's block with its pattern (after the word
// slots writeAll uses), then reads every peer's block whole, so that every
// page of every rank's segment is resident in this process.
func fillAndTouch(h *Handle) (sum uint64, err error) {
	me, world := h.Rank(), h.World()
	own, _ := h.BufferPtr(me)
	w := words(own, pauseBlock/8)
	for i := world; i < len(w); i++ {
		w[i] = uint64(me)<<32 | uint64(i)
	}
	if err := h.Barrier(0, 0, 0); err != nil {
		return 0, err
	}
	for p := 0; p < world; p++ {
		ptr, _ := h.BufferPtr(p)
		for _, v := range words(ptr, pauseBlock/8) {
			sum += v
		}
	}
	return sum, h.Barrier(1, 0, 0)
}

// checkPatterns checks every rank's block as seen here holds its owner's
// pattern (the backup restored on every rank and mapped again here).
func checkPatterns(h *Handle, cycle int) error {
	for p := 0; p < h.World(); p++ {
		ptr, _ := h.BufferPtr(p)
		w := words(ptr, pauseBlock/8)
		for _, i := range []int{h.World(), len(w) / 2, len(w) - 1} {
			if want := uint64(p)<<32 | uint64(i); w[i] != want {
				return fmt.Errorf("cycle %d: rank %d's block word %d reads %#x here, want %#x", cycle, p, i, w[i], want)
			}
		}
	}
	return nil
}

func scPause(e *rankEnv, a *alloc.Allocator) error {
	tag := "sym-" + e.name
	g, h, err := joinTagged(e, a, tag)
	if err != nil {
		return err
	}
	defer g.Destroy()
	defer h.Release()
	ptrs := h.Buffers()
	if _, err := fillAndTouch(h); err != nil {
		return err
	}
	for cycle := 0; cycle < 3; cycle++ {
		if err := writeAll(h, 2*cycle); err != nil {
			return err
		}
		before, err := rssShmem()
		if err != nil {
			return err
		}
		if err := g.Pause(tag); err != nil {
			return err
		}
		after, err := rssShmem()
		if err != nil {
			return err
		}
		// Our segment and every peer's (2 MiB each, 1 MiB of each touched)
		// left this process.
		if drop := before - after; drop < int64(e.world)*pauseBlock*9/10 {
			return fmt.Errorf("cycle %d: RssShmem went from %d to %d while paused: %d bytes, want at least %d", cycle, before, after, drop, e.world*pauseBlock*9/10)
		}
		if err := g.Pause(tag); core.CodeOf(err) != core.ErrInvalidState {
			return fmt.Errorf("pausing a paused tag collectively: %v, want ErrInvalidState", err)
		}
		if err := g.Resume(tag); err != nil {
			return err
		}
		if !slices.Equal(ptrs, h.Buffers()) {
			return fmt.Errorf("cycle %d: pointers moved: %#x -> %#x", cycle, ptrs, h.Buffers())
		}
		// writeAll's words of the last round survive, with the rest.
		if err := checkPatterns(h, cycle); err != nil {
			return err
		}
		if err := writeAll(h, 2*cycle+1); err != nil {
			return err
		}
		if _, err := fillAndTouch(h); err != nil {
			return err
		}
	}
	// A rendezvous after the cycles reuses the mappings (no exchange).
	ex := g.exchanges
	h2, err := g.Rendezvous(ptrs[e.rank])
	if err != nil {
		return err
	}
	defer h2.Release()
	if g.exchanges != ex {
		return fmt.Errorf("a rendezvous after resume exchanged descriptors again")
	}
	return writeAll(h2, 100)
}

// scPauseDies: rank e.arg exits instead of pausing. The others fail with
// its name within the timeout, and their tag is untouched (still live).
func scPauseDies(e *rankEnv, a *alloc.Allocator) error {
	tag := "dies-" + e.name
	g, h, err := joinTagged(e, a, tag)
	if err != nil {
		return err
	}
	defer g.Destroy()
	defer h.Release()
	if e.rank == e.arg {
		os.Exit(3)
	}
	err = g.Pause(tag)
	if err == nil {
		return fmt.Errorf("collective pause succeeded without rank %d", e.arg)
	}
	if _, lerr := a.TagSegments(tag, false); lerr != nil {
		return fmt.Errorf("after the failed pause the tag is not live: %v (pause said %v)", lerr, err)
	}
	return err
}

func scPauseErrors(e *rankEnv, a *alloc.Allocator) error {
	tag := "err-" + e.name
	g, h, err := joinTagged(e, a, tag)
	if err != nil {
		return err
	}
	defer g.Destroy()
	defer h.Release()
	expect := func(what string, err error, code core.Code, contains string) error {
		if core.CodeOf(err) != code || !strings.Contains(fmt.Sprint(err), contains) {
			return fmt.Errorf("%s: %v (code %d), want code %d mentioning %q", what, err, core.CodeOf(err), code, contains)
		}
		return nil
	}
	if err := expect("group pause of an unknown tag", g.Pause("no-such-tag"), core.ErrInvalidArgument, "no-such-tag"); err != nil {
		return err
	}
	if err := expect("group resume of a live tag", g.Resume(tag), core.ErrInvalidState, "not paused"); err != nil {
		return err
	}
	_, err = a.Pause(tag, alloc.PauseOptions{})
	if err := expect("local pause of a rendezvoused tag", err, core.ErrInvalidState, "symmem_pause_group"); err != nil {
		return err
	}
	if err := writeAll(h, 0); err != nil {
		return err
	}
	if err := g.Pause(tag); err != nil {
		return err
	}
	own, _ := h.BufferPtr(e.rank)
	_, err = g.Rendezvous(own)
	if err := expect("rendezvous on a paused block", err, core.ErrInvalidState, "paused"); err != nil {
		return err
	}
	// Rank 1 cannot take its memory back: every rank gets its error and
	// stays paused; the retry succeeds everywhere.
	if e.rank == 1 {
		a.SetLimit(1 << 20)
	}
	err = g.Resume(tag)
	if err := expect("resume over the limit", err, core.ErrOutOfMemory, "failed on rank 1"); err != nil {
		return err
	}
	if !strings.Contains(err.Error(), tag) || !strings.Contains(err.Error(), fmt.Sprint(2<<20)) {
		return fmt.Errorf("the error does not name the tag and the bytes: %v", err)
	}
	if _, err := a.TagSegments(tag, true); err != nil {
		return fmt.Errorf("after the failed resume the tag is not paused: %v", err)
	}
	a.SetLimit(0)
	if err := g.Resume(tag); err != nil {
		return err
	}
	if err := writeAll(h, 1); err != nil {
		return err
	}
	return a.Validate()
}

func TestProcessesCollectivePause(t *testing.T) {
	allOK(t, runProcs(t, "pause", 4, 60*time.Second, 0))
}

func TestProcessesCollectivePauseErrors(t *testing.T) {
	allOK(t, runProcs(t, "pause-errors", 3, 60*time.Second, 0))
}

// A rank that exits during a collective pause: the others fail naming it,
// within the timeout, with their tag untouched.
func TestProcessesRankExitsDuringPause(t *testing.T) {
	res := runProcs(t, "pause-dies", 3, 10*time.Second, 1)
	for _, r := range res {
		if r.Rank == 1 {
			if r.Exit != 3 {
				t.Fatalf("rank 1 exit %d", r.Exit)
			}
			continue
		}
		if c := core.Code(r.Code); (c != core.ErrPeer && c != core.ErrTimeout) || !strings.Contains(r.Msg, "rank 1") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
}
