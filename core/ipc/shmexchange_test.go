package ipc

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// shmRecord is rank r's record of round i: lengths vary per rank and round,
// and every 7th round rank (i % world) sends one longer than a slot, which
// makes every rank take the sockets for that round.
func shmRecord(r, i, world int) []byte {
	n := (r*37 + i*11) % 300
	if i%7 == 3 && r == i%world {
		n = shmSlotSize(world) + 100
	}
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(r*31 + i*7 + k)
	}
	return b
}

func helperShm(scenario string, ch *Channel, cfg Config) error {
	rank, world := cfg.Rank, cfg.World
	x, err := NewShmExchange(ch)
	if err != nil {
		return err
	}
	defer x.Close()
	switch scenario {
	case "shm-gather":
		// Odd rounds gather into buffers kept from round to round
		// (AllGatherInto), which a page round hands back filled.
		into := make([][]byte, world)
		for i := 0; i < 300; i++ {
			var got [][]byte
			var err error
			if i%2 == 0 {
				got, err = x.AllGather(0, shmRecord(rank, i, world))
			} else {
				got, err = x.AllGatherInto(0, shmRecord(rank, i, world), into)
				if long := i%7 == 3; err == nil && long == (&got[0] == &into[0]) {
					return fmt.Errorf("round %d (a long record: %v): the result is into: %v", i, long, !long)
				}
			}
			if err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
			for r := 0; r < world; r++ {
				if want := shmRecord(r, i, world); !bytes.Equal(got[r], want) {
					return fmt.Errorf("round %d: rank %d's record has %d bytes %x..., want %d bytes", i, r, len(got[r]), got[r][:min(8, len(got[r]))], len(want))
				}
			}
			if i%50 == 0 { // the sockets still work between page rounds
				if _, err := ch.AllGather(0, []byte{byte(rank)}); err != nil {
					return err
				}
			}
		}
		return nil
	case "shm-stall":
		// The rank named by SYMMEM_IPC_EXIT arrives long after the timeout.
		if _, err := x.AllGather(0, []byte("warm")); err != nil {
			return err
		}
		if rank == envInt("SYMMEM_IPC_EXIT") {
			time.Sleep(3 * cfg.Timeout)
		}
		_, err := x.AllGather(0, []byte("x"))
		return err
	case "shm-exit-early":
		if _, err := x.AllGather(0, []byte("warm")); err != nil {
			return err
		}
		if rank == envInt("SYMMEM_IPC_EXIT") {
			os.Exit(3)
		}
		_, err := x.AllGather(0, []byte("x"))
		return err
	}
	return fmt.Errorf("unknown scenario %q", scenario)
}

// The page passed in an exchange of its own, and with the welcome
// (Config.ControlPage, what groups use).
func TestShmExchangeProcesses(t *testing.T) {
	for _, welcome := range []string{"0", "1"} {
		for _, world := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("welcome%s/%d", welcome, world), func(t *testing.T) {
				res := runRanks(t, "shm-gather", "shmgather", world, sockDir(t), allRanks(world), "SYMMEM_IPC_CONTROL_PAGE="+welcome)
				checkAllOK(t, res)
			})
		}
	}
}

// Spinning off: every wait sleeps on the futex, which must still wake.
func TestShmExchangeFutexOnly(t *testing.T) {
	res := runRanks(t, "shm-gather", "shmfutex", 4, sockDir(t), allRanks(4), "SYMMEM_SHM_SPIN_US=0")
	checkAllOK(t, res)
}

// A rank that never arrives: every rank fails with ErrTimeout naming it,
// the late one included (it finds the verdict in the page).
func TestShmExchangeTimeout(t *testing.T) {
	res := runRanks(t, "shm-stall", "shmstall", 4, sockDir(t), allRanks(4), "SYMMEM_IPC_TIMEOUT_MS=600", "SYMMEM_IPC_EXIT=2")
	for _, r := range res {
		if core.Code(r.Code) != core.ErrTimeout || !strings.Contains(r.Msg, "rank(s) 2 never arrived") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
}

// A rank that exits: the others fail with ErrPeer naming it, long before
// the timeout.
func TestShmExchangeDeadPeer(t *testing.T) {
	for _, exit := range []int{0, 3} {
		t.Run(fmt.Sprint("rank", exit), func(t *testing.T) {
			start := time.Now()
			res := runRanks(t, "shm-exit-early", "shmexit", 4, sockDir(t), allRanks(4), "SYMMEM_IPC_TIMEOUT_MS=60000", fmt.Sprintf("SYMMEM_IPC_EXIT=%d", exit), "SYMMEM_IPC_CONTROL_PAGE=1")
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("took %v: the dead rank was not noticed", d)
			}
			for _, r := range res {
				if r.Rank == exit {
					if r.Exit != 3 {
						t.Fatalf("rank %d exit %d\n%s", r.Rank, r.Exit, r.Out)
					}
					continue
				}
				want := fmt.Sprintf("rank %d (pid", exit)
				if core.Code(r.Code) != core.ErrPeer || !strings.Contains(r.Msg, want) {
					t.Fatalf("rank %d: code %d %q, want ErrPeer naming %q\n%s", r.Rank, r.Code, r.Msg, want, r.Out)
				}
			}
		})
	}
}

// threeShmExchanges opens three ranks in this process (threads as ranks)
// with control pages, and their exchanges; the caller closes the channels.
func threeShmExchanges(t *testing.T, name string) ([]*ShmExchange, []*Channel) {
	t.Helper()
	dir := sockDir(t)
	cs := cfgs(name, dir, 3, 5*time.Second)
	for i := range cs {
		cs[i].ControlPage = true
	}
	chs, errs := openAll(t, cs)
	for r, err := range errs {
		if err != nil {
			closeChans(chs)
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	xs := make([]*ShmExchange, 3)
	errs = parallel(3, func(r int) (err error) { xs[r], err = NewShmExchange(chs[r]); return })
	for _, err := range errs {
		if err != nil {
			closeChans(chs)
			t.Fatal(err)
		}
	}
	return xs, chs
}

// In one process (threads as ranks): records, a closed exchange, world 1.
func TestShmExchangeInProcess(t *testing.T) {
	xs, chs := threeShmExchanges(t, "shmin")
	defer closeChans(chs)
	errs := parallel(3, func(r int) error {
		for i := 0; i < 100; i++ {
			got, err := xs[r].AllGather(0, shmRecord(r, i, 3))
			if err != nil {
				return err
			}
			for q := 0; q < 3; q++ {
				if !bytes.Equal(got[q], shmRecord(q, i, 3)) {
					return fmt.Errorf("round %d: rank %d's record differs", i, q)
				}
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Rank 0 waits for a round that the others never join; Cancel from
	// another goroutine ends it at once, and the others then learn that
	// rank 0 left.
	done := make(chan error, 1)
	start := time.Now()
	go func() { _, err := xs[0].AllGather(time.Minute, []byte("alone")); done <- err }()
	time.Sleep(100 * time.Millisecond)
	xs[0].Cancel()
	select {
	case err := <-done:
		wantCode(t, err, core.ErrInvalidState, "left the group")
	case <-time.After(5 * time.Second):
		t.Fatal("Cancel did not end the all-gather")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %v", d)
	}
	_, err := xs[1].AllGather(0, nil)
	wantCode(t, err, core.ErrPeer, "rank 0 (pid")
	xs[2].Close()
	_, err = xs[2].AllGather(0, nil)
	wantCode(t, err, core.ErrInvalidState, "closed")
	for _, x := range xs {
		x.Close()
	}

	solo, err := Open(Config{Name: "shmsolo", World: 1, Dir: sockDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer solo.Close()
	x, err := NewShmExchange(solo)
	if err != nil {
		t.Fatal(err)
	}
	got, err := x.AllGather(0, []byte("only"))
	if err != nil || len(got) != 1 || string(got[0]) != "only" {
		t.Fatalf("%q %v", got, err)
	}
}

// A round's records reach every rank that took part in it, even one that
// reads them after its peers have closed the page (Close writes a verdict
// naming the closing rank): a group whose ranks all fail on what a round
// gathered (the member agreement's mismatches) closes right after it, and
// the slowest rank must report that failure too, not its peers' leaving.
// Rank 0 waits asleep in the round; ranks 1 and 2 complete it and close
// at once, so that the first to finish closes while the other may still be
// between its checks in the round (a window of a few instructions: the
// test finds it in about one run of 100 where the verdict is read after
// arrival, under load). Only rank 0's next round learns that they left.
func TestShmExchangeRoundOutlivesClose(t *testing.T) {
	xs, chs := threeShmExchanges(t, "shmlast")
	defer closeChans(chs)
	defer func() {
		for _, x := range xs {
			x.Close()
		}
	}()
	type result struct {
		got [][]byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := xs[0].AllGather(0, shmRecord(0, 0, 3))
		done <- result{got, err}
	}()
	time.Sleep(50 * time.Millisecond) // past the spin: rank 0 sleeps on the futex
	errs := parallel(2, func(i int) error {
		r := i + 1
		if _, err := xs[r].AllGather(0, shmRecord(r, 0, 3)); err != nil {
			return err
		}
		return xs[r].Close()
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	res := <-done
	if res.err != nil {
		t.Fatalf("rank 0 lost the round its peers completed before closing: %v", res.err)
	}
	for q := 0; q < 3; q++ {
		if !bytes.Equal(res.got[q], shmRecord(q, 0, 3)) {
			t.Fatalf("rank %d's record differs", q)
		}
	}
	_, err := xs[0].AllGather(0, nil)
	wantCode(t, err, core.ErrPeer, "left the group (destroyed or closed)")
}

// TestSpinCountsTheGroupsCPUs: the spin decision counts the CPUs of every
// rank's affinity mask: two processes pinned to two CPUs have two, pinned
// to one CPU they have one.
func TestSpinCountsTheGroupsCPUs(t *testing.T) {
	var mine unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &mine))
	var cpus []int
	for c := 0; c < 1024 && len(cpus) < 2; c++ {
		if mine.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	if len(cpus) < 2 {
		t.Skip("needs 2 CPUs")
	}
	done := make(chan error)
	go func() {
		// This thread is pinned and dies with the goroutine (no unlock).
		runtime.LockOSThread()
		done <- func() error {
			var one, other unix.CPUSet
			one.Set(cpus[0])
			other.Set(cpus[1])
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			child := exec.Command("sleep", "30")
			if err := child.Start(); err != nil {
				return err
			}
			defer func() { child.Process.Kill(); child.Wait() }()
			pid := child.Process.Pid
			if err := unix.SchedSetaffinity(pid, &other); err != nil {
				return err
			}
			if n := groupCPUs([]int32{int32(pid)}); n != 2 {
				return fmt.Errorf("pinned to CPUs %d and %d: counted %d CPUs, want 2", cpus[0], cpus[1], n)
			}
			if err := unix.SchedSetaffinity(pid, &one); err != nil {
				return err
			}
			if n := groupCPUs([]int32{int32(pid)}); n != 1 {
				return fmt.Errorf("both pinned to CPU %d: counted %d CPUs, want 1", cpus[0], n)
			}
			if d := shmSpin(2, []int32{int32(pid)}); d != 0 {
				return fmt.Errorf("two ranks on one CPU spin for %v, want 0", d)
			}
			return nil
		}()
	}()
	require.NoError(t, <-done)
}
