package symm

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The copy-engine collectives (Note [Copy-engine collectives] in
// core/symm/coll) on the host backend, as real processes: every kind, in
// place and out of place, uneven counts, bit for bit against the same
// references as the kernels' algorithms; their argument agreement; and
// SYMMEM_LEAVE_SMS's auto.

func init() {
	moreScenarios["coll-ce"] = scCollCopyEngine
	moreScenarios["coll-ce-mismatch"] = scCollCopyEngineMismatch
}

func TestProcessesCopyEngine(t *testing.T) {
	for _, world := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "coll-ce", world, 120*time.Second, 0))
		})
	}
	// SYMMEM_LEAVE_SMS: auto is the copy engines (every rank alike).
	t.Run("leave-sms", func(t *testing.T) {
		allOK(t, runProcs(t, "coll-ce", 2, 120*time.Second, 1))
	})
}

func TestProcessesCopyEngineMismatch(t *testing.T) {
	allOK(t, runProcs(t, "coll-ce-mismatch", 3, 60*time.Second, 0))
}

func scCollCopyEngine(e *rankEnv, a *alloc.Allocator) error {
	algo := core.AlgoCopyEngine
	if e.arg == 1 {
		coll.LeaveSMs = true
		algo = core.AlgoAuto
	}
	const size = 256 << 10
	buf, g, err := join(e, a, size)
	if err != nil {
		return err
	}
	defer g.Destroy()
	h, err := g.Rendezvous(buf + 4096) // room for an in-place all-gather below the input
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
	call := 0
	for _, dt := range allDTypes {
		for _, n := range []int{1, 3, 8, 67, 1029} {
			for _, op := range allOps {
				for _, where := range []string{"local", "inplace", "block"} {
					call++
					if err := runCase(h, collCase{core.AllReduce, dt, op, algo, n, where}, local, half, call); err != nil {
						return err
					}
					if where != "inplace" || n*w*int(dt.Size())/w%16 == 0 {
						call++
						if err := runCase(h, collCase{core.ReduceScatter, dt, op, algo, n * w, where}, local, half, call); err != nil {
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
				if err := runCase(h, collCase{core.AllGather, dt, core.OpSum, algo, n, where}, local, half, call); err != nil {
					return err
				}
			}
			call++
			if err := ceAllToAll(h, dt, n, algo, local, call); err != nil {
				return err
			}
		}
	}
	// Many calls in a row, in place and not, alternating with the kernels'
	// algorithm on the same channel: the barriers stay in step.
	for i := 0; i < 300; i++ {
		call++
		c := collCase{core.AllReduce, core.Int32, core.OpSum, algo, 5, "inplace"}
		switch i % 3 {
		case 1:
			c.where = "local"
		case 2:
			c.algo = core.AlgoOneShot
		}
		if err := runCase(h, c, local, half, call); err != nil {
			return err
		}
	}
	return nil
}

// ceAllToAll runs an equal-split all-to-all of count elements per chunk
// with algo into out and checks what arrived from every rank.
func ceAllToAll(h *Handle, dt core.DType, count int, algo core.Algo, out uintptr, call int) error {
	me, w := h.Rank(), h.World()
	es := dt.Size()
	in := h.bufPtrs[me] + h.offset
	for i := 0; i < w*count; i++ {
		storeBits(dt, in+uintptr(i)*es, inputBits(dt, me, i, call))
	}
	if err := coll.Run(h, coll.Args{Kind: core.AllToAll, DType: dt, Algo: algo, Count: uintptr(count), Out: out}); err != nil {
		return fmt.Errorf("all_to_all %s count %d: %w", dt, count, err)
	}
	for s := 0; s < w; s++ {
		for i := 0; i < count; i++ {
			got, want := loadBits(dt, out+uintptr(s*count+i)*es), inputBits(dt, s, me*count+i, call)
			if got != want {
				return fmt.Errorf("rank %d: all_to_all %s count %d: element %d from rank %d is %#x, want %#x", me, dt, count, i, s, got, want)
			}
		}
	}
	return nil
}

// scCollCopyEngineMismatch: a rank that runs copy_engine where the others
// run one_shot (or the reverse) fails every rank with MISMATCH naming both
// calls, out untouched, the group usable; a v-form all-to-all refuses
// copy_engine; a matching call then succeeds.
func scCollCopyEngineMismatch(e *rankEnv, a *alloc.Allocator) error {
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
	for _, kind := range []core.CollKind{core.AllReduce, core.AllGather, core.AllToAll} {
		args := coll.Args{Kind: kind, DType: core.Float32, Op: core.OpSum, Algo: core.AlgoOneShot, Count: 256, Out: local}
		if e.rank == last {
			args.Algo = core.AlgoCopyEngine
		}
		for i := uintptr(0); i < size; i += 4 {
			*(*uint32)(unmanaged.Pointer(local + i)) = 0xdeadbeef
		}
		err := coll.Run(h, args)
		if core.CodeOf(err) != core.ErrMismatch {
			return fmt.Errorf("%s: got %v, want MISMATCH", kind, err)
		}
		var mine, theirs string
		switch kind {
		case core.AllReduce:
			mine, theirs = "all_reduce(float32, sum, count 256, one_shot)", "all_reduce(float32, sum, count 256, copy_engine)"
		case core.AllGather:
			mine, theirs = "all_gather(float32, count 256)", "all_gather(float32, count 256, copy_engine)"
		case core.AllToAll:
			mine, theirs = "all_to_all(float32, count 256)", "all_to_all(float32, count 256, copy_engine)"
		}
		for _, want := range []string{mine, fmt.Sprintf("rank %d: %s", last, theirs)} {
			if !strings.Contains(err.Error(), want) {
				return fmt.Errorf("%s: message %q lacks %q", kind, err, want)
			}
		}
		for i := uintptr(0); i < size; i += 4 {
			if v := *(*uint32)(unmanaged.Pointer(local + i)); v != 0xdeadbeef {
				return fmt.Errorf("%s: out byte %d changed to %#x", kind, i, v)
			}
		}
	}
	splits, err := a.Alloc(64, 0)
	if err != nil {
		return err
	}
	err = coll.Run(h, coll.Args{Kind: core.AllToAll, Algo: core.AlgoCopyEngine, Out: local, V: &coll.A2AArgs{Layout: core.A2AV, RowBytes: 8, Experts: 1, InSplits: splits, OutRows: 16, OutSplitsOffsets: local + 8192}})
	if core.CodeOf(err) != core.ErrInvalidArgument || !strings.Contains(err.Error(), "copy_engine runs the equal-split all_to_all only") {
		return fmt.Errorf("v form with copy_engine: got %v, want INVALID_ARGUMENT naming the equal-split form", err)
	}
	return runCase(h, collCase{core.AllReduce, core.Float32, core.OpSum, core.AlgoCopyEngine, 100, "inplace"}, local, 32<<10, 1)
}
