package symm

import (
	"errors"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"golang.org/x/sys/unix"
)

// Note [NCCL groups]
//
// A group can live on a communicator its caller owns (Options.Comm; the
// cuda package's NCCLComm is one, an ncclComm_t). Then:
//
//   - rank, world size and device are the communicator's;
//   - the group's records are all-gathered through it (commGather): copied
//     into a small staging buffer of device memory, ncclAllGather on a
//     private stream (the backend's, where it makes streams; stream 0 on the
//     host backend), waited for with the group's timeout. On expiry the
//     rendezvous fails with ErrTimeout and the group is broken: the
//     communicator is left to its owner (who may abort it: a dead peer leaves
//     NCCL's kernel spinning), the staging buffer is deliberately leaked
//     since the GPU may still write it. File descriptors still travel over
//     the Unix socket channel, as in every group.
//   - every rendezvous registers the segment that holds the buffer as an
//     NCCL symmetric window (NCCL_WIN_COLL_SYMMETRIC), unless
//     Options.NoWindows: whole segments, whose addresses and sizes are
//     multiples of the backend granularity (2 MiB on cuda, so NCCL's
//     4096-byte rule holds), of cuMem memory with POSIX-fd handles, as NCCL
//     requires. Registration is collective, so whether it is needed is
//     decided from the rendezvous records (blockRecord.winHeld), the same on
//     every rank: it happens once per (segment, group), and a rendezvous on
//     a segment that every rank has registered costs no NCCL call. Where a
//     rank holds a window and another does not (its segment was released
//     and made again), the holder deregisters its window first, so that no
//     memory is ever registered twice.
//   - a window is deregistered before its segment's memory is released (an
//     allocator release hook, after the device is synchronised), or when the
//     group is destroyed, whichever comes first; never twice. Deregistration
//     is local (as torch's NCCL backend does it when a tensor dies): destroy
//     the group before the communicator, since deregistering needs it.
//   - with NCCL >= 2.29 (Communicator.PeerPointer reports ok), the
//     rendezvous checks that NCCL's view of every peer's window (its host
//     peer pointer) holds the same bytes as our mapping of that peer's block;
//     a peer NCCL cannot reach by load/store (pointer 0) is skipped.
//
// Registration is never the first operation on the communicator: the group
// all-gathers its member records through it first. That is the workaround of
// pytorch issue 188567 (window registration as the first NCCL call on a
// communicator fails), here by construction.

// streamMaker is implemented by backends that make streams (cuda).
type streamMaker interface {
	NewStream(device int) (core.Stream, error)
	DestroyStream(device int, s core.Stream) error
	Synchronize(device int, s core.Stream) error
}

// syncStream waits for the work on the gatherer's stream: the stream alone
// where the backend makes streams, else the device (the host backend's
// work is done when its calls return).
func (cg *commGather) syncStream() error {
	if cg.sm != nil {
		return cg.sm.Synchronize(cg.dev, cg.stream)
	}
	return cg.be.SynchronizeDevice(cg.dev)
}

// commGather all-gathers a group's records through a Communicator.
type commGather struct {
	comm    Communicator
	be      core.Backend
	dev     int
	name    string
	timeout time.Duration

	mu     lockrank.Mutex[lockrank.CommGather]
	stream core.Stream
	sm     streamMaker // nil: stream 0
	// dbuf is device staging (send bytes then world*send bytes), hbuf the
	// same size of host memory outside Go's heap; size their size.
	dbuf, hbuf uintptr
	dmem       core.Memory
	size       uintptr
	// broken is set when a collective did not finish in time: nothing may
	// use the staging buffer or the stream again.
	broken error
}

func newCommGather(comm Communicator, be core.Backend, dev int, name string, timeout time.Duration) (*commGather, error) {
	cg := &commGather{comm: comm, be: be, dev: dev, name: name, timeout: timeout}
	if sm, ok := be.(streamMaker); ok {
		s, err := sm.NewStream(dev)
		if err != nil {
			return nil, err
		}
		cg.stream, cg.sm = s, sm
	}
	return cg, nil
}

// bounded runs fn on another goroutine and waits for it for the timeout.
// On expiry the gatherer is broken (fn may still be running).
func (cg *commGather) bounded(what string, fn func() error) error {
	done := make(chan error, 1)
	go func() { done <- fn() }()
	t := time.NewTimer(cg.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		cg.broken = core.Errorf(core.ErrTimeout,
			"group %q: %s over %s did not finish within %v: a rank died or did not make the same call. The communicator is left to its owner (abort it: ncclCommAbort); this group cannot be used any more",
			cg.name, what, cg.comm.Describe(), cg.timeout)
		return cg.broken
	}
}

// ensure makes the staging buffers at least n bytes (mu held).
func (cg *commGather) ensure(n uintptr) error {
	if n <= cg.size {
		return nil
	}
	cg.freeBuffers()
	gran, err := cg.be.Granularity(cg.dev)
	if err != nil {
		return err
	}
	size := roundUp(max(n, 64<<10), gran)
	addr, m, err := core.CreateMapped(cg.be, cg.dev, size)
	if err != nil {
		return err
	}
	h, err := unix.MmapPtr(-1, 0, nil, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		core.UnmapRelease(cg.be, cg.dev, addr, size, m)
		return core.Errorf(core.ErrOutOfMemory, "host staging of %d bytes: %v", size, err)
	}
	cg.dbuf, cg.dmem, cg.hbuf, cg.size = addr, m, uintptr(h), size
	return nil
}

// freeBuffers releases the staging buffers (mu held; the stream is idle).
func (cg *commGather) freeBuffers() error {
	if cg.size == 0 {
		return nil
	}
	err := errors.Join(cg.syncStream(), cg.be.Unmap(cg.dev, cg.dbuf, cg.size),
		cg.be.Release(cg.dmem), cg.be.Unreserve(cg.dev, cg.dbuf, cg.size), unix.MunmapPtr(unmanaged.Pointer(cg.hbuf), cg.size))
	cg.size = 0
	return err
}

// allGather is the group's FuncExchange function: len(send) bytes from every
// rank into recv.
func (cg *commGather) allGather(send, recv []byte) error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.broken != nil {
		return cg.broken
	}
	n := uintptr(len(send))
	world := uintptr(cg.comm.World())
	if uintptr(len(recv)) != n*world {
		return core.Errorf(core.ErrInternal, "group %q: all-gather of %d bytes into %d", cg.name, n, len(recv))
	}
	if n == 0 {
		return nil
	}
	if err := cg.ensure(n * (world + 1)); err != nil {
		return core.Errorf(core.CodeOf(err), "group %q: staging memory for the all-gather over %s: %v", cg.name, cg.comm.Describe(), err)
	}
	host := unsafe.Slice((*byte)(unmanaged.Pointer(cg.hbuf)), cg.size)
	copy(host, send)
	if err := cg.be.Copy(cg.dev, cg.stream, cg.dbuf, cg.hbuf, n); err != nil {
		return err
	}
	err := cg.bounded("an all-gather of records", func() error {
		if err := cg.comm.AllGather(cg.stream, cg.dbuf, cg.dbuf+n, n); err != nil {
			return err
		}
		return cg.syncStream()
	})
	if err != nil {
		return err
	}
	if err := cg.be.Copy(cg.dev, cg.stream, cg.hbuf+n, cg.dbuf+n, n*world); err != nil {
		return err
	}
	copy(recv, host[n:n+n*world])
	return nil
}

// stage lends the staging buffers, n bytes or more of device memory (dev)
// and as many of host memory outside Go's heap (host), to a call that
// uses them on its own stream and waits for that use before done; done
// ends the loan, and with an error marks the gatherer broken (a wait for
// the GPU timed out: it may still write the buffers, which are then
// leaked at close).
func (cg *commGather) stage(n uintptr) (dev, host uintptr, done func(broken error), err error) {
	cg.mu.Lock()
	if cg.broken != nil {
		err := cg.broken
		cg.mu.Unlock()
		return 0, 0, nil, err
	}
	if err := cg.ensure(n); err != nil {
		cg.mu.Unlock()
		return 0, 0, nil, core.Errorf(core.CodeOf(err), "group %q: staging memory of %d bytes: %v", cg.name, n, err)
	}
	return cg.dbuf, cg.hbuf, func(broken error) {
		if broken != nil {
			cg.broken = broken
		}
		cg.mu.Unlock()
	}, nil
}

// close releases the stream and staging (not after a timeout: the GPU may
// still use them, so they are leaked on purpose).
func (cg *commGather) close() error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if cg.broken != nil {
		return nil
	}
	err := cg.freeBuffers()
	if cg.sm != nil {
		err = errors.Join(err, cg.sm.DestroyStream(cg.dev, cg.stream))
		cg.sm = nil
	}
	cg.broken = core.Errorf(core.ErrInvalidState, "group %q is destroyed", cg.name)
	return err
}

// readBytes copies len(dst) bytes at addr (device memory) into dst.
func (cg *commGather) readBytes(dst []byte, addr uintptr) error {
	cg.mu.Lock()
	defer cg.mu.Unlock()
	if err := cg.ensure(uintptr(len(dst))); err != nil {
		return err
	}
	if err := cg.be.Copy(cg.dev, cg.stream, cg.hbuf, addr, uintptr(len(dst))); err != nil {
		return err
	}
	copy(dst, unsafe.Slice((*byte)(unmanaged.Pointer(cg.hbuf)), len(dst)))
	return nil
}
