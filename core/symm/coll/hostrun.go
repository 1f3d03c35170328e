package coll

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// The host reference runner: the kernels' protocol (barriers on the pads'
// sets, the argument agreement, the same reductions in the same order) on
// the calling thread, over CPU memory.

// hostBarrier is a barrier on set (Note [Pad partition] in core).
func (l local) hostBarrier(set int, deadline time.Time) error {
	me, w := l.rank, l.world
	mark := core.InterruptMark()
	for i := 1; i < w; i++ {
		atomic.AddUint32(l.setWord((me+i)%w, set, me), 1)
	}
	for i := 1; i < w; i++ {
		p := (me + w - i) % w
		seen := l.setWord(me, set, w+p)
		n := atomic.LoadUint32(seen) + 1
		arr := l.setWord(me, set, p)
		sleep := time.Microsecond
		var checked time.Time
		for k := 0; !core.Reached(atomic.LoadUint32(arr), n); k++ {
			switch {
			case k < 200:
			case k < 400:
				runtime.Gosched()
			default:
				if err := l.h.port.WaitCut(mark, fmt.Sprintf("collective's barrier (device set %d)", set)); err != nil {
					l.stop(core.DevFlag(core.DevCausePeerExited, l.global(me), set))
					return err
				}
				now := time.Now()
				if err := l.h.port.CollectivesStopped(); err != nil { // a peer gave up: it will not arrive
					// The rank we wait for may be why (it exited): say so
					// rather than that a peer gave up.
					var never time.Time
					exited := l.h.port.PeerExited(l.global(p), now, &never, fmt.Sprintf("rank %d's collective (device set %d)", l.global(me), set))
					if exited != nil && !core.Reached(atomic.LoadUint32(arr), n) {
						atomic.CompareAndSwapUint32(l.regionWord(me, 0), 0, core.DevFlag(core.DevCausePeerExited, l.global(p), set))
						return exited
					}
					return err
				}
				if !now.Before(deadline) {
					flag := core.DevFlag(core.DevCauseTimeout, p, set)
					atomic.CompareAndSwapUint32(l.regionWord(me, 0), 0, flag)
					l.stop(flag)
					return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v in a collective's barrier (device set %d): rank %d never arrived; the group's collectives are stopped (abort and destroy the group, then create a new one)",
						l.h.GroupName, l.global(me), l.h.Timeout, set, l.global(p))
				}
				exited := l.h.port.PeerExited(l.global(p), now, &checked, fmt.Sprintf("rank %d's collective (device set %d)", l.global(me), set))
				if exited != nil && !core.Reached(atomic.LoadUint32(arr), n) {
					atomic.CompareAndSwapUint32(l.regionWord(me, 0), 0, core.DevFlag(core.DevCausePeerExited, l.global(p), set))
					l.stop(core.DevFlag(core.DevCausePeerExited, l.global(p), set))
					return exited
				}
				core.Nap(sleep)
				if sleep < 100*time.Microsecond {
					sleep *= 2
				}
			}
		}
		atomic.StoreUint32(seen, n)
	}
	return nil
}

// stop records that a wait of this rank gave up with flag, whose peer is a
// rank of the view (a group rank for cause 2, as the kernels record it:
// Note [Team view]; Note [Failed collectives]): flag in our stop word, and
// that we gave up in every peer's of the view (the first failure of each
// only).
func (l local) stop(flag uint32) {
	atomic.CompareAndSwapUint32(l.regionWord(l.rank, core.DevStopWord), 0, flag)
	gaveUp := core.DevGaveUp(l.rank, int(flag>>29&3), int(flag&0xfff))
	for p := 0; p < l.world; p++ {
		if p != l.rank {
			atomic.CompareAndSwapUint32(l.regionWord(p, core.DevStopWord), 0, gaveUp)
		}
	}
}

// checkAgreement compares the arguments every peer published at the
// opening barrier on set with ours (Note [Collective agreement]); on a
// difference the error names every rank's arguments, the same on every rank,
// and peer is the first that differs.
func (l local) checkAgreement(set int, args uint64, digest uint32) (peer int, err error) {
	me, w := l.rank, l.world
	all := make([]uint64, w)
	all[me] = args
	differ := -1
	for p := 0; p < w; p++ {
		if p == me {
			continue
		}
		slot := l.argSlot(me, set, p)
		tagged := atomic.LoadUint64((*uint64)(unmanaged.Pointer(slot)))
		all[p] = atomic.LoadUint64((*uint64)(unmanaged.Pointer(slot + 8)))
		if tagged>>32 != uint64(atomic.LoadUint32(l.setWord(me, set, w+p))) {
			return p, core.Errorf(core.ErrPeer, "group %q: rank %d published no collective arguments with its arrival (device set %d)", l.h.GroupName, l.global(p), set)
		}
		if differ < 0 && (uint32(tagged) != digest || all[p] != args) {
			differ = p
		}
	}
	if differ < 0 {
		return -1, nil
	}
	return differ, core.Errorf(core.ErrMismatch, "group %q: rank %d: the ranks%s called different collectives (nothing was moved): %s",
		l.h.GroupName, l.global(me), l.text(), core.RanksByValue(w, func(r int) string { return argsText(all[r]) }))
}

// bytesAt views n bytes at addr.
func bytesAt(addr, n uintptr) []byte { return unsafe.Slice((*byte)(unmanaged.Pointer(addr)), n) }

// twoShotSlice is rank r's slice [lo, hi) of count elements of size es.
func twoShotSlice(count, es uintptr, world, r int) (lo, hi uintptr) {
	vec := 16 / es
	per := ((count+vec-1)/vec + uintptr(world) - 1) / uintptr(world) * vec
	lo, hi = min(count, uintptr(r)*per), min(count, uintptr(r+1)*per)
	return lo, hi
}

// openHost is a call's opening barrier on set with the argument
// agreement (Note [Collective agreement]): every rank publishes its
// arguments to every peer, arrives, and compares; on a difference one more
// barrier keeps the slots until every rank has read them, and the error
// names every rank's call.
func (l local) openHost(c *core.Collective, set int, deadline time.Time) error {
	me, w := l.rank, l.world
	args := argsWord(c)
	for i := 1; i < w; i++ {
		p := (me + i) % w
		n := atomic.LoadUint32(l.setWord(me, set, w+p)) + 1
		slot := l.argSlot(p, set, me)
		atomic.StoreUint64((*uint64)(unmanaged.Pointer(slot+8)), args)
		atomic.StoreUint64((*uint64)(unmanaged.Pointer(slot)), uint64(n)<<32|uint64(c.Digest))
	}
	if err := l.hostBarrier(set, deadline); err != nil {
		return err
	}
	if peer, err := l.checkAgreement(set, args, c.Digest); err != nil {
		atomic.CompareAndSwapUint32(l.regionWord(me, 0), 0, core.DevFlag(core.DevCauseMismatch, peer, set))
		// Every rank sees a difference when not all agree; one more
		// barrier keeps the slots until all have read them, and the
		// counts balanced for the next call.
		if berr := l.hostBarrier(set, deadline); berr != nil {
			return berr
		}
		return err
	}
	return nil
}

// runHost runs c on this thread (a CPU-addressable backend).
func (l local) runHost(c *core.Collective) error {
	if c.Kind == core.AllToAll {
		return l.runHostAllToAll(c)
	}
	deadline := time.Now().Add(l.h.Timeout)
	set := c.Channel * core.CollMaxBlocks
	es := c.DType.Size()
	me, w := l.rank, l.world
	input := func(r int) uintptr { return l.bufs[r] + c.InOffset }
	if c.SlicedInput {
		input = func(r int) uintptr { return l.bufs[r] + c.InOffset + uintptr(r)*c.Count*es }
	}
	if err := l.openHost(c, set, deadline); err != nil {
		return err
	}
	var store func()
	switch {
	case c.Kind == core.AllGather:
		n := c.Count * es
		tmp := make([]byte, n*uintptr(w))
		for p := 0; p < w; p++ {
			copy(tmp[uintptr(p)*n:], bytesAt(input(p), n))
		}
		store = func() { copy(bytesAt(c.Out, n*uintptr(w)), tmp) }
	case c.Kind == core.ReduceScatter:
		per := c.Count / uintptr(w)
		tmp := Reduce(c.DType, c.Op, l.bufs, c.InOffset+uintptr(me)*per*es, per)
		store = func() { copy(bytesAt(c.Out, per*es), tmp) }
	case c.Algo == core.AlgoTwoShot && !c.Pull:
		// Stores into every rank's out before the closing barrier: rank r
		// alone reads and writes slice r anywhere, so no store races a read.
		lo, hi := twoShotSlice(c.Count, es, w, me)
		tmp := Reduce(c.DType, c.Op, l.bufs, c.InOffset+lo*es, hi-lo)
		for p := 0; p < w; p++ {
			copy(bytesAt(l.bufs[p]+uintptr(c.OutOffset)+lo*es, (hi-lo)*es), tmp)
		}
	case c.Algo == core.AlgoTwoShot:
		// Note [Two-shot pulls]: slice me reduced into our own out, a
		// barrier, then every peer's reduced slice read from its out.
		out := func(r int, lo uintptr) uintptr { return l.bufs[r] + uintptr(c.OutOffset) + lo*es }
		lo, hi := twoShotSlice(c.Count, es, w, me)
		copy(bytesAt(out(me, lo), (hi-lo)*es), Reduce(c.DType, c.Op, l.bufs, c.InOffset+lo*es, hi-lo))
		if err := l.hostBarrier(set, deadline); err != nil {
			return err
		}
		for k := 1; k < w; k++ {
			q := (me + k) % w
			lo, hi := twoShotSlice(c.Count, es, w, q)
			copy(bytesAt(out(me, lo), (hi-lo)*es), bytesAt(out(q, lo), (hi-lo)*es))
		}
	default:
		tmp := Reduce(c.DType, c.Op, l.bufs, c.InOffset, c.Count)
		store = func() { copy(bytesAt(c.Out, c.Count*es), tmp) }
	}
	// One-shot in place: nobody may store before every peer has read.
	if store != nil && c.Kind == core.AllReduce && c.Out == input(me) {
		if err := l.hostBarrier(set, deadline); err != nil {
			return err
		}
		store()
		return nil
	}
	if store != nil {
		store()
	}
	return l.hostBarrier(set, deadline)
}

// Reduce reduces n elements of type dt with op at offset off of every
// block in bufs, in their order (rank order), as the kernels do (fp32
// accumulation for 16-bit types, one rounding; int32 sums wrap): the host
// reference runner's reduction.
func Reduce(dt core.DType, op core.ReduceOp, bufs []uintptr, off, n uintptr) []byte {
	es := dt.Size()
	out := make([]byte, n*es)
	if n == 0 {
		return out
	}
	if dt == core.Int32 {
		acc := make([]int32, n)
		for r, b := range bufs {
			src := unsafe.Slice((*int32)(unmanaged.Pointer(b+off)), n)
			for i, v := range src {
				if r == 0 {
					acc[i] = v
				} else {
					acc[i] = ReduceInt(op, acc[i], v)
				}
			}
		}
		copy(out, unsafe.Slice((*byte)(unsafe.Pointer(&acc[0])), n*4))
		return out
	}
	acc := make([]float32, n)
	for r, b := range bufs {
		for i := uintptr(0); i < n; i++ {
			v := LoadFloat(dt, b+off+i*es)
			if r == 0 {
				acc[i] = v
			} else {
				acc[i] = ReduceFloat(op, acc[i], v)
			}
		}
	}
	for i, v := range acc {
		PutFloat(dt, out[uintptr(i)*es:], v) // Go memory: no address arithmetic
	}
	return out
}

// ReduceInt is op on two int32 values as the kernels compute it (sums wrap).
func ReduceInt(op core.ReduceOp, a, b int32) int32 {
	switch op {
	case core.OpMax:
		return max(a, b)
	case core.OpMin:
		return min(a, b)
	}
	return a + b
}
