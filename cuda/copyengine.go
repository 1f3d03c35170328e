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
// [Copy-engine collectives] in core/symm/coll/copyengine.go): copies on
// a stream (cuMemcpyAsync between this device's memory and the peers'
// mapped blocks: the copy engines move them, no kernel), the local
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

// CopyAsync is core.CopyEngineRunner: a copy of n bytes from src to dst
// enqueued on s (cuMemcpyAsync).
func (b *Backend) CopyAsync(dev int, s core.Stream, dst, src, n uintptr) error {
	d, err := b.device(dev)
	if err != nil || n == 0 {
		return err
	}
	return check(C.smcu_copy_async(d.ctx, C.uintptr_t(s), C.ulonglong(dst), C.ulonglong(src), C.size_t(n)), dev)
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
