package ipc

// Multi-process tests: the test binary re-executes itself as each rank
// (TestHelperRank, selected by SYMMEM_IPC_HELPER=1), and the rank prints one
// result line that the parent parses.

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core/internal/ranktest"
	"golang.org/x/sys/unix"
)

type (
	rankResult = ranktest.Result
	rankSpec   = ranktest.Spec
)

// runRanks starts one process per spec, each running scenario as its rank
// of group name, and waits for all of them.
func runRanks(t *testing.T, scenario, name string, world int, dir string, specs []rankSpec, extra ...string) []rankResult {
	t.Helper()
	for i := range specs {
		env := []string{
			"SYMMEM_IPC_HELPER=1",
			"SYMMEM_IPC_SCENARIO=" + scenario,
			"SYMMEM_IPC_NAME=" + name,
			"SYMMEM_IPC_RANK=" + strconv.Itoa(specs[i].Rank),
			"SYMMEM_IPC_WORLD=" + strconv.Itoa(world),
			"SYMMEM_SOCKET_DIR=" + dir,
		}
		specs[i].Env = append(append(env, extra...), specs[i].Env...)
	}
	return ranktest.Run(t, "TestHelperRank", specs)
}

func allRanks(world int) []rankSpec {
	s := make([]rankSpec, world)
	for i := range s {
		s[i].Rank = i
	}
	return s
}

var (
	report = ranktest.Report
	envInt = ranktest.EnvInt
)

// TestHelperRank is one rank of a multi-process test; it does nothing in a
// normal test run.
func TestHelperRank(t *testing.T) {
	if os.Getenv("SYMMEM_IPC_HELPER") != "1" {
		t.Skip("helper process for the multi-process tests")
	}
	rank, world := envInt("SYMMEM_IPC_RANK"), envInt("SYMMEM_IPC_WORLD")
	cfg := Config{Name: os.Getenv("SYMMEM_IPC_NAME"), Rank: rank, World: world}
	cfg.ControlPage = os.Getenv("SYMMEM_IPC_CONTROL_PAGE") == "1"
	if ms := envInt("SYMMEM_IPC_TIMEOUT_MS"); ms > 0 {
		cfg.Timeout = time.Duration(ms) * time.Millisecond
	}
	err := helperScenario(os.Getenv("SYMMEM_IPC_SCENARIO"), cfg)
	report(rank, err)
}

func helperScenario(scenario string, cfg Config) error {
	ch, err := Open(cfg)
	if err != nil {
		return err
	}
	defer ch.Close()
	rank, world := cfg.Rank, cfg.World
	switch scenario {
	case "join":
		return nil
	case "gather":
		for round := 0; round < 50; round++ {
			rec := []byte(strings.Repeat(fmt.Sprintf("r%d.%d;", rank, round), rank+round%3))
			got, err := ch.AllGather(0, rec)
			if err != nil {
				return err
			}
			for r := 0; r < world; r++ {
				want := strings.Repeat(fmt.Sprintf("r%d.%d;", r, round), r+round%3)
				if string(got[r]) != want {
					return fmt.Errorf("round %d: rank %d's record is %q, want %q", round, r, got[r], want)
				}
			}
		}
		return nil
	case "fds":
		return helperFDs(ch, rank, world)
	case "shm-gather", "shm-stall", "shm-exit-early":
		return helperShm(scenario, ch, cfg)
	case "stall":
		// The rank named by SYMMEM_IPC_EXIT joins, then arrives at the
		// all-gather long after the timeout.
		if rank == envInt("SYMMEM_IPC_EXIT") {
			time.Sleep(3 * cfg.Timeout)
		}
		_, err := ch.AllGather(0, []byte("x"))
		return err
	case "fd-starved":
		// Rank 0 has 2 descriptors left when 8 arrive from every rank: it
		// must say that it ran out, not blame the healthy senders.
		var fds []int
		for i := 0; i < 8; i++ {
			fd, err := newMemfd("x")
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			fds = append(fds, fd)
		}
		if rank == 0 {
			ents, _ := os.ReadDir("/proc/self/fd")
			lim := uint64(len(ents) + 2)
			if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
				return err
			}
			fds = nil
		}
		in, err := ch.AllGatherFDs(0, fds)
		for _, l := range in {
			closeAll(l)
		}
		return err
	case "exit-early":
		// The rank named by SYMMEM_IPC_EXIT leaves after joining.
		if rank == envInt("SYMMEM_IPC_EXIT") {
			os.Exit(3)
		}
		_, err := ch.AllGather(0, []byte("x"))
		return err
	}
	return fmt.Errorf("unknown scenario %q", scenario)
}

func newMemfd(content string) (int, error) {
	fd, err := unix.MemfdCreate("symmem-test", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	if _, err := unix.Pwrite(fd, []byte(content), 0); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func readFD(fd int) string {
	b := make([]byte, 256)
	n, _ := unix.Pread(fd, b, 0)
	if n < 0 {
		n = 0
	}
	return string(b[:n])
}

// helperFDs passes a memfd with data from every rank to every rank, then
// distinct memfds per destination.
func helperFDs(ch *Channel, rank, world int) error {
	fd, err := newMemfd(fmt.Sprintf("from rank %d", rank))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	in, err := ch.AllGatherFDs(0, []int{fd})
	if err != nil {
		return err
	}
	for src := 0; src < world; src++ {
		if src == rank {
			if in[src] != nil {
				return fmt.Errorf("got descriptors from ourselves")
			}
			continue
		}
		if len(in[src]) != 1 {
			return fmt.Errorf("from rank %d: %d descriptors, want 1", src, len(in[src]))
		}
		if got, want := readFD(in[src][0]), fmt.Sprintf("from rank %d", src); got != want {
			return fmt.Errorf("from rank %d: read %q, want %q", src, got, want)
		}
		// Writes through the received descriptor reach the sender's memory.
		closeAll(in[src])
	}
	out := make([][]int, world)
	defer func() {
		for _, l := range out {
			closeAll(l)
		}
	}()
	for dst := 0; dst < world; dst++ {
		if dst == rank {
			continue
		}
		for k := 0; k < 2; k++ {
			fd, err := newMemfd(fmt.Sprintf("%d->%d #%d", rank, dst, k))
			if err != nil {
				return err
			}
			out[dst] = append(out[dst], fd)
		}
	}
	in, err = ch.AllToAllFDs(0, out)
	if err != nil {
		return err
	}
	for src := 0; src < world; src++ {
		if src == rank {
			continue
		}
		if len(in[src]) != 2 {
			return fmt.Errorf("all-to-all from rank %d: %d descriptors, want 2", src, len(in[src]))
		}
		for k, fd := range in[src] {
			if got, want := readFD(fd), fmt.Sprintf("%d->%d #%d", src, rank, k); got != want {
				return fmt.Errorf("all-to-all from rank %d: read %q, want %q", src, got, want)
			}
		}
		closeAll(in[src])
	}
	// A final all-gather so that no rank closes while others still read.
	_, err = ch.AllGather(0, nil)
	return err
}
