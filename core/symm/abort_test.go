package symm

import (
	"fmt"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/internal/faultbe"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/stretchr/testify/require"
)

// Note [Abort]: a rank whose peer never comes gets its waits back with an
// abort from another goroutine: a host barrier (host backend), the stream
// wait of a barrier (cuda: the device synchronisation behind it returns),
// a rendezvous waiting for the peer; every later call is ABORTED, and
// release and destroy work. Two ranks in this process, on the backend of
// the environment (the stand-in driver in the go-fakecuda suite).
func TestAbortReleasesStuckWaits(t *testing.T) {
	if fb := faultBackend(t); !fb.Capabilities().SharedDevice && fb.DeviceCount() < 2 {
		t.Skip("needs a device per rank (2)")
	}
	for _, what := range []string{"barrier", "rendezvous"} {
		t.Run(what, func(t *testing.T) { testAbort(t, what) })
	}
}

func testAbort(t *testing.T, what string) {
	done := make(chan struct{}) // rank 0 is through: rank 1 may leave
	errs := onTwoFaultRanks(t, "abort-"+what, 20*time.Second, nil, func(e *rankEnv, fb *faultbe.Backend, a *alloc.Allocator) error {
		// A stream per rank: two ranks' waits on one stream would
		// wait for each other in its order.
		s, dropStream, err := rankStream(fb, e.device)
		if err != nil {
			return err
		}
		defer dropStream()
		buf, g, err := join(e, a, 64<<10)
		if err != nil {
			return err
		}
		defer g.Destroy()
		h, err := g.Rendezvous(buf)
		if err != nil {
			return err
		}
		defer h.Release()
		if err := h.Barrier(0, s, 0); err != nil {
			return err
		}
		if e.rank == 1 { // the peer that never comes
			<-done
			return nil
		}
		defer close(done)
		return abortRank0(g, h, buf, what, s)
	})
	require.NoError(t, errs[0], "rank 0")
	require.NoError(t, errs[1], "rank 1")
}

func abortRank0(g *Group, h *Handle, buf uintptr, what string, s core.Stream) error {
	const after = 200 * time.Millisecond
	go func() {
		time.Sleep(after)
		g.Abort()
	}()
	start := time.Now()
	var werr error
	switch {
	case what == "rendezvous":
		var h2 *Handle
		h2, werr = g.Rendezvous(buf)
		if werr == nil {
			h2.Release()
		}
	case h.onStreams():
		// Enqueued at once; the device synchronisation waits for it.
		if err := h.Barrier(1, s, 0); err != nil {
			return fmt.Errorf("enqueueing the barrier: %v", err)
		}
		werr = h.gm.be.SynchronizeDevice(h.gm.device)
		if werr == nil {
			werr = core.Errorf(core.ErrAborted, "released")
		}
	default:
		werr = h.Barrier(1, 0, 0)
	}
	took := time.Since(start)
	if core.CodeOf(werr) != core.ErrAborted {
		return fmt.Errorf("%s: %v, want ABORTED", what, werr)
	}
	if took > after+2*time.Second {
		return fmt.Errorf("%s came back %v after the abort", what, took-after)
	}
	// Every later call: ABORTED.
	calls := map[string]func() error{
		"barrier":     func() error { return h.Barrier(0, s, 0) },
		"put_signal":  func() error { return h.PutSignal(1, 0, s, 0) },
		"wait_signal": func() error { return h.WaitSignal(1, 0, s, 0) },
		"all_reduce": func() error {
			return coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, Stream: s})
		},
		"rendezvous":  func() error { _, err := g.Rendezvous(buf); return err },
		"pause_group": func() error { return g.Pause("") },
		"set_pad":     func() error { return g.SetSignalPadSize(4096) },
	}
	for name, f := range calls {
		if err := f(); core.CodeOf(err) != core.ErrAborted {
			return fmt.Errorf("%s after the abort: %v, want ABORTED", name, err)
		}
	}
	if _, err := h.DeviceError(); err != nil {
		return fmt.Errorf("the device error flag after the abort: %v", err)
	}
	// What a kernel records when it sees this rank's abort word.
	if err := h.DeviceErrorText(core.DevFlag(core.DevCausePeerExited, h.gm.rank, 3)); core.CodeOf(err) != core.ErrAborted {
		return fmt.Errorf("the flag a kernel records on the abort word reads %v, want ABORTED", err)
	}
	if err := g.Abort(); err != nil {
		return fmt.Errorf("a second abort: %v", err)
	}
	if err := h.Release(); err != nil {
		return fmt.Errorf("release after the abort: %v", err)
	}
	return g.Destroy()
}
