package symm

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// Records are what ranks all-gather. Each starts with a version and a kind
// byte, then a status (code, message: a rank's local failure, shared so that
// every rank fails the same way), then the kind's fields.
const recordVersion = 2

const (
	recMember     = 1 // at group creation: who and where this rank is
	recRendezvous = 2 // at rendezvous: the block and what we have cached
	recStatus     = 3 // after a descriptor exchange: did mapping succeed
)

type writer struct{ b []byte }

func (w *writer) u8(v uint8)   { w.b = append(w.b, v) }
func (w *writer) u32(v uint32) { w.b = binary.LittleEndian.AppendUint32(w.b, v) }
func (w *writer) u64(v uint64) { w.b = binary.LittleEndian.AppendUint64(w.b, v) }
func (w *writer) str(s string) { w.u32(uint32(len(s))); w.b = append(w.b, s...) }

type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("record too short")

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b) < n {
		r.err = errShort
		return nil
	}
	p := r.b[:n]
	r.b = r.b[n:]
	return p
}
func (r *reader) u8() uint8 {
	if p := r.take(1); p != nil {
		return p[0]
	}
	return 0
}
func (r *reader) u32() uint32 {
	if p := r.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}
func (r *reader) u64() uint64 {
	if p := r.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

// maxRecordString bounds every string in a record (messages, names): a
// peer cannot make us keep or print more.
const maxRecordString = 64 << 10

func (r *reader) str() string {
	n := r.u32()
	if r.err == nil && n > maxRecordString {
		r.err = fmt.Errorf("a string of %d bytes in a record (at most %d)", n, maxRecordString)
	}
	return string(r.take(int(n)))
}

// status is a rank's local outcome, carried in every record.
type status struct {
	code core.Code
	msg  string
}

func statusOf(err error) status {
	if err == nil {
		return status{}
	}
	return status{core.CodeOf(err), err.Error()}
}

func (w *writer) header(kind uint8, st status) {
	w.u8(recordVersion)
	w.u8(kind)
	w.u32(uint32(st.code))
	w.str(st.msg)
}

func (r *reader) header(kind uint8) status {
	if v := r.u8(); r.err == nil && v != recordVersion {
		r.err = fmt.Errorf("record version %d, this library has %d (mixed libsymmem versions)", v, recordVersion)
	}
	if k := r.u8(); r.err == nil && k != kind {
		r.err = fmt.Errorf("record kind %d where %d was expected (the ranks made collective calls in different orders)", k, kind)
	}
	return status{core.Code(r.u32()), r.str()}
}

// memberRecord says who and where a rank is.
type memberRecord struct {
	status
	pid      uint32
	backend  string
	hostname string
	bootID   string // the kernel's boot id: identifies the machine
	// simulated is SYMMEM_MACHINE_ID on that rank, "" if unset (Note
	// [Machine identity]).
	simulated string
	// fabric names the rank's NVLink domain where its device's memory
	// carries fabric handles, else "" (Note [Fabric teams]).
	fabric string
	// nonce is random: rank 0's becomes part of the job token of groups
	// whose records go through the caller's all-gather.
	nonce  [16]byte
	device int32
	uuid   string // the device's UUID where the backend knows it
	// overlap: SYMMEM_ALLOW_OVERLAPPING_DEVICES=1 is set on this rank.
	overlap bool
}

// machine is the identity the record claims.
func (m *memberRecord) machine() machineIdentity {
	return machineIdentity{hostname: m.hostname, bootID: m.bootID, simulated: m.simulated}
}

func (m *memberRecord) encode() []byte {
	var w writer
	w.header(recMember, m.status)
	w.u32(m.pid)
	w.str(m.backend)
	w.str(m.hostname)
	w.str(m.bootID)
	w.str(m.simulated)
	w.str(m.fabric)
	w.b = append(w.b, m.nonce[:]...)
	w.u32(uint32(m.device))
	w.str(m.uuid)
	if m.overlap {
		w.u8(1)
	} else {
		w.u8(0)
	}
	return w.b
}

func decodeMember(b []byte) (m memberRecord, err error) {
	r := reader{b: b}
	m.status = r.header(recMember)
	m.pid = r.u32()
	m.backend = r.str()
	m.hostname = r.str()
	m.bootID = r.str()
	m.simulated = r.str()
	m.fabric = r.str()
	copy(m.nonce[:], r.take(16))
	m.device = int32(r.u32())
	m.uuid = r.str()
	m.overlap = r.u8() != 0
	return m, r.err
}

// blockRecord describes the block a rank rendezvouses on.
type blockRecord struct {
	status
	blockSize  uint64
	requested  uint64
	offset     uint64 // ptr - block start
	heapOff    uint64
	segHeapOff uint64
	segSize    uint64
	segID      uint64
	allocs     uint64
	frees      uint64
	padSize    uint64
	padsReady  bool
	// held[p] is 1 + the ID of peer p's segment at segHeapOff that this
	// rank has mapped, 0 if none (Note [What a rendezvous costs]).
	held []uint64
	// winHeld is 1 + the segment ID of the NCCL window this rank holds for
	// its segment at segHeapOff, 0 if none (Note [NCCL groups]).
	winHeld uint64
}

func (b *blockRecord) encode() []byte { return b.appendTo(nil) }

// appendTo appends the encoded record to buf (a rendezvous reuses one).
func (b *blockRecord) appendTo(buf []byte) []byte {
	w := writer{b: buf}
	w.header(recRendezvous, b.status)
	for _, v := range [...]uint64{b.blockSize, b.requested, b.offset, b.heapOff, b.segHeapOff, b.segSize, b.segID, b.allocs, b.frees, b.padSize} {
		w.u64(v)
	}
	if b.padsReady {
		w.u8(1)
	} else {
		w.u8(0)
	}
	w.u32(uint32(len(b.held)))
	for _, v := range b.held {
		w.u64(v)
	}
	w.u64(b.winHeld)
	return w.b
}

func decodeBlock(p []byte, world int) (b blockRecord, err error) {
	err = decodeBlockInto(&b, p, world, nil)
	return b, err
}

// decodeBlockInto decodes p into *b, with b.held in held (world long) if
// given, else in a new slice.
func decodeBlockInto(b *blockRecord, p []byte, world int, held []uint64) error {
	r := reader{b: p}
	*b = blockRecord{status: r.header(recRendezvous)}
	// The fixed fields in one take (one bounds check, not one per field).
	if f := r.take(10*8 + 1 + 4); f != nil {
		le := binary.LittleEndian
		b.blockSize, b.requested, b.offset, b.heapOff, b.segHeapOff = le.Uint64(f[0:]), le.Uint64(f[8:]), le.Uint64(f[16:]), le.Uint64(f[24:]), le.Uint64(f[32:])
		b.segSize, b.segID, b.allocs, b.frees, b.padSize = le.Uint64(f[40:]), le.Uint64(f[48:]), le.Uint64(f[56:]), le.Uint64(f[64:]), le.Uint64(f[72:])
		b.padsReady = f[80] != 0
		if n := int(le.Uint32(f[81:])); n != world {
			r.err = fmt.Errorf("record for %d ranks in a group of %d", n, world)
		}
	}
	if r.err == nil {
		if len(held) != world {
			held = make([]uint64, world)
		}
		if f := r.take(8 * world); f != nil {
			b.held = held
			for i := range b.held {
				b.held[i] = binary.LittleEndian.Uint64(f[8*i:])
			}
		}
	}
	b.winHeld = r.u64()
	return r.err
}

func encodeStatus(st status) []byte {
	var w writer
	w.header(recStatus, st)
	return w.b
}

func decodeStatus(p []byte) (status, error) {
	r := reader{b: p}
	st := r.header(recStatus)
	return st, r.err
}

// firstFailure returns the error of the lowest rank whose status is a
// failure, worded the same on every rank.
func firstFailure(group, what string, sts []status) error {
	var failed []int
	for r, st := range sts {
		if st.code != core.Success {
			failed = append(failed, r)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	r := failed[0]
	msg := fmt.Sprintf("group %q: %s failed on rank %d: %s", group, what, r, sts[r].msg)
	if len(failed) > 1 {
		msg += fmt.Sprintf(" (rank(s) %s failed too)", core.RanksText(failed[1:]))
	}
	return &core.Error{Code: sts[r].code, Msg: msg}
}

// rendezvousScratch is what a rendezvous reuses from one call to the next,
// so that a rendezvous again on the same buffer allocates little beyond its
// handle: guarded by g.coll, and nothing in it outlives the call that
// filled it (the handle copies what it keeps).
type rendezvousScratch struct {
	enc    []byte        // our record, encoded
	raw    [][]byte      // every rank's record as it arrived (ipc.ReusingExchange)
	recs   []blockRecord // every rank's record, decoded
	held   []uint64      // the records' held arrays, world by world, then ours
	pinned []*peerMap    // the call's pinned peer mappings
}

// reset sizes the scratch for world ranks and clears what a call reads
// before it writes.
func (sc *rendezvousScratch) reset(world int) *rendezvousScratch {
	if len(sc.recs) != world {
		*sc = rendezvousScratch{raw: make([][]byte, world), recs: make([]blockRecord, world),
			held: make([]uint64, (world+1)*world), pinned: make([]*peerMap, world)}
	}
	clear(sc.held[world*world:])
	clear(sc.pinned)
	return sc
}
