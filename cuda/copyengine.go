package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// The copy-engine collectives' pieces (core.CopyEngineRunner; Note
// [Copy-engine collectives] in core/symm/coll/copyengine.go): copies
// beside a stream (cuMemcpyAsync between this device's memory and the
// peers' mapped blocks, each on a stream of its own: the copy engines move
// them, no kernel), the local
// reduction of the pulled chunks (one kernel of a few blocks), and
// whether a stream is being captured.

// ceReduceParamSize is sizeof(symmem_ce_reduce_params), ceMaxSources its
// SYMMEM_CE_MAX_SRCS (kernels/collectives.cu).
const (
	ceReduceParamSize = 536
	ceMaxSources      = 64
)

// ceReduceBlocks is the reduction kernel's grid (SYMMEM_CE_REDUCE_BLOCKS,
// 16): few, so that the matmul beside it keeps the other SMs.
var ceReduceBlocks = func() uint32 {
	n, err := strconv.Atoi(core.Current().Text("SYMMEM_CE_REDUCE_BLOCKS", ""))
	if err != nil || n <= 0 {
		return 16
	}
	return uint32(n)
}()

// CopiesAsync is core.CopyEngineRunner: copies[0] on s, every other copy
// on a stream of the library's own (device.copyStreams) that first waits
// for what s holds so far; then s waits for every one of those streams
// (an event recorded and waited for each way: smcu_stream_wait), so the
// copies run at once and later work on s follows all of them. Inside a
// CUDA-graph capture the waits fork the copy streams into the capture and
// join them back, as a capture needs. A failure after some copies were
// forked still joins those, so that s stays after them.
func (b *Backend) CopiesAsync(dev int, s core.Stream, copies []core.Copy) error {
	d, err := b.device(dev)
	if err != nil || len(copies) == 0 {
		return err
	}
	copyOn := func(st C.uintptr_t, c core.Copy) error {
		if c.N == 0 {
			return nil
		}
		return check(C.smcu_copy_async(d.ctx, st, C.ulonglong(c.Dst), C.ulonglong(c.Src), C.size_t(c.N)), dev)
	}
	if len(copies) == 1 {
		return copyOn(C.uintptr_t(s), copies[0])
	}
	d.sideMu.Lock()
	defer d.sideMu.Unlock()
	for len(d.copyStreams) < len(copies)-1 {
		var st C.uintptr_t
		if err := check(C.smcu_stream_create(d.ctx, &st), dev); err != nil {
			return core.Errorf(core.CodeOf(err), "cuda: a stream for copies beside the caller's on device %d: %v", dev, err)
		}
		d.copyStreams = append(d.copyStreams, st)
	}
	forked := 0
	var first error
	for i, c := range copies[1:] {
		side := d.copyStreams[i]
		if err := check(C.smcu_stream_wait(d.ctx, side, C.uintptr_t(s)), dev); err != nil {
			first = err
			break
		}
		forked++
		if err := copyOn(side, c); err != nil {
			first = err
			break
		}
	}
	if first == nil {
		first = copyOn(C.uintptr_t(s), copies[0])
	}
	for i := 0; i < forked; i++ {
		if err := check(C.smcu_stream_wait(d.ctx, C.uintptr_t(s), d.copyStreams[i]), dev); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// LaunchLocalReduce is core.CopyEngineRunner: the kernel
// symmem_ce_reduce_<dtype>_<op> over srcs into out, on s.
func (b *Backend) LaunchLocalReduce(dev int, s core.Stream, dt core.DType, op core.ReduceOp, srcs []uintptr, out, count uintptr) error {
	if len(srcs) == 0 || len(srcs) > ceMaxSources {
		return core.Errorf(core.ErrInvalidArgument, "cuda: a copy-engine reduction of %d sources (1 to %d)", len(srcs), ceMaxSources)
	}
	m, err := b.kernels(dev)
	if err != nil {
		return err
	}
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	fn, _, err := m.kernel(ceReduceKernels + reduceKernel(dt, op))
	if err != nil || count == 0 {
		return err
	}
	var p [ceReduceParamSize]byte
	le := binary.LittleEndian
	for i, a := range srcs {
		le.PutUint64(p[8*i:], uint64(a))
	}
	le.PutUint64(p[512:], uint64(out))
	le.PutUint64(p[520:], uint64(count))
	le.PutUint32(p[528:], uint32(len(srcs)))
	items := (uint64(count)*uint64(dt.Size()) + 15) / 16
	blocks := uint32(min((items+collThreads-1)/collThreads, uint64(ceReduceBlocks)))
	return check(C.smcu_launch(d.ctx, fn, C.uint(max(blocks, 1)), collThreads, C.uintptr_t(s), unsafe.Pointer(&p[0]), 0), dev)
}

// Capturing is core.CopyEngineRunner: whether s is being captured into a
// CUDA graph (cuStreamIsCapturing; false where the driver lacks it).
func (b *Backend) Capturing(dev int, s core.Stream) (bool, error) {
	d, err := b.device(dev)
	if err != nil {
		return false, err
	}
	var st C.int
	if err := check(C.smcu_stream_is_capturing(d.ctx, C.uintptr_t(s), &st), dev); err != nil {
		return false, err
	}
	return st != 0, nil
}

var _ core.CopyEngineRunner = (*Backend)(nil)
