package symm

import (
	"github.com/libsymmem/libsymmem/core"
)

const recFabric = 5 // fabric handles between the machines of a team

// fabricRecord carries a rank's fabric handles (Note [Fabric teams]): its
// signal pad's, and its segments' by heap offset.
type fabricRecord struct {
	status status
	pad    []byte
	segs   map[uint64][]byte
}

func (f *fabricRecord) encode() []byte {
	var w writer
	w.header(recFabric, f.status)
	w.str(string(f.pad))
	w.u32(uint32(len(f.segs)))
	for off, h := range f.segs {
		w.u64(off)
		w.str(string(h))
	}
	return w.b
}

func decodeFabric(p []byte) (f fabricRecord, err error) {
	r := reader{b: p}
	f.status = r.header(recFabric)
	f.pad = []byte(r.str())
	n := int(r.u32())
	if n > len(p)/12 {
		return f, errShort
	}
	f.segs = map[uint64][]byte{}
	for i := 0; i < n && r.err == nil; i++ {
		off := r.u64()
		f.segs[off] = []byte(r.str())
	}
	return f, r.err
}

// fabricGather all-gathers fabric handles (Note [Fabric teams]); made by
// every rank of a group where g.fabricSpan, whatever its own state.
// exportPad: this rank sends its pad's handle; segs: the segments whose
// handles it sends (addresses by heap offset). localErr, if set, is sent
// instead of handles. It returns every rank's record, or the exchange's
// failure.
func (g *Group) fabricGather(localErr error, exportPad bool, segs map[uint64]uintptr) ([]fabricRecord, error) {
	rec := fabricRecord{segs: map[uint64][]byte{}}
	fb, ok := g.be.(fabricBackend)
	if localErr == nil && !ok && (exportPad || len(segs) > 0) {
		localErr = core.Errorf(core.ErrInternal, "rank %d: the %s backend makes no fabric handles", g.rank, g.be.Name())
	}
	if localErr == nil && exportPad {
		var err error
		if rec.pad, err = fb.ExportFabric(g.gm.pads.current().own); err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: exporting its signal pad as a fabric handle: %v", g.rank, err)
		}
	}
	for off, addr := range segs {
		if localErr != nil {
			break
		}
		err := g.alloc.ExportSegmentWith(addr, func(m core.Memory) error {
			h, err := fb.ExportFabric(m)
			rec.segs[off] = h
			return err
		})
		if err != nil {
			localErr = core.Errorf(core.CodeOf(err), "rank %d: exporting its segment at heap offset %#x as a fabric handle: %v", g.rank, off, err)
		}
	}
	if localErr != nil {
		rec = fabricRecord{status: statusOf(localErr)}
	}
	raw, err := g.ex.AllGather(0, rec.encode())
	if err != nil {
		return nil, err
	}
	recs := make([]fabricRecord, g.world)
	for r := range raw {
		if recs[r], err = decodeFabric(raw[r]); err != nil {
			return nil, core.Errorf(core.ErrPeer, "group %q: rank %d sent a malformed fabric record: %v", g.name, r, err)
		}
	}
	return recs, nil
}

// importMapFabric is importMap for a fabric handle.
func (gm *groupMem) importMapFabric(h []byte, size uintptr, what string) (addr uintptr, mem core.Memory, err error) {
	fb, ok := gm.be.(fabricBackend)
	if !ok {
		return 0, 0, core.Errorf(core.ErrInternal, "%s: the %s backend imports no fabric handles", what, gm.be.Name())
	}
	if mem, err = fb.ImportFabric(gm.device, h); err != nil {
		return 0, 0, err
	}
	return gm.mapImported(mem, size, what)
}
