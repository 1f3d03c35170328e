package symm

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Multi-process tests of the collectives on the host backend: every rank
// computes the expected result from the inputs that every rank generates
// (inputOf), in rank order as Note [Collectives] promises, and compares bit
// for bit.

func TestProcessesCollectives(t *testing.T) {
	for _, world := range []int{2, 4, 8} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "coll", world, 120*time.Second, 0))
		})
	}
	// Every two-shot call pulls (Note [Two-shot pulls]): at the sizes of
	// the scenario two-shot otherwise pushes.
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprint(world, "-pull"), func(t *testing.T) {
			allOK(t, runProcs(t, "coll", world, 120*time.Second, 1))
		})
	}
}

func TestProcessesCollectivesBadInput(t *testing.T) {
	allOK(t, runProcs(t, "coll-bad", 2, 60*time.Second, 0))
}

// Note [Collective agreement]: every kind of difference fails every rank
// with ErrMismatch naming every rank's call, leaves the output untouched,
// and leaves the group usable (a matching call then succeeds).
func TestProcessesCollectivesMismatch(t *testing.T) {
	for _, world := range []int{2, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "coll-mismatch", world, 60*time.Second, 0))
		})
	}
}

// mismatchCases: what the last rank passes instead of the others' call
// (all_reduce float32 sum, 256 elements, one-shot, into local memory),
// and what the message must say of it.
var mismatchCases = []struct {
	what   string
	mod    func(a *coll.Args)
	theirs string
}{
	{"count", func(a *coll.Args) { a.Count = 128 }, "all_reduce(float32, sum, count 128, one_shot)"},
	{"dtype", func(a *coll.Args) { a.DType = core.Int32 }, "all_reduce(int32, sum, count 256, one_shot)"},
	{"op", func(a *coll.Args) { a.Op = core.OpMax }, "all_reduce(float32, max, count 256, one_shot)"},
	{"kind", func(a *coll.Args) { a.Kind = core.AllGather }, "all_gather(float32, count 256)"},
	{"algo", func(a *coll.Args) { a.Algo = core.AlgoTwoShot; a.Out = 0 }, "all_reduce(float32, sum, count 256, two_shot)"},
}

func scCollMismatch(e *rankEnv, a *alloc.Allocator) error {
	const size = 64 << 10
	h, done, err := joinRendezvous(e, a, size)
	if err != nil {
		return err
	}
	defer done()
	local, err := a.Alloc(size, 0)
	if err != nil {
		return err
	}
	last := e.world - 1
	others := "ranks " + core.RanksText(func() []int {
		r := make([]int, last)
		for i := range r {
			r[i] = i
		}
		return r
	}())
	if last == 1 {
		others = "rank 0"
	}
	for _, m := range mismatchCases {
		args := coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: core.OpSum, Algo: core.AlgoOneShot, Count: 256, Out: local}
		if e.rank == last {
			m.mod(&args)
		}
		// A marker in out and in the input: nothing may be moved.
		in := h.bufPtrs[e.rank] + h.offset
		for i := uintptr(0); i < size/4; i += 4 {
			*(*uint32)(unmanaged.Pointer(local + i)) = 0xdeadbeef
		}
		for i := uintptr(0); i < 1024; i += 4 {
			*(*uint32)(unmanaged.Pointer(in + i)) = uint32(e.rank + 1)
		}
		err := coll.Run(h, args)
		if core.CodeOf(err) != core.ErrMismatch {
			return fmt.Errorf("%s: got %v, want MISMATCH", m.what, err)
		}
		want := []string{others + ": all_reduce(float32, sum, count 256, one_shot)", fmt.Sprintf("rank %d: %s", last, m.theirs)}
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				return fmt.Errorf("%s: message %q lacks %q", m.what, err, w)
			}
		}
		for i := uintptr(0); i < size/4; i += 4 {
			if v := *(*uint32)(unmanaged.Pointer(local + i)); v != 0xdeadbeef {
				return fmt.Errorf("%s: out byte %d changed to %#x", m.what, i, v)
			}
		}
		for i := uintptr(0); i < 1024; i += 4 {
			if v := *(*uint32)(unmanaged.Pointer(in + i)); v != uint32(e.rank+1) {
				return fmt.Errorf("%s: input byte %d changed to %#x", m.what, i, v)
			}
		}
		// The group is still balanced: a matching call works.
		if err := runCase(h, collCase{core.AllReduce, core.Float32, core.OpSum, core.AlgoAuto, 100, "local"}, local, size/2, 1); err != nil {
			return fmt.Errorf("after the %s mismatch: %w", m.what, err)
		}
	}
	return nil
}

// Two groups at once (concurrent goroutines), and pair subgroups beside
// the world group.
func TestProcessesCollectivesGroups(t *testing.T) {
	allOK(t, runProcs(t, "coll-groups", 4, 120*time.Second, 0))
}

// inputOf is element i of rank r's input for a call numbered call: varied,
// not exactly representable sums, so rounding order shows.
func inputBits(dt core.DType, r, i, call int) uint32 {
	if dt == core.Int32 {
		v := int32((r+1)*1000003*(i+7) + call*7919)
		return uint32(v)
	}
	f := float32((r*7919+i*131+call*17)%2003-1001) * 0.0371
	switch dt {
	case core.BFloat16:
		return uint32(coll.FloatToBF16(f))
	case core.Float16:
		return uint32(coll.FloatToF16(f))
	}
	return math.Float32bits(f)
}

func storeBits(dt core.DType, addr uintptr, v uint32) {
	if dt.Size() == 2 {
		*(*uint16)(unmanaged.Pointer(addr)) = uint16(v)
	} else {
		*(*uint32)(unmanaged.Pointer(addr)) = v
	}
}

func loadBits(dt core.DType, addr uintptr) uint32 {
	if dt.Size() == 2 {
		return uint32(*(*uint16)(unmanaged.Pointer(addr)))
	}
	return *(*uint32)(unmanaged.Pointer(addr))
}

// expectReduced is the reduction of element i over world ranks.
func expectReduced(dt core.DType, op core.ReduceOp, world, i, call int) uint32 {
	if dt == core.Int32 {
		acc := int32(inputBits(dt, 0, i, call))
		for r := 1; r < world; r++ {
			acc = coll.ReduceInt(op, acc, int32(inputBits(dt, r, i, call)))
		}
		return uint32(acc)
	}
	wide := func(b uint32) float32 {
		switch dt {
		case core.BFloat16:
			return coll.BF16ToFloat(uint16(b))
		case core.Float16:
			return coll.F16ToFloat(uint16(b))
		}
		return math.Float32frombits(b)
	}
	acc := wide(inputBits(dt, 0, i, call))
	for r := 1; r < world; r++ {
		acc = coll.ReduceFloat(op, acc, wide(inputBits(dt, r, i, call)))
	}
	switch dt {
	case core.BFloat16:
		return uint32(coll.FloatToBF16(acc))
	case core.Float16:
		return uint32(coll.FloatToF16(acc))
	}
	return math.Float32bits(acc)
}

// collCase is one call and its check.
type collCase struct {
	kind  core.CollKind
	dt    core.DType
	op    core.ReduceOp
	algo  core.Algo
	count int
	// where: "local" (out outside the block), "inplace", "block" (out in
	// the second half of the block)
	where string
}

func (c collCase) String() string {
	return fmt.Sprintf("%s %s %s %s count %d out %s", c.kind, c.dt, c.op, c.algo, c.count, c.where)
}

// runCase fills the input, runs c and checks the output. half is where
// the block's second half starts; local is memory outside the block.
func runCase(h *Handle, c collCase, local uintptr, half uintptr, call int) error {
	me, w := h.Rank(), h.World()
	es := c.dt.Size()
	in := h.bufPtrs[me] + h.offset
	for i := 0; i < c.count; i++ {
		storeBits(c.dt, in+uintptr(i)*es, inputBits(c.dt, me, i, call))
	}
	var out uintptr
	switch c.where {
	case "local":
		out = local
	case "block":
		out = h.bufPtrs[me] + half
	case "inplace":
		switch c.kind {
		case core.AllReduce:
			out = 0
		case core.AllGather:
			// the input must be chunk me of out: only rank 0's in place
			// fits at the buffer's start; others use out = in - me*n.
			out = in - uintptr(me*c.count)*es
		case core.ReduceScatter:
			out = in + uintptr(me*c.count/w)*es
		}
	}
	if err := coll.Run(h, coll.Args{Kind: c.kind, DType: c.dt, Op: c.op, Algo: c.algo, Count: uintptr(c.count), Out: out}); err != nil {
		return fmt.Errorf("%v: %w", c, err)
	}
	if out == 0 {
		out = in
	}
	check := func(k int, got, want uint32) error {
		if got != want {
			return fmt.Errorf("rank %d, %v, call %d: element %d is %#x, want %#x", me, c, call, k, got, want)
		}
		return nil
	}
	switch c.kind {
	case core.AllReduce:
		for i := 0; i < c.count; i++ {
			if err := check(i, loadBits(c.dt, out+uintptr(i)*es), expectReduced(c.dt, c.op, w, i, call)); err != nil {
				return err
			}
		}
	case core.AllGather:
		for p := 0; p < w; p++ {
			for i := 0; i < c.count; i++ {
				k := p*c.count + i
				if err := check(k, loadBits(c.dt, out+uintptr(k)*es), inputBits(c.dt, p, i, call)); err != nil {
					return err
				}
			}
		}
	case core.ReduceScatter:
		per := c.count / w
		for i := 0; i < per; i++ {
			if err := check(i, loadBits(c.dt, out+uintptr(i)*es), expectReduced(c.dt, c.op, w, me*per+i, call)); err != nil {
				return err
			}
		}
	}
	return nil
}

var allDTypes = []core.DType{core.Float32, core.Float16, core.BFloat16, core.Int32}
var allOps = []core.ReduceOp{core.OpSum, core.OpMax, core.OpMin}

func scColl(e *rankEnv, a *alloc.Allocator) error {
	if e.arg == 1 { // every rank alike: the push/pull choice must agree
		coll.TwoShotPullMinBytes = 0
	}
	const size = 256 << 10
	// The input starts 4096 bytes into the block, so that an in-place
	// all-gather (out = input - rank*count elements) stays inside it.
	buf, g, err := join(e, a, size)
	if err != nil {
		return err
	}
	defer g.Destroy()
	h, err := g.Rendezvous(buf + 4096)
	if err != nil {
		return err
	}
	defer h.Release()
	local, err := a.Alloc(size, 0)
	if err != nil {
		return err
	}
	w := e.world
	half := uintptr(size / 2)
	counts := []int{1, 3, 8, 67, 1029}
	if w == 8 {
		counts = []int{1, 67, 1029}
	}
	call := 0
	for _, dt := range allDTypes {
		for _, n := range counts {
			for _, op := range allOps {
				for _, where := range []string{"local", "inplace", "block"} {
					algos := []core.Algo{core.AlgoOneShot}
					if where != "local" {
						algos = append(algos, core.AlgoTwoShot)
					}
					if where == "block" {
						// hierarchical and nccl are auto on one machine.
						algos = append(algos, core.AlgoAuto, core.AlgoHierarchical, core.AlgoNCCL)
					}
					for _, algo := range algos {
						call++
						if err := runCase(h, collCase{core.AllReduce, dt, op, algo, n, where}, local, half, call); err != nil {
							return err
						}
					}
					// reduce-scatter of n*w elements (a multiple of w);
					// in place only where the slice stays 16-byte aligned.
					rsIn := n*w*int(dt.Size())/w%16 == 0
					if where != "inplace" || rsIn {
						call++
						if err := runCase(h, collCase{core.ReduceScatter, dt, op, core.AlgoAuto, n * w, where}, local, half, call); err != nil {
							return err
						}
					}
				}
			}
			for _, where := range []string{"local", "inplace", "block"} {
				if where == "inplace" && (n*int(dt.Size())%16 != 0 || e.rank*n*int(dt.Size()) > 4096) {
					continue
				}
				call++
				if err := runCase(h, collCase{core.AllGather, dt, core.OpSum, core.AlgoAuto, n, where}, local, half, call); err != nil {
					return err
				}
			}
		}
	}
	// 1000 calls in a row on one channel: the counts keep the pads ready.
	for i := 0; i < 1000; i++ {
		call++
		c := collCase{core.AllReduce, core.Int32, core.OpSum, core.AlgoAuto, 5, "inplace"}
		if i%2 == 1 {
			c.algo = core.AlgoTwoShot
		}
		if err := runCase(h, c, local, half, call); err != nil {
			return err
		}
	}
	if v, err := h.DeviceError(); err != nil || v != 0 {
		return fmt.Errorf("device error word %#x (%v), want 0", v, err)
	}
	return nil
}

// scCollBad: every bad call fails locally with INVALID_ARGUMENT and
// enqueues nothing (a good call after them still meets the peers).
func scCollBad(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	in := h.bufPtrs[e.rank]
	local, _ := a.Alloc(64<<10, 0)
	bad := []struct {
		what string
		a    coll.Args
		msg  string
	}{
		{"count past the buffer", coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 16<<10 + 1}, "past the buffer"},
		{"unknown dtype", coll.Args{Kind: core.AllReduce, DType: 9, Count: 4}, "unknown dtype 9 (known: " + core.Known[core.DType]() + ")"},
		{"unknown op", coll.Args{Kind: core.AllReduce, DType: core.Float32, Op: 7, Count: 4}, "unknown reduction op 7 (known: " + core.Known[core.ReduceOp]() + ")"},
		{"unknown algo", coll.Args{Kind: core.AllReduce, DType: core.Float32, Algo: 7, Count: 4}, "unknown algorithm 7 (known: " + core.Known[core.Algo]() + ")"},
		{"misaligned out", coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 4, Out: local + 4}, "16-byte aligned"},
		{"overlap", coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 64, Out: in + 16}, "overlaps the input"},
		{"all-gather overlap", coll.Args{Kind: core.AllGather, DType: core.Float32, Count: 64, Out: in + 16}, "overlaps the input"},
		{"all-gather no out", coll.Args{Kind: core.AllGather, DType: core.Float32, Count: 64}, "out is NULL"},
		{"reduce-scatter count", coll.Args{Kind: core.ReduceScatter, DType: core.Float32, Count: uintptr(e.world*3 + 1), Out: local}, "not a multiple of the world size"},
		{"two-shot local out", coll.Args{Kind: core.AllReduce, DType: core.Float32, Algo: core.AlgoTwoShot, Count: 64, Out: local}, "inside the rendezvoused block"},
		{"channel", coll.Args{Kind: core.AllReduce, DType: core.Float32, Count: 4, Channel: core.CollChannels}, "collective channel 4 is out of range"},
		{"kind", coll.Args{Kind: 4, DType: core.Float32, Count: 4}, "unknown collective 4 (known: " + core.Known[core.CollKind]() + ")"},
	}
	for _, b := range bad {
		err := coll.Run(h, b.a)
		if core.CodeOf(err) != core.ErrInvalidArgument || !regexp.MustCompile(regexp.QuoteMeta(b.msg)).MatchString(err.Error()) {
			return fmt.Errorf("%s: got %v, want INVALID_ARGUMENT with %q", b.what, err, b.msg)
		}
	}
	// count 0 is a no-op.
	if err := coll.Run(h, coll.Args{Kind: core.AllReduce, DType: core.Float32}); err != nil {
		return fmt.Errorf("count 0: %v", err)
	}
	// Nothing was enqueued: a good call meets the peers at once.
	if err := runCase(h, collCase{core.AllReduce, core.Float32, core.OpSum, core.AlgoAuto, 100, "inplace"}, local, 32<<10, 1); err != nil {
		return err
	}
	return nil
}

// scCollGroups: two groups on two buffers run collectives at once (two
// goroutines), then pair subgroups beside the world group, and two channels
// of one group at once.
func scCollGroups(e *rankEnv, a *alloc.Allocator) error {
	const size = 64 << 10
	ha, doneA, err := joinRendezvous(e, a, size)
	if err != nil {
		return err
	}
	defer doneA()
	eb := *e
	eb.name = e.name + "-b"
	hb, doneB, err := joinRendezvous(&eb, a, size)
	if err != nil {
		return err
	}
	defer doneB()
	la, _ := a.Alloc(size, 0)
	lb, _ := a.Alloc(size, 0)
	run := func(h *Handle, local uintptr, base int, errs *error) {
		for i := 0; i < 200; i++ {
			c := collCase{core.AllReduce, allDTypes[i%4], allOps[i%3], core.Algo(i % 3), 37 + i, []string{"local", "inplace", "block"}[i%3]}
			if c.where == "local" && c.algo == core.AlgoTwoShot {
				c.algo = core.AlgoOneShot
			}
			if err := runCase(h, c, local, size/2, base+i); err != nil {
				*errs = err
				return
			}
		}
	}
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() { defer wg.Done(); run(ha, la, 0, &errA) }()
	go func() { defer wg.Done(); run(hb, lb, 1000, &errB) }()
	wg.Wait()
	if errA != nil || errB != nil {
		return fmt.Errorf("two groups at once: %v / %v", errA, errB)
	}
	// Pair subgroups (ranks 2k, 2k+1) on their own buffer.
	sub, err := New(e.opts(e.name+"-pair"+strconv.Itoa(e.rank/2), e.rank%2, 2))
	if err != nil {
		return err
	}
	defer sub.Destroy()
	sbuf, _ := a.Alloc(size, 0)
	hs, err := sub.Rendezvous(sbuf)
	if err != nil {
		return err
	}
	defer hs.Release()
	for i := 0; i < 50; i++ {
		// In the pair, rank 2k is 0 and 2k+1 is 1: inputs follow the pair
		// rank, so the expectation is the same function of world 2.
		if err := runCase(hs, collCase{core.ReduceScatter, core.Float32, core.OpSum, core.AlgoAuto, 64, "local"}, la, size/2, 5000+i); err != nil {
			return fmt.Errorf("subgroup: %w", err)
		}
		if err := runCase(ha, collCase{core.AllGather, core.BFloat16, core.OpSum, core.AlgoAuto, 9, "local"}, lb, size/2, 6000+i); err != nil {
			return fmt.Errorf("world group beside the subgroup: %w", err)
		}
	}
	return nil
}
