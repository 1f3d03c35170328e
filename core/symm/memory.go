package symm

import (
	"encoding/binary"
	"errors"
	"runtime"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/ipc"
	"github.com/libsymmem/libsymmem/core/lockrank"
	"golang.org/x/sys/unix"
)

// Note [Owners of the group's memory]
//
// The memory of a group that may outlive it (Note [Lifetimes]) is three
// tables, each the only code that touches its fields, under its own lock:
//
//	peers   peerMappings (peermaps.go): the peers' segments mapped here,
//	        their references, and their pause and resume.
//	pads    padTable (pads.go): this rank's signal pad, its mappings of
//	        the peers' pads, and what lives in a pad (the signal counts,
//	        the collective channels' locks, the stop word's host view).
//	arrays  pointerArrays (ptrarrays.go): the handles' C-visible pointer
//	        arrays, host and device slabs, shared by content.
//
// groupMem holds them with what they share (memOps: the device and how
// memory is imported, mapped and given back) and the references that keep
// them (life). A call that needs several tables takes their locks one after
// another, never one inside another, in the order of Note [Lock order] in
// core/lockrank; what must happen to several tables at once (a
// rendezvous, a pause) is serialised by the group's collective lock, and
// the tables' release by the last reference.

// groupMem is the memory of a group that may outlive it (Note [Owners of
// the group's memory]).
type groupMem struct {
	memOps
	// live watches the peers' processes for the waits on the pads (Note
	// [Dead peers] in core/ipc); closed with the memory.
	live *ipc.Liveness
	// abort is the group's abort state (Note [Abort]); it takes no lock
	// that a stuck call may hold.
	abort *abortState

	peers  peerMappings
	pads   padTable
	arrays pointerArrays

	// life guards refs and watch.
	life lockrank.Mutex[lockrank.GroupLife]
	// refs = (1 while the group is not destroyed) + (live handles). The
	// memory is released when it reaches 0.
	refs int
	// watch writes the abort word of our device region when a peer exits
	// (cuda; peerWatch below); nil on the host backend.
	watch *peerWatch
}

// makeTables gives each table of a new group's memory the device it works
// on.
func (gm *groupMem) makeTables() {
	gm.peers = peerMappings{ops: &gm.memOps, maps: map[mapKey]*peerMap{}}
	gm.pads = padTable{ops: &gm.memOps}
	gm.arrays = pointerArrays{ops: &gm.memOps}
}

// unrefLocked drops a reference (life held); the last one releases
// everything, once the device is synchronised through s (or leaks it all
// if that fails).
func (gm *groupMem) unrefLocked(s *deviceSync) error {
	gm.refs--
	if gm.refs > 0 {
		return nil
	}
	gm.endLiveness()
	return gm.syncThen(s, "the group's memory (signal pads, peer mappings, pointer arrays)", func() error {
		return errors.Join(gm.peers.dropAll(), gm.dropPadsLocked(), gm.arrays.closeHost())
	})
}

// dropPadsLocked gives back the pads (the peers' mappings and this rank's
// own) and the device slab seeded with this rank's pad, which go together
// (Note [Pointer arrays in the pad]): a slab tainted by a timed-out copy
// is leaked, and with it the pad that holds its slots. The device is
// synchronised or unused (life held).
func (gm *groupMem) dropPadsLocked() error {
	gm.abort.setRegion(nil)
	gm.stopWatch()
	padTainted, err := gm.arrays.closeDevice()
	return errors.Join(err, gm.pads.drop(padTainted))
}

// release gives back a handle's references: its peer mappings, its pointer
// arrays, and its reference to the group's memory, sharing one device
// synchronisation. The first error is returned.
func (gm *groupMem) release(maps []*peerMap, arrays func()) error {
	var s deviceSync
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	for _, m := range maps {
		keep(gm.peers.put(&s, m))
	}
	arrays()
	gm.life.Lock()
	defer gm.life.Unlock()
	keep(gm.unrefLocked(&s))
	return first
}

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
