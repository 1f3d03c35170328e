package symm

import (
	"fmt"
	"math"
	"regexp"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/symm/coll"
)

// Multi-process tests of the all-reduce with RMSNorm on the host backend
// (Note [All-reduce with RMSNorm] in core/symm/coll/norm.go): every rank
// generates every rank's input, its residual and weight from the call's
// number, computes residual and out with the reference below (written
// from the note's text: its own loops, not the runner's), and compares
// bit for bit.

func init() {
	moreScenarios["norm"] = scNorm
	moreScenarios["norm-bad"] = scNormBad
}

func TestProcessesAllReduceRMSNorm(t *testing.T) {
	for _, world := range []int{2, 3} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			allOK(t, runProcs(t, "norm", world, 120*time.Second, 0))
		})
	}
}

func TestProcessesAllReduceRMSNormBadInput(t *testing.T) {
	allOK(t, runProcs(t, "norm-bad", 2, 60*time.Second, 0))
}

// normValue is element i of rank r's tensor kind (0 input, 1 residual, 2
// weight) in call n, as a value of dt: spread over a few binades, signs
// mixed, so that rounding and order show.
func normValue(dt core.DType, kind, r, i, n int) float32 {
	f := float32((r*7919+i*131+n*17+kind*1009)%2003-1001) * 0.0123
	if kind == 2 {
		f = 0.5 + float32((i*37+n)%97)/64
	}
	return wide(dt, narrow(dt, f))
}

func narrow(dt core.DType, f float32) uint32 {
	switch dt {
	case core.BFloat16:
		return uint32(coll.FloatToBF16(f))
	case core.Float16:
		return uint32(coll.FloatToF16(f))
	}
	return math.Float32bits(f)
}

func wide(dt core.DType, b uint32) float32 {
	switch dt {
	case core.BFloat16:
		return coll.BF16ToFloat(uint16(b))
	case core.Float16:
		return coll.F16ToFloat(uint16(b))
	}
	return math.Float32frombits(b)
}

// normWant is row t's residual and out (bits of dt) on rank me of world
// in call n, from the note: the all-reduce in rank order in fp32 rounded
// once; the add rounded; the squares' partial sums by octet, their tree;
// 1/sqrt(ss/hidden + eps); (residual*inv)*weight rounded.
func normWant(dt core.DType, world, me, t, hidden, n int, eps float32) (res, out []uint32) {
	res, out = make([]uint32, hidden), make([]uint32, hidden)
	rv := make([]float32, hidden)
	for i := 0; i < hidden; i++ {
		k := t*hidden + i
		acc := normValue(dt, 0, 0, k, n)
		for r := 1; r < world; r++ {
			acc = float32(acc + normValue(dt, 0, r, k, n))
		}
		a := wide(dt, narrow(dt, acc))
		res[i] = narrow(dt, float32(a+normValue(dt, 1, me, k, n)))
		rv[i] = wide(dt, res[i])
	}
	const parts = 256
	var p [parts]float32
	for o := 0; o < hidden/8; o++ {
		for e := 0; e < 8; e++ {
			x := rv[8*o+e]
			sq := float32(x * x)
			p[o%parts] = float32(p[o%parts] + sq)
		}
	}
	for s := parts / 2; s >= 1; s /= 2 {
		for j := 0; j < s; j++ {
			p[j] = float32(p[j] + p[j+s])
		}
	}
	q := float32(p[0] / float32(hidden))
	inv := float32(1 / float32(math.Sqrt(float64(float32(q+eps)))))
	for i := 0; i < hidden; i++ {
		y := float32(rv[i] * inv)
		out[i] = narrow(dt, float32(y*normValue(dt, 2, me, i, n)))
	}
	return res, out
}

// normMem is a rank's memory outside the block for the calls.
type normMem struct{ residual, weight, local uintptr }

func allocNorm(a *alloc.Allocator) (m normMem, err error) {
	for _, p := range []*uintptr{&m.residual, &m.weight, &m.local} {
		if *p, err = a.Alloc(256<<10, 0); err != nil {
			return m, err
		}
	}
	return m, nil
}

// normCase runs one call: tokens x hidden of dt with algo, out where
// ("inplace", "local", "block": the block's second half), and checks
// residual and out.
func normCase(h *Handle, m normMem, dt core.DType, algo core.Algo, tokens, hidden int, where string, n int) error {
	me, w := h.Rank(), h.World()
	es := dt.Size()
	in := h.bufPtrs[me] + h.offset
	residual, weight, local := m.residual, m.weight, m.local
	for k := 0; k < tokens*hidden; k++ {
		storeBits(dt, in+uintptr(k)*es, narrow(dt, normValue(dt, 0, me, k, n)))
		storeBits(dt, residual+uintptr(k)*es, narrow(dt, normValue(dt, 1, me, k, n)))
	}
	for i := 0; i < hidden; i++ {
		storeBits(dt, weight+uintptr(i)*es, narrow(dt, normValue(dt, 2, me, i, n)))
	}
	out := uintptr(0)
	switch where {
	case "local":
		out = local
	case "block":
		out = h.bufPtrs[me] + h.bufSize/2
	}
	const eps = 1e-5
	call := fmt.Sprintf("rank %d: %s %s %d x %d out %s (call %d)", me, dt, algo, tokens, hidden, where, n)
	if err := coll.RunRMSNorm(h, coll.NormArgs{DType: dt, Algo: algo, Tokens: uintptr(tokens), Hidden: uintptr(hidden),
		Residual: residual, Weight: weight, Out: out, Eps: eps}); err != nil {
		return fmt.Errorf("%s: %w", call, err)
	}
	if out == 0 {
		out = in
	}
	for t := 0; t < tokens; t++ {
		res, want := normWant(dt, w, me, t, hidden, n, eps)
		for i := 0; i < hidden; i++ {
			off := uintptr(t*hidden+i) * es
			if got := loadBits(dt, residual+off); got != res[i] {
				return fmt.Errorf("%s: residual[%d][%d] is %#x, want %#x", call, t, i, got, res[i])
			}
			if got := loadBits(dt, out+off); got != want[i] {
				return fmt.Errorf("%s: out[%d][%d] is %#x (%g), want %#x (%g)", call, t, i, got, wide(dt, got), want[i], wide(dt, want[i]))
			}
		}
	}
	return nil
}

func scNorm(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 1<<20)
	if err != nil {
		return err
	}
	defer done()
	m, err := allocNorm(a)
	if err != nil {
		return err
	}
	n := 0
	for _, dt := range []core.DType{core.BFloat16, core.Float16, core.Float32} {
		for _, shape := range [][2]int{{1, 8}, {3, 40}, {2, 2048 + 8}, {1, coll.NormMaxHidden}} {
			for _, where := range []string{"inplace", "local", "block"} {
				algos := []core.Algo{core.AlgoAuto, core.AlgoLowLatency, core.AlgoOneShot}
				if where != "local" {
					algos = append(algos, core.AlgoTwoShot)
				}
				for _, algo := range algos {
					n++
					if err := normCase(h, m, dt, algo, shape[0], shape[1], where, n); err != nil {
						return err
					}
				}
			}
		}
	}
	return nil
}

// scNormBad: every bad call fails with INVALID_ARGUMENT naming the
// argument, and enqueues nothing (a good call after them meets the peers).
func scNormBad(e *rankEnv, a *alloc.Allocator) error {
	h, done, err := joinRendezvous(e, a, 64<<10)
	if err != nil {
		return err
	}
	defer done()
	in := h.bufPtrs[e.rank] + h.offset
	m, err := allocNorm(a)
	if err != nil {
		return err
	}
	res, wt := m.residual, m.weight
	good := coll.NormArgs{DType: core.BFloat16, Tokens: 2, Hidden: 64, Residual: res, Weight: wt, Eps: 1e-6}
	bad := []struct {
		what string
		mod  func(a *coll.NormArgs)
		msg  string
	}{
		{"int32", func(a *coll.NormArgs) { a.DType = core.Int32 }, "dtype int32: the norm takes bfloat16, float16 or float32"},
		{"unknown dtype", func(a *coll.NormArgs) { a.DType = 7 }, "unknown dtype 7"},
		{"unknown algo", func(a *coll.NormArgs) { a.Algo = 9 }, "unknown algorithm 9"},
		{"hidden 0", func(a *coll.NormArgs) { a.Hidden = 0 }, `hidden 0 must be a multiple of 8 in \[8, 16384\]`},
		{"hidden odd", func(a *coll.NormArgs) { a.Hidden = 12 }, "hidden 12 must be a multiple of 8"},
		{"hidden big", func(a *coll.NormArgs) { a.Hidden = 16392 }, "hidden 16392 must be"},
		{"eps NaN", func(a *coll.NormArgs) { a.Eps = float32(math.NaN()) }, "eps NaN must be finite and not negative"},
		{"eps negative", func(a *coll.NormArgs) { a.Eps = -1 }, "eps -1 must be finite"},
		{"residual NULL", func(a *coll.NormArgs) { a.Residual = 0 }, `residual \(0x0\) and weight`},
		{"weight NULL", func(a *coll.NormArgs) { a.Weight = 0 }, "must not be NULL"},
		{"residual misaligned", func(a *coll.NormArgs) { a.Residual += 2 }, "16-byte aligned"},
		{"past the buffer", func(a *coll.NormArgs) { a.Tokens = 1000 }, `1000 tokens x hidden 64 of bfloat16 \(128000 bytes\) is past the buffer`},
		{"residual on input", func(a *coll.NormArgs) { a.Residual = in }, "residual .* overlaps the input"},
		{"residual on out", func(a *coll.NormArgs) { a.Out = res + 16 }, "residual .* overlaps out"},
		{"weight on out", func(a *coll.NormArgs) { a.Weight = in + 64 }, "out .* overlaps weight"},
		{"out overlaps input", func(a *coll.NormArgs) { a.Out = in + 16 }, "overlaps the input"},
		{"two-shot out local", func(a *coll.NormArgs) { a.Out = wt + 4096; a.Algo = core.AlgoTwoShot }, "inside the rendezvoused block"},
	}
	for _, b := range bad {
		args := good
		b.mod(&args)
		err := coll.RunRMSNorm(h, args)
		if core.CodeOf(err) != core.ErrInvalidArgument || !regexp.MustCompile(b.msg).MatchString(err.Error()) {
			return fmt.Errorf("%s: got %v, want INVALID_ARGUMENT with %q", b.what, err, b.msg)
		}
	}
	// tokens 0 does nothing.
	args := good
	args.Tokens = 0
	if err := coll.RunRMSNorm(h, args); err != nil {
		return fmt.Errorf("tokens 0: %v", err)
	}
	return normCase(h, m, core.BFloat16, core.AlgoAuto, 2, 64, "inplace", 1)
}
