package symm

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
)

// Note [Dead peers] (core/ipc): every wait for a peer whose process exits
// fails with PEER naming its rank, pid and exit status, long before the
// timeout; a stopped peer still gets the timeout.

// The waits, by the scenario's argument.
var deadPeerWaits = []string{"barrier", "wait_signal", "all_reduce", "pause_group", "killed"}

func TestProcessesDeadPeer(t *testing.T) {
	for arg, what := range deadPeerWaits {
		for _, world := range []int{2, 4} {
			t.Run(fmt.Sprint(what, "-", world), func(t *testing.T) {
				start := time.Now()
				res := runProcs(t, "dead-peer", world, 60*time.Second, arg)
				if d := time.Since(start); d > 30*time.Second {
					t.Fatalf("took %v (the timeout is 60 s)", d)
				}
				for _, r := range res {
					if r.Rank == world-1 {
						continue
					}
					if r.Code != 0 || r.Exit != 0 {
						t.Fatalf("rank %d: code %d exit %d: %s\n%s", r.Rank, r.Code, r.Exit, r.Msg, r.Out)
					}
				}
			})
		}
	}
}

// A stopped (SIGSTOP) peer has not exited: the barrier times out.
func TestProcessesStoppedPeer(t *testing.T) {
	start := time.Now()
	res := runProcs(t, "dead-peer", 2, 2*time.Second, len(deadPeerWaits))
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("took %v, less than the timeout", d)
	}
	if r := res[0]; r.Code != 0 || r.Exit != 0 {
		t.Fatalf("rank 0: code %d exit %d: %s\n%s", r.Code, r.Exit, r.Msg, r.Out)
	}
}

func init() { moreScenarios["dead-peer"] = scDeadPeer }

// scDeadPeer: the last rank leaves 150 ms after a barrier (exit status 3,
// SIGKILL for "killed", SIGSTOP past the list); the others wait for it as
// deadPeerWaits[arg] says and must fail with PEER within 100 ms of its exit
// (400 ms allowed here for a loaded machine).
func scDeadPeer(e *rankEnv, a *alloc.Allocator) error {
	const lead = 150 * time.Millisecond
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
	last := e.world - 1
	if err := h.Barrier(0, 0, 0); err != nil {
		return err
	}
	stopped := e.arg >= len(deadPeerWaits)
	if e.rank == last {
		time.Sleep(lead)
		switch {
		case stopped:
			syscall.Kill(os.Getpid(), syscall.SIGSTOP)
			for { // stopped until rank 0 kills it
				time.Sleep(time.Second)
			}
		case deadPeerWaits[e.arg] == "killed":
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		os.Exit(3)
	}
	start := time.Now()
	var werr error
	what := "barrier"
	if !stopped {
		what = deadPeerWaits[e.arg]
	}
	switch what {
	case "barrier", "killed":
		werr = h.Barrier(1, 0, 0)
	case "wait_signal":
		werr = h.WaitSignal(last, 2, 0, 0)
	case "all_reduce":
		werr = coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 64})
	case "pause_group":
		werr = g.Pause("")
	}
	waited := time.Since(start)
	pid := g.ch.Pids()[last]
	if stopped {
		syscall.Kill(int(pid), syscall.SIGKILL) // let the parent collect it
		if core.CodeOf(werr) != core.ErrTimeout {
			return fmt.Errorf("%s with a stopped peer: %v, want TIMEOUT", what, werr)
		}
		return nil
	}
	cause := "exited with status 3"
	if what == "killed" {
		cause = "was killed by signal 9"
	}
	want := fmt.Sprintf("rank %d (pid %d) %s", last, pid, cause)
	if core.CodeOf(werr) != core.ErrPeer || !strings.Contains(werr.Error(), want) {
		return fmt.Errorf("%s: got %v, want PEER with %q", what, werr, want)
	}
	if waited > lead+400*time.Millisecond {
		return fmt.Errorf("%s: noticed the exit after %v (the peer left %v after the wait began)", what, waited, lead)
	}
	return nil
}
