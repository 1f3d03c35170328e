package symm

// The all-to-alls on groups that span machines (Note [All-to-all across
// machines] in core/symm/coll), imitated in one process (machines_test.go):
// every form against the reference of alltoall_test.go, which every rank
// computes from one seed; which chunks cross the engine; the refusals.

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/symm/coll"
)

// a2aLayouts are the imitated machines of the tests: teams of one size,
// of different sizes, a team of its own for every rank, and teams whose
// ranks are not consecutive (the engine then moves every chunk).
var a2aLayouts = map[string][]int{"2x2": {0, 0, 1, 1}, "2x1": {0, 0, 1}, "3x1": {0, 1, 2}, "interleaved": {0, 1, 0, 1}}

// mmA2A is one rank's all-to-all test state: the handle, its input (the
// rendezvous pointer), out, the split table and out_splits_offsets.
type mmA2A struct {
	r                  *mmRank
	h                  *Handle
	in, out, splits, s uintptr
}

func (r *mmRank) joinA2A(size uintptr) (*mmA2A, func(), error) {
	g, h, buf, err := r.join(size)
	if err != nil {
		return nil, nil, err
	}
	x := &mmA2A{r: r, h: h, in: buf}
	var allocs []uintptr
	done := func() {
		for _, p := range allocs {
			r.a.Free(p, size, 0)
		}
		h.Release()
		g.Destroy()
	}
	for _, p := range []*uintptr{&x.out, &x.splits, &x.s} {
		if *p, err = r.a.Alloc(size, 0); err != nil {
			done()
			return nil, nil, err
		}
		allocs = append(allocs, *p)
	}
	return x, done, nil
}

// equal runs the equal-split all-to-all of count elements of dt as call n
// and checks what arrived.
func (x *mmA2A) equal(n int, count uintptr, dt core.DType) error {
	r, world := x.r.rank, x.r.world
	chunk := int(count * dt.Size())
	in := bytesOf(x.in, uintptr(chunk*world))
	for p := 0; p < world; p++ {
		for b := 0; b < chunk; b++ {
			in[p*chunk+b] = a2aRow(n, r, p, b)
		}
	}
	out := bytesOf(x.out, uintptr(chunk*world))
	for i := range out {
		out[i] = 0xee
	}
	if err := coll.Run(x.h, coll.Args{Kind: core.AllToAll, DType: dt, Count: count, Out: x.out}); err != nil {
		return fmt.Errorf("all_to_all count %d %s: %v", count, dt, err)
	}
	for s := 0; s < world; s++ {
		for b := 0; b < chunk; b++ {
			if got, want := out[s*chunk+b], a2aRow(n, s, r, b); got != want {
				return fmt.Errorf("all_to_all count %d %s: from rank %d byte %d = %#x, want %#x", count, dt, s, b, got, want)
			}
		}
	}
	return nil
}

// call runs a split-driven all-to-all with table (splits, and offsets for
// the combine) and returns its error.
func (x *mmA2A) call(layout core.A2ALayout, experts, rowBytes int, table []int64, outRows int, align int64) error {
	copy(int64sOf(x.splits, len(table)), table)
	return coll.Run(x.h, coll.Args{Kind: core.AllToAll, Out: x.out, V: &coll.A2AArgs{Layout: layout, RowBytes: uintptr(rowBytes),
		Experts: experts, InSplits: x.splits, OutRows: uintptr(outRows), OutSplitsOffsets: x.s, MajorAlign: align}})
}

// run runs case c as call n and checks out_splits_offsets, every received
// row, and that rows receiving nothing are untouched.
func (x *mmA2A) run(n int, c a2aCase) error {
	r, world := x.r.rank, x.r.world
	a2aPrepare(n, c, world, r, x.in, x.out, x.s)
	if err := x.call(c.layout, c.experts, c.rowBytes, c.tables[r], c.outRows, c.align); err != nil {
		return fmt.Errorf("call %d (%s, experts %d): %v", n, c.layout, c.experts, err)
	}
	return a2aCheck(n, c, world, r, x.out, x.s)
}

// mappedChunks says whether rank me's equal-split chunks for rank p move
// through the mapped memory: p is in me's team, whose ranks are
// consecutive and more than one (Note [All-to-all across machines]).
func mappedChunks(machines []int, me, p int) bool {
	var team []int
	for r, m := range machines {
		if m == machines[me] {
			team = append(team, r)
		}
	}
	for i, r := range team {
		if r != team[0]+i {
			return false
		}
	}
	return len(team) > 1 && machines[p] == machines[me]
}

// Every form, exact against the reference, on every layout: equal splits
// (the team's chunks through the team view where its ranks are
// consecutive, the engine carrying exactly the others), the v, 2-D and
// combine forms with zero splits and one rank receiving everything, and
// the dispatch-combine round trip.
func TestMachinesAllToAll(t *testing.T) {
	for name, machines := range a2aLayouts {
		t.Run(name, func(t *testing.T) {
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm"}, func(r *mmRank) error {
				x, done, err := r.joinA2A(1 << 20)
				if err != nil {
					return err
				}
				defer done()
				world := r.world
				var sent uintptr
				n := 0
				for _, count := range []uintptr{1, 3, 64, 1000} {
					for _, dt := range []core.DType{core.Float32, core.BFloat16} {
						n++
						if err := x.equal(n, count, dt); err != nil {
							return err
						}
						sent += count * dt.Size()
					}
				}
				for p := 0; p < world; p++ {
					want := sent
					if mappedChunks(machines, r.rank, p) {
						want = 0
					}
					if got := r.comm.hub.sentBytes(r.rank, p); got != want {
						return fmt.Errorf("equal splits: %d bytes to rank %d through the engine, want %d (mapped: %v)", got, p, want, want == 0)
					}
				}
				rng := rand.New(rand.NewSource(int64(world)))
				n = 100
				for round := 0; round < 3; round++ {
					skew := round == 2
					for _, rb := range []int{16, 12} {
						for _, c := range []a2aCase{
							a2aRandomCase(rng, core.A2AV, world, 1, rb, 0, skew),
							a2aRandomCase(rng, core.A2AV2D, world, 3, rb, 1, skew),
							a2aRandomCase(rng, core.A2AV2D, world, 2, rb, 4, skew),
							a2aRandomCase(rng, core.A2AV2DOffset, world, 3, rb, 0, skew),
						} {
							n++
							if err := x.run(n, c); err != nil {
								return err
							}
						}
					}
				}
				// Every split 0: nothing moves, every expert of the dispatch
				// still takes major_align rows.
				zero := a2aCase{layout: core.A2AV2D, experts: 2, align: 4, rowBytes: 8, outRows: 8, tables: make([][]int64, world)}
				for s := range zero.tables {
					zero.tables[s] = make([]int64, 2*world)
				}
				if err := x.run(500, zero); err != nil {
					return err
				}
				return x.roundTrip(rng)
			}))
		})
	}
}

// roundTrip: a dispatch, then the combine of what it delivered, gives
// every rank its input rows back in order.
func (x *mmA2A) roundTrip(rng *rand.Rand) error {
	world, r := x.r.world, x.r.rank
	const E, rb = 2, 32
	d := a2aRandomCase(rng, core.A2AV2D, world, E, rb, 8, false)
	if err := x.run(900, d); err != nil {
		return err
	}
	S := world * E
	table := append([]int64(nil), int64sOf(x.s, 2*S)...)
	copy(bytesOf(x.in, uintptr(d.outRows*rb)), bytesOf(x.out, uintptr(d.outRows*rb)))
	clear(bytesOf(x.out, uintptr(d.outRows*rb)))
	if err := x.call(core.A2AV2DOffset, E, rb, table, d.outRows, 0); err != nil {
		return fmt.Errorf("combine: %v", err)
	}
	var mine int64
	for _, k := range d.tables[r] {
		mine += k
	}
	out := bytesOf(x.out, uintptr(mine)*rb)
	for k := 0; k < int(mine); k++ {
		for b := 0; b < rb; b++ {
			if got, want := out[k*rb+b], a2aRow(900, r, k, b); got != want {
				return fmt.Errorf("round trip: row %d byte %d = %#x, want %#x", k, b, got, want)
			}
		}
	}
	return nil
}

// The refusals across machines: a receiver's overrun fails that receiver
// alone, naming it, with out untouched and out_splits_offsets written,
// while the others receive theirs; a negative split or one past the input
// fails every rank naming the sender; ranks that pass different experts
// fail with ErrMismatch naming every rank's arguments; after each the
// group runs a good call.
func TestMachinesAllToAllRefusals(t *testing.T) {
	for _, name := range []string{"2x2", "2x1"} {
		machines := a2aLayouts[name]
		t.Run(name, func(t *testing.T) {
			requireAllOK(t, runMachines(t, mmConfig{machines: machines, engine: "comm"}, func(r *mmRank) error {
				x, done, err := r.joinA2A(1 << 20)
				if err != nil {
					return err
				}
				defer done()
				world, me := r.world, r.rank
				good := func(n int) error {
					c := a2aCase{layout: core.A2AV, experts: 1, rowBytes: 8, outRows: 2 * world, tables: make([][]int64, world)}
					for s := range c.tables {
						c.tables[s] = make([]int64, world)
						for j := range c.tables[s] {
							c.tables[s][j] = 2
						}
					}
					return x.run(n, c)
				}
				marker := func() {
					for i := range bytesOf(x.out, 4096) {
						bytesOf(x.out, 4096)[i] = 0x5a
					}
				}
				untouched := func(what string) error {
					if !bytes.Equal(bytesOf(x.out, 4096), bytes.Repeat([]byte{0x5a}, 4096)) {
						return fmt.Errorf("%s: out was written", what)
					}
					return nil
				}
				if err := good(1); err != nil {
					return err
				}
				// Every rank sends 5 rows to the last rank (on another
				// machine than rank 0) and 4 to the others; outs hold
				// 4*world rows.
				last := world - 1
				marker()
				table := make([]int64, world)
				for j := range table {
					table[j] = 4
				}
				table[last] = 5
				for i := range bytesOf(x.in, uintptr(8*(4*world+1))) {
					bytesOf(x.in, uintptr(8*(4*world+1)))[i] = byte(me + 1)
				}
				err = x.call(core.A2AV, 1, 8, table, 4*world, 0)
				if me == last {
					if core.CodeOf(err) != core.ErrInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("rank %d receives %d rows", last, 5*world)) {
						return fmt.Errorf("overrun: got %v", err)
					}
					if err := untouched("overrun"); err != nil {
						return err
					}
					if got := int64sOf(x.s, 2*world); got[0] != 5 || got[world] != 0 || got[world+1] != 5 {
						return fmt.Errorf("overrun: out_splits_offsets %v, want the splits and offsets received", got)
					}
				} else {
					if err != nil {
						return fmt.Errorf("overrun on rank %d: rank %d failed too: %v", last, me, err)
					}
					for s := 0; s < world; s++ {
						if got := bytesOf(x.out+uintptr(32*s), 32); !bytes.Equal(got, bytes.Repeat([]byte{byte(s + 1)}, 32)) {
							return fmt.Errorf("overrun on rank %d: rank %d's rows from rank %d are %v", last, me, s, got)
						}
					}
				}
				if err := good(2); err != nil {
					return fmt.Errorf("after the overrun: %v", err)
				}
				for _, bad := range []int64{-1, 1 << 40} {
					marker()
					for j := range table {
						table[j] = 1
					}
					if me == 0 {
						table[world-1] = bad
					}
					err = x.call(core.A2AV, 1, 8, table, 64, 0)
					if core.CodeOf(err) != core.ErrInvalidArgument || !strings.Contains(err.Error(), "rank 0's splits overrun its input") {
						return fmt.Errorf("bad split %d: got %v", bad, err)
					}
					if err := untouched(fmt.Sprintf("bad split %d", bad)); err != nil {
						return err
					}
					if err := good(3); err != nil {
						return fmt.Errorf("after bad split %d: %v", bad, err)
					}
				}
				experts := 2
				if me == last {
					experts = 1
				}
				err = x.call(core.A2AV2D, experts, 8, make([]int64, world*experts), 64, 1)
				if core.CodeOf(err) != core.ErrMismatch || !strings.Contains(err.Error(), fmt.Sprintf("rank %d: all_to_all_v_2d(row_bytes 8, experts 1", last)) ||
					!strings.Contains(err.Error(), "rank 0: all_to_all_v_2d(row_bytes 8, experts 2") {
					return fmt.Errorf("experts mismatch: got %v", err)
				}
				return good(4)
			}))
		})
	}
}

// A group that spans machines without an engine refuses every form,
// naming the missing engine.
func TestMachinesAllToAllWithoutEngine(t *testing.T) {
	requireAllOK(t, runMachines(t, mmConfig{machines: a2aLayouts["2x2"], engine: "allgather"}, func(r *mmRank) error {
		x, done, err := r.joinA2A(64 << 10)
		if err != nil {
			return err
		}
		defer done()
		for what, err := range map[string]error{
			"all_to_all":   coll.Run(x.h, coll.Args{Kind: core.AllToAll, DType: core.Float32, Count: 4, Out: x.out}),
			"all_to_all_v": x.call(core.A2AV, 1, 8, make([]int64, 4), 16, 0),
		} {
			if core.CodeOf(err) != core.ErrUnavailable || !strings.Contains(err.Error(), what+" needs an engine between machines") {
				return fmt.Errorf("%s: %v, want ErrUnavailable naming the missing engine", what, err)
			}
		}
		return nil
	}))
}

// A rank on another machine that never makes the call: the split-driven
// form's waits are bounded, and every caller fails with ErrTimeout naming
// the ranks of the other machines, within about the timeout.
func TestMachinesAllToAllAbsentRank(t *testing.T) {
	const timeout = 3 * time.Second
	requireAllOK(t, runMachines(t, mmConfig{machines: a2aLayouts["2x2"], engine: "comm", timeout: timeout}, func(r *mmRank) error {
		x, done, err := r.joinA2A(64 << 10)
		if err != nil {
			return err
		}
		defer done()
		if r.rank == 3 {
			return nil
		}
		start := time.Now()
		err = x.call(core.A2AV, 1, 8, []int64{1, 1, 1, 1}, 16, 0)
		took := time.Since(start)
		if core.CodeOf(err) != core.ErrTimeout || !strings.Contains(err.Error(), "all_to_all_v: the all-gather of the arguments") ||
			!strings.Contains(err.Error(), `rank(s) 2, 3 on machine "m1"`) && !strings.Contains(err.Error(), `rank(s) 0, 1 on machine "m0"`) {
			return fmt.Errorf("a rank never calls: %v, want ErrTimeout naming the other machine's ranks", err)
		}
		if took > 3*timeout {
			return fmt.Errorf("a rank never calls: the call took %v, the timeout is %v", took, timeout)
		}
		return nil
	}))
}
