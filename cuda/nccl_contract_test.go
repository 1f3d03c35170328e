package cuda

// The optional interfaces core/symm finds on a group's Communicator by type
// assertion (core/symm/engine.go), repeated here so that the compiler checks
// that *NCCLComm has exactly those methods: the two packages do not import
// each other. Split returns *NCCLComm: a method returning symm.Communicator
// would need cuda to import core/symm, whose tests import cuda.

import "github.com/libsymmem/libsymmem/core"

type (
	contractReducer interface {
		AllReduce(stream core.Stream, send, recv, count uintptr, dt core.DType, op core.ReduceOp) error
		ReduceScatter(stream core.Stream, send, recv, recvCount uintptr, dt core.DType, op core.ReduceOp) error
		AllGatherTyped(stream core.Stream, send, recv, sendCount uintptr, dt core.DType) error
	}
	contractSplitter interface {
		Split(color, key int) (*NCCLComm, error)
	}
	contractCloser   interface{ Close() error }
	contractOneSided interface {
		OneSided() (ok bool, version string)
		Signal(stream core.Stream, peer, slot int) error
		WaitSignal(stream core.Stream, peer, slot, count int) error
	}
	contractSignalSlots interface{ SignalSlots() int }
	contractLSATeam     interface {
		LSAPeers() (peers []int, ok bool, err error)
	}
)

var (
	_ contractReducer     = (*NCCLComm)(nil)
	_ contractSplitter    = (*NCCLComm)(nil)
	_ contractCloser      = (*NCCLComm)(nil)
	_ contractOneSided    = (*NCCLComm)(nil)
	_ contractSignalSlots = (*NCCLComm)(nil)
	_ contractLSATeam     = (*NCCLComm)(nil)
)
