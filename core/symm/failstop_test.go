package symm

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Note [Failed collectives] in core/symm/coll: a collective that gave up on
// one rank stops the group's collectives on every rank; no later call
// returns success with numbers mixed from different calls.

func init() {
	moreScenarios["coll-late-peer"] = scCollLatePeer
	moreScenarios["coll-stop-wakes"] = scCollStopWakes
	moreScenarios["barrier-late-peer"] = scBarrierLatePeer
	moreScenarios["rendezvous-late-peer"] = scRendezvousLatePeer
	moreScenarios["pause-late-peer"] = scPauseLatePeer
	moreScenarios["signal-late-peer"] = scSignalLatePeer
}

// latePeerCount is the elements of the late-peer scenarios' all-reduce.
const latePeerCount = 256

// lateCall fills this rank's input with value call*10 + rank + 1 and runs
// an in-place float32 sum of latePeerCount elements with algo; on success
// it checks the sum. What it returns is the call's error, or a check's.
func lateCall(h *Handle, call int, algo core.Algo) (err error, wrong error) {
	in := unsafe.Slice((*float32)(unmanaged.Pointer(h.bufPtrs[h.rank]+h.offset)), latePeerCount)
	for i := range in {
		in[i] = float32(call*10 + h.rank + 1)
	}
	err = coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: core.OpSum, Algo: algo, Count: latePeerCount})
	want := float32(0)
	for r := 0; r < h.world; r++ {
		want += float32(call*10 + r + 1)
	}
	for i, v := range in {
		if err == nil && v != want {
			return nil, fmt.Errorf("call #%d returned success with element %d = %v (want %v)", call, i, v, want)
		}
		if err != nil && v != float32(call*10+h.rank+1) {
			return err, fmt.Errorf("call #%d failed (%v) but changed element %d to %v (its input was %v)", call, err, i, v, call*10+h.rank+1)
		}
	}
	return err, nil
}

// wantStopped checks that err is the error of a stopped group that names
// the first failure.
func wantStopped(err error, call int, first string) error {
	if err == nil {
		return fmt.Errorf("call #%d succeeded on a group whose collectives stopped", call)
	}
	if core.CodeOf(err) != core.ErrInvalidState {
		return fmt.Errorf("call #%d: got %v, want INVALID_STATE (stopped)", call, err)
	}
	for _, s := range []string{"collectives are stopped since", first, "abort the group", "create a new one"} {
		if !strings.Contains(err.Error(), s) {
			return fmt.Errorf("call #%d: message %q lacks %q", call, err, s)
		}
	}
	return nil
}

// scCollLatePeer is a late peer on 2 ranks: both run #1;
// rank 0 runs #2 while rank 1 is busy for longer than the timeout, so rank
// 0 times out; rank 1 runs #2 late; then both run #3-#6 with fresh inputs.
// Rank 0's #2 times out, rank 1's late #2 and every later call on both
// ranks fail at once naming the first failure, and none moves data. arg
// is the algorithm.
func scCollLatePeer(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	algo := core.Algo(e.arg)
	if err, wrong := lateCall(h, 1, algo); err != nil || wrong != nil {
		return fmt.Errorf("call #1: %v %v", err, wrong)
	}
	first := "rank 0 gave up a collective"
	if e.rank == 0 {
		first = "this rank's collective timed out waiting for rank 1"
	} else {
		time.Sleep(e.timeout*2 + e.timeout/2)
	}
	err, wrong := lateCall(h, 2, algo)
	if wrong != nil {
		return wrong
	}
	if e.rank == 0 && core.CodeOf(err) != core.ErrTimeout {
		return fmt.Errorf("call #2 on rank 0: got %v, want TIMEOUT", err)
	}
	if e.rank == 1 {
		if err := wantStopped(err, 2, first); err != nil {
			return err
		}
	}
	for call := 3; call <= 6; call++ {
		start := time.Now()
		err, wrong := lateCall(h, call, algo)
		if wrong != nil {
			return wrong
		}
		if err := wantStopped(err, call, first); err != nil {
			return err
		}
		if d := time.Since(start); d > e.timeout/2 {
			return fmt.Errorf("call #%d took %v to fail: it waited rather than failing at once", call, d)
		}
	}
	return nil
}

func TestCollectiveLatePeerStopsTheGroup(t *testing.T) {
	for _, algo := range []core.Algo{core.AlgoOneShot, core.AlgoTwoShot} {
		t.Run(algo.String(), func(t *testing.T) {
			for r, err := range runInProcess(t, "coll-late-peer", 2, 500*time.Millisecond, int(algo)) {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// scCollStopWakes: on 3 ranks, ranks 0 and 1 run a collective that rank 2
// joins late; rank 0 has the short timeout, rank 1 a long one. Rank 0's
// giving up ends rank 1's wait at once (it would otherwise wait out its own
// timeout), and rank 2's late call is refused.
func scCollStopWakes(e *rankEnv, a *alloc.Allocator) error {
	short := e.timeout
	if e.rank != 0 {
		e.timeout = 60 * time.Second
	}
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	if err, wrong := lateCall(h, 1, core.AlgoOneShot); err != nil || wrong != nil {
		return fmt.Errorf("call #1: %v %v", err, wrong)
	}
	if e.rank == 2 {
		time.Sleep(4 * short)
	}
	start := time.Now()
	err, wrong := lateCall(h, 2, core.AlgoOneShot)
	took := time.Since(start)
	switch {
	case wrong != nil:
		return wrong
	case e.rank == 0 && core.CodeOf(err) != core.ErrTimeout:
		return fmt.Errorf("call #2 on rank 0: got %v, want TIMEOUT", err)
	case e.rank == 0:
		return nil
	case e.rank == 1 && took > 10*short:
		return fmt.Errorf("call #2 on rank 1 took %v: rank 0's giving up did not end its wait", took)
	}
	return wantStopped(err, 2, "rank 0 gave up a collective")
}

func TestCollectiveStopEndsPeersWaits(t *testing.T) {
	for r, err := range runInProcess(t, "coll-stop-wakes", 3, 500*time.Millisecond, 0) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// scBarrierLatePeer: barrier #2 times out on the ranks that wait for a
// late rank, and no barrier returns on any rank before the late rank
// entered it: after each, the other ranks see the mark the late rank wrote
// into its block just before it. Linear (arg 0, 2 ranks): the late rank's
// #2 returns (the others did enter it), and #3-#6 meet on every rank.
// Dissemination (arg 1, 4 ranks, rank 3 late): a rank whose round depends
// on one that failed fails too, never passes early. Note [Barriers that
// fail].
func scBarrierLatePeer(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	late := e.world - 1
	mark := func(r int) *uint32 { return (*uint32)(unmanaged.Pointer(h.bufPtrs[r])) }
	barrier := func(n int) error {
		if e.rank == late {
			atomic.StoreUint32(mark(late), uint32(n))
		}
		err := h.Barrier(0, 0, 0)
		if got := atomic.LoadUint32(mark(late)); err == nil && e.rank != late && got < uint32(n) {
			return fmt.Errorf("barrier #%d returned success before rank %d entered it (its mark is %d)", n, late, got)
		}
		return err
	}
	if err := barrier(1); err != nil {
		return err
	}
	T := e.timeout
	if e.rank == late {
		time.Sleep(T*2 + T/2) // the others time out in #2 meanwhile
		if err := barrier(2); err != nil && e.arg == 0 {
			return fmt.Errorf("late barrier #2: %v", err)
		}
		time.Sleep(2 * T) // the others wait in #3 for T/2
	} else {
		if err := barrier(2); err == nil || core.CodeOf(err) != core.ErrTimeout {
			return fmt.Errorf("barrier #2 without rank %d: got %v, want TIMEOUT", late, err)
		}
		time.Sleep(3 * T) // the late rank has passed #2
	}
	for n := 3; n <= 6; n++ {
		if err := barrier(n); err != nil && (e.arg == 0 || core.CodeOf(err) != core.ErrTimeout) {
			return fmt.Errorf("barrier #%d: %v", n, err)
		}
	}
	return nil
}

func TestBarrierLatePeerStaysInStep(t *testing.T) {
	for _, c := range []struct {
		name   string
		world  int
		dissem bool
	}{{"linear", 2, false}, {"dissemination", 4, true}} {
		t.Run(c.name, func(t *testing.T) {
			defer func(v bool) { barrierDissemination = v }(barrierDissemination)
			barrierDissemination = c.dissem
			arg := 0
			if c.dissem {
				arg = 1
			}
			for r, err := range runInProcess(t, "barrier-late-peer", c.world, 400*time.Millisecond, arg) {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// scRendezvousLatePeer: rendezvous #2 times out on rank 0 while rank 1 is
// late; rank 1's late #2 and every later rendezvous on both ranks fail,
// naming the first failure: the group's exchange does not pair a late
// call with a later one.
func scRendezvousLatePeer(e *rankEnv, a *alloc.Allocator) error {
	g, err := New(e.opts(e.name, e.rank, e.world))
	if err != nil {
		return err
	}
	defer g.Destroy()
	for n := 1; n <= 4; n++ {
		buf, err := a.Alloc(64<<10, 0)
		if err != nil {
			return err
		}
		if n == 2 && e.rank == 1 {
			time.Sleep(e.timeout*2 + e.timeout/2)
		}
		h, err := g.Rendezvous(buf)
		switch {
		case n == 1 && err != nil:
			return fmt.Errorf("rendezvous #1: %v", err)
		case n == 1:
			h.Release()
		case err == nil:
			h.Release()
			return fmt.Errorf("rendezvous #%d succeeded after rank 0's #2 timed out", n)
		case core.CodeOf(err) != core.ErrTimeout || !strings.Contains(err.Error(), "rank(s) 1 never arrived"):
			return fmt.Errorf("rendezvous #%d: got %v, want the TIMEOUT of #2 naming rank 1", n, err)
		}
	}
	return nil
}

func TestRendezvousLatePeerFailsLoudly(t *testing.T) {
	for r, err := range runInProcess(t, "rendezvous-late-peer", 2, 500*time.Millisecond, 0) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// scPauseLatePeer: pause_group #2 times out on rank 0 while rank 1 is
// late; rank 1's late pause and every later pause or resume on both ranks
// fail, and the buffer stays mapped with its contents.
func scPauseLatePeer(e *rankEnv, a *alloc.Allocator) error {
	tag := fmt.Sprintf("late-pause-%d", e.arg)
	g, h, err := joinTagged(e, a, tag)
	if err != nil {
		return err
	}
	defer g.Destroy()
	defer h.Release()
	own, _ := h.BufferPtr(e.rank)
	w := words(own, 8)
	w[0] = uint64(e.rank) + 77
	if err := g.Pause(tag); err != nil {
		return fmt.Errorf("pause #1: %v", err)
	}
	if err := g.Resume(tag); err != nil {
		return fmt.Errorf("resume #1: %v", err)
	}
	if w[0] != uint64(e.rank)+77 {
		return fmt.Errorf("after pause #1 the block holds %d", w[0])
	}
	if e.rank == 1 {
		time.Sleep(e.timeout*2 + e.timeout/2)
	}
	if err := g.Pause(tag); err == nil {
		return fmt.Errorf("pause #2 succeeded (rank 1 late by %v)", e.timeout*5/2)
	}
	for n := 3; n <= 4; n++ {
		if err := g.Pause(tag); err == nil {
			return fmt.Errorf("pause #%d succeeded after pause #2 failed", n)
		}
		if err := g.Resume(tag); err == nil {
			return fmt.Errorf("resume #%d succeeded after pause #2 failed", n)
		}
	}
	if w[0] != uint64(e.rank)+77 {
		return fmt.Errorf("after the failed pauses the block holds %d", w[0])
	}
	return nil
}

func TestPauseLatePeerFailsLoudly(t *testing.T) {
	for r, err := range runInProcess(t, "pause-late-peer", 2, 500*time.Millisecond, int(time.Now().UnixNano()%1000000)) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// On a group that spans machines (2 machines of 2 ranks), a hierarchical
// all-reduce that rank 3 joins late: rank 2 times out in the step inside
// machine m1, ranks 0 and 1 in the step across machines, rank 3's late
// call and every later call on every rank fail at once, naming the first
// failure, and no call returns success (Note [Failed collectives]).
func TestMachinesLatePeerStopsTheGroup(t *testing.T) {
	defer func(v uintptr) { coll.HierMinBytes = v }(coll.HierMinBytes)
	coll.HierMinBytes = 4 << 10
	const T = 500 * time.Millisecond
	errs := runMachines(t, mmConfig{machines: layouts["2x2"], engine: "comm", timeout: T}, func(r *mmRank) error {
		g, h, _, err := r.join(4 << 20)
		if err != nil {
			return err
		}
		defer g.Destroy()
		defer h.Release()
		const count = 8 << 10 // 32 KiB of float32: hierarchical
		if err := collCheckAlgo(h, core.AllReduce, core.Float32, core.OpSum, count, 1, core.AlgoHierarchical, true); err != nil {
			return fmt.Errorf("call #1: %v", err)
		}
		if r.rank == 3 {
			time.Sleep(T*2 + T/2)
		}
		err = collCheckAlgo(h, core.AllReduce, core.Float32, core.OpSum, count, 2, core.AlgoHierarchical, true)
		switch {
		case err == nil:
			return fmt.Errorf("call #2 succeeded with rank 3 late")
		case r.rank == 3:
			if core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), "collectives are stopped since rank 2 gave up a collective") {
				return fmt.Errorf("rank 3's late call #2: %v", err)
			}
		case core.CodeOf(err) != core.ErrTimeout:
			return fmt.Errorf("call #2: got %v, want TIMEOUT", err)
		}
		for call := 3; call <= 4; call++ {
			start := time.Now()
			err := collCheckAlgo(h, core.AllReduce, core.Float32, core.OpSum, count, call, core.AlgoHierarchical, true)
			if core.CodeOf(err) != core.ErrInvalidState || !strings.Contains(err.Error(), "collectives are stopped since") {
				return fmt.Errorf("call #%d: got %v, want the stopped group's INVALID_STATE", call, err)
			}
			if d := time.Since(start); d > T/2 {
				return fmt.Errorf("call #%d took %v to fail", call, d)
			}
		}
		return nil
	})
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// scSignalLatePeer: rank 0's wait for rank 1's signal times out; rank 1
// puts it late. A signal wait that gives up takes nothing (Note
// [Signals]), so rank 0's next wait consumes that late signal, and the one
// after waits for rank 1's next: each wait returns only once the put it
// pairs with was made (rank 1 writes a mark before each put).
func scSignalLatePeer(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	mark := (*uint32)(unmanaged.Pointer(h.bufPtrs[1]))
	T := e.timeout
	if e.rank == 1 {
		time.Sleep(T*2 + T/2)
		for n := uint32(1); n <= 3; n++ {
			atomic.StoreUint32(mark, n)
			if err := h.PutSignal(0, 1, 0, 0); err != nil {
				return err
			}
			time.Sleep(T / 2)
		}
		return h.Barrier(0, 0, 0)
	}
	if err := h.WaitSignal(1, 1, 0, 0); core.CodeOf(err) != core.ErrTimeout {
		return fmt.Errorf("the first wait: got %v, want TIMEOUT", err)
	}
	for n := uint32(1); n <= 3; n++ {
		if err := h.WaitSignal(1, 1, 0, 4*T); err != nil {
			return fmt.Errorf("wait %d: %v", n, err)
		}
		if got := atomic.LoadUint32(mark); got != n {
			return fmt.Errorf("wait %d returned with rank 1's mark at %d", n, got)
		}
	}
	return h.Barrier(0, 0, 0)
}

func TestSignalLatePeerStaysInStep(t *testing.T) {
	for r, err := range runInProcess(t, "signal-late-peer", 2, 400*time.Millisecond, 0) {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}
