package symm

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/libsymmem/libsymmem/core/internal/ranktest"
)

type rankResult = ranktest.Result

var (
	envInt  = ranktest.EnvInt
	sockDir = ranktest.SockDir
)

// TestHelperRank is one rank of a multi-process test (SYMMEM_SYMM_HELPER=1);
// it does nothing in a normal run.
func TestHelperRank(t *testing.T) {
	if os.Getenv("SYMMEM_SYMM_HELPER") != "1" {
		t.Skip("helper process for the multi-process tests")
	}
	rt, err := alloc.Default()
	e := &rankEnv{rt: rt, rank: envInt("SYMMEM_SYMM_RANK"), world: envInt("SYMMEM_SYMM_WORLD"),
		name: os.Getenv("SYMMEM_SYMM_NAME"), dir: os.Getenv("SYMMEM_SOCKET_DIR"),
		timeout: time.Duration(envInt("SYMMEM_SYMM_TIMEOUT_MS")) * time.Millisecond, arg: envInt("SYMMEM_SYMM_ARG")}
	if err == nil {
		if rt.Backend.Name() != "host" {
			err = fmt.Errorf("backend %q, these tests need SYMMEM_BACKEND=host", rt.Backend.Name())
		} else {
			err = runScenario(os.Getenv("SYMMEM_SYMM_SCENARIO"), e)
		}
	}
	ranktest.Report(e.rank, err)
}

// runProcs runs scenario sc with one process per rank.
func runProcs(t *testing.T, sc string, world int, timeout time.Duration, arg int) []rankResult {
	t.Helper()
	dir := sockDir(t)
	specs := make([]ranktest.Spec, world)
	for r := range specs {
		specs[r] = ranktest.Spec{Rank: r, Env: []string{"SYMMEM_SYMM_HELPER=1", "SYMMEM_BACKEND=host",
			"SYMMEM_SYMM_SCENARIO=" + sc, "SYMMEM_SYMM_NAME=" + sc, "SYMMEM_SOCKET_DIR=" + dir,
			fmt.Sprintf("SYMMEM_SYMM_RANK=%d", r), fmt.Sprintf("SYMMEM_SYMM_WORLD=%d", world),
			fmt.Sprintf("SYMMEM_SYMM_TIMEOUT_MS=%d", timeout.Milliseconds()), fmt.Sprintf("SYMMEM_SYMM_ARG=%d", arg)}}
	}
	return ranktest.Run(t, "TestHelperRank", specs)
}

func allOK(t *testing.T, res []rankResult) {
	t.Helper()
	for _, r := range res {
		if r.Code != 0 || r.Exit != 0 {
			t.Fatalf("rank %d: code %d exit %d: %s\n%s", r.Rank, r.Code, r.Exit, r.Msg, r.Out)
		}
	}
}

func allFail(t *testing.T, res []rankResult, code core.Code, contains ...string) {
	t.Helper()
	for _, r := range res {
		if core.Code(r.Code) != code {
			t.Fatalf("rank %d: code %d (%s), want %d: %s\n%s", r.Rank, r.Code, core.Code(r.Code), code, r.Msg, r.Out)
		}
		for _, s := range contains {
			if !strings.Contains(r.Msg, s) {
				t.Fatalf("rank %d: message %q lacks %q", r.Rank, r.Msg, s)
			}
		}
	}
}

// runInProcess runs scenario sc with one goroutine per rank, each with a
// runtime (and so a heap) of its own over the host backend.
func runInProcess(t *testing.T, sc string, world int, timeout time.Duration, arg int) []error {
	t.Helper()
	dir := sockDir(t)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		be, err := host.New()
		if err != nil {
			t.Fatal(err)
		}
		e := &rankEnv{rt: alloc.NewRuntime(be), rank: r, world: world, name: sc, dir: dir, timeout: timeout, arg: arg}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[e.rank] = runScenario(sc, e)
		}()
	}
	wg.Wait()
	return errs
}

func TestProcessesWriteBarrier(t *testing.T) {
	for _, world := range []int{2, 4, 8} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "write", world, 60*time.Second, 0))
		})
	}
}

// The same with the records through the sockets (SYMMEM_SHM_EXCHANGE=0),
// the path that every rendezvous took before the control page.
func TestProcessesWriteBarrierSockets(t *testing.T) {
	t.Setenv("SYMMEM_SHM_EXCHANGE", "0")
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "write", world, 60*time.Second, 0))
		})
	}
}

// The dissemination barrier (SYMMEM_BARRIER=dissemination, Note [Barrier at
// more ranks]) at world sizes that are and are not powers of two: the write
// scenario checks after each barrier that every rank's writes are there.
func TestProcessesWriteBarrierDissemination(t *testing.T) {
	t.Setenv("SYMMEM_BARRIER", "dissemination")
	for _, world := range []int{3, 4, 5, 8} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "write", world, 60*time.Second, 0))
		})
	}
	allOK(t, runProcs(t, "counts", 3, 30*time.Second, 0))
}

func TestBarrierRounds(t *testing.T) {
	defer func(v bool) { barrierDissemination = v }(barrierDissemination)
	for _, dis := range []bool{false, true} {
		barrierDissemination = dis
		for world := 2; world <= 9; world++ {
			// Simulate the rounds: what each rank has heard of (directly or
			// through the ranks it heard from in earlier rounds) must be
			// everyone by the end, and no (sender, receiver) pair may carry
			// two signals in one barrier.
			heard := make([]map[int]bool, world)
			steps := make([][][]int, world)
			froms := make([][][]int, world)
			for r := range heard {
				heard[r] = map[int]bool{r: true}
				h := &Handle{rank: r, world: world}
				steps[r], froms[r] = h.barrierRounds()
			}
			pairs := map[[2]int]int{}
			for k := range steps[0] {
				next := make([]map[int]bool, world)
				for r := range heard {
					next[r] = map[int]bool{}
					for q := range heard[r] {
						next[r][q] = true
					}
				}
				for r := 0; r < world; r++ {
					for _, d := range steps[r][k] {
						pairs[[2]int{r, d}]++
						for q := range heard[r] {
							next[d][q] = true
						}
					}
					for _, src := range froms[r][k] {
						found := false
						for _, d := range steps[src][k] {
							found = found || d == r
						}
						if !found {
							t.Fatalf("world %d dissemination %v: rank %d waits for %d in step %d, which does not signal it", world, dis, r, src, k)
						}
					}
				}
				heard = next
			}
			for r := range heard {
				if len(heard[r]) != world {
					t.Fatalf("world %d dissemination %v: rank %d heard of %d ranks", world, dis, r, len(heard[r]))
				}
			}
			for p, n := range pairs {
				if n > 1 {
					t.Fatalf("world %d dissemination %v: pair %v signalled %d times in one barrier", world, dis, p, n)
				}
			}
			if want := 1; dis && world > 2 {
				want = 0
				for d := 1; d < world; d *= 2 {
					want++
				}
				if len(steps[0]) != want {
					t.Fatalf("world %d: %d rounds, want %d", world, len(steps[0]), want)
				}
			} else if len(steps[0]) != want {
				t.Fatalf("world %d linear: %d steps", world, len(steps[0]))
			}
		}
	}
}

func TestProcessesPingPong(t *testing.T) {
	allOK(t, runProcs(t, "pingpong", 4, 60*time.Second, 0))
}

func TestProcessesSignalCounts(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "counts", world, 30*time.Second, 0))
		})
	}
}

func TestProcessesSubgroups(t *testing.T) {
	allOK(t, runProcs(t, "subgroup", 4, 60*time.Second, 0))
}

func TestProcessesMismatchedSizes(t *testing.T) {
	allFail(t, runProcs(t, "mismatch-size", 4, 30*time.Second, 0), core.ErrMismatch,
		"blocks of different sizes", "ranks 0, 1, 2: block of 65536 bytes", "rank 3: block of 131072 bytes")
}

func TestProcessesMismatchedSignalPadSizes(t *testing.T) {
	allFail(t, runProcs(t, "mismatch-pad", 3, 30*time.Second, 0), core.ErrMismatch,
		"signal pad sizes differ", "ranks 0, 1: 65536 bytes", "rank 2: 24 bytes")
}

func TestProcessesDivergedPlacement(t *testing.T) {
	allFail(t, runProcs(t, "diverged", 3, 30*time.Second, 0), core.ErrMismatch,
		"different heap offsets", "placement diverged", "ranks 0, 2: heap offset 0x0", "rank 1: heap offset 0x1000",
		"rank 0: 1 allocs, 0 frees", "rank 1: 2 allocs, 0 frees")
}

func TestProcessesBadPointer(t *testing.T) {
	allFail(t, runProcs(t, "bad-pointer", 3, 30*time.Second, 0), core.ErrInvalidPointer, "failed on rank 1")
}

// A rank that exits after creating the group: the others fail (ErrPeer
// naming it) within the timeout.
func TestProcessesRankExitsBeforeRendezvous(t *testing.T) {
	start := time.Now()
	res := runProcs(t, "exit-before", 4, 20*time.Second, 2)
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v", d)
	}
	for _, r := range res {
		if r.Rank == 2 {
			if r.Exit != 3 {
				t.Fatalf("rank 2 exit %d", r.Exit)
			}
			continue
		}
		if c := core.Code(r.Code); (c != core.ErrPeer && c != core.ErrTimeout) || !strings.Contains(r.Msg, "rank 2") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
}

func TestProcessesBadArguments(t *testing.T) {
	allOK(t, runProcs(t, "badargs", 2, 30*time.Second, 0))
}

func TestProcessesCallbackExchange(t *testing.T) {
	allOK(t, runProcs(t, "callback", 3, 30*time.Second, 0))
}

func TestProcessesNoLeaks(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 100
	}
	allOK(t, runProcs(t, "leak", 2, 60*time.Second, n))
}

// In-process runs of the same scenarios: the race detector sees every
// rank's goroutines.
func TestInProcess(t *testing.T) {
	for _, sc := range []string{"write", "pingpong", "counts", "subgroup", "badargs", "callback"} {
		t.Run(sc, func(t *testing.T) {
			for r, err := range runInProcess(t, sc, 4, 30*time.Second, 0) {
				if err != nil {
					t.Fatalf("rank %d: %v", r, err)
				}
			}
		})
	}
	t.Run("world1", func(t *testing.T) {
		if err := runInProcess(t, "write", 1, 5*time.Second, 0)[0]; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("diverged", func(t *testing.T) {
		for r, err := range runInProcess(t, "diverged", 2, 30*time.Second, 0) {
			if core.CodeOf(err) != core.ErrMismatch {
				t.Fatalf("rank %d: %v", r, err)
			}
		}
	})
}

func TestRecordRoundTrip(t *testing.T) {
	b := blockRecord{status: status{core.ErrMismatch, "m"}, blockSize: 1, requested: 2, offset: 3, heapOff: 4, segHeapOff: 5,
		segSize: 6, segID: 7, allocs: 8, frees: 9, padSize: 10, padsReady: true, held: []uint64{11, 12}}
	got, err := decodeBlock(b.encode(), 2)
	if err != nil || fmt.Sprint(got) != fmt.Sprint(b) {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := decodeBlock(b.encode(), 3); err == nil {
		t.Fatal("world mismatch not caught")
	}
	if _, err := decodeBlock(b.encode()[:20], 2); err == nil {
		t.Fatal("short record not caught")
	}
	if _, err := decodeBlock(encodeStatus(status{}), 2); err == nil {
		t.Fatal("wrong kind not caught")
	}
	m := memberRecord{pid: 1, backend: "host", hostname: "h", bootID: "b", device: 3, uuid: "u", overlap: true}
	gm, err := decodeMember(m.encode())
	if err != nil || gm != m {
		t.Fatalf("%+v %v", gm, err)
	}
}
