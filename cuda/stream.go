package cuda

/*
#include "shim.h"
*/
import "C"

import (
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
)

// Synchronize waits for the work queued on stream s (cuStreamSynchronize).
func (b *Backend) Synchronize(dev int, s core.Stream) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return b.bounded(dev, flightKey{dev, "cuStreamSynchronize", s}, func() C.smcu_status {
		return C.smcu_stream_synchronize(d.ctx, C.uintptr_t(s))
	})
}

// SynchronizeDevice waits for all work in the device's primary context
// (cuCtxSynchronize).
func (b *Backend) SynchronizeDevice(dev int) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return b.bounded(dev, flightKey{dev, "cuCtxSynchronize", 0}, func() C.smcu_status { return C.smcu_ctx_synchronize(d.ctx) })
}

// flightKey names one kind of synchronisation: at most one call per key is
// in the driver at a time (Note [Bounded waits]).
type flightKey struct {
	dev    int
	what   string
	stream core.Stream
}

// flight is a synchronisation call running in the driver.
type flight struct {
	done chan struct{} // closed when the call returns
	err  error         // its result, set before done is closed
}

// Note [Bounded waits]
//
// The driver's synchronisation calls cannot be cancelled, and a stream
// blocked on a signal from a peer that died never drains: cuCtxSynchronize
// would wait for ever. bounded runs such a call on a goroutine of its own
// and gives up on it after b.syncTimeout with ErrTimeout; the abandoned call
// stays in the driver, holding its OS thread, until the device drains.
// Calls are single-flight per (device, call, stream): a caller that finds
// the same call still in the driver (abandoned by an earlier caller) waits
// for it, within its own deadline, and then makes its own (the earlier one
// does not cover work queued since it started). So repeated timeouts on a
// stuck device hold at most one OS thread per key, not one per timeout.
// Only calls that touch no caller memory are run this way (not Copy or
// Memset, whose late completion could write into memory the caller has
// moved on from).
func (b *Backend) bounded(dev int, key flightKey, call func() C.smcu_status) error {
	return b.boundedFor(dev, key, b.syncTimeout, call)
}

func (b *Backend) boundedFor(dev int, key flightKey, timeout time.Duration, call func() C.smcu_status) error {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	waitedForOther := false
	for {
		b.flightsMu.Lock()
		if b.flights == nil {
			b.flights = map[flightKey]*flight{}
		}
		f, mine := b.flights[key], false
		if f == nil {
			f, mine = &flight{done: make(chan struct{})}, true
			b.flights[key] = f
			go func() {
				f.err = check(call(), dev)
				b.flightsMu.Lock()
				delete(b.flights, key)
				b.flightsMu.Unlock()
				close(f.done)
			}()
		}
		b.flightsMu.Unlock()
		select {
		case <-f.done:
			if mine {
				return f.err
			}
			waitedForOther = true // the earlier call ended: now ours
		case <-timer.C:
			still := ""
			if !mine && !waitedForOther {
				still = " (an earlier " + key.what + " that timed out is still waiting in the driver; this call waited for it)"
			}
			return core.Errorf(core.ErrTimeout,
				"cuda: %s on device %d did not finish within %v: work queued on the device is stuck (a stream waiting for a signal from a peer that is gone?); the wait is abandoned and the device stays busy%s (SYMMEM_TIMEOUT_MS sets the limit)",
				key.what, dev, timeout, still)
		}
	}
}

// ownStream is dev's stream for the library's own bounded work, made on
// first use: non-blocking, so work stuck on the caller's streams (or the
// legacy default stream) does not hold it up.
func (b *Backend) ownStream(d *device) (C.uintptr_t, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ownStream == 0 {
		var s C.uintptr_t
		if err := check(C.smcu_stream_create(d.ctx, &s), d.ordinal); err != nil {
			return 0, err
		}
		d.ownStream = s
	}
	return d.ownStream, nil
}

// MemsetWithin is core.BoundedMemOps: Memset on the library's own stream,
// waiting for it up to timeout (Note [Bounded waits]). After ErrTimeout the
// memset may still run: the caller must not free the memory.
func (b *Backend) MemsetWithin(dev int, addr uintptr, value byte, size uintptr, timeout time.Duration) error {
	return b.onOwnStreamWithin(dev, size, timeout, func(d *device, s C.uintptr_t) C.smcu_status {
		return C.smcu_memset_async(d.ctx, s, C.ulonglong(addr), C.uchar(value), C.size_t(size))
	})
}

// CopyWithin is core.BoundedMemOps: Copy on the library's own stream,
// waiting for it up to timeout. After ErrTimeout the copy may still run:
// the caller must not free either side.
func (b *Backend) CopyWithin(dev int, dst, src, size uintptr, timeout time.Duration) error {
	return b.onOwnStreamWithin(dev, size, timeout, func(d *device, s C.uintptr_t) C.smcu_status {
		return C.smcu_copy_async(d.ctx, s, C.ulonglong(dst), C.ulonglong(src), C.size_t(size))
	})
}

// onOwnStreamWithin enqueues op (size bytes of work; none when 0) on the
// library's own stream of dev and waits for it up to timeout.
func (b *Backend) onOwnStreamWithin(dev int, size uintptr, timeout time.Duration, op func(d *device, s C.uintptr_t) C.smcu_status) error {
	d, err := b.device(dev)
	if err != nil || size == 0 {
		return err
	}
	s, err := b.ownStream(d)
	if err != nil {
		return err
	}
	if err := check(op(d, s), dev); err != nil {
		return err
	}
	return b.boundedFor(dev, flightKey{dev, "cuStreamSynchronize", core.Stream(s)}, timeout, func() C.smcu_status {
		return C.smcu_stream_synchronize(d.ctx, s)
	})
}

var _ core.BoundedMemOps = (*Backend)(nil)

// FillOrCopyWithin is core.BatchMemOps: every op queued in order on the
// library's own stream (cuMemsetD8Async, cuMemcpyAsync), then one wait for
// them all, up to timeout. An op the driver refuses stops the queueing; the
// ops queued before it are waited for, and its error is returned, unless
// that wait fails: then the wait's error, naming the refusal too, so that a
// timeout still tells the caller that those ops may run on (and write into
// memory it must keep).
func (b *Backend) FillOrCopyWithin(dev int, ops []core.FillOrCopy, timeout time.Duration) error {
	d, err := b.device(dev)
	if err != nil || len(ops) == 0 {
		return err
	}
	s, err := b.ownStream(d)
	if err != nil {
		return err
	}
	var opErr error
	for _, op := range ops {
		if op.Size == 0 {
			continue
		}
		var st C.smcu_status
		if op.Fill {
			st = C.smcu_memset_async(d.ctx, s, C.ulonglong(op.Dst), C.uchar(op.Value), C.size_t(op.Size))
		} else {
			st = C.smcu_copy_async(d.ctx, s, C.ulonglong(op.Dst), C.ulonglong(op.Src), C.size_t(op.Size))
		}
		if opErr = check(st, dev); opErr != nil {
			break
		}
	}
	waitErr := b.boundedFor(dev, flightKey{dev, "cuStreamSynchronize", core.Stream(s)}, timeout, func() C.smcu_status {
		return C.smcu_stream_synchronize(d.ctx, s)
	})
	if waitErr != nil && opErr != nil {
		return core.Errorf(core.CodeOf(waitErr), "%v (queueing had stopped at an op the driver refused: %v)", waitErr, opErr)
	}
	if waitErr != nil {
		return waitErr
	}
	return opErr
}

var _ core.BatchMemOps = (*Backend)(nil)

// StreamWait makes later work on waiter wait for the work queued on other so
// far: an event (timing disabled) recorded on other and waited for on
// waiter, in one trampoline; the event is destroyed right after the wait is
// enqueued, which the driver allows. waiter == other is a no-op.
func (b *Backend) StreamWait(dev int, waiter, other core.Stream) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_stream_wait(d.ctx, C.uintptr_t(waiter), C.uintptr_t(other)), dev)
}

// Memset sets size bytes at addr to value in stream order on s
// (cuMemsetD8Async) and waits for s.
func (b *Backend) Memset(dev int, s core.Stream, addr uintptr, value byte, size uintptr) error {
	d, err := b.device(dev)
	if err != nil || size == 0 {
		return err
	}
	return check(C.smcu_memset(d.ctx, C.uintptr_t(s), C.ulonglong(addr), C.uchar(value), C.size_t(size)), dev)
}

// Copy copies size bytes from src to dst in stream order on s
// (cuMemcpyAsync; unified addressing, so either side may be device or host
// memory) and waits for s. Host memory must not move during the call: Go
// memory must be pinned (runtime.Pinner) by the caller.
func (b *Backend) Copy(dev int, s core.Stream, dst, src uintptr, size uintptr) error {
	d, err := b.device(dev)
	if err != nil || size == 0 {
		return err
	}
	return check(C.smcu_copy(d.ctx, C.uintptr_t(s), C.ulonglong(dst), C.ulonglong(src), C.size_t(size)), dev)
}

// AllocHost returns size bytes of pinned host memory (cuMemHostAlloc,
// portable: usable with every device), for pause backups
// (core.HostMemory): copies from and to it run at the link's full speed.
func (b *Backend) AllocHost(dev int, size uintptr) (uintptr, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	var p unsafe.Pointer
	if err := check(C.smcu_host_alloc(d.ctx, C.size_t(size), &p), dev); err != nil {
		return 0, err
	}
	return uintptr(p), nil
}

// FreeHost frees memory from AllocHost (cuMemFreeHost).
func (b *Backend) FreeHost(dev int, addr, size uintptr) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_host_free(d.ctx, unmanaged.Pointer(addr)), dev)
}

// WriteValue32 enqueues on s a store of v at addr, ordered after the work
// before it (cuStreamWriteValue32_v2, flags 0: with a memory barrier). addr
// may be device memory, including a peer's mapped memory.
func (b *Backend) WriteValue32(dev int, s core.Stream, addr uintptr, v uint32) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_write_value32(d.ctx, C.uintptr_t(s), C.ulonglong(addr), C.uint32_t(v)), dev)
}

// WaitValue32 enqueues on s a wait until the 32-bit word at addr equals v
// (cuStreamWaitValue32_v2 with CU_STREAM_WAIT_VALUE_EQ) and returns without
// waiting. timeout is not enforced: the GPU has no timeout for the wait, so
// s stays blocked until the value arrives; apply the timeout to the
// host-side wait that follows (Note [streams]).
func (b *Backend) WaitValue32(dev int, s core.Stream, addr uintptr, v uint32, timeout time.Duration) error {
	_ = timeout
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	return check(C.smcu_wait_value32(d.ctx, C.uintptr_t(s), C.ulonglong(addr), C.uint32_t(v)), dev)
}

// StreamMemOps enqueues ops on s in order with cuStreamBatchMemOp_v2, up to
// SMCU_MAX_BATCH operations per driver call; waits are CU_STREAM_WAIT_VALUE_EQ
// (AtLeast: CU_STREAM_WAIT_VALUE_GEQ) and, as in WaitValue32, not bounded by
// timeout on the GPU.
func (b *Backend) StreamMemOps(dev int, s core.Stream, ops []core.MemOp, timeout time.Duration) error {
	_ = timeout
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	buf := make([]C.smcu_memop, len(ops))
	for i, op := range ops {
		buf[i] = C.smcu_memop{addr: C.ulonglong(op.Addr), value: C.uint32_t(op.Value)}
		switch {
		case op.Wait && op.AtLeast:
			buf[i].wait = 2
		case op.Wait:
			buf[i].wait = 1
		}
	}
	for len(buf) > 0 {
		n := min(len(buf), C.SMCU_MAX_BATCH)
		if err := check(C.smcu_batch_memops(d.ctx, C.uintptr_t(s), &buf[0], C.int(n)), dev); err != nil {
			return err
		}
		buf = buf[n:]
	}
	return nil
}

// WriteWordsWithin is core.WordWriter: the words stored by the GPU
// (cuStreamBatchMemOp writes, up to SMCU_MAX_BATCH a call) on the library's
// own stream, waited for up to timeout.
func (b *Backend) WriteWordsWithin(dev int, ops []core.MemOp, timeout time.Duration) error {
	buf := make([]C.smcu_memop, len(ops))
	for i, op := range ops {
		if op.Wait {
			return core.Errorf(core.ErrInvalidArgument, "cuda: WriteWordsWithin on device %d: op %d is a wait", dev, i)
		}
		buf[i] = C.smcu_memop{addr: C.ulonglong(op.Addr), value: C.uint32_t(op.Value)}
	}
	return b.onOwnStreamWithin(dev, uintptr(4*len(ops)), timeout, func(d *device, s C.uintptr_t) C.smcu_status {
		for rest := buf; len(rest) > 0; {
			n := min(len(rest), C.SMCU_MAX_BATCH)
			if st := C.smcu_batch_memops(d.ctx, s, &rest[0], C.int(n)); st.res != C.SM_CUDA_SUCCESS {
				return st
			}
			rest = rest[n:]
		}
		return C.smcu_status{}
	})
}

var _ core.WordWriter = (*Backend)(nil)

// NewStream creates a non-blocking stream (CU_STREAM_NON_BLOCKING: it does
// not synchronise with the legacy default stream) in dev's primary context.
// Not part of core.Backend: for tests, benchmarks and C programs that have
// no stream of their own. Destroy it with DestroyStream.
func (b *Backend) NewStream(dev int) (core.Stream, error) {
	d, err := b.device(dev)
	if err != nil {
		return 0, err
	}
	var s C.uintptr_t
	if err := check(C.smcu_stream_create(d.ctx, &s), dev); err != nil {
		return 0, err
	}
	return core.Stream(s), nil
}

// DestroyStream destroys a stream made by NewStream (cuStreamDestroy); work
// already queued on it still completes.
func (b *Backend) DestroyStream(dev int, s core.Stream) error {
	d, err := b.device(dev)
	if err != nil {
		return err
	}
	if s == 0 {
		return core.Errorf(core.ErrInvalidArgument, "cuda: DestroyStream on device %d: the default stream cannot be destroyed", dev)
	}
	return check(C.smcu_stream_destroy(d.ctx, C.uintptr_t(s)), dev)
}
