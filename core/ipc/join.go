package ipc

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
)

// Joining a group: rank 0 listens and admits (rank0.go, Note [Rank 0's
// join]), the others connect and introduce themselves (openMember).

// Note [Join backoff]
//
// A joining rank retries connect until rank 0 listens. The retries began
// at 1 ms and doubled up to 100 ms: when rank 0 came a few milliseconds
// after its peers (its own start-up, the driver's), the peers slept 1, 2,
// 4, 8, 16 ms and joined up to twice as late as rank 0 was ready: group
// creation measured 11.8 ms at 2 H200s and 32 ms at 4. A connect to a
// socket that is not there yet is a failed system call of a few µs, so the
// join polls at 20 µs, doubling to at most joinBackoffMax: it joins within
// 2 ms of rank 0 at a cost of at most 500 syscalls a second while waiting.
//
// The steps were not that short: time.Sleep below a millisecond slept
// about a millisecond (Note [Short sleeps] in core/timeout.go), so the
// connect phase, with ranks lined up by a barrier, was 0.15-0.3 ms or, in
// about half the groups, 1.2-1.5 ms on both ranks (2 H200 and the 2-CPU
// CI machine alike). The steps now sleep what they say (core.Nap), and
// for the first joinPollFor of the wait they stop growing at
// joinPollEvery (a join lands at most about 50 µs after rank 0's bind, for
// at most 400 failed connects), and only then double to joinBackoffMax
// (rank 0 is slow to come: its start-up, the driver's). A watch of the
// socket directory (inotify) was tried instead: it woke the peer at the
// bind itself, but closing an inotify descriptor waits for the kernel's
// SRCU grace period (6-15 ms measured), and closing it in the background
// made the descriptor counts that the leak tests compare depend on timing.
const (
	joinBackoffStart = 20 * time.Microsecond
	joinPollEvery    = 50 * time.Microsecond
	joinPollFor      = 20 * time.Millisecond
	joinBackoffMax   = 2 * time.Millisecond
)

// sleepBackoff sleeps *d (not past deadline) and doubles it up to 100 ms.
func sleepBackoff(d *time.Duration, deadline time.Time) {
	sleepBackoffMax(d, deadline, 100*time.Millisecond)
}

// sleepBackoffMax sleeps *d (not past deadline) and doubles it up to most.
func sleepBackoffMax(d *time.Duration, deadline time.Time, most time.Duration) {
	s := *d
	if left := time.Until(deadline); left < s {
		s = left
	}
	core.Nap(s) // Note [Short sleeps]
	if *d *= 2; *d > most {
		*d = most
	}
}

// hello is what a joining rank presents.
type hello struct {
	world uint32
	pid   uint32
	name  string
	token string
}

func (h *hello) encode() []byte {
	var e enc
	e.u32(h.world)
	e.u32(h.pid)
	e.bytes([]byte(h.name))
	e.bytes([]byte(h.token))
	return e.b
}

func decodeHello(p []byte) (hello, error) {
	d := dec{b: p}
	h := hello{world: d.u32(), pid: d.u32(), name: string(d.bytes()), token: string(d.bytes())}
	return h, d.err
}

// openMember is the side of Open of every rank but 0: connect (retrying
// until rank 0 listens), check that rank 0 is of our uid, introduce
// ourselves, and wait for the welcome.
func (ch *Channel) openMember(start, deadline time.Time) error {
	path := ch.cfg.sockPath()
	me := hello{world: uint32(ch.cfg.World), pid: uint32(os.Getpid()), name: ch.cfg.Name, token: ch.cfg.Token}
	backoff := joinBackoffStart
	last := "rank 0 never listened on the socket: it has not started, it failed, or it completed the group without us (another process may already hold this rank)"
	var lastReject *core.Error
	rep := core.StartWait(ch.cfg.Name, ch.cfg.Rank, "connection", deadline)
	var firstMiss time.Time // when a connect first found no listener
	for {
		rep.Tick(func() string { return "rank 0 (" + last + ")" })
		if !time.Now().Before(deadline) {
			if lastReject != nil {
				return &core.Error{Code: lastReject.Code, Msg: fmt.Sprintf("%s (rank %d kept being refused for %v)", lastReject.Msg, ch.cfg.Rank, ch.cfg.Timeout)}
			}
			return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v joining (%s; socket %s)", ch.cfg.Name, ch.cfg.Rank, ch.cfg.Timeout, last, path)
		}
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return core.Errorf(core.ErrBackend, "group %q: rank %d (pid %d): socket: %s", ch.cfg.Name, ch.cfg.Rank, os.Getpid(), core.DescribeErrno(err))
		}
		c := &conn{fd: fd, rank: 0}
		switch err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err {
		case nil:
		case unix.ENOENT, unix.ECONNREFUSED, unix.EAGAIN, unix.EINTR:
			c.close()
			if firstMiss.IsZero() {
				firstMiss = time.Now()
			}
			most := joinBackoffMax
			if time.Since(firstMiss) < joinPollFor {
				most = joinPollEvery
			}
			sleepBackoffMax(&backoff, deadline, most)
			continue
		case unix.EACCES, unix.EPERM:
			c.close()
			return core.Errorf(core.ErrPermission, "group %q: cannot connect to %s: %v (the socket directory belongs to another user?)", ch.cfg.Name, path, err)
		default:
			c.close()
			return core.Errorf(core.ErrBackend, "group %q: connect %s: %v", ch.cfg.Name, path, err)
		}
		cred, err := peerCred(fd)
		if err == nil {
			c.pid, c.uid = cred.Pid, cred.Uid
			err = checkPeerCred(cred, ch.uid, fmt.Sprintf("the process listening on %s for group %q", path, ch.cfg.Name))
		}
		if err != nil {
			c.close()
			return err
		}
		if err := c.send(header{kind: kHello, rank: int32(ch.cfg.Rank)}, me.encode(), nil, deadline); err != nil {
			c.close()
			last = fmt.Sprintf("sending our hello to pid %d failed: %v", c.pid, err)
			sleepBackoffMax(&backoff, deadline, joinBackoffMax)
			continue
		}
		ch.waitReadable(c.fd, deadline, rep, func() string {
			return "rank 0's welcome (it waits for the other ranks to connect): some rank"
		})
		f, err := c.recv(deadline.Add(grace(ch.cfg.Timeout)))
		if err != nil {
			c.close()
			if errors.Is(err, errDeadline) {
				return core.Errorf(core.ErrTimeout, "group %q: rank %d timed out after %v: rank 0 (pid %d) accepted us but never completed the group or told us why",
					ch.cfg.Name, ch.cfg.Rank, time.Since(start).Round(time.Millisecond), c.pid)
			}
			// Rank 0 went away before welcoming us (for instance a listener
			// that completed its own group as we connected): try again.
			last = fmt.Sprintf("pid %d closed the connection before welcoming us (%v)", c.pid, err)
			sleepBackoffMax(&backoff, deadline, joinBackoffMax)
			continue
		}
		if f.kind == kWelcome && ch.cfg.ControlPage && len(f.fds) == 1 {
			ch.controlFD, f.fds = f.fds[0], nil
		}
		f.closeFDs()
		switch f.kind {
		case kWelcome:
			d := dec{b: f.payload}
			for r := range ch.pids {
				ch.pids[r] = int32(d.u32())
			}
			if d.err != nil {
				c.close()
				return core.Errorf(core.ErrPeer, "group %q: malformed welcome from rank 0: %v", ch.cfg.Name, d.err)
			}
			ch.pids[0] = c.pid
			ch.conns[0] = c
			return nil
		case kReject, kAbort:
			c.close()
			e := &core.Error{Code: f.code, Msg: string(f.payload)}
			if f.kind == kReject && f.flags&flagRetry != 0 {
				lastReject = e
				last = e.Msg
				sleepBackoffMax(&backoff, deadline, joinBackoffMax)
				continue
			}
			return e
		default:
			c.close()
			return core.Errorf(core.ErrPeer, "group %q: rank 0 (pid %d) answered our hello with a %s frame", ch.cfg.Name, c.pid, f.kind)
		}
	}
}
