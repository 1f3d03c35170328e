package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// normParamSize is sizeof(symmem_norm_params), normThreads
// SYMMEM_NORM_THREADS (kernels/collectives.cu), normMaxBlocks the most
// blocks of the add and norm alone.
const (
	normParamSize = collParamSize + 40
	normThreads   = 256
	normMaxBlocks = 1024
)

// launchNorm enqueues the all-reduce with RMSNorm c on s (Note [All-reduce
// with RMSNorm] in core/symm/coll/norm.go): a block per row up to
// collBlocks on the low-latency path (each block one device set), up to
// normMaxBlocks for the add and norm alone.
func (b *Backend) launchNorm(m *kernelModule, d *device, dev int, s core.Stream, c *core.Collective) error {
	fn, _, err := m.kernel(normKernels + int(c.DType))
	if err != nil {
		return err
	}
	var p [normParamSize]byte
	cp := packCollParams(c)
	copy(p[:], cp[:])
	n, le := c.Norm, binary.LittleEndian
	const at = collParamSize // the norm's fields follow the all-reduce's parameters
	le.PutUint64(p[at:], uint64(n.Residual))
	le.PutUint64(p[at+8:], uint64(n.Weight))
	le.PutUint64(p[at+16:], uint64(n.Tokens))
	le.PutUint64(p[at+24:], uint64(n.Hidden))
	le.PutUint32(p[at+32:], math.Float32bits(n.Eps))
	blocks := min(uint64(n.Tokens), normMaxBlocks)
	if c.Algo == core.AlgoLowLatency {
		blocks = min(uint64(n.Tokens), collBlocks)
	}
	pdl := C.int(0)
	if collPDL && m.arch >= 90 {
		pdl = 1
	}
	return check(C.smcu_launch(d.ctx, fn, C.uint(blocks), C.uint(normThreads), C.uintptr_t(s), unsafe.Pointer(&p[0]), pdl), dev)
}
