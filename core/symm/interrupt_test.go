package symm

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Note [Interrupts] (core): with an interrupt descriptor set, a byte on it
// ends the host waits in progress within about 50 ms with INTERRUPTED: a
// barrier whose peer never comes (the group is then aborted) and a group
// creation whose peer never comes (nothing is left of it); a byte that
// comes while nothing waits interrupts nothing later.
func TestInterruptEndsHostWaits(t *testing.T) {
	if faultBackend(t).Capabilities().StreamSignals {
		t.Skip("barriers wait on streams here, not on the host")
	}
	var p [2]int
	require.NoError(t, unix.Pipe2(p[:], unix.O_NONBLOCK|unix.O_CLOEXEC))
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	require.NoError(t, core.SetInterruptFD(p[0]))
	defer core.SetInterruptFD(-1)
	signal := func(after time.Duration) time.Time {
		time.Sleep(after)
		unix.Write(p[1], []byte{2})
		return time.Now()
	}
	// A byte while nothing waits: consumed, harmless.
	signal(0)
	time.Sleep(50 * time.Millisecond)

	dir := sockDir(t)
	t.Run("join", func(t *testing.T) {
		e := &rankEnv{rt: alloc.NewRuntime(faultBackend(t)), rank: 1, world: 2, name: "intr-join", dir: dir, timeout: 20 * time.Second}
		sent := make(chan time.Time, 1)
		go func() { sent <- signal(300 * time.Millisecond) }()
		_, err := New(e.opts(e.name, e.rank, e.world))
		require.Equal(t, core.ErrInterrupted, core.CodeOf(err), "%v", err)
		require.Less(t, time.Since(<-sent), 300*time.Millisecond)
	})
	t.Run("barrier", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		done := make(chan struct{})
		for r := 0; r < 2; r++ {
			e := &rankEnv{rt: alloc.NewRuntime(faultBackend(t)), rank: r, world: 2, name: "intr-barrier", dir: dir, timeout: 20 * time.Second}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[e.rank] = func() error {
					a, err := e.rt.Allocator(0)
					if err != nil {
						return err
					}
					h, fin, err := joinRendezvous(e, a, 64<<10)
					if err != nil {
						return err
					}
					defer fin()
					if err := h.Barrier(0, 0, 0); err != nil {
						return err
					}
					if e.rank == 1 {
						<-done
						return nil
					}
					defer close(done)
					sent := make(chan time.Time, 1)
					go func() { sent <- signal(300 * time.Millisecond) }()
					err = h.Barrier(1, 0, 0)
					if core.CodeOf(err) != core.ErrInterrupted {
						return fmt.Errorf("barrier: %v, want INTERRUPTED", err)
					}
					if late := time.Since(<-sent); late > 300*time.Millisecond {
						return fmt.Errorf("the barrier returned %v after the signal", late)
					}
					if err := h.Barrier(0, 0, 0); core.CodeOf(err) != core.ErrAborted {
						return fmt.Errorf("barrier after the interrupt: %v, want ABORTED", err)
					}
					return nil
				}()
			}()
		}
		wg.Wait()
		require.NoError(t, errs[0], "rank 0")
		require.NoError(t, errs[1], "rank 1")
	})
}
