package core

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Note [Interrupts]
//
// A host-side wait of a group (joining, an all-gather, a barrier or signal
// wait on the host backend, a collective pause) may last up to the group's
// timeout, 5 minutes by default, and a signal does not shorten it: the
// library's waits are loops in Go that retry on EINTR, and Python runs its
// own handlers (KeyboardInterrupt for Ctrl-C) only once the C call returns.
//
// SetInterruptFD hands the library a descriptor that becomes readable when
// a signal arrives: the read end of a self-pipe whose write end a signal
// handler writes to (Python: signal.set_wakeup_fd, which makes CPython's
// C-level handler write the signal's number there). A goroutine (the
// watcher) sleeps in poll(2) on it; for each wake-up it reads what is there
// and counts one interrupt. A wait takes the count when it begins (an atomic
// load: nothing else on the fast path) and, in the slow part of its loop,
// where it already naps or polls with back-off, compares it with the
// current count (another load; ipc polls wake at least every
// InterruptCheckEvery while a descriptor is set); a difference ends the wait
// with ErrInterrupted. So every wait that was in progress when the signal
// came returns within about InterruptCheckEvery, and waits that begin after
// it are not disturbed by its bytes (the watcher has read them): no stale
// interrupt outlives the signal. The watcher owns the descriptor's reading:
// the caller must not read it too.
//
// An interrupted wait of a group leaves the peers' protocol state unknown,
// as a failed one does: group creation fails and undoes itself; a wait of a
// made group aborts it (every later call is ErrAborted; destroy it).

// InterruptCheckEvery bounds how long a host wait goes on after a signal
// once an interrupt descriptor is set.
const InterruptCheckEvery = 50 * time.Millisecond

var (
	interrupts atomic.Uint64 // the number of wake-ups the watcher has seen
	intrOn     atomic.Bool   // a descriptor is set
	intrMu     sync.Mutex    // guards intrStop, intrDone
	intrStop   = -1          // the watcher's stop eventfd
	intrDone   chan struct{}
)

// InterruptMark is the count of interrupts so far: a wait takes it when it
// begins and passes it to InterruptedSince.
func InterruptMark() uint64 { return interrupts.Load() }

// InterruptedSince says whether an interrupt came after mark was taken.
func InterruptedSince(mark uint64) bool { return interrupts.Load() != mark }

// InterruptsOn says whether an interrupt descriptor is set (ipc's polls
// then wake at least every InterruptCheckEvery).
func InterruptsOn() bool { return intrOn.Load() }

// SetInterruptFD makes fd the interrupt descriptor (Note [Interrupts]); -1
// removes it. The previous one's watcher is stopped first (its descriptor
// stays the caller's, open). fd is not closed by the library.
func SetInterruptFD(fd int) error {
	intrMu.Lock()
	defer intrMu.Unlock()
	if intrStop >= 0 {
		var one [8]byte
		binary.NativeEndian.PutUint64(one[:], 1)
		unix.Write(intrStop, one[:])
		<-intrDone
		unix.Close(intrStop)
		intrStop, intrDone = -1, nil
		intrOn.Store(false)
	}
	if fd < 0 {
		return nil
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return Errorf(ErrInvalidArgument, "the interrupt descriptor %d is not open: %v", fd, err)
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return Errorf(ErrBackend, "an eventfd for the interrupt watcher: %v", err)
	}
	done := make(chan struct{})
	intrStop, intrDone = stop, done
	intrOn.Store(true)
	go watchInterrupts(fd, stop, done)
	return nil
}

// watchInterrupts is the watcher: it counts the wake-ups of fd until stop
// is readable, or until fd is closed or its write end is (then interrupts
// cannot come any more).
func watchInterrupts(fd, stop int, done chan struct{}) {
	defer close(done)
	buf := make([]byte, 256)
	for {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(stop), Events: unix.POLLIN}}
		_, err := unix.Poll(p, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || p[1].Revents != 0 || p[0].Revents&unix.POLLNVAL != 0 {
			return
		}
		if p[0].Revents&unix.POLLIN != 0 {
			n, rerr := unix.Read(fd, buf)
			if n > 0 {
				interrupts.Add(1)
				continue
			}
			if rerr == unix.EAGAIN || rerr == unix.EINTR {
				continue
			}
			return // EOF or an error: nothing more will come
		}
		if p[0].Revents&(unix.POLLHUP|unix.POLLERR) != 0 {
			return
		}
	}
}

// InterruptedErr is the error of a wait of group that a signal ended.
func InterruptedErr(group string, rank int, what string) *Error {
	return Errorf(ErrInterrupted, "group %q: rank %d: a signal interrupted %s (the interrupt descriptor, symmem_set_interrupt_fd)", group, rank, what)
}
