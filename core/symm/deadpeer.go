package symm

import (
	"encoding/binary"
	"runtime"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// peerWatch is the goroutine of Note [Dead peers] (core/ipc) on backends
// whose waits run on the device: it sleeps in poll(2) on the peers' pidfds
// and, when one exits, writes the abort word of this rank's device region
// (Note [Pad partition] in core), which the kernels' waits read.
type peerWatch struct {
	stop int // an eventfd: readable once stopWatch asks the goroutine to end
	done chan struct{}
}

// watchPeers starts the watch on the device region at region (this rank's
// pad + pad size), where the backend's signals and collectives run on
// streams; nothing on the host backend, whose waits check for themselves.
func (gm *groupMem) watchPeers(region uintptr) {
	if gm.live == nil || gm.world == 1 || !gm.be.Capabilities().StreamSignals {
		return
	}
	gm.stopWatch() // pads made again: the region moved
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return // no watch: kernel waits end at their timeout
	}
	w := &peerWatch{stop: efd, done: make(chan struct{})}
	gm.watch = w
	go func() {
		defer close(w.done)
		r := gm.live.WaitAnyGone(efd)
		if r < 0 {
			return
		}
		word := core.DevFlag(core.DevCausePeerExited, r, 0)
		if _, ok := gm.be.(core.WordWriter); ok { // stored by the device: Note [Abort]'s reason
			gm.writeWords([]core.MemOp{{Addr: region + 4, Value: word}})
			return
		}
		// Pinned: the copy reads v through its address as a uintptr, so v
		// must not live on this goroutine's stack, which may move.
		v := []uint32{word}
		pin := new(runtime.Pinner)
		pin.Pin(&v[0])
		unpinUnlessLate(pin, gm.copyOut(region+4, uintptr(unsafe.Pointer(&v[0])), 4))
	}()
}

// Note [Who closes the pidfds]
//
// The watch polls the pidfds of gm.live, which it copied when it started:
// closing them under it would make it poll closed (or reused) descriptor
// numbers. So gm.live has one owner, the last reference of the group's
// memory (unrefLocked), which stops the watch, waits for it to end, and
// only then closes the pidfds, in one place (endLiveness), whether or not
// the device synchronisation before the memory goes succeeds (pidfds are
// not memory the device may use: they were leaked with the memory when it
// failed). The wait happens without gm.life: the watch may be in a copy to
// the device bounded by the group's timeout, and nothing should wait that
// long for the memory lock. Callers that replace the pads (SetSignalPadSize)
// stop and join the watch the same way before they take gm.life for good.

// detachWatch takes the watch out of gm and asks it to end (gm.life held);
// join, without the lock, waits for it.
func (gm *groupMem) detachWatch() *peerWatch {
	w := gm.watch
	if w == nil {
		return nil
	}
	gm.watch = nil
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(w.stop, one[:])
	return w
}

// join waits for a detached watch to end and frees its eventfd (nil: none).
func (w *peerWatch) join() {
	if w == nil {
		return
	}
	<-w.done
	unix.Close(w.stop)
}

// stopWatch ends the watch and waits for it (gm.life held; a no-op where the
// caller already stopped it without the lock).
func (gm *groupMem) stopWatch() { gm.detachWatch().join() }

// stopWatchUnlocked stops and joins the watch with gm.life released for the
// wait (gm.life held on entry and on return; nobody else may change gm
// meanwhile: the caller holds the group's collective lock, or the last
// reference).
func (gm *groupMem) stopWatchUnlocked() {
	w := gm.detachWatch()
	if w == nil {
		return
	}
	gm.life.Unlock()
	w.join()
	gm.life.Lock()
}

// endLiveness stops the watch and closes the pidfds (Note [Who closes the
// pidfds]); gm.life held on entry and on return.
func (gm *groupMem) endLiveness() {
	gm.stopWatchUnlocked()
	gm.live.Close()
}
