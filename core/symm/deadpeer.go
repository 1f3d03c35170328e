package symm

import (
	"encoding/binary"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// peerWatch is the goroutine of Note [Dead peers] (core/ipc) on backends
// whose waits run on the device: it sleeps in poll(2) on the peers' pidfds
// and, when one exits, writes the abort word of this rank's device region
// (Note [Pad partition]), which the kernels' waits read.
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
		// Pinned: the copy reads v through its address as a uintptr, so v
		// must not live on this goroutine's stack, which may move.
		v := []uint32{devFlag(devCausePeerExited, r, 0)}
		pin := new(runtime.Pinner)
		pin.Pin(&v[0])
		unpinUnlessLate(pin, gm.copyOut(region+4, uintptr(unsafe.Pointer(&v[0])), 4))
	}()
}

// stopWatch ends the watch and waits for it (before the pads go).
func (gm *groupMem) stopWatch() {
	w := gm.watch
	if w == nil {
		return
	}
	gm.watch = nil
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	unix.Write(w.stop, one[:])
	<-w.done
	unix.Close(w.stop)
}
