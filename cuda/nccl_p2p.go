package cuda

/*
#include "nccl.h"
#include "shim.h"
*/
import "C"

import (
	"fmt"

	"github.com/libsymmem/libsymmem/core"
)

// SendRecv enqueues ops on stream as one NCCL group (ncclGroupStart,
// ncclSend / ncclRecv of bytes, ncclGroupEnd): core.SendRecver. Ops of 0
// bytes are skipped.
func (c *NCCLComm) SendRecv(stream core.Stream, ops []core.P2POp) error {
	if err := c.usable("ncclSend/ncclRecv"); err != nil {
		return err
	}
	n := 0
	for _, op := range ops {
		if op.Peer < 0 || op.Peer >= c.world {
			return core.Errorf(core.ErrInvalidArgument, "nccl: a transfer with peer %d: the communicator has ranks 0..%d", op.Peer, c.world-1)
		}
		if op.Bytes > 0 && op.Addr == 0 {
			return core.Errorf(core.ErrInvalidArgument, "nccl: a transfer of %d bytes with peer %d at NULL", op.Bytes, op.Peer)
		}
		if op.Bytes > 0 {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	peers, recv := make([]C.int, 0, n), make([]C.int, 0, n)
	addrs, sizes := make([]C.ulonglong, 0, n), make([]C.size_t, 0, n)
	posted := make([]core.P2POp, 0, n)
	for _, op := range ops {
		if op.Bytes == 0 {
			continue
		}
		r := C.int(0)
		if op.Recv {
			r = 1
		}
		peers, recv = append(peers, C.int(op.Peer)), append(recv, r)
		addrs, sizes = append(addrs, C.ulonglong(op.Addr)), append(sizes, C.size_t(op.Bytes))
		posted = append(posted, op)
	}
	var failed C.int
	if r := C.smnc_send_recv(c.ctx, C.uintptr_t(c.ptr), C.uintptr_t(stream), C.int(n), &peers[0], &addrs[0], &sizes[0], &recv[0], &failed); r != 0 {
		what := fmt.Sprintf("ncclGroupEnd of %d transfers", n)
		if k := int(failed); k >= 0 && k < n {
			op, dir := posted[k], "ncclSend of %d bytes to rank %d"
			if op.Recv {
				dir = "ncclRecv of %d bytes from rank %d"
			}
			what = fmt.Sprintf(dir, op.Bytes, op.Peer)
		}
		return c.fail(what, r)
	}
	return nil
}
