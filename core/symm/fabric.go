package symm

import (
	"fmt"

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
		if rec.pad, err = fb.ExportFabric(g.gm.pads.own); err != nil {
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

// exchangeFabric is the fabric phase of an exchangeCall (Note [Descriptor
// exchange phases]), between the machines of a team: the pads (needPads)
// and the segment of the rendezvous where a peer of the team on another
// machine lacks it travel as fabric handles through the all-gather, and
// are mapped into the pads and fresh like descriptors. Collective where
// g.fabricSpan; it returns this rank's failure.
func (x *exchangeCall) exchangeFabric() error {
	g, info, recs, needPads, need, fresh, localErr := x.g, x.info, x.recs, x.needPads, x.need, x.fresh, x.localErr
	me := g.rank
	exportPad := false
	segs := map[uint64]uintptr{}
	for r := 0; r < g.world; r++ {
		if !g.crossTeam(me, r) {
			continue
		}
		exportPad = exportPad || needPads
		if need(r, me) {
			segs[info.Segment.HeapOff] = info.Segment.Addr
		}
	}
	frs, err := g.fabricGather(localErr, exportPad, segs)
	if err != nil {
		return err
	}
	if localErr != nil {
		return nil // ours is the failure the verdict reports
	}
	gm := g.gm
	gm.mu.Lock()
	defer gm.mu.Unlock()
	p := gm.pads
	for src := 0; src < g.world; src++ {
		if !g.crossTeam(me, src) {
			continue
		}
		f := frs[src]
		if f.status.code != core.Success {
			return core.Errorf(core.ErrPeer, "%s could not send its fabric handles: %s", g.who(src), f.status.msg)
		}
		if needPads {
			if len(f.pad) == 0 {
				return core.Errorf(core.ErrPeer, "%s sent no fabric handle for its signal pad", g.who(src))
			}
			addr, mem, err := gm.importMapFabric(f.pad, p.phys, g.who(src)+"'s signal pad (fabric handle)")
			if err != nil {
				return fmt.Errorf("mapping %s's signal pad through its fabric handle: %w", g.who(src), err)
			}
			p.addr[src], p.mem[src] = addr, mem
		}
		if need(me, src) {
			h := f.segs[info.Segment.HeapOff]
			if len(h) == 0 {
				return core.Errorf(core.ErrPeer, "%s sent no fabric handle for its segment at heap offset %#x", g.who(src), info.Segment.HeapOff)
			}
			size := uintptr(recs[src].segSize)
			addr, mem, err := gm.importMapFabric(h, size, fmt.Sprintf("%s's segment at heap offset %#x (fabric handle)", g.who(src), info.Segment.HeapOff))
			if err != nil {
				return fmt.Errorf("mapping %s's segment of %d bytes through its fabric handle: %w", g.who(src), size, err)
			}
			fresh[src] = &peerMap{key: mapKey{src, info.Segment.HeapOff}, id: recs[src].segID, addr: addr, size: size, mem: mem}
		}
	}
	return nil
}
