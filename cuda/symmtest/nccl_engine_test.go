package symmtest

// The engine between machines (Note [NCCL as the engine]) against the NCCL
// stand-in, through the real loader: every rank is a child process (this
// test binary again, TestChildNCCLRank) that loads the stand-in named by
// SYMMEM_LIBNCCL, makes its communicator with the stand-in's
// ncclCommInitRank, wraps it with cuda.OpenNCCLComm and runs one scenario,
// checking values against references computed here in Go.

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"github.com/libsymmem/libsymmem/cuda"
	"github.com/libsymmem/libsymmem/cuda/internal/nccltest"
)

const (
	envScenario = "SYMMEM_NCCL_TEST_SCENARIO"
	envRank     = "SYMMEM_NCCL_TEST_RANK"
	envWorld    = "SYMMEM_NCCL_TEST_WORLD"
	envJob      = "SYMMEM_NCCL_TEST_JOB"
	envMachine  = "SYMMEM_MACHINE_ID"
	envLargest  = "SYMMEM_NCCL_TEST_LARGEST" // the largest count the collectives scenario tries
)

// runRanks runs scenario on world child processes; machines[r] (when
// given) is rank r's SYMMEM_MACHINE_ID.
func runRanks(t *testing.T, lib, scenario string, world int, machines []string, env ...string) {
	t.Helper()
	job := fmt.Sprintf("%s-%d-%d", scenario, os.Getpid(), time.Now().UnixNano())
	tmp := t.TempDir()
	outs := make([]string, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		cmd := exec.Command(os.Args[0], "-test.run=^TestChildNCCLRank$", "-test.count=1", "-test.v")
		base := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, envMachine+"=") })
		cmd.Env = append(base, cuda.EnvNCCL+"="+lib, envScenario+"="+scenario, envRank+"="+strconv.Itoa(r),
			envWorld+"="+strconv.Itoa(world), envJob+"="+job, "TMPDIR="+tmp, "FAKENCCL_TIMEOUT_MS=20000")
		if machines != nil {
			cmd.Env = append(cmd.Env, envMachine+"="+machines[r])
		}
		cmd.Env = append(cmd.Env, env...)
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			out, err := cmd.CombinedOutput()
			outs[r], errs[r] = string(out), err
		}(r)
	}
	wg.Wait()
	for r := 0; r < world; r++ {
		if errs[r] != nil || !strings.Contains(outs[r], "--- PASS: TestChildNCCLRank") {
			t.Errorf("rank %d of %s failed (%v):\n%s", r, scenario, errs[r], outs[r])
		}
	}
}

func TestNCCLEngine(t *testing.T) {
	if os.Getenv(envScenario) != "" {
		t.Skip("running as a child")
	}
	cur := buildFakeNCCL(t, "libnccl_fake.so")
	old := buildFakeNCCL(t, "libnccl_fake_228.so", "-DFAKENCCL_NO_PEER_POINTER")
	t.Run("collectives, 3 ranks", func(t *testing.T) { runRanks(t, cur, "collectives", 3, nil) })
	t.Run("collectives, 2 machines of 2", func(t *testing.T) {
		runRanks(t, cur, "collectives", 4, []string{"a", "a", "b", "b"}, envLargest+"=1000")
	})
	t.Run("collectives on NCCL 2.28", func(t *testing.T) { runRanks(t, old, "collectives", 2, nil, envLargest+"=1000") })
	t.Run("split", func(t *testing.T) { runRanks(t, cur, "split", 4, nil) })
	t.Run("signals", func(t *testing.T) { runRanks(t, cur, "signals", 3, nil, "FAKENCCL_TIMEOUT_MS=2000") })
	t.Run("signals across machines", func(t *testing.T) {
		runRanks(t, cur, "signals", 3, []string{"a", "b", "c"}, "FAKENCCL_TIMEOUT_MS=2000")
	})
	t.Run("one-sided on NCCL 2.28", func(t *testing.T) { runRanks(t, old, "old", 2, nil) })
	t.Run("one-sided without host RMA", func(t *testing.T) { runRanks(t, cur, "norma", 2, nil, "FAKENCCL_NO_HOST_RMA=1") })
	t.Run("LSA teams, 2 machines of 2", func(t *testing.T) { runRanks(t, cur, "lsa", 4, []string{"a", "a", "b", "b"}) })
	t.Run("LSA teams, 3 machines of 1", func(t *testing.T) { runRanks(t, cur, "lsa", 3, []string{"a", "b", "c"}) })
	t.Run("LSA teams, one machine", func(t *testing.T) { runRanks(t, cur, "lsa", 3, nil) })
}

// rankEnv is a child's part of the job.
type rankEnv struct {
	rank, world int
	machines    []string // every rank's SYMMEM_MACHINE_ID as the parent set them (nil: unset)
	comm        *cuda.NCCLComm
}

// TestChildNCCLRank is one rank of TestNCCLEngine.
func TestChildNCCLRank(t *testing.T) {
	scenario := os.Getenv(envScenario)
	if scenario == "" {
		t.Skip("runs only as a child of TestNCCLEngine")
	}
	rank, _ := strconv.Atoi(os.Getenv(envRank))
	world, _ := strconv.Atoi(os.Getenv(envWorld))
	ptr, err := nccltest.InitRank(os.Getenv(cuda.EnvNCCL), os.Getenv(envJob), world, rank)
	require.NoError(t, err)
	comm, err := cuda.OpenNCCLComm(ptr)
	require.NoError(t, err)
	require.Equal(t, rank, comm.Rank())
	require.Equal(t, world, comm.World())
	e := &rankEnv{rank: rank, world: world, comm: comm}
	switch scenario {
	case "collectives":
		scenarioCollectives(t, e)
	case "split":
		scenarioSplit(t, e)
	case "signals":
		scenarioSignals(t, e)
	case "old":
		scenarioOld(t, e)
	case "lsa":
		scenarioLSA(t, e)
	case "norma":
		scenarioNoHostRMA(t, e)
	default:
		t.Fatalf("unknown scenario %q", scenario)
	}
	require.NoError(t, nccltest.Destroy(os.Getenv(cuda.EnvNCCL), ptr))
}

// hostBuf is memory outside Go's heap: a memfd mapped shared, as the host
// backend's memory is (the stand-in maps peers' windows through it).
type hostBuf struct {
	b []byte
}

func newHostBuf(t *testing.T, size int) *hostBuf {
	t.Helper()
	size = (max(size, 1) + 4095) &^ 4095
	fd, err := unix.MemfdCreate("nccl-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, int64(size)))
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	// The mapping keeps the memfd alive; the descriptor stays open so that
	// the stand-in can find it (/proc/self/fd) when a window is registered.
	t.Cleanup(func() { unix.Munmap(b); unix.Close(fd) })
	return &hostBuf{b: b}
}

func (h *hostBuf) addr() uintptr { return uintptr(unsafe.Pointer(&h.b[0])) }

// elem is the input element i of rank r for a test case, stored as dt
// stores it (the 16-bit types rounded from float32): its bits. Floats span
// a wide range of exponents, different on every rank, so that float32
// accumulation is inexact and its order and single rounding show in the
// results; int32 values overflow when summed.
func elem(dt core.DType, seed, r, i int) uint32 {
	if dt == core.Int32 {
		return uint32(r)*0x9E3779B9 + uint32(i)*0x7F4A7C15 + uint32(seed)*0x1234567
	}
	span := 60
	if dt == core.Float16 {
		span = 24 // 2^-12 .. 2^11: subnormal halves to sums far below 65504
	}
	m := float64((r*7919+i*31+seed*13)%2001-1000) / 1000
	v := float32(math.Ldexp(m, (r*5+i*3+seed)%span-span/2))
	switch dt {
	case core.Float16:
		return uint32(coll.FloatToF16(v))
	case core.BFloat16:
		return uint32(coll.FloatToBF16(v))
	}
	return math.Float32bits(v)
}

func widen(dt core.DType, b uint32) float32 {
	switch dt {
	case core.Float16:
		return coll.F16ToFloat(uint16(b))
	case core.BFloat16:
		return coll.BF16ToFloat(uint16(b))
	}
	return math.Float32frombits(b)
}

func narrow(dt core.DType, f float32) uint32 {
	switch dt {
	case core.Float16:
		return uint32(coll.FloatToF16(f))
	case core.BFloat16:
		return uint32(coll.FloatToBF16(f))
	}
	return math.Float32bits(f)
}

// reduceRef is op over ranks 0..world-1 in order of elem(dt, seed, r, i):
// float accumulation, rounded once; int32 wrapping.
func reduceRef(dt core.DType, op core.ReduceOp, seed, world, i int) uint32 {
	if dt == core.Int32 {
		acc := int32(elem(dt, seed, 0, i))
		for r := 1; r < world; r++ {
			v := int32(elem(dt, seed, r, i))
			switch op {
			case core.OpMax:
				acc = max(acc, v)
			case core.OpMin:
				acc = min(acc, v)
			default:
				acc += v
			}
		}
		return uint32(acc)
	}
	acc := widen(dt, elem(dt, seed, 0, i))
	for r := 1; r < world; r++ {
		acc = coll.ReduceFloat(op, acc, widen(dt, elem(dt, seed, r, i)))
	}
	return narrow(dt, acc)
}

func load(dt core.DType, b []byte, i int) uint32 {
	if dt.Size() == 2 {
		return uint32(*(*uint16)(unsafe.Pointer(&b[2*i])))
	}
	return *(*uint32)(unsafe.Pointer(&b[4*i]))
}

func store(dt core.DType, b []byte, i int, v uint32) {
	if dt.Size() == 2 {
		*(*uint16)(unsafe.Pointer(&b[2*i])) = uint16(v)
		return
	}
	*(*uint32)(unsafe.Pointer(&b[4*i])) = v
}

func poison(b []byte) {
	for i := range b {
		b[i] = 0xA5
	}
}

var (
	allDTypes = []core.DType{core.Float32, core.Float16, core.BFloat16, core.Int32}
	allOps    = []core.ReduceOp{core.OpSum, core.OpMax, core.OpMin}
	// Element counts per rank: tiny, odd, and past the stand-in's 256 KiB
	// piece for every type (70001 float32 = 273 KiB).
	testCounts = []int{1, 7, 1000, 70001}
)

// checkElems compares got[0:n] with want(i), reporting the first few
// differences.
func checkElems(t *testing.T, what string, dt core.DType, got []byte, n int, want func(i int) uint32) {
	t.Helper()
	bad := 0
	for i := 0; i < n; i++ {
		if g, w := load(dt, got, i), want(i); g != w {
			if bad < 3 {
				t.Errorf("%s: element %d is %#x, want %#x", what, i, g, w)
			}
			bad++
		}
	}
	if bad > 0 {
		t.Errorf("%s: %d of %d elements differ", what, bad, n)
	}
}

func scenarioCollectives(t *testing.T, e *rankEnv) {
	c, w, me := e.comm, e.world, e.rank
	seed := 0
	largest, err := strconv.Atoi(os.Getenv(envLargest))
	if err != nil {
		largest = math.MaxInt
	}
	for _, n := range testCounts {
		if n > largest {
			continue
		}
		for _, dt := range allDTypes {
			es := int(dt.Size())
			for _, inPlace := range []bool{false, true} {
				for _, op := range allOps {
					seed++
					what := fmt.Sprintf("all-reduce %s %v x %d, in place %v", op, dt, n, inPlace)
					send := newHostBuf(t, n*es)
					for i := 0; i < n; i++ {
						store(dt, send.b, i, elem(dt, seed, me, i))
					}
					recv := send
					if !inPlace {
						recv = newHostBuf(t, n*es)
						poison(recv.b)
					}
					require.NoError(t, c.AllReduce(0, send.addr(), recv.addr(), uintptr(n), dt, op), what)
					s := seed
					checkElems(t, what, dt, recv.b, n, func(i int) uint32 { return reduceRef(dt, op, s, w, i) })

					seed++
					what = fmt.Sprintf("reduce-scatter %s %v x %d per rank, in place %v", op, dt, n, inPlace)
					send = newHostBuf(t, w*n*es)
					for i := 0; i < w*n; i++ {
						store(dt, send.b, i, elem(dt, seed, me, i))
					}
					out := send.b[me*n*es:]
					recvAddr := send.addr() + uintptr(me*n*es)
					if !inPlace {
						rb := newHostBuf(t, n*es)
						poison(rb.b)
						out, recvAddr = rb.b, rb.addr()
					}
					require.NoError(t, c.ReduceScatter(0, send.addr(), recvAddr, uintptr(n), dt, op), what)
					s = seed
					checkElems(t, what, dt, out, n, func(i int) uint32 { return reduceRef(dt, op, s, w, me*n+i) })
					if inPlace {
						// The other slices of the send buffer are untouched.
						for r := 0; r < w; r++ {
							if r != me {
								checkElems(t, what+fmt.Sprintf(", slice %d kept", r), dt, send.b[r*n*es:], n,
									func(i int) uint32 { return elem(dt, s, me, r*n+i) })
							}
						}
					}
				}
				seed++
				what := fmt.Sprintf("all-gather %v x %d per rank, in place %v", dt, n, inPlace)
				recv := newHostBuf(t, w*n*es)
				poison(recv.b)
				sendAddr := recv.addr() + uintptr(me*n*es)
				for i := 0; i < n; i++ {
					store(dt, recv.b[me*n*es:], i, elem(dt, seed, me, i))
				}
				if !inPlace {
					sb := newHostBuf(t, n*es)
					for i := 0; i < n; i++ {
						store(dt, sb.b, i, elem(dt, seed, me, i))
					}
					sendAddr = sb.addr()
				}
				require.NoError(t, c.AllGatherTyped(0, sendAddr, recv.addr(), uintptr(n), dt), what)
				s := seed
				checkElems(t, what, dt, recv.b, w*n, func(i int) uint32 { return elem(dt, s, i/n, i%n) })
			}
		}
	}

	// Bad input is refused before NCCL is called: it fails the same way on
	// every rank, so the ranks stay in step.
	b := newHostBuf(t, 64)
	err = c.AllReduce(0, b.addr(), b.addr(), 4, core.DType(9), core.OpSum)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)
	err = c.AllReduce(0, b.addr(), b.addr(), 4, core.Float32, core.ReduceOp(7))
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "no NCCL equivalent")
	err = c.ReduceScatter(0, 0, b.addr(), 4, core.Float32, core.OpSum)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)

	// Ranks disagreeing on the count: NCCL's own error, with its words.
	err = c.AllReduce(0, b.addr(), b.addr(), uintptr(4+me), core.Float32, core.OpSum)
	require.Error(t, err)
	assert.Equal(t, core.ErrInvalidState, core.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "ncclAllReduce")
	assert.Contains(t, err.Error(), "invalid usage")

	// The communicator still works after the refusals.
	one := newHostBuf(t, 4)
	store(core.Int32, one.b, 0, uint32(me+1))
	require.NoError(t, c.AllReduce(0, one.addr(), one.addr(), 1, core.Int32, core.OpSum))
	assert.Equal(t, uint32(w*(w+1)/2), load(core.Int32, one.b, 0))
}

// splitNCCL is Split with the child as what it is, a *cuda.NCCLComm (nil
// where the rank joins none).
func splitNCCL(c *cuda.NCCLComm, color, key int) (*cuda.NCCLComm, error) {
	child, err := c.Split(color, key)
	if child == nil {
		return nil, err
	}
	return child.(*cuda.NCCLComm), err
}

func scenarioSplit(t *testing.T, e *rankEnv) {
	c, me := e.comm, e.rank
	// Colors by parity, keys reversing the order: color 0 is (2, 0).
	child, err := splitNCCL(c, me%2, -me)
	require.NoError(t, err)
	require.NotNil(t, child)
	assert.Equal(t, 2, child.World())
	wantRank := map[int]int{0: 1, 2: 0, 1: 1, 3: 0}[me]
	assert.Equal(t, wantRank, child.Rank())
	assert.Equal(t, c.Device(), child.Device())
	b := newHostBuf(t, 8)
	store(core.Int32, b.b, 0, uint32(me+1))
	store(core.Int32, b.b, 1, uint32(100*(me+1)))
	require.NoError(t, child.AllReduce(0, b.addr(), b.addr(), 2, core.Int32, core.OpSum))
	pair := map[int]int{0: 1 + 3, 2: 1 + 3, 1: 2 + 4, 3: 2 + 4}[me]
	assert.Equal(t, uint32(pair), load(core.Int32, b.b, 0), "sum over the child of color %d", me%2)
	assert.Equal(t, uint32(100*pair), load(core.Int32, b.b, 1))
	// All-gather in the child's order (by key): rank 0 of the child first.
	g := newHostBuf(t, 8)
	mine := newHostBuf(t, 4)
	store(core.Int32, mine.b, 0, uint32(me))
	require.NoError(t, child.AllGatherTyped(0, mine.addr(), g.addr(), 1, core.Int32))
	order := map[int][]uint32{0: {2, 0}, 1: {3, 1}}[me%2]
	assert.Equal(t, order, []uint32{load(core.Int32, g.b, 0), load(core.Int32, g.b, 1)})

	// NCCL_SPLIT_NOCOLOR: rank 3 joins nothing; the others form one.
	color := 0
	if me == 3 {
		color = cuda.NCCLSplitNoColor
	}
	second, err := splitNCCL(c, color, 0)
	require.NoError(t, err)
	if me == 3 {
		assert.Nil(t, second)
	} else {
		require.NotNil(t, second)
		assert.Equal(t, 3, second.World())
		assert.Equal(t, me, second.Rank())
		require.NoError(t, second.Close())
	}
	_, err = c.Split(-5, 0)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)

	// Close destroys the child once; a destroyed child refuses calls.
	require.NoError(t, child.Close())
	require.NoError(t, child.Close())
	err = child.AllReduce(0, b.addr(), b.addr(), 1, core.Int32, core.OpSum)
	assert.Equal(t, core.ErrInvalidState, core.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "destroyed")
	// The caller's communicator is never destroyed by Close.
	require.NoError(t, c.Close())
	store(core.Int32, b.b, 0, 1)
	require.NoError(t, c.AllReduce(0, b.addr(), b.addr(), 1, core.Int32, core.OpSum))
	assert.Equal(t, uint32(4), load(core.Int32, b.b, 0))
}

func scenarioSignals(t *testing.T, e *rankEnv) {
	c, w, me := e.comm, e.world, e.rank
	ok, version := c.OneSided()
	require.True(t, ok)
	assert.Equal(t, "2.29.0", version)
	assert.Equal(t, 1, c.SignalSlots())
	next, prev := (me+1)%w, (me+w-1)%w

	// A ring of signals: two to the next rank, two awaited from the previous.
	require.NoError(t, c.Signal(0, next, 0))
	require.NoError(t, c.Signal(0, next, 0))
	require.NoError(t, c.WaitSignal(0, prev, 0, 2))
	require.NoError(t, c.WaitSignal(0, prev, 0, 0))

	// A barrier: everyone signals everyone, then waits for everyone.
	for round := 0; round < 3; round++ {
		for p := 0; p < w; p++ {
			if p != me {
				require.NoError(t, c.Signal(0, p, 0))
			}
		}
		for p := 0; p < w; p++ {
			if p != me {
				require.NoError(t, c.WaitSignal(0, p, 0, 1), "round %d", round)
			}
		}
	}

	// Put with a signal into the next rank's window: the data is there
	// when the signal is.
	const size = 64 << 10
	win := newHostBuf(t, size)
	poison(win.b)
	src := newHostBuf(t, size)
	wh, err := c.RegisterWindow(win.addr(), size)
	require.NoError(t, err)
	sh, err := c.RegisterWindow(src.addr(), size)
	require.NoError(t, err)
	const n = 1000
	for i := 0; i < n; i++ {
		store(core.Int32, src.b, i, uint32(me*1_000_000+i))
	}
	off := uintptr(4096 * (me + 1))
	require.NoError(t, c.PutSignal(0, src.addr(), n, core.Int32, next, wh, off, 0))
	require.NoError(t, c.WaitSignal(0, prev, 0, 1))
	checkElems(t, "put from the previous rank", core.Int32, win.b[4096*(prev+1):], n,
		func(i int) uint32 { return uint32(prev*1_000_000 + i) })
	// A source outside every window is refused, as NCCL refuses it.
	outside := newHostBuf(t, 4096)
	err = c.PutSignal(0, outside.addr(), 4, core.Int32, next, wh, 0, 0)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "not inside a window")

	// Signal slots other than 0 and peers out of range are refused here.
	err = c.Signal(0, next, 1)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)
	assert.Contains(t, err.Error(), "signal slot 1")
	err = c.WaitSignal(0, w, 0, 1)
	assert.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%v", err)

	// A signal that never comes: a bounded wait, and NCCL's words for it.
	start := time.Now()
	err = c.WaitSignal(0, prev, 0, 1)
	require.Error(t, err)
	assert.Less(t, time.Since(start), 30*time.Second)
	assert.Contains(t, err.Error(), "ncclWaitSignal(peer")
	assert.Contains(t, err.Error(), fmt.Sprintf("for 1 signal(s) from rank %d", prev))

	// The ranks leave in step (the timed-out wait above is local).
	one := newHostBuf(t, 4)
	require.NoError(t, c.AllReduce(0, one.addr(), one.addr(), 1, core.Int32, core.OpSum))
	require.NoError(t, c.DeregisterWindow(wh))
	require.NoError(t, c.DeregisterWindow(sh))
}

func scenarioOld(t *testing.T, e *rankEnv) {
	c := e.comm
	ok, version := c.OneSided()
	assert.False(t, ok)
	assert.Equal(t, "2.28.9", version)
	for name, err := range map[string]error{
		"Signal":     c.Signal(0, 0, 0),
		"WaitSignal": c.WaitSignal(0, 0, 0, 1),
		"PutSignal":  c.PutSignal(0, 1, 1, core.Int32, 0, 1, 0, 0),
	} {
		require.Error(t, err, name)
		assert.Equal(t, core.ErrUnavailable, core.CodeOf(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), "2.28.9", name)
		assert.Contains(t, err.Error(), "NCCL 2.29 or newer", name)
	}
	peers, ok, err := c.LSAPeers()
	require.NoError(t, err)
	assert.False(t, ok, "NCCL 2.28's stand-in cannot say which peers it reaches")
	assert.Nil(t, peers)
	// The collectives and splits do not need 2.29.
	child, err := splitNCCL(c, 0, 0)
	require.NoError(t, err)
	b := newHostBuf(t, 4)
	store(core.Float32, b.b, 0, math.Float32bits(1.5))
	require.NoError(t, child.AllReduce(0, b.addr(), b.addr(), 1, core.Float32, core.OpSum))
	assert.Equal(t, float32(3), math.Float32frombits(load(core.Float32, b.b, 0)))
	require.NoError(t, child.Close())
}

// NCCL 2.29 on a communicator without host RMA support refuses the
// one-sided calls: UNAVAILABLE, so that the caller falls back.
func scenarioNoHostRMA(t *testing.T, e *rankEnv) {
	c := e.comm
	ok, _ := c.OneSided()
	require.True(t, ok, "the library has the API; this communicator cannot use it")
	for name, err := range map[string]error{
		"Signal":     c.Signal(0, 1-e.rank, 0),
		"WaitSignal": c.WaitSignal(0, 1-e.rank, 0, 1),
	} {
		require.Error(t, err, name)
		assert.Equal(t, core.ErrUnavailable, core.CodeOf(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), "host RMA support", name)
		assert.Contains(t, err.Error(), "invalid argument", name)
	}
}

func scenarioLSA(t *testing.T, e *rankEnv) {
	c, w, me := e.comm, e.world, e.rank
	machine := os.Getenv(envMachine)
	machines := map[int]string{}
	// Every rank's machine, through the communicator (as a group learns it).
	rec := newHostBuf(t, 16*w)
	mine := newHostBuf(t, 16)
	copy(mine.b, machine)
	require.NoError(t, c.AllGather(0, mine.addr(), rec.addr(), 16))
	for r := 0; r < w; r++ {
		machines[r] = strings.TrimRight(string(rec.b[16*r:16*r+16]), "\x00")
	}
	var want []int
	for r := 0; r < w; r++ {
		if machines[r] == machine {
			want = append(want, r)
		}
	}
	peers, ok, err := c.LSAPeers()
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, want, peers, "rank %d on machine %q", me, machine)

	// NCCL's peer pointers: the peer's bytes on this machine, NULL across.
	const size = 8192
	buf := newHostBuf(t, size)
	for i := 0; i < 16; i++ {
		store(core.Int32, buf.b, i, uint32(me*100+i))
	}
	win, err := c.RegisterWindow(buf.addr(), size)
	require.NoError(t, err)
	for p := 0; p < w; p++ {
		ptr, ok, err := c.PeerPointer(win, 4, p)
		require.NoError(t, err)
		require.True(t, ok)
		if machines[p] != machine {
			assert.Zero(t, ptr, "rank %d is on machine %q, rank %d on %q", p, machines[p], me, machine)
			continue
		}
		require.NotZero(t, ptr, "peer %d on this machine", p)
		assert.Equal(t, uint32(p*100+1), *(*uint32)(unmanaged.Pointer(ptr)), "peer %d's element 1 through NCCL's pointer", p)
	}
	// Collectives cross machines all the same.
	one := newHostBuf(t, 4)
	store(core.Int32, one.b, 0, 1)
	require.NoError(t, c.AllReduce(0, one.addr(), one.addr(), 1, core.Int32, core.OpSum))
	assert.Equal(t, uint32(w), load(core.Int32, one.b, 0))
	require.NoError(t, c.DeregisterWindow(win))
}
