package ipc

import (
	"encoding/binary"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// Exchange all-gathers small byte records among the ranks of a group. It is
// what a group uses for records; descriptors always travel over a Channel.
// Implementations: *Channel (the built-in Unix sockets) and FuncExchange (a
// caller's all-gather, e.g. MPI_Allgather or a torch.distributed store).
type Exchange interface {
	// AllGather contributes rec and returns every rank's record, indexed by
	// rank. Collective: every rank calls it, in the same order as its other
	// collective calls. timeout <= 0 means the group's.
	AllGather(timeout time.Duration, rec []byte) ([][]byte, error)
}

var _ Exchange = (*Channel)(nil)

// ReusingExchange is an Exchange that can hand the records back in buffers
// its caller keeps from one call to the next, so that a call that is made
// over and over (a rendezvous again on the same buffer) allocates nothing.
type ReusingExchange interface {
	Exchange
	// AllGatherInto is AllGather with the records copied into into's
	// entries (each grown as needed, so each must be a buffer of its own)
	// when into has one entry per rank; the result is then into itself,
	// valid until into is passed again. Otherwise, and where the records
	// had to take another way, the result is freshly allocated (into's
	// entries may hold bytes of the call either way).
	AllGatherInto(timeout time.Duration, rec []byte, into [][]byte) ([][]byte, error)
}

// FuncExchange adapts a caller's all-gather of equal-sized records (the
// shape of MPI_Allgather and of symmem_allgather_fn): Fn sends send
// (len(send) bytes) and fills recv with World*len(send) bytes, rank r's at
// r*len(send). Fn runs on the calling goroutine (and so, from C, on the
// calling thread). The timeout is Fn's business: we cannot interrupt it.
type FuncExchange struct {
	Rank, World int
	Fn          func(send, recv []byte) error
}

// lenMagic marks the length round so that a callback that does not really
// all-gather (a stub returning zeros, wrong sizes) is caught.
const lenMagic = 0x4c4d5953 // "SYML"

// AllGather runs two rounds of Fn: the record lengths, then the records
// padded to the longest.
func (f *FuncExchange) AllGather(_ time.Duration, rec []byte) ([][]byte, error) {
	if f.World < 1 || f.Rank < 0 || f.Rank >= f.World || f.Fn == nil {
		return nil, core.Errorf(core.ErrInvalidArgument, "callback exchange: rank %d, world %d, or no function", f.Rank, f.World)
	}
	var lb [8]byte
	binary.LittleEndian.PutUint32(lb[0:], lenMagic)
	binary.LittleEndian.PutUint32(lb[4:], uint32(len(rec)))
	lens := make([]byte, 8*f.World)
	if err := f.call(lb[:], lens, "record lengths"); err != nil {
		return nil, err
	}
	max := 0
	for r := 0; r < f.World; r++ {
		if binary.LittleEndian.Uint32(lens[8*r:]) != lenMagic {
			return nil, core.Errorf(core.ErrPeer, "callback exchange: the caller's all-gather returned garbage for rank %d (it must gather bytes_per_rank bytes from every rank into recv at rank*bytes_per_rank)", r)
		}
		n := int(binary.LittleEndian.Uint32(lens[8*r+4:]))
		if n > maxPayload {
			return nil, core.Errorf(core.ErrPeer, "callback exchange: rank %d announced a record of %d bytes", r, n)
		}
		if n > max {
			max = n
		}
	}
	if max == 0 {
		return make([][]byte, f.World), nil
	}
	send := make([]byte, max)
	copy(send, rec)
	recv := make([]byte, max*f.World)
	if err := f.call(send, recv, "records"); err != nil {
		return nil, err
	}
	out := make([][]byte, f.World)
	for r := range out {
		n := int(binary.LittleEndian.Uint32(lens[8*r+4:]))
		out[r] = recv[r*max : r*max+n : r*max+n]
	}
	return out, nil
}

func (f *FuncExchange) call(send, recv []byte, what string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = core.Errorf(core.ErrPeer, "callback exchange: the all-gather of %s panicked: %v", what, p)
		}
	}()
	if err := f.Fn(send, recv); err != nil {
		if core.CodeOf(err) == core.ErrTimeout {
			return err // a bounded all-gather (a communicator's) says what timed out
		}
		return core.Errorf(core.ErrPeer, "callback exchange: the caller's all-gather of %s failed: %v", what, err)
	}
	return nil
}
