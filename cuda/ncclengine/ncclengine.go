// Package ncclengine presents a *cuda.NCCLComm to core/symm as a
// Communicator with the optional engine interfaces of core/symm/engine.go.
//
// One method needs it: splitter's Split returns a symm.Communicator, which
// package cuda cannot name (core/symm's tests import cuda, so cuda cannot
// import core/symm). Comm embeds the communicator, so every other method
// (AllGather, windows, peer pointers, the typed collectives, the one-sided
// signals, LSAPeers, Close) is the cuda method itself, and its Split wraps
// the child the same way, so that children split again.
package ncclengine

import (
	"github.com/libsymmem/libsymmem/core/symm"
	"github.com/libsymmem/libsymmem/cuda"
)

// Comm is a cuda.NCCLComm seen by core/symm.
type Comm struct {
	*cuda.NCCLComm
}

// New wraps c (nil stays nil).
func New(c *cuda.NCCLComm) symm.Communicator {
	if c == nil {
		return nil
	}
	return Comm{c}
}

// Split is cuda.NCCLComm.Split with the child wrapped; a rank that joins no
// child (cuda.NCCLSplitNoColor) gets (nil, nil).
func (c Comm) Split(color, key int) (symm.Communicator, error) {
	child, err := c.NCCLComm.Split(color, key)
	if err != nil || child == nil {
		return nil, err
	}
	return Comm{child}, nil
}
