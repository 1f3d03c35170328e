package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
)

// a2aParamSize is sizeof(symmem_a2a_params) (kernels/collectives.cu).
const a2aParamSize = 224

// packA2AParams lays all-to-all c out as symmem_a2a_params.
func packA2AParams(c *core.Collective) [a2aParamSize]byte {
	var p [a2aParamSize]byte
	le := binary.LittleEndian
	packViewInOut(p[:], c)
	layout := int32(-1)
	if v := c.V; v != nil {
		layout = int32(v.Layout)
		le.PutUint64(p[56:], uint64(v.OutRows))
		le.PutUint64(p[64:], uint64(v.RowBytes))
		le.PutUint64(p[72:], uint64(v.InSplits))
		le.PutUint64(p[80:], uint64(v.OutSplitsOffsets))
		le.PutUint64(p[88:], uint64(v.ExchangeOffset))
		le.PutUint64(p[96:], uint64(v.InRows))
		le.PutUint64(p[104:], uint64(v.MajorAlign))
		le.PutUint32(p[116:], uint32(v.Experts))
	} else {
		le.PutUint64(p[64:], uint64(c.Count*c.DType.Size())) // bytes from each rank
		le.PutUint32(p[116:], 1)
	}
	le.PutUint32(p[112:], uint32(layout))
	le.PutUint32(p[120:], uint32(c.Channel*collMaxBlocks))
	le.PutUint32(p[124:], c.Digest)
	if c.Unchecked {
		le.PutUint32(p[128:], 1)
	}
	le.PutUint64(p[216:], uint64(c.StopMirror))
	if c.V != nil && c.Algo == core.AlgoLowLatency {
		le.PutUint64(p[136:], uint64(c.LLOffset))
		le.PutUint64(p[144:], uint64(c.LLSlot))
		if c.World <= llDirectRanks && len(c.PadAddrs) >= c.World {
			for r := 0; r < c.World; r++ {
				le.PutUint64(p[152+8*r:], uint64(c.PadAddrs[r]))
			}
		}
	}
	return p
}

// a2aGrid is the all-to-all's launch geometry: blocks enough for one
// 16-byte item per thread of what out can receive, at most collBlocks, of
// collThreads threads (its scans and barriers take one block of them).
// Every rank computes the same from agreed arguments.
func a2aGrid(c *core.Collective) uint32 {
	bytes := uint64(c.Count*c.DType.Size()) * uint64(c.World)
	if v := c.V; v != nil {
		bytes = uint64(v.OutRows) * uint64(v.RowBytes)
	}
	g := (bytes/16 + collThreads - 1) / collThreads
	return uint32(max(1, min(g, collBlocks)))
}

// launchAllToAll enqueues all-to-all c on s (Note [All-to-all] in
// core/symm/coll).
func (b *Backend) launchAllToAll(m *kernelModule, d *device, dev int, s core.Stream, c *core.Collective) error {
	fn, _, err := m.kernel(allToAllKernel)
	if err != nil {
		return err
	}
	params := packA2AParams(c)
	pdl := C.int(0)
	if collPDL && m.arch >= 90 {
		pdl = 1
	}
	return check(C.smcu_launch(d.ctx, fn, C.uint(a2aGrid(c)), C.uint(collThreads), C.uintptr_t(s), unsafe.Pointer(&params[0]), pdl), dev)
}
