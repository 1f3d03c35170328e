package symm

import (
	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
)

// signalCounts is one rank's count of the signals through its group's pads
// (Note [Signals] in signal.go); the group's memory holds it, every handle
// of the group and the abort share it.
type signalCounts struct {
	channels int
	// mu orders "take the next number, enqueue the operation" on the cuda
	// backend and guards sent and seen there; the host backend uses atomics
	// on seen and does not use sent.
	mu lockrank.Mutex[lockrank.SignalCounts]
	// sent[peer*channels+c]: signals put to peer on channel c;
	// seen[peer*channels+c]: signals from peer on c waited for.
	sent []uint32
	seen []uint32
	// ops and peers are the stream signals' scratch (streamSignals), used
	// under mu: the backend reads them during the call and keeps nothing.
	ops   []core.MemOp
	peers []int
}

func newSignalCounts(world, channels int) *signalCounts {
	return &signalCounts{channels: channels, sent: make([]uint32, world*channels), seen: make([]uint32, world*channels)}
}

func (c *signalCounts) index(peer, channel int) int { return peer*c.channels + channel }

// scratchOps is ops with n zeroed entries; under mu.
func (c *signalCounts) scratchOps(n int) []core.MemOp {
	if cap(c.ops) < n {
		c.ops = make([]core.MemOp, n)
	}
	c.ops = c.ops[:n]
	clear(c.ops)
	return c.ops
}
