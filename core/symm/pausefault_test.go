package symm

import (
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/stretchr/testify/require"
)

// Note [Collective pause]: a failure of any call that a collective pause
// makes before its shared verdict (the device synchronisation, the host
// copies), injected on one rank, fails the pause on every rank and leaves
// every rank live: handles work (what one rank writes through them another
// reads) and the next pause and resume succeed, with the contents kept.
// Two ranks in this process, on the backend of the environment (the
// stand-in driver in the go-fakecuda suite).
func TestCollectivePauseRollsBackUnderInjectedFaults(t *testing.T) {
	if fb := faultBackend(t); !fb.Capabilities().SharedDevice && fb.DeviceCount() < 2 {
		t.Skip("needs a device per rank (2)")
	}
	dir := sockDir(t)
	fbs := [2]*faultbe.Backend{}
	envs := [2]*rankEnv{}
	for r := range fbs {
		fbs[r] = faultbe.New(faultBackend(t))
		envs[r] = &rankEnv{rt: alloc.NewRuntime(fbs[r]), rank: r, world: 2, name: "pause-rollback", dir: dir, timeout: 20 * time.Second}
		if !fbs[r].Capabilities().SharedDevice {
			envs[r].device = r
		}
	}
	tag := fmt.Sprintf("rollback-%d", time.Now().UnixNano()%1e9)
	// plan is rank 1's list of injections, set by rank 1 after its dry
	// runs; both ranks then run one pause per entry.
	var plan []faultbe.Rule
	planned := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = rollbackRank(envs[r], fbs[r], tag, &plan, planned)
		}()
	}
	wg.Wait()
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
	require.NotEmpty(t, plan)
	t.Logf("%d injected failures: %v", len(plan), fbs[1].Injected())
}

func rollbackRank(e *rankEnv, fb *faultbe.Backend, tag string, plan *[]faultbe.Rule, planned chan struct{}) error {
	a, err := e.rt.Allocator(e.device)
	if err != nil {
		return err
	}
	g, h, err := joinTagged(e, a, tag)
	if err != nil {
		return err
	}
	defer g.Destroy()
	defer h.Release()
	s, dropStream, err := rankStream(fb, e.device)
	if err != nil {
		return err
	}
	defer dropStream()
	round := 0
	live := func(when string) error {
		round++
		if err := exchangeWords(h, fb, s, round); err != nil {
			return fmt.Errorf("%s: %v", when, err)
		}
		return nil
	}
	cycle := func(when string) error {
		if err := g.Pause(tag); err != nil {
			return fmt.Errorf("%s: pause: %v", when, err)
		}
		if err := g.Resume(tag); err != nil {
			return fmt.Errorf("%s: resume: %v", when, err)
		}
		return live(when + ", after a pause and resume")
	}
	if err := live("before any pause"); err != nil {
		return err
	}
	// Two dry cycles (the first makes the host copies); the second's calls
	// before its first unmap are what the prepare step makes.
	if err := cycle("dry run 1"); err != nil {
		return err
	}
	before := len(fb.Calls())
	if err := cycle("dry run 2"); err != nil {
		return err
	}
	if e.rank == 1 {
		calls := fb.Calls()[before:]
		if i := slices.Index(calls, "Unmap"); i >= 0 {
			calls = calls[:i]
		}
		seen := map[string]int{}
		for _, m := range calls {
			seen[m]++
			*plan = append(*plan, faultbe.Rule{Method: m, Nth: seen[m]})
		}
		close(planned)
	} else {
		<-planned
	}
	for i, r := range *plan {
		what := fmt.Sprintf("failure %d (%s call %d of the pause on rank 1)", i, r.Method, r.Nth)
		if e.rank == 1 {
			fb.Add(r)
		}
		err := g.Pause(tag)
		fb.Clear()
		if err == nil {
			return fmt.Errorf("%s: the pause succeeded", what)
		}
		if c := core.CodeOf(err); c == core.ErrAborted || c == core.ErrInternal {
			return fmt.Errorf("%s: %v", what, err)
		}
		if err := live(what); err != nil {
			return err
		}
	}
	if err := cycle("after the injected failures"); err != nil {
		return err
	}
	return nil
}

// exchangeWords has each rank store a word of round into every rank's
// block through the handle and check, after a barrier on s, what every
// peer stored into its own.
func exchangeWords(h *Handle, fb *faultbe.Backend, s core.Stream, round int) error {
	me, world := h.Rank(), h.World()
	sync := func() error {
		if err := h.Barrier(0, s, 0); err != nil {
			return err
		}
		// The stream alone: the stand-in driver's device synchronisation
		// waits for the other rank's streams of this process too.
		if ss, ok := fb.Inner.(interface {
			Synchronize(dev int, s core.Stream) error
		}); ok {
			return ss.Synchronize(h.gm.device, s)
		}
		return fb.SynchronizeDevice(h.gm.device)
	}
	for p := 0; p < world; p++ {
		ptr, _ := h.BufferPtr(p)
		if err := setWord(h, fb, s, ptr+uintptr(8*me), val(me, p, round)); err != nil {
			return err
		}
	}
	if err := sync(); err != nil {
		return err
	}
	own, _ := h.BufferPtr(me)
	for p := 0; p < world; p++ {
		got, err := getWord(h, fb, s, own+uintptr(8*p))
		if err != nil {
			return err
		}
		if want := val(p, me, round); got != want {
			return fmt.Errorf("rank %d's word in rank %d's block reads %#x, want %#x", p, me, got, want)
		}
	}
	return sync()
}

// rankStream is a stream of the rank's own where fb's backend has streams
// and signals on them (0 otherwise: the host backend), and its destroy:
// two ranks' waits on one stream would wait for each other in its order.
func rankStream(fb *faultbe.Backend, device int) (core.Stream, func(), error) {
	sb, ok := fb.Inner.(streamBackend)
	if !ok || !fb.Capabilities().StreamSignals {
		return 0, func() {}, nil
	}
	s, err := sb.NewStream(device)
	if err != nil {
		return 0, nil, err
	}
	return s, func() { sb.DestroyStream(device, s) }, nil
}

// setWord and getWord move one word between Go memory and addr (this
// rank's or a peer's block) as the backend copies, so that the test runs
// where device memory is not the CPU's: on CPU memory with atomics, else
// with the unwrapped backend's Copy on s (the fault counts stay the
// pause's). The Go word is pinned: the copy reads it through its address.
func setWord(h *Handle, fb *faultbe.Backend, s core.Stream, addr uintptr, v uint64) error {
	if !fb.Capabilities().StreamSignals {
		atomic.StoreUint64((*uint64)(unmanaged.Pointer(addr)), v)
		return nil
	}
	buf := []uint64{v}
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	return fb.Inner.Copy(h.gm.device, s, addr, uintptr(unsafe.Pointer(&buf[0])), 8)
}

func getWord(h *Handle, fb *faultbe.Backend, s core.Stream, addr uintptr) (uint64, error) {
	if !fb.Capabilities().StreamSignals {
		return atomic.LoadUint64((*uint64)(unmanaged.Pointer(addr))), nil
	}
	buf := []uint64{0}
	var pin runtime.Pinner
	pin.Pin(&buf[0])
	defer pin.Unpin()
	err := fb.Inner.Copy(h.gm.device, s, uintptr(unsafe.Pointer(&buf[0])), addr, 8)
	return buf[0], err
}
