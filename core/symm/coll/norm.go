package coll

import (
	"fmt"
	"math"

	"github.com/libsymmem/libsymmem/core"
)

// Note [All-reduce with RMSNorm]
//
// The step that ends a tensor-parallel decode layer: with the input x
// (tokens rows of hidden elements at the rendezvous offset of every rank),
// this rank's residual (read and written) and weight (hidden elements),
// all of the call's dtype (bf16, fp16 or fp32):
//
//	a        = all_reduce(x)                the all-reduce of Note
//	                                        [Collectives]: fp32 sums in rank
//	                                        order, rounded once to the dtype
//	residual = round(a + residual)          one fp32 add per element, rounded
//	ss       = sum of residual^2 over a row fp32, in the order below
//	inv      = 1 / sqrt(ss / hidden + eps)  three fp32 operations, each
//	                                        correctly rounded (IEEE division
//	                                        and square root, not rsqrt)
//	out      = round((residual * inv) * weight)  two fp32 products, rounded
//	                                        once to the dtype at the end
//
// where residual in ss and out is the rounded value stored in residual. No
// operation is fused (each product and sum rounds to fp32 on its own).
// The order of ss: a row is cut into octets of 8 elements (hidden is a
// multiple of 8); partial j (j < NormParts = 256) is the sum, octet by
// octet in ascending order over octets o with o % 256 == j, element by
// element inside each octet, of x*x (each product rounded, then added);
// then for s = 128, 64, ..., 1 partial[j] += partial[j+s] for j < s, and
// ss is partial[0]. The kernels run a row on one block of 256 threads
// (thread j holds partial j, a tree in shared memory); the host backend
// computes the same sequence (hostAddNorm), so both give the same bits,
// and every rank computes the same a, hence the same residual and out
// when the residuals and weights were equal.
//
// Two forms. Small calls (the input's bytes fit the low-latency buffers:
// Note [Low-latency collectives]; channel 0, cuda) run as one kernel on
// the low-latency path: each block owns whole rows, sends their lines into
// every peer's buffer as the other low-latency collectives of channel 0 do
// (same lines, parities, call counter and argument agreement, whose digest
// here also covers hidden), and once a row's lines from every peer have
// arrived reduces them with its own input, adds, norms and stores, all in
// the one kernel. Other calls run the all-reduce (auto, one-shot or
// two-shot: algo chooses as for all_reduce) into out and then one kernel
// that adds and norms over out (the host backend: the all-reduce, then
// hostAddNorm on this thread). out may be the input (in place) or memory
// that overlaps none of input, residual and weight; residual overlaps none
// of input, out and weight.

// NormMaxHidden is the largest hidden size of an all-reduce with RMSNorm
// (a row's octets per thread stay few at 256 threads).
const NormMaxHidden = 16384

// NormParts is the number of partial sums of squares a row is cut into
// (the kernels' threads per block; Note [All-reduce with RMSNorm]).
const NormParts = 256

// NormArgs is one all-reduce with RMSNorm.
type NormArgs struct {
	DType            core.DType
	Algo             core.Algo
	Tokens, Hidden   uintptr
	Residual, Weight uintptr
	// Out is this rank's output; 0 means in place (the input).
	Out uintptr
	// In is this rank's input when it is not at the rendezvous pointer (0:
	// it is there); only the fused low-latency call takes such an input
	// (Note [Inputs outside the block]).
	In     uintptr
	Eps    float32
	Stream core.Stream
}

// RunRMSNorm checks a and runs it over the handle behind p (Note [All-reduce with
// RMSNorm]): one kernel on the low-latency path where it fits, else the
// all-reduce and then the add and the norm. On an error of the checks
// nothing ran.
func RunRMSNorm(p Port, a NormArgs) error {
	leave, err := p.Enter()
	if err != nil {
		return err
	}
	defer leave()
	h := &target{p.Symmetric(), p}
	c, ar, err := planNorm(h, a)
	if err != nil || c == nil {
		return err
	}
	if c.Algo == core.AlgoLowLatency {
		return wholeGroup(h).run(c, a.Stream)
	}
	if err := runEntered(h, ar); err != nil {
		return err
	}
	be, device := h.Backend, h.Device
	if launcher, ok := be.(core.CollectiveLauncher); ok {
		return launcher.LaunchCollective(device, a.Stream, c)
	}
	if !be.Capabilities().StreamSignals {
		hostAddNorm(c)
		return nil
	}
	return core.Errorf(core.ErrUnavailable, "group %q: the backend runs no collectives (it launches no kernels and its memory is not the CPU's)", h.GroupName)
}

// planNorm validates a and resolves it: c is the fused low-latency call,
// or the add and norm that follow the all-reduce ar; c nil: tokens 0,
// nothing to do.
func planNorm(h *target, a NormArgs) (c *core.Collective, ar Args, err error) {
	bad := func(format string, args ...any) (*core.Collective, Args, error) {
		return nil, Args{}, core.Errorf(core.ErrInvalidArgument, "group %q: all_reduce_rmsnorm: "+format, append([]any{h.GroupName}, args...)...)
	}
	switch {
	case !a.DType.Valid():
		return bad("unknown dtype %d (known: %s)", int32(a.DType), core.Known[core.DType]())
	case a.DType == core.Int32:
		return bad("dtype int32: the norm takes bfloat16, float16 or float32")
	case !a.Algo.Valid():
		return bad("unknown algorithm %d (known: %s)", int32(a.Algo), core.Known[core.Algo]())
	case a.Hidden == 0 || a.Hidden > NormMaxHidden || a.Hidden%8 != 0:
		return bad("hidden %d must be a multiple of 8 in [8, %d]", a.Hidden, NormMaxHidden)
	case math.IsNaN(float64(a.Eps)) || math.IsInf(float64(a.Eps), 0) || a.Eps < 0:
		return bad("eps %g must be finite and not negative", a.Eps)
	case a.Tokens == 0:
		return nil, Args{}, nil
	case a.Residual == 0 || a.Weight == 0:
		return bad("residual (%#x) and weight (%#x) must not be NULL", a.Residual, a.Weight)
	case a.Residual%16 != 0 || a.Weight%16 != 0:
		return bad("residual %#x and weight %#x must be 16-byte aligned (the kernels move 16 bytes at a time)", a.Residual, a.Weight)
	}
	es := a.DType.Size()
	in := h.Buffers[h.Rank] + h.Offset
	outside := a.In != 0 && a.In != in // Note [Inputs outside the block]
	if outside {
		if a.Tokens > core.LowLatencyMaxBytes/es/a.Hidden {
			return bad("the input %#x is outside the rendezvoused block, which only the fused low-latency call takes, and %d tokens x hidden %d of %s (%d bytes) are past its buffers (SYMMEM_LL_MAX_BYTES %d)",
				a.In, a.Tokens, a.Hidden, a.DType, a.Tokens*a.Hidden*es, core.LowLatencyMaxBytes)
		}
		in = a.In
	} else if a.Tokens > (h.BufferSize-h.Offset)/es/a.Hidden {
		return bad("%d tokens x hidden %d of %s (%d bytes) is past the buffer: %d bytes from the rendezvous offset %d to the block's end",
			a.Tokens, a.Hidden, a.DType, a.Tokens*a.Hidden*es, h.BufferSize-h.Offset, h.Offset)
	}
	n, row := a.Tokens*a.Hidden*es, a.Hidden*es
	out := a.Out
	if out == 0 {
		out = in
	}
	switch {
	case overlap(a.Residual, n, in, n):
		return bad("residual [%#x, +%d) overlaps the input [%#x, +%d)", a.Residual, n, in, n)
	case overlap(a.Residual, n, out, n):
		return bad("residual [%#x, +%d) overlaps out [%#x, +%d)", a.Residual, n, out, n)
	case overlap(a.Residual, n, a.Weight, row):
		return bad("residual [%#x, +%d) overlaps weight [%#x, +%d)", a.Residual, n, a.Weight, row)
	case overlap(out, n, a.Weight, row):
		return bad("out [%#x, +%d) overlaps weight [%#x, +%d)", out, n, a.Weight, row)
	}
	ar = Args{Kind: core.AllReduce, DType: a.DType, Op: core.OpSum, Algo: a.Algo, Count: a.Tokens * a.Hidden, Out: out, Stream: a.Stream}
	if a.Algo == core.AlgoLowLatency {
		ar.Algo = core.AlgoAuto // the all-reduce of the two-step form, where the fused one cannot run
	}
	norm := &core.RMSNorm{Tokens: a.Tokens, Hidden: a.Hidden, Residual: a.Residual, Weight: a.Weight, Eps: a.Eps}
	team := h.team()
	ll, why := lowLatencyFits(h, ar, n)
	fused := team == nil && h.World > 1 && ll && (a.Algo == core.AlgoAuto || a.Algo == core.AlgoLowLatency)
	if outside && !fused {
		switch {
		case team != nil:
			why = "the group spans machines"
		case h.World == 1:
			why = "a group of one rank has no low-latency buffers"
		case ll:
			why = fmt.Sprintf("algo %s runs the all-reduce apart, which reads the peers' blocks", a.Algo)
		}
		return bad("the input %#x is outside the rendezvoused block, which only the fused low-latency call takes, and it cannot run this call: %s", a.In, why)
	}
	if a.Algo == core.AlgoLowLatency && !fused && launchesKernels(h) && h.World > 1 {
		if team != nil {
			why = "the group spans machines"
		}
		return bad("low_latency cannot run this call: %s", why)
	}
	if !fused {
		// Checks the all-reduce as Run will (and fails before anything runs).
		if _, err := plan(h, ar); err != nil {
			return nil, Args{}, err
		}
		return &core.Collective{Kind: core.AllReduce, DType: a.DType, Algo: core.AlgoOneShot, Count: ar.Count, Rank: h.Rank,
			World: h.World, Out: out, OutOffset: -1, Norm: norm}, ar, nil
	}
	c, err = plan(h, Args{Kind: core.AllReduce, DType: a.DType, Op: core.OpSum, Algo: core.AlgoLowLatency, Count: ar.Count, In: a.In, Out: out})
	if err != nil {
		return nil, Args{}, err
	}
	c.Norm = norm
	c.Digest ^= argsDigest(1<<63 | uint64(a.Hidden))
	return c, ar, nil
}

// normRound is v rounded to dt and widened back.
func normRound(dt core.DType, v float32) float32 {
	switch dt {
	case core.BFloat16:
		return BF16ToFloat(FloatToBF16(v))
	case core.Float16:
		return F16ToFloat(FloatToF16(v))
	}
	return v
}

// NormRow is the add and the norm of one row (Note [All-reduce with
// RMSNorm]) in fp32: a, the all-reduce's results, and residual, both
// already of dt's values; returns the new residual and out before their
// rounding to dt (the residual's values are dt's already).
func NormRow(dt core.DType, a, residual, weight []float32, eps float32) (res, out []float32) {
	h := len(a)
	res, out = make([]float32, h), make([]float32, h)
	var parts [NormParts]float32
	for i := range a {
		res[i] = normRound(dt, float32(a[i]+residual[i]))
		sq := float32(res[i] * res[i])
		j := i / 8 % NormParts
		parts[j] = float32(parts[j] + sq)
	}
	for s := NormParts / 2; s >= 1; s /= 2 {
		for j := 0; j < s; j++ {
			parts[j] = float32(parts[j] + parts[j+s])
		}
	}
	mean := float32(parts[0] / float32(h))
	inv := float32(1 / float32(math.Sqrt(float64(float32(mean+eps)))))
	for i := range res {
		out[i] = float32(float32(res[i]*inv) * weight[i])
	}
	return res, out
}

// hostAddNorm is c's add and norm over out, which holds the all-reduce's
// result, on this thread (CPU memory).
func hostAddNorm(c *core.Collective) {
	n, dt, es := c.Norm, c.DType, c.DType.Size()
	h := int(n.Hidden)
	load := func(addr uintptr) []float32 {
		v := make([]float32, h)
		for i := range v {
			v[i] = LoadFloat(dt, addr+uintptr(i)*es)
		}
		return v
	}
	weight := load(n.Weight)
	for t := uintptr(0); t < n.Tokens; t++ {
		off := t * n.Hidden * es
		res, out := NormRow(dt, load(c.Out+off), load(n.Residual+off), weight, n.Eps)
		for i := 0; i < h; i++ {
			StoreFloat(dt, n.Residual+off+uintptr(i)*es, res[i])
			StoreFloat(dt, c.Out+off+uintptr(i)*es, out[i])
		}
	}
}
