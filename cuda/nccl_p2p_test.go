package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/libsymmem/libsymmem/core"
)

// SendRecv checks its transfers before NCCL sees any (Note [NCCL as the
// engine]): a peer outside the communicator or a NULL address is refused
// naming it, a group of transfers of 0 bytes posts nothing, and a
// destroyed communicator refuses every call. None of these reaches NCCL,
// so no NCCL is loaded here.
func TestSendRecvChecksItsTransfers(t *testing.T) {
	c := &NCCLComm{ptr: 0x1000, world: 2, info: NCCLInfo{Version: 22900}, owned: true}
	for _, tc := range []struct {
		op   core.P2POp
		want string
	}{
		{core.P2POp{Peer: 2, Addr: 0x2000, Bytes: 8}, "a transfer with peer 2: the communicator has ranks 0..1"},
		{core.P2POp{Peer: -1, Addr: 0x2000, Bytes: 8, Recv: true}, "a transfer with peer -1"},
		{core.P2POp{Peer: 1, Bytes: 8}, "a transfer of 8 bytes with peer 1 at NULL"},
	} {
		err := c.SendRecv(0, []core.P2POp{{Peer: 0, Addr: 0x2000, Bytes: 4}, tc.op})
		require.Equal(t, core.ErrInvalidArgument, core.CodeOf(err), "%+v: %v", tc.op, err)
		require.Contains(t, err.Error(), tc.want)
	}
	require.NoError(t, c.SendRecv(0, []core.P2POp{{Peer: 1, Bytes: 0}, {Peer: 0, Bytes: 0, Recv: true}}), "transfers of 0 bytes post nothing")
	require.NoError(t, c.SendRecv(0, nil))
	c.closed = true
	err := c.SendRecv(0, []core.P2POp{{Peer: 1, Addr: 0x2000, Bytes: 8}})
	require.Equal(t, core.ErrInvalidState, core.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "ncclSend/ncclRecv on NCCL 2.29.0 communicator 0x1000")
}
