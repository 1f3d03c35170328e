package symm

import (
	"bytes"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Multi-process tests of the all-to-alls on the host backend (Note
// [All-to-all] in core/symm/coll): every rank generates every rank's splits
// and rows from one seed, computes what it must receive with the reference
// below (written from the header's text, independently of the runner),
// and compares byte for byte.

func init() {
	moreScenarios["a2a"] = scAllToAll
	moreScenarios["a2a-faults"] = scAllToAllFaults
}

func TestProcessesAllToAll(t *testing.T) {
	for _, world := range []int{2, 3, 4} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "a2a", world, 120*time.Second, 0))
		})
	}
}

func TestProcessesAllToAllFaults(t *testing.T) {
	allOK(t, runProcs(t, "a2a-faults", 3, 120*time.Second, 0))
}

// a2aRow is byte b of row k of rank r's input in call n.
func a2aRow(n, r, k, b int) byte { return byte(n*131 + r*71 + k*13 + b*7 + 1) }

// a2aCase is one split-driven call: every rank's split table (splits then,
// for the combine, offsets), in the layout's order.
type a2aCase struct {
	layout   core.A2ALayout
	experts  int
	align    int64
	rowBytes int
	tables   [][]int64 // by rank: S splits (and S offsets for the combine)
	outRows  int
}

// a2aWant is the out_splits_offsets rank r must get in case c.
func a2aWant(c a2aCase, world, r int) []int64 {
	E, S := c.experts, world*c.experts
	type piece struct{ s, j int }
	var order []piece
	switch c.layout {
	case core.A2AV:
		for s := 0; s < world; s++ {
			order = append(order, piece{s, r})
		}
	case core.A2AV2D:
		for e := 0; e < E; e++ {
			for s := 0; s < world; s++ {
				order = append(order, piece{s, r*E + e})
			}
		}
	case core.A2AV2DOffset:
		for s := 0; s < world; s++ {
			for e := 0; e < E; e++ {
				order = append(order, piece{s, e*world + r})
			}
		}
	}
	so := make([]int64, 2*S)
	var rows int64
	for i, p := range order {
		if c.layout == core.A2AV2D && i%world == 0 && i > 0 {
			// The previous expert's group ended: align its end.
			rows = alignUp(rows, so[S+i-world], c.align)
		}
		so[i], so[S+i] = c.tables[p.s][p.j], rows
		rows += so[i]
	}
	return so
}

// alignUp is the end of an expert's group that started at start and ends
// at end, aligned as the dispatch aligns it.
func alignUp(end, start, align int64) int64 {
	n := (end - start + align - 1) / align * align
	if n < align {
		n = align
	}
	return start + n
}

// a2aRandomCase draws a case: splits in [0, 5], with zeros, or (every
// third case) every rank sending everything to rank 0.
func a2aRandomCase(rng *rand.Rand, layout core.A2ALayout, world, experts, rowBytes int, align int64, skew bool) a2aCase {
	S := world * experts
	c := a2aCase{layout: layout, experts: experts, align: align, rowBytes: rowBytes, tables: make([][]int64, world)}
	for r := range c.tables {
		t := make([]int64, S)
		for j := range t {
			t[j] = int64(rng.Intn(6))
			if skew && a2aDest(layout, world, experts, j) != 0 {
				t[j] = 0
			}
		}
		if layout == core.A2AV2DOffset {
			// Offsets with gaps between the splits, as a dispatch's
			// aligned output has.
			offs := make([]int64, S)
			var at int64
			for j := range t {
				at += int64(rng.Intn(3))
				offs[j] = at
				at += t[j]
			}
			t = append(t, offs...)
		}
		c.tables[r] = t
	}
	c.outRows = 6 * S * 2 // room for anything, with alignment
	if align > 1 {
		c.outRows += int(align) * experts
	}
	return c
}

// a2aDest is the rank that split j of a table goes to.
func a2aDest(layout core.A2ALayout, world, experts, j int) int {
	switch layout {
	case core.A2AV2D:
		return j / experts
	case core.A2AV2DOffset:
		return j % world
	}
	return j
}

// a2aInputRows is how many rows rank r's input needs for its table.
func a2aInputRows(c a2aCase, world int) int {
	S := world * c.experts
	var most int64
	for _, t := range c.tables {
		var end int64
		for j := 0; j < S; j++ {
			if c.layout == core.A2AV2DOffset {
				end = max(end, t[S+j]+t[j])
			} else {
				end += t[j]
			}
		}
		most = max(most, end)
	}
	return int(most)
}

type a2aRank struct {
	e      *rankEnv
	h      *Handle
	in     uintptr // this rank's input (the handle's rendezvous pointer)
	out    uintptr
	splits uintptr // room for 2 x A2AMaxSplits int64
	so     uintptr // out_splits_offsets
}

func setupA2A(e *rankEnv, a *alloc.Allocator, size uintptr) (*a2aRank, func(), error) {
	h, done, err := joinRendezvous(e, a, size)
	if err != nil {
		return nil, nil, err
	}
	x := &a2aRank{e: e, h: h, in: h.bufPtrs[e.rank] + h.offset}
	for _, p := range []*uintptr{&x.out, &x.splits, &x.so} {
		if *p, err = a.Alloc(size, 0); err != nil {
			done()
			return nil, nil, err
		}
	}
	return x, done, nil
}

func int64sOf(addr uintptr, n int) []int64 {
	return unsafe.Slice((*int64)(unmanaged.Pointer(addr)), n)
}

// run runs case c as call n and checks what this rank received.
func (x *a2aRank) run(n int, c a2aCase) error {
	r, world := x.e.rank, x.e.world
	a2aPrepare(n, c, world, r, x.in, x.out, x.so)
	copy(int64sOf(x.splits, len(c.tables[r])), c.tables[r])
	err := coll.Run(x.h, coll.Args{Kind: core.AllToAll, Out: x.out, V: &coll.A2AArgs{Layout: c.layout, RowBytes: uintptr(c.rowBytes),
		Experts: c.experts, InSplits: x.splits, OutRows: uintptr(c.outRows), OutSplitsOffsets: x.so, MajorAlign: c.align}})
	if err != nil {
		return fmt.Errorf("call %d (%s, experts %d): %v", n, c.layout, c.experts, err)
	}
	return a2aCheck(n, c, world, r, x.out, x.so)
}

// a2aPrepare fills rank r's input rows of call n of case c at in, out
// with 0xee (a row that receives nothing must keep it) and the
// out_splits_offsets at so with -7.
func a2aPrepare(n int, c a2aCase, world, r int, in, out, so uintptr) {
	rows := a2aInputRows(c, world)
	inBytes := bytesOf(in, uintptr(rows*c.rowBytes))
	for k := 0; k < rows; k++ {
		for b := 0; b < c.rowBytes; b++ {
			inBytes[k*c.rowBytes+b] = a2aRow(n, r, k, b)
		}
	}
	outBytes := bytesOf(out, uintptr(c.outRows*c.rowBytes))
	for i := range outBytes {
		outBytes[i] = 0xee
	}
	splitsOffsets := int64sOf(so, 2*world*c.experts)
	for i := range splitsOffsets {
		splitsOffsets[i] = -7
	}
}

// a2aCheck checks what rank r received in call n of case c: the
// out_splits_offsets at so, every received piece at its offset in out,
// and the rows that receive nothing untouched.
func a2aCheck(n int, c a2aCase, world, r int, out, so uintptr) error {
	S := world * c.experts
	wantSO := a2aWant(c, world, r)
	gotSO := int64sOf(so, 2*S)
	for i := range wantSO {
		if gotSO[i] != wantSO[i] {
			return fmt.Errorf("call %d (%s): out_splits_offsets %v, want %v", n, c.layout, gotSO, wantSO)
		}
	}
	outBytes := bytesOf(out, uintptr(c.outRows*c.rowBytes))
	written := make([]bool, c.outRows)
	for i := 0; i < S; i++ {
		s, start := a2aPieceSource(c, world, r, i)
		for q := int64(0); q < wantSO[i]; q++ {
			row := wantSO[S+i] + q
			written[row] = true
			for b := 0; b < c.rowBytes; b++ {
				if got, want := outBytes[int(row)*c.rowBytes+b], a2aRow(n, s, int(start+q), b); got != want {
					return fmt.Errorf("call %d (%s): out row %d byte %d = %#x, want %#x (rank %d's row %d)", n, c.layout, row, b, got, want, s, start+q)
				}
			}
		}
	}
	for row, w := range written {
		if !w && !bytes.Equal(outBytes[row*c.rowBytes:(row+1)*c.rowBytes], bytes.Repeat([]byte{0xee}, c.rowBytes)) {
			return fmt.Errorf("call %d (%s): out row %d was written but receives nothing", n, c.layout, row)
		}
	}
	return nil
}

// a2aPieceSource is the sender of output piece i of rank r and the row its
// piece starts at in the sender's input.
func a2aPieceSource(c a2aCase, world, r, i int) (s int, start int64) {
	E, S := c.experts, world*c.experts
	j := 0
	switch c.layout {
	case core.A2AV:
		s, j = i, r
	case core.A2AV2D:
		s, j = i%world, r*E+i/world
	case core.A2AV2DOffset:
		s, j = i/E, (i%E)*world+r
	}
	t := c.tables[s]
	if c.layout == core.A2AV2DOffset {
		return s, t[S+j]
	}
	for k := 0; k < j; k++ {
		start += t[k]
	}
	return s, start
}

func scAllToAll(e *rankEnv, a *alloc.Allocator) error {
	x, done, err := setupA2A(e, a, 1<<20)
	if err != nil {
		return err
	}
	defer done()
	world, r := e.world, e.rank
	// Equal splits: count elements of each dtype's size, aligned and not.
	for n, count := range []uintptr{1, 3, 64, 1000} {
		for _, dt := range []core.DType{core.Float32, core.BFloat16} {
			es := dt.Size()
			chunk := int(count * es)
			in := bytesOf(x.in, uintptr(chunk*world))
			for p := 0; p < world; p++ {
				for b := 0; b < chunk; b++ {
					in[p*chunk+b] = a2aRow(n, r, p, b)
				}
			}
			if err := coll.Run(x.h, coll.Args{Kind: core.AllToAll, DType: dt, Count: count, Out: x.out}); err != nil {
				return fmt.Errorf("all_to_all count %d %s: %v", count, dt, err)
			}
			out := bytesOf(x.out, uintptr(chunk*world))
			for s := 0; s < world; s++ {
				for b := 0; b < chunk; b++ {
					if got, want := out[s*chunk+b], a2aRow(n, s, r, b); got != want {
						return fmt.Errorf("all_to_all count %d %s: from rank %d byte %d = %#x, want %#x", count, dt, s, b, got, want)
					}
				}
			}
		}
	}
	// The split-driven forms, every rank drawing every rank's tables from
	// one seed.
	rng := rand.New(rand.NewSource(int64(world)))
	n := 100
	for round := 0; round < 4; round++ {
		skew := round == 3
		for _, rb := range []int{16, 12} {
			cases := []a2aCase{
				a2aRandomCase(rng, core.A2AV, world, 1, rb, 0, skew),
				a2aRandomCase(rng, core.A2AV2D, world, 3, rb, 1, skew),
				a2aRandomCase(rng, core.A2AV2D, world, 2, rb, 4, skew),
				a2aRandomCase(rng, core.A2AV2DOffset, world, 3, rb, 0, skew),
			}
			for _, c := range cases {
				n++
				if err := x.run(n, c); err != nil {
					return err
				}
			}
		}
	}
	// The round trip: a dispatch, then the combine of what it delivered
	// (the dispatch's out_splits_offsets are the combine's table) gives
	// every rank its input rows back, in order.
	return a2aRoundTrip(x, rng)
}

func a2aRoundTrip(x *a2aRank, rng *rand.Rand) error {
	world, r := x.e.world, x.e.rank
	const E, rb = 2, 32
	d := a2aRandomCase(rng, core.A2AV2D, world, E, rb, 8, false)
	if err := x.run(900, d); err != nil {
		return err
	}
	S := world * E
	table := append([]int64(nil), int64sOf(x.so, 2*S)...)
	// The expert outputs: the dispatch's out, moved into the input block.
	copy(bytesOf(x.in, uintptr(d.outRows*rb)), bytesOf(x.out, uintptr(d.outRows*rb)))
	copy(int64sOf(x.splits, 2*S), table)
	sent := a2aInputRows(d, world)
	for i := range bytesOf(x.out, uintptr(d.outRows*rb)) {
		bytesOf(x.out, uintptr(d.outRows*rb))[i] = 0
	}
	err := coll.Run(x.h, coll.Args{Kind: core.AllToAll, Out: x.out, V: &coll.A2AArgs{Layout: core.A2AV2DOffset, RowBytes: rb,
		Experts: E, InSplits: x.splits, OutRows: uintptr(d.outRows), OutSplitsOffsets: x.so}})
	if err != nil {
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
				return fmt.Errorf("round trip: row %d byte %d = %#x, want %#x (%d rows sent)", k, b, got, want, sent)
			}
		}
	}
	return nil
}

// scAllToAllFaults: a receiver's overrun fails that receiver alone, with
// nothing written; a negative split or one past the input fails every rank;
// ranks that disagree on experts fail with ErrMismatch; after each the
// group runs a good call.
func scAllToAllFaults(e *rankEnv, a *alloc.Allocator) error {
	x, done, err := setupA2A(e, a, 1<<20)
	if err != nil {
		return err
	}
	defer done()
	world, r := e.world, e.rank
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
	call := func(layout core.A2ALayout, experts int, table []int64, outRows int) error {
		copy(int64sOf(x.splits, len(table)), table)
		return coll.Run(x.h, coll.Args{Kind: core.AllToAll, Out: x.out, V: &coll.A2AArgs{Layout: layout, RowBytes: 8,
			Experts: experts, InSplits: x.splits, OutRows: uintptr(outRows), OutSplitsOffsets: x.so, MajorAlign: 1}})
	}
	marker := func() {
		for i := range bytesOf(x.out, uintptr(4096)) {
			bytesOf(x.out, uintptr(4096))[i] = 0x5a
		}
	}
	untouched := func(what string) error {
		if !bytes.Equal(bytesOf(x.out, uintptr(4096)), bytes.Repeat([]byte{0x5a}, 4096)) {
			return fmt.Errorf("%s: out was written", what)
		}
		return nil
	}
	if err := good(1); err != nil {
		return err
	}
	// Everyone sends 5 rows to rank 1 and 4 to the others, whose outs hold
	// 4*world: rank 1's call fails with nothing written, the others'
	// succeed.
	marker()
	table := make([]int64, world)
	for j := range table {
		table[j] = 4
	}
	table[1] = 5
	err = call(core.A2AV, 1, table, 4*world)
	if r == 1 {
		if core.CodeOf(err) != core.ErrInvalidArgument || !strings.Contains(err.Error(), fmt.Sprintf("rank 1 receives %d rows", 5*world)) {
			return fmt.Errorf("overrun: got %v", err)
		}
		if err := untouched("overrun"); err != nil {
			return err
		}
		if got := int64sOf(x.so, 2*world); got[0] != 5 || got[world] != 0 || got[world+1] != 5 {
			return fmt.Errorf("overrun: out_splits_offsets %v, want the splits and offsets received", got)
		}
	} else if err != nil {
		return fmt.Errorf("overrun on rank 1: rank %d failed too: %v", r, err)
	}
	if err := good(2); err != nil {
		return fmt.Errorf("after the overrun: %v", err)
	}
	// Rank 0 passes a negative split, then one past its input: every rank
	// fails naming rank 0, nothing written.
	for _, bad := range []int64{-1, 1 << 40} {
		marker()
		for j := range table {
			table[j] = 1
		}
		if r == 0 {
			table[world-1] = bad
		}
		err = call(core.A2AV, 1, table, 64)
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
	// Experts differ on the last rank.
	experts := 2
	if r == world-1 {
		experts = 1
	}
	table = make([]int64, world*experts)
	err = call(core.A2AV2D, experts, table, 64)
	if core.CodeOf(err) != core.ErrMismatch || !strings.Contains(err.Error(), "all_to_all_v_2d") {
		return fmt.Errorf("experts mismatch: got %v", err)
	}
	return good(4)
}
