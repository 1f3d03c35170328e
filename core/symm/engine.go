package symm

import "github.com/libsymmem/libsymmem/core"

// The engine a group may live on, and its optional capabilities, are core's
// vocabulary (Note [Engines] in core/engine.go): cuda implements them there
// without importing this package. Inside this package they go by these
// names.
type (
	// Communicator is a collective engine the caller owns (an NCCL
	// communicator); the group never destroys it.
	Communicator = core.Communicator

	reducer     = core.Reducer
	splitter    = core.Splitter
	closer      = core.Closer
	oneSided    = core.OneSided
	signalSlots = core.SignalSlotter
	lsaTeam     = core.LSATeam
)
