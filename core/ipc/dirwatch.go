package ipc

import (
	"time"

	"golang.org/x/sys/unix"
)

// Note [Waking a joining rank]
//
// A joining rank that finds no listener yet (rank 0 has not bound its
// socket) used only to sleep: 20 µs, doubling up to 2 ms (Note [Join
// backoff]). With ranks lined up by a barrier, rank 0 binds a few hundred
// µs after its peers first try, and a peer then slept past the bind by up
// to as long again: the connect phase of group creation took 1.2-1.5 ms in
// about half the groups (measured on 2 H200 and on the 2-CPU CI machine,
// where the other half took 0.15-0.3 ms), the sum of the backoff steps.
//
// Now a joining rank also watches the socket directory (inotify, IN_CREATE
// and IN_MOVED_TO): rank 0's bind creates the socket file, which wakes it
// at once. The watch is added after the first failed connect and is
// followed by another connect before any wait, so a bind that lands
// between the two is not missed. Every wait is still bounded by the
// backoff, so nothing depends on an event arriving: a connect between
// rank 0's bind and its listen (ECONNREFUSED, no later event), events of
// other groups' sockets, or a watch that cannot be made (no inotify
// instances left: plain sleeps, as before) cost at most the old backoff.

// dirWatch wakes its owner when an entry is created in (or moved into) a
// directory.
type dirWatch struct{ fd int }

// watchDir watches dir, or returns nil when inotify is not available.
func watchDir(dir string) *dirWatch {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_MOVED_TO); err != nil {
		unix.Close(fd)
		return nil
	}
	return &dirWatch{fd: fd}
}

// wait returns when an entry appears in the directory (or appeared since
// the last wait) or after d, whichever comes first.
func (w *dirWatch) wait(d time.Duration) {
	if d > 0 {
		ts := unix.NsecToTimespec(d.Nanoseconds())
		pfd := []unix.PollFd{{Fd: int32(w.fd), Events: unix.POLLIN}}
		unix.Ppoll(pfd, &ts, nil) // EINTR: a spurious wake-up, the caller retries
	}
	var buf [4096]byte
	for { // drain the events: the next wait is for new ones
		if n, err := unix.Read(w.fd, buf[:]); n <= 0 || err != nil {
			return
		}
	}
}

// close gives the watch back in the background: closing an inotify
// descriptor waits for the kernel's SRCU grace period, measured at 6-15 ms
// on the CI machine, which the join would otherwise add to every group
// creation that needed a watch.
func (w *dirWatch) close() {
	if w != nil {
		go unix.Close(w.fd)
	}
}

// waitBackoff waits for *d (not past deadline), or until w sees an entry
// appear, and doubles *d up to most; without a watch it sleeps.
func waitBackoff(w *dirWatch, d *time.Duration, deadline time.Time, most time.Duration) {
	if w == nil {
		sleepBackoffMax(d, deadline, most)
		return
	}
	s := *d
	if left := time.Until(deadline); left < s {
		s = left
	}
	w.wait(s)
	if *d *= 2; *d > most {
		*d = most
	}
}
