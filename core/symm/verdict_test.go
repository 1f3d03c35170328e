package symm

import (
	"testing"

	"github.com/libsymmem/libsymmem/core"
)

// TestRendezvousVerdictTexts: the verdict on gathered records gives each
// mismatch's code and full message, checks the fields in order (the first
// that differs is the one reported), and passes records that agree.
func TestRendezvousVerdictTexts(t *testing.T) {
	base := func() []blockRecord {
		recs := make([]blockRecord, 3)
		for r := range recs {
			recs[r] = blockRecord{blockSize: 65536, requested: 65000, heapOff: 0x2000, segHeapOff: 0, segSize: 2 << 20,
				segID: 4, allocs: 5, frees: 1, padSize: 4096, padsReady: true, held: make([]uint64, 3), offset: 64}
		}
		return recs
	}
	cases := []struct {
		name string
		edit func(recs []blockRecord)
		code core.Code
		msg  string
	}{
		{"agree", func([]blockRecord) {}, core.Success, ""},
		{"agree apart from counters, requests, IDs and what is held", func(recs []blockRecord) {
			recs[1].allocs, recs[1].frees, recs[1].requested, recs[1].segID, recs[1].held[0] = 9, 3, 65536, 7, 5
		}, core.Success, ""},
		{"failure", func(recs []blockRecord) {
			recs[2].status = status{core.ErrInvalidArgument, "rank 2: no block"}
			recs[1].status = status{core.ErrInvalidState, "rank 1: paused"}
			recs[0].blockSize = 1
		}, core.ErrInvalidState, `group "v": rendezvous failed on rank 1: rank 1: paused (rank(s) 2 failed too)`},
		{"pad sizes", func(recs []blockRecord) { recs[2].padSize = 24; recs[1].blockSize = 1 }, core.ErrMismatch,
			`group "v": rendezvous: the signal pad sizes differ (ranks 0, 1: 4096 bytes; rank 2: 24 bytes): set the same size on every rank before the first rendezvous`},
		{"pads exchanged", func(recs []blockRecord) { recs[0].padsReady = false }, core.ErrInternal,
			`group "v": rendezvous: the ranks disagree on whether the signal pads were exchanged (ranks 1, 2: true; rank 0: false)`},
		{"block sizes", func(recs []blockRecord) { recs[1].blockSize, recs[1].requested = 131072, 131000; recs[0].heapOff = 0 }, core.ErrMismatch,
			`group "v": rendezvous on blocks of different sizes: ranks 0, 2: block of 65536 bytes; rank 1: block of 131072 bytes; every rank must pass an allocation of the same size (bytes requested: rank 0: 65000, rank 1: 131000, rank 2: 65000)`},
		{"heap offsets", func(recs []blockRecord) { recs[1].heapOff, recs[1].allocs = 0x3000, 6; recs[1].segSize = 1 }, core.ErrMismatch,
			`group "v": rendezvous on blocks at different heap offsets (ranks 0, 2: heap offset 0x2000; rank 1: heap offset 0x3000): placement diverged; every rank must make the same allocations and frees, in the same order, before a rendezvous. Allocator counters: rank 0: 5 allocs, 1 frees; rank 1: 6 allocs, 1 frees; rank 2: 5 allocs, 1 frees`},
		{"segment sizes", func(recs []blockRecord) { recs[0].segSize = 4 << 20; recs[0].offset = 0 }, core.ErrMismatch,
			`group "v": rendezvous: the blocks lie in different segments (ranks 1, 2: segment at heap offset 0x0 of 2097152 bytes; rank 0: segment at heap offset 0x0 of 4194304 bytes): placement diverged`},
		{"segment offsets", func(recs []blockRecord) { recs[2].segHeapOff = 0x200000 }, core.ErrMismatch,
			`group "v": rendezvous: the blocks lie in different segments (ranks 0, 1: segment at heap offset 0x0 of 2097152 bytes; rank 2: segment at heap offset 0x200000 of 2097152 bytes): placement diverged`},
		{"offsets", func(recs []blockRecord) { recs[1].offset = 0 }, core.ErrMismatch,
			`group "v": rendezvous on pointers at different offsets in their blocks (ranks 0, 2: offset 64; rank 1: offset 0): every rank must pass the same offset into its block`},
	}
	for _, tc := range cases {
		recs := base()
		tc.edit(recs)
		c := &rendezvousCall{g: &Group{name: "v", world: 3}, recs: recs}
		err := c.check()
		if tc.code == core.Success {
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
			}
			continue
		}
		if err == nil || core.CodeOf(err) != tc.code || err.Error() != tc.msg {
			t.Errorf("%s: got %v (code %v)\nwant %s (code %v)", tc.name, err, core.CodeOf(err), tc.msg, tc.code)
		}
	}
}
