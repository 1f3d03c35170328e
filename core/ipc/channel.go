package ipc

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// Channel is this process's member of a group's IPC channel: the star of
// connections of Note [Star topology]. It is an Exchange (records through
// the sockets) and it passes descriptors. Safe for concurrent use; its
// collective calls run one at a time, and every rank must make them in the
// same order.
type Channel struct {
	cfg Config
	uid uint32

	// mu serialises collective calls; the fields below are guarded by it.
	mu sync.Mutex
	// seq numbers the collective calls made so far. Every rank counts the
	// same calls, so a frame whose seq or kind differs from rank 0's is
	// proof that the ranks' call sequences diverged.
	seq uint64
	// broken is the first failure of the channel or nil. Once set it never
	// changes: a failed collective leaves the peers' protocol state unknown,
	// so every later call returns this error.
	broken error
	// conns: on rank 0, conns[r] is the connection to rank r (conns[0] is
	// nil); on any other rank, conns[0] is the connection to rank 0 and the
	// rest are nil. All nil once closed.
	conns []*conn
	// pids[r] is rank r's process id, as rank 0 saw it at SO_PEERCRED.
	pids []int32
	// otherRank0s are the pids of other processes of this job that claimed
	// rank 0 while we, rank 0, waited for the ranks (admit; openRoot fails
	// shortly after the first, naming them all).
	otherRank0s []int32
	// controlFD is the control page that came with the welcome (made, on
	// rank 0) when cfg.ControlPage, until NewShmExchange takes it; -1 if
	// none, with controlErr saying why on rank 0.
	controlFD  int
	controlErr error

	// cancelled is set by Cancel: a collective that fails from then on
	// reports the cancellation, not the closed sockets it sees.
	cancelled atomic.Bool
	// shutMu orders Cancel's shutdown of the sockets with their closing
	// (closeConns), so that a descriptor number is never shut down after
	// it was closed and reused. Cancel does not take mu, which a collective
	// in flight holds.
	shutMu sync.Mutex
}

// Open creates this process's member of the group that cfg names. It is
// collective: rank 0 listens, every other rank connects, and it returns when
// all world ranks have joined, or fails everywhere within the timeout
// (Note [Deadlines]).
func Open(cfg Config) (*Channel, error) {
	if err := cfg.normalize(); err != nil {
		return nil, err
	}
	ch := &Channel{cfg: cfg, uid: uint32(os.Getuid()), conns: make([]*conn, cfg.World), pids: make([]int32, cfg.World), controlFD: -1}
	ch.pids[cfg.Rank] = int32(os.Getpid())
	if cfg.World == 1 {
		return ch, nil
	}
	start := time.Now()
	var err error
	if cfg.Rank == 0 {
		err = ch.openRoot(start.Add(cfg.Timeout))
	} else {
		err = ch.openMember(start, start.Add(cfg.Timeout))
	}
	if err != nil {
		ch.closeConns()
		if ch.controlFD >= 0 {
			unix.Close(ch.controlFD)
			ch.controlFD = -1
		}
		return nil, err
	}
	return ch, nil
}

// Name, Rank, World and Timeout describe the group.
func (ch *Channel) Name() string           { return ch.cfg.Name }
func (ch *Channel) Rank() int              { return ch.cfg.Rank }
func (ch *Channel) World() int             { return ch.cfg.World }
func (ch *Channel) Timeout() time.Duration { return ch.cfg.Timeout }

// takeControlPage hands the control page that came with the welcome to the
// caller (who closes it), or returns -1 and why not.
func (ch *Channel) takeControlPage() (int, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	fd := ch.controlFD
	ch.controlFD = -1
	if fd < 0 {
		if ch.controlErr != nil {
			return -1, ch.controlErr
		}
		return -1, core.Errorf(core.ErrPeer, "group %q: rank 0 sent no control page with its welcome (it could not make it, or the group was opened without one)", ch.cfg.Name)
	}
	return fd, nil
}

// Pids returns every rank's process id.
func (ch *Channel) Pids() []int32 { return append([]int32(nil), ch.pids...) }

// Cancel makes a collective in flight on another thread fail at once with
// ErrInvalidState, instead of waiting out its timeout, and every later one
// fail too: it shuts this rank's sockets down (peers see the rank leave, as
// with Close) without waiting for the collective lock. Idempotent; Close
// still has to be called to free the descriptors.
func (ch *Channel) Cancel() {
	ch.cancelled.Store(true)
	ch.shutMu.Lock()
	defer ch.shutMu.Unlock()
	for _, c := range ch.conns {
		if c != nil && c.fd >= 0 {
			unix.Shutdown(c.fd, unix.SHUT_RDWR)
		}
	}
}

// Close leaves the group: it closes this rank's connections (peers in a
// collective with us then fail with ErrPeer). Not collective. Idempotent.
// A collective in flight on another thread is cancelled first (Cancel), so
// Close never waits for it to time out.
func (ch *Channel) Close() error {
	ch.Cancel()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	ch.closeConns()
	if ch.controlFD >= 0 {
		unix.Close(ch.controlFD)
		ch.controlFD = -1
	}
	if ch.broken == nil {
		ch.broken = core.Errorf(core.ErrInvalidState, "group %q: the channel is closed", ch.cfg.Name)
	}
	return nil
}

func (ch *Channel) closeConns() {
	ch.shutMu.Lock()
	defer ch.shutMu.Unlock()
	for i, c := range ch.conns {
		c.close()
		ch.conns[i] = nil
	}
}

func (ch *Channel) who(rank int) string {
	if rank >= 0 && rank < len(ch.pids) && ch.pids[rank] != 0 {
		return fmt.Sprintf("rank %d (pid %d)", rank, ch.pids[rank])
	}
	return fmt.Sprintf("rank %d", rank)
}

// dedupe joins notes with "; ", each distinct note once, in order of first
// appearance, with how many times it came when more than once (a rank
// refused on every retry must not fill the message with one line).
func dedupe(notes []string) string {
	count := map[string]int{}
	var order []string
	for _, n := range notes {
		if count[n] == 0 {
			order = append(order, n)
		}
		count[n]++
	}
	for i, n := range order {
		if count[n] > 1 {
			order[i] = fmt.Sprintf("%s (%d times)", n, count[n])
		}
	}
	return strings.Join(order, "; ")
}

// rankList formats ranks as "1, 3, 4".
func rankList(ranks []int) string {
	sort.Ints(ranks)
	s := make([]string, len(ranks))
	for i, r := range ranks {
		s[i] = fmt.Sprint(r)
	}
	return strings.Join(s, ", ")
}

// ---------------------------------------------------------------------------
// Joining

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

// listen binds rank 0's socket. A socket file that nobody listens on (a
// crashed earlier run) is removed; one that a live process listens on
// belongs to another group of the same name, and we wait for it to go away
// (rank 0 removes its socket as soon as its group is complete) until the
// deadline. The check-remove-bind sequence runs under an flock of the
// directory's lock file (Config.lockPath: one for every name, so the
// directory does not grow per group name) so that two processes never
// remove each other's fresh socket.
func (ch *Channel) listen(deadline time.Time) (lfd int, ino uint64, err error) {
	lock, err := unix.Open(ch.cfg.lockPath(), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return -1, 0, core.Errorf(core.ErrBackend, "group %q: rank 0 (pid %d) cannot open the lock file %s: %s", ch.cfg.Name, os.Getpid(), ch.cfg.lockPath(), core.DescribeErrno(err))
	}
	defer unix.Close(lock)
	backoff := time.Millisecond
	asked := int32(-1) // the holder we asked whether it is our rank 0
	for {
		if err := flock(lock, unix.LOCK_EX); err != nil {
			return -1, 0, core.Errorf(core.ErrBackend, "group %q: flock %s: %v", ch.cfg.Name, ch.cfg.lockPath(), err)
		}
		lfd, ino, busyPid, err := ch.tryBind()
		flock(lock, unix.LOCK_UN)
		if err != nil || lfd >= 0 {
			return lfd, ino, err
		}
		if busyPid != asked {
			asked = busyPid
			if err := ch.claimRank0(deadline); err != nil {
				return -1, 0, err
			}
		}
		if !time.Now().Before(deadline) {
			return -1, 0, core.Errorf(core.ErrTimeout, "group %q: the socket %s was held for %v by another live group of the same name (pid %d): another job uses this group name, or its rank 0 never completed; use a distinct name or SYMMEM_JOB_TOKEN",
				ch.cfg.Name, ch.cfg.sockPath(), ch.cfg.Timeout, busyPid)
		}
		sleepBackoff(&backoff, deadline)
	}
}

func flock(fd, how int) error {
	for {
		if err := unix.Flock(fd, how); err != unix.EINTR {
			return err
		}
	}
}

// tryBind returns a listening socket, or lfd -1 and the pid of the live
// process that holds the path.
func (ch *Channel) tryBind() (lfd int, ino uint64, busyPid int32, err error) {
	path := ch.cfg.sockPath()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, 0, core.Errorf(core.ErrBackend, "group %q: rank 0 (pid %d): socket: %s", ch.cfg.Name, os.Getpid(), core.DescribeErrno(err))
	}
	for attempt := 0; ; attempt++ {
		err := unix.Bind(fd, &unix.SockaddrUnix{Name: path})
		if err == nil {
			break
		}
		if err != unix.EADDRINUSE || attempt > 0 {
			unix.Close(fd)
			code := core.ErrBackend
			if err == unix.EACCES || err == unix.EPERM {
				code = core.ErrPermission
			}
			return -1, 0, 0, core.Errorf(code, "group %q: bind %s: %v", ch.cfg.Name, path, err)
		}
		if live, pid := probe(path); live {
			unix.Close(fd)
			return -1, 0, pid, nil
		}
		// Stale: nobody listens there. Remove it and bind again.
		if err := unix.Unlink(path); err != nil && err != unix.ENOENT {
			unix.Close(fd)
			return -1, 0, 0, core.Errorf(core.ErrBackend, "group %q: cannot remove the stale socket %s: %v", ch.cfg.Name, path, err)
		}
	}
	backlog := ch.cfg.World + 16
	if backlog > 4096 {
		backlog = 4096
	}
	if err := unix.Listen(fd, backlog); err != nil {
		unix.Close(fd)
		unix.Unlink(path)
		return -1, 0, 0, core.Errorf(core.ErrBackend, "group %q: listen %s: %v", ch.cfg.Name, path, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		unix.Close(fd)
		return -1, 0, 0, core.Errorf(core.ErrBackend, "group %q: stat %s: %v", ch.cfg.Name, path, err)
	}
	return fd, st.Ino, 0, nil
}

// claimRank0 introduces us as rank 0 to the process that listens on our
// socket: if it is rank 0 of this job (same name, token and world size), it
// refuses us as a second rank 0 and fails its own group too (admit), and we
// return that refusal; any other answer (another job's group, no answer
// within a second) returns nil and we keep waiting for the name.
func (ch *Channel) claimRank0(deadline time.Time) error {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	c := &conn{fd: fd, rank: 0}
	defer c.close()
	if unix.Connect(fd, &unix.SockaddrUnix{Name: ch.cfg.sockPath()}) != nil {
		return nil
	}
	cred, err := peerCred(fd)
	if err != nil || cred.Uid != ch.uid {
		return nil
	}
	soon := time.Now().Add(time.Second)
	if soon.After(deadline) {
		soon = deadline
	}
	me := hello{world: uint32(ch.cfg.World), pid: uint32(os.Getpid()), name: ch.cfg.Name, token: ch.cfg.Token}
	if c.send(header{kind: kHello, rank: 0}, me.encode(), nil, soon) != nil {
		return nil
	}
	f, err := c.recv(soon)
	if err != nil {
		return nil
	}
	f.closeFDs()
	if f.kind == kReject && f.flags&flagRetry == 0 {
		return &core.Error{Code: f.code, Msg: string(f.payload)}
	}
	return nil
}

// probe tells whether a process listens on path (and which, if it can).
func probe(path string) (live bool, pid int32) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return true, 0 // cannot tell: be conservative, do not remove it
	}
	defer unix.Close(fd)
	switch err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err {
	case nil:
		if cred, err := peerCred(fd); err == nil {
			pid = cred.Pid
		}
		return true, pid
	case unix.ECONNREFUSED, unix.ENOENT:
		return false, 0
	default: // EAGAIN: a full backlog is a live listener
		return true, 0
	}
}

// unlisten removes rank 0's socket file if it is still ours, then closes
// the listener, both under the lock (see listen).
func (ch *Channel) unlisten(lfd int, ino uint64) {
	lock, err := unix.Open(ch.cfg.lockPath(), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err == nil {
		flock(lock, unix.LOCK_EX)
	}
	var st unix.Stat_t
	if unix.Stat(ch.cfg.sockPath(), &st) == nil && st.Ino == ino {
		unix.Unlink(ch.cfg.sockPath())
	}
	unix.Close(lfd)
	if err == nil {
		flock(lock, unix.LOCK_UN)
		unix.Close(lock)
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

// helloWait bounds how long rank 0 waits for a connected process to say
// who it is, so that a stray connection cannot stall the group.
const helloWait = 2 * time.Second

// openRoot is rank 0's side of Open.
func (ch *Channel) openRoot(deadline time.Time) (err error) {
	lfd, ino, err := ch.listen(deadline)
	if err != nil {
		return err
	}
	listening := true
	stopListening := func() {
		if listening {
			ch.unlisten(lfd, ino)
			listening = false
		}
	}
	defer stopListening()

	var pending []*conn // accepted, not yet introduced
	var notes []string  // refused connections, for the timeout message
	defer func() {
		for _, c := range pending {
			c.close()
		}
		if err != nil {
			ch.abortAll(err)
		}
	}()
	joined := 1
	rep := core.StartWait(ch.cfg.Name, 0, "connection", deadline)
	var rank0Since time.Time // when the first other process claimed rank 0
	mark := core.InterruptMark()
	for joined < ch.cfg.World {
		if core.InterruptedSince(mark) {
			return core.InterruptedErr(ch.cfg.Name, 0, "joining the group")
		}
		rep.Tick(func() string { return ch.missingConns() })
		// The poll set: the listener, then pending, then joined ranks (a
		// joined rank sends nothing more until welcomed: readable means it
		// closed).
		pfds := []unix.PollFd{{Fd: int32(lfd), Events: unix.POLLIN}}
		for _, c := range pending {
			pfds = append(pfds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLIN})
		}
		var joinedRanks []int
		for r, c := range ch.conns {
			if c != nil {
				pfds = append(pfds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLIN})
				joinedRanks = append(joinedRanks, r)
			}
		}
		// Other processes that claim rank 0: fail once every rank has
		// (everyone was started as rank 0) or shortly after the first.
		if k := len(ch.otherRank0s); k > 0 && (k >= ch.cfg.World-1 || !time.Now().Before(rank0Since.Add(rank0Grace))) {
			return core.Errorf(core.ErrMismatch, "%s", ch.rank0Claims())
		} else if k > 0 && rank0Since.IsZero() {
			rank0Since = time.Now()
		}
		wake := rep.Wake(deadline)
		if !rank0Since.IsZero() && rank0Since.Add(rank0Grace).Before(wake) {
			wake = rank0Since.Add(rank0Grace)
		}
		n, perr := unix.Poll(pfds, pollTimeout(wake))
		if perr == unix.EINTR {
			continue
		}
		if perr != nil {
			return core.Errorf(core.ErrBackend, "group %q: poll: %v", ch.cfg.Name, perr)
		}
		if n == 0 {
			if time.Now().Before(deadline) || len(ch.otherRank0s) > 0 {
				continue
			}
			var missing []int
			for r := 1; r < ch.cfg.World; r++ {
				if ch.conns[r] == nil {
					missing = append(missing, r)
				}
			}
			msg := fmt.Sprintf("group %q: timed out after %v waiting for rank(s) %s to join (%d of %d ranks joined, socket %s)",
				ch.cfg.Name, ch.cfg.Timeout, rankList(missing), joined, ch.cfg.World, ch.cfg.sockPath())
			if len(notes) > 0 {
				msg += "; refused: " + dedupe(notes)
			}
			return &core.Error{Code: core.ErrTimeout, Msg: msg}
		}
		// Joined ranks first: one that went away fails the group.
		for i, r := range joinedRanks {
			if pfds[1+len(pending)+i].Revents == 0 {
				continue
			}
			c := ch.conns[r]
			f, rerr := c.recv(time.Now().Add(100 * time.Millisecond))
			if rerr == nil {
				f.closeFDs()
				rerr = fmt.Errorf("%w: unexpected %s frame before the group was complete", errProtocol, f.kind)
			}
			if errors.Is(rerr, errDeadline) {
				continue
			}
			c.close()
			ch.conns[r] = nil
			return core.Errorf(core.ErrPeer, "group %q: %s joined, then its connection ended before the group was complete (%v): it exited or failed", ch.cfg.Name, ch.who(r), rerr)
		}
		// Pending connections: read their hello.
		var still []*conn
		for i, c := range pending {
			if pfds[1+i].Revents == 0 {
				still = append(still, c)
				continue
			}
			hd := deadline
			if t := time.Now().Add(helloWait); t.Before(hd) {
				hd = t
			}
			f, rerr := c.recv(hd)
			if rerr != nil {
				if !isPeerGone(rerr) {
					notes = append(notes, fmt.Sprintf("pid %d: %v", c.pid, rerr))
				}
				c.close()
				continue
			}
			ok, fatal := ch.admit(c, f, &notes)
			if fatal != nil {
				return fatal
			}
			if ok {
				joined++
			}
		}
		pending = still
		// New connections.
		if pfds[0].Revents != 0 {
			for {
				nfd, _, aerr := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
				if aerr == unix.EINTR || aerr == unix.ECONNABORTED {
					continue
				}
				if aerr == unix.EAGAIN {
					break
				}
				if aerr != nil {
					return core.Errorf(core.ErrBackend, "group %q: rank 0 (pid %d) cannot accept connections on %s: %s", ch.cfg.Name, os.Getpid(), ch.cfg.sockPath(), core.DescribeErrno(aerr))
				}
				c := &conn{fd: nfd, rank: -1}
				cred, cerr := peerCred(nfd)
				if cerr == nil {
					c.pid, c.uid = cred.Pid, cred.Uid
					cerr = checkPeerCred(cred, ch.uid, fmt.Sprintf("a process connecting to group %q", ch.cfg.Name))
				}
				if cerr != nil {
					ch.reject(c, core.CodeOf(cerr), false, cerr.Error())
					notes = append(notes, cerr.Error())
					c.close()
					continue
				}
				pending = append(pending, c)
			}
		}
	}
	// Complete: nobody else may join, so free the name at once.
	stopListening()
	var e enc
	for _, p := range ch.pids {
		e.u32(uint32(p))
	}
	var page []int
	if ch.cfg.ControlPage {
		// The control page rides on the welcome: no round trip of its own.
		ch.controlFD, ch.controlErr = makeControlPage(ch.cfg.Name, ch.cfg.World)
		if ch.controlFD >= 0 {
			page = []int{ch.controlFD}
		}
	}
	for r := 1; r < ch.cfg.World; r++ {
		c := ch.conns[r]
		if serr := c.send(header{kind: kWelcome, rank: int32(r)}, e.b, page, time.Now().Add(grace(ch.cfg.Timeout))); serr != nil {
			return core.Errorf(core.ErrPeer, "group %q: cannot welcome %s: %v", ch.cfg.Name, ch.who(r), serr)
		}
	}
	return nil
}

// admit checks a hello and, if it is right, makes c the connection of its
// rank. A refused connection is answered and closed. fatal is set when the
// hello proves that this job's ranks disagree (a world size that differs
// from ours under the same job token): the group cannot complete, so every
// rank fails now rather than at the timeout. A different job token is
// another job that uses the same name: it is told to retry (it gets the
// name once we are done with it).
func (ch *Channel) admit(c *conn, f *frame, notes *[]string) (ok bool, fatal error) {
	f.closeFDs()
	refuse := func(code core.Code, retry bool, format string, args ...any) (bool, error) {
		msg := fmt.Sprintf(format, args...)
		ch.reject(c, code, retry, msg)
		*notes = append(*notes, msg)
		c.close()
		return false, nil
	}
	if f.kind != kHello {
		return refuse(core.ErrPeer, false, "group %q: pid %d sent a %s frame instead of introducing itself", ch.cfg.Name, c.pid, f.kind)
	}
	h, err := decodeHello(f.payload)
	if err != nil {
		return refuse(core.ErrPeer, false, "group %q: pid %d sent a malformed hello: %v", ch.cfg.Name, c.pid, err)
	}
	r := int(f.rank)
	switch {
	case h.name != ch.cfg.Name:
		return refuse(core.ErrMismatch, true, "group %q: pid %d asked for group %s", ch.cfg.Name, c.pid, core.Quote(h.name))
	case h.token != ch.cfg.Token:
		return refuse(core.ErrMismatch, true, "group %q: pid %d (rank %d) has job token %s, rank 0 (pid %d) has %s: another job uses the same group name (set SYMMEM_JOB_TOKEN or use distinct names)",
			ch.cfg.Name, c.pid, r, core.Quote(h.token), os.Getpid(), core.Quote(ch.cfg.Token))
	case int(h.world) != ch.cfg.World:
		msg := fmt.Sprintf("group %q: world size mismatch: rank %d (pid %d) has world size %d, rank 0 (pid %d) has %d",
			ch.cfg.Name, r, c.pid, h.world, os.Getpid(), ch.cfg.World)
		refuse(core.ErrMismatch, false, "%s", msg)
		return false, &core.Error{Code: core.ErrMismatch, Msg: msg}
	case r == 0:
		ch.otherRank0s = append(ch.otherRank0s, c.pid)
		return refuse(core.ErrMismatch, false, "%s", ch.rank0Claims())
	case r <= 0 || r >= ch.cfg.World:
		return refuse(core.ErrInvalidArgument, false, "group %q: pid %d claims rank %d, out of [1, %d)", ch.cfg.Name, c.pid, r, ch.cfg.World)
	case ch.conns[r] != nil:
		return refuse(core.ErrMismatch, false, "group %q: rank %d is taken: %s holds it and pid %d claims it too (two processes were started with the same rank)",
			ch.cfg.Name, r, ch.who(r), c.pid)
	}
	c.rank = r
	ch.conns[r] = c
	ch.pids[r] = c.pid
	return true, nil
}

// rank0Grace is how long rank 0 goes on, after another process of its job
// claimed rank 0, for the others that may claim it too (all processes
// started as rank 0), before it fails: each is told at once.
const rank0Grace = 2 * time.Second

// rank0Claims names this process and every other that claimed rank 0.
func (ch *Channel) rank0Claims() string {
	pids := fmt.Sprintf("pid %d", os.Getpid())
	for i, p := range ch.otherRank0s {
		sep := ", "
		if i == len(ch.otherRank0s)-1 {
			sep = " and "
		}
		pids += fmt.Sprintf("%spid %d", sep, p)
	}
	n := "two"
	if k := len(ch.otherRank0s) + 1; k > 2 {
		n = fmt.Sprint(k)
	}
	return fmt.Sprintf("group %q: %s processes claim rank 0: %s (were they all started as rank 0? check the rank each one passes)", ch.cfg.Name, n, pids)
}

// reject answers a connection we refuse (best effort).
func (ch *Channel) reject(c *conn, code core.Code, retry bool, msg string) {
	var flags uint16
	if retry {
		flags = flagRetry
	}
	c.send(header{kind: kReject, flags: flags, code: code}, []byte(msg), nil, time.Now().Add(100*time.Millisecond))
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
	mark := core.InterruptMark()
	for {
		if core.InterruptedSince(mark) {
			return core.InterruptedErr(ch.cfg.Name, ch.cfg.Rank, "joining the group")
		}
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
		ch.waitReadable(c.fd, deadline, rep, mark, func() string {
			return "rank 0's welcome (it waits for the other ranks to connect): some rank"
		})
		if core.InterruptedSince(mark) {
			c.close()
			return core.InterruptedErr(ch.cfg.Name, ch.cfg.Rank, "joining the group")
		}
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

// ---------------------------------------------------------------------------
// Collectives

// begin starts a collective: it takes mu (the caller unlocks), checks the
// channel is usable and counts the call.
func (ch *Channel) begin() error {
	ch.mu.Lock()
	if ch.broken != nil {
		return ch.broken
	}
	ch.seq++
	return nil
}

// fail records err as the channel's failure; on rank 0 it also tells every
// connected rank (Note [Deadlines]). It returns err.
func (ch *Channel) fail(err error) error {
	if ch.cancelled.Load() {
		err = core.Errorf(core.ErrInvalidState, "group %q: rank %d left the group (destroyed or closed on another thread) during collective #%d (%v)", ch.cfg.Name, ch.cfg.Rank, ch.seq, err)
	}
	if ch.broken == nil {
		ch.broken = err
	}
	if ch.cfg.Rank == 0 {
		ch.abortAll(err)
	}
	return err
}

// abortAll sends every connected rank an abort frame carrying err (best
// effort: a rank that is gone or not reading is skipped).
func (ch *Channel) abortAll(err error) {
	if core.CodeOf(err) == core.ErrInterrupted { // ours: the peers' is our leaving
		err = core.Errorf(core.ErrPeer, "group %q: %s left the group: %v", ch.cfg.Name, ch.who(ch.cfg.Rank), err)
	}
	code := core.CodeOf(err)
	for r, c := range ch.conns {
		if c != nil && r != ch.cfg.Rank {
			c.send(header{kind: kAbort, seq: ch.seq, rank: int32(r), code: code}, []byte(err.Error()), nil, time.Now().Add(100*time.Millisecond))
		}
	}
}

func (ch *Channel) opName(k kind) string {
	return fmt.Sprintf("%s #%d", k, ch.seq)
}

// gatherUp is rank 0's half of a gather: wait for every other rank's frame
// of kind k for the current call. On error every frame's descriptors are
// closed.
func (ch *Channel) gatherUp(k kind, deadline time.Time, timeout time.Duration) (ups []*frame, err error) {
	ups = make([]*frame, ch.cfg.World)
	defer func() {
		if err != nil {
			for _, f := range ups {
				if f != nil {
					f.closeFDs()
				}
			}
		}
	}()
	left := ch.cfg.World - 1
	rep := core.StartWait(ch.cfg.Name, 0, ch.opName(k), deadline)
	mark := core.InterruptMark()
	for left > 0 {
		if core.InterruptedSince(mark) {
			return nil, core.InterruptedErr(ch.cfg.Name, 0, ch.opName(k))
		}
		var pfds []unix.PollFd
		var ranks []int
		for r := 1; r < ch.cfg.World; r++ {
			if ups[r] == nil {
				pfds = append(pfds, unix.PollFd{Fd: int32(ch.conns[r].fd), Events: unix.POLLIN})
				ranks = append(ranks, r)
			}
		}
		rep.Tick(func() string { return "rank(s) " + rankList(ranks) })
		n, perr := unix.Poll(pfds, pollTimeout(rep.Wake(deadline)))
		if perr == unix.EINTR {
			continue
		}
		if perr != nil {
			return nil, core.Errorf(core.ErrBackend, "group %q: poll: %v", ch.cfg.Name, perr)
		}
		if n == 0 {
			if time.Now().Before(deadline) {
				continue
			}
			return nil, ch.timeoutErr(k, timeout, ranks)
		}
		for i, r := range ranks {
			if pfds[i].Revents == 0 {
				continue
			}
			f, rerr := ch.conns[r].recv(deadline)
			switch {
			case rerr == nil:
			case errors.Is(rerr, errDeadline):
				var missing []int
				for q := 1; q < ch.cfg.World; q++ {
					if ups[q] == nil {
						missing = append(missing, q)
					}
				}
				return nil, ch.timeoutErr(k, timeout, missing)
			case errors.Is(rerr, errNoFDs):
				return nil, ch.outOfFDs(k, r, rerr)
			case errors.Is(rerr, errInterrupted):
				return nil, core.InterruptedErr(ch.cfg.Name, 0, ch.opName(k))
			case isPeerGone(rerr):
				return nil, core.Errorf(core.ErrPeer, "group %q: %s closed its connection during %s: it exited or failed", ch.cfg.Name, ch.who(r), ch.opName(k))
			default:
				return nil, core.Errorf(core.ErrPeer, "group %q: %s broke the protocol during %s: %v", ch.cfg.Name, ch.who(r), ch.opName(k), rerr)
			}
			if f.kind != k || f.seq != ch.seq {
				f.closeFDs()
				return nil, core.Errorf(core.ErrMismatch, "group %q: %s is in %s #%d while rank 0 is in %s: the ranks made collective calls in different orders",
					ch.cfg.Name, ch.who(r), f.kind, f.seq, ch.opName(k))
			}
			if f.flags&flagError != 0 {
				f.closeFDs()
				return nil, &core.Error{Code: f.code, Msg: fmt.Sprintf("group %q: %s failed in %s: %s", ch.cfg.Name, ch.who(r), ch.opName(k), f.payload)}
			}
			ups[r] = f
			left--
		}
	}
	return ups, nil
}

// waitReadable waits until fd is readable or deadline passes, printing
// progress lines (Note [Progress while waiting]); the read that follows
// reports a timeout in its own words.
func (ch *Channel) waitReadable(fd int, deadline time.Time, rep *core.WaitReport, mark uint64, missing func() string) {
	if rep == nil {
		waitFDSince(fd, unix.POLLIN, deadline, mark)
		return
	}
	for {
		err := waitFDSince(fd, unix.POLLIN, rep.Wake(deadline), mark)
		if err != errDeadline || !time.Now().Before(deadline) {
			return
		}
		rep.Tick(missing)
	}
}

// missingConns lists the ranks that have not connected to rank 0.
func (ch *Channel) missingConns() string {
	var missing []int
	for r := 1; r < ch.cfg.World; r++ {
		if ch.conns[r] == nil {
			missing = append(missing, r)
		}
	}
	return "rank(s) " + rankList(missing)
}

// outOfFDs is this rank's failure to receive descriptors from rank from
// because it has no descriptors left: a local shortage, reported as such
// and naming this rank, never blamed on the sender (rank 0 passes it on to
// every rank with its abort).
func (ch *Channel) outOfFDs(k kind, from int, err error) error {
	var rl unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &rl)
	return &localShortage{core.Errorf(core.ErrBackend, "group %q: %s ran out of file descriptors receiving %s's descriptors in %s (EMFILE: its limit RLIMIT_NOFILE is %d; raise it with ulimit -n): %v",
		ch.cfg.Name, ch.who(ch.cfg.Rank), ch.who(from), ch.opName(k), rl.Cur, err)}
}

// localShortage is a failure of this rank alone for want of a resource
// (descriptors): the peers did nothing wrong and may not know.
type localShortage struct{ err *core.Error }

func (e *localShortage) Error() string { return e.err.Msg }
func (e *localShortage) Unwrap() error { return e.err }

// IsLocalShortage says whether err is this rank running out of a resource
// in a collective of the channel. On a rank other than 0 the others have
// not heard of it (only rank 0's failures are sent to everyone), so the
// caller should pass it on through its next shared verdict.
func IsLocalShortage(err error) bool {
	var e *localShortage
	return errors.As(err, &e)
}

func (ch *Channel) timeoutErr(k kind, timeout time.Duration, missing []int) error {
	return core.Errorf(core.ErrTimeout, "group %q: %s timed out after %v: rank(s) %s never arrived (%d of %d did)",
		ch.cfg.Name, ch.opName(k), timeout, rankList(missing), ch.cfg.World-len(missing), ch.cfg.World)
}

// sendUp is a rank's half of a gather: send our frame to rank 0. If rank 0
// is gone it looks for an abort that rank 0 left before closing.
func (ch *Channel) sendUp(h header, payload []byte, fds []int, deadline time.Time) error {
	c := ch.conns[0]
	h.seq, h.rank = ch.seq, int32(ch.cfg.Rank)
	err := c.send(h, payload, fds, deadline)
	if err == nil {
		return nil
	}
	if f, rerr := c.recv(time.Now().Add(50 * time.Millisecond)); rerr == nil {
		f.closeFDs()
		if f.kind == kAbort {
			return &core.Error{Code: f.code, Msg: string(f.payload)}
		}
	}
	if errors.Is(err, errInterrupted) {
		return core.InterruptedErr(ch.cfg.Name, ch.cfg.Rank, ch.opName(h.kind))
	}
	if errors.Is(err, errDeadline) {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d could not send its part of %s to rank 0 within the timeout (rank 0 is not reading)", ch.cfg.Name, ch.cfg.Rank, ch.opName(h.kind))
	}
	return core.Errorf(core.ErrPeer, "group %q: %s closed its connection before %s (%v): it exited or failed", ch.cfg.Name, ch.who(0), ch.opName(h.kind), err)
}

// recvDown is a rank's wait for rank 0's answer of kind k, or its abort.
func (ch *Channel) recvDown(k kind, deadline time.Time, timeout time.Duration) (*frame, error) {
	mark := core.InterruptMark()
	ch.waitReadable(ch.conns[0].fd, deadline, core.StartWait(ch.cfg.Name, ch.cfg.Rank, ch.opName(k), deadline), mark,
		func() string { return "rank 0's answer (it waits for every rank's part): rank 0 or another rank" })
	if core.InterruptedSince(mark) {
		return nil, core.InterruptedErr(ch.cfg.Name, ch.cfg.Rank, ch.opName(k))
	}
	f, err := ch.conns[0].recv(deadline)
	switch {
	case err == nil:
	case errors.Is(err, errInterrupted):
		return nil, core.InterruptedErr(ch.cfg.Name, ch.cfg.Rank, ch.opName(k))
	case errors.Is(err, errDeadline):
		return nil, core.Errorf(core.ErrTimeout, "group %q: rank %d got no answer from %s for %s within %v (plus %v grace): rank 0 is stuck or has not made this call",
			ch.cfg.Name, ch.cfg.Rank, ch.who(0), ch.opName(k), timeout, grace(timeout))
	case errors.Is(err, errNoFDs):
		return nil, ch.outOfFDs(k, 0, err)
	case isPeerGone(err):
		return nil, core.Errorf(core.ErrPeer, "group %q: %s closed its connection during %s: it exited or failed", ch.cfg.Name, ch.who(0), ch.opName(k))
	default:
		return nil, core.Errorf(core.ErrPeer, "group %q: %s broke the protocol during %s: %v", ch.cfg.Name, ch.who(0), ch.opName(k), err)
	}
	if f.kind == kAbort {
		f.closeFDs()
		return nil, &core.Error{Code: f.code, Msg: string(f.payload)}
	}
	if f.kind != k || f.seq != ch.seq {
		f.closeFDs()
		return nil, core.Errorf(core.ErrMismatch, "group %q: rank 0 answered with %s #%d while rank %d is in %s: the ranks made collective calls in different orders",
			ch.cfg.Name, f.kind, f.seq, ch.cfg.Rank, ch.opName(k))
	}
	return f, nil
}

func (ch *Channel) timeoutOr(t time.Duration) time.Duration {
	if t <= 0 {
		return ch.cfg.Timeout
	}
	return t
}

// AllGather sends rec to every rank and returns every rank's record, index
// by rank (ours included, copied). Collective. timeout <= 0 means the
// group's timeout.
func (ch *Channel) AllGather(timeout time.Duration, rec []byte) ([][]byte, error) {
	defer ch.mu.Unlock()
	if err := ch.begin(); err != nil {
		return nil, err
	}
	timeout = ch.timeoutOr(timeout)
	out := make([][]byte, ch.cfg.World)
	out[ch.cfg.Rank] = append([]byte(nil), rec...)
	if ch.cfg.World == 1 {
		return out, nil
	}
	deadline := time.Now().Add(timeout)
	if ch.cfg.Rank != 0 {
		if err := ch.sendUp(header{kind: kGather}, rec, nil, deadline); err != nil {
			return nil, ch.fail(err)
		}
		f, err := ch.recvDown(kGathered, deadline.Add(grace(timeout)), timeout)
		if err != nil {
			return nil, ch.fail(err)
		}
		f.closeFDs()
		d := dec{b: f.payload}
		for r := range out {
			out[r] = d.bytes()
		}
		if d.err != nil {
			return nil, ch.fail(core.Errorf(core.ErrPeer, "group %q: malformed %s from rank 0: %v", ch.cfg.Name, ch.opName(kGathered), d.err))
		}
		return out, nil
	}
	ups, err := ch.gatherUp(kGather, deadline, timeout)
	if err != nil {
		return nil, ch.fail(err)
	}
	var e enc
	for r := range out {
		if r != 0 {
			out[r] = ups[r].payload
		}
		e.bytes(out[r])
	}
	ch.scatter(kGathered, func(int) ([]byte, []int) { return e.b, nil }, timeout)
	return out, nil
}

// scatter is rank 0's answer to every rank. A rank that cannot be reached
// is not an error of this call: every other rank has its answer, and the
// dead rank's EOF fails the next collective with its name.
func (ch *Channel) scatter(k kind, part func(r int) ([]byte, []int), timeout time.Duration) {
	deadline := time.Now().Add(grace(timeout))
	for r := 1; r < ch.cfg.World; r++ {
		p, fds := part(r)
		ch.conns[r].send(header{kind: k, seq: ch.seq, rank: int32(r)}, p, fds, deadline)
	}
}

// AllToAllFDs passes descriptors: out[dst] are the descriptors this rank
// sends to rank dst (out[own rank] is ignored; a descriptor may appear for
// several destinations). It returns in[src], the descriptors received from
// each rank, new descriptors owned by the caller (in[own rank] is nil).
// The caller keeps ownership of out's descriptors. Collective; a rank may
// send at most 250 distinct descriptors per call and receive at most 250.
func (ch *Channel) AllToAllFDs(timeout time.Duration, out [][]int) (in [][]int, err error) {
	defer ch.mu.Unlock()
	if err := ch.begin(); err != nil {
		return nil, err
	}
	timeout = ch.timeoutOr(timeout)
	world, me := ch.cfg.World, ch.cfg.Rank
	in = make([][]int, world)
	if world == 1 {
		return in, nil
	}
	deadline := time.Now().Add(timeout)
	if me != 0 {
		// Up: the distinct descriptors, then per destination the indexes.
		var uniq []int
		index := map[int]uint32{}
		var e enc
		for dst := 0; dst < world; dst++ {
			var list []int
			if dst < len(out) && dst != me {
				list = out[dst]
			}
			e.u32(uint32(len(list)))
			for _, fd := range list {
				i, ok := index[fd]
				if !ok {
					i = uint32(len(uniq))
					index[fd] = i
					uniq = append(uniq, fd)
				}
				e.u32(i)
			}
		}
		var serr error
		if len(uniq) > maxFDsPerFrame {
			msg := fmt.Sprintf("it sends %d distinct descriptors in one exchange, at most %d are allowed", len(uniq), maxFDsPerFrame)
			serr = ch.sendUp(header{kind: kFDsUp, flags: flagError, code: core.ErrInvalidArgument}, []byte(msg), nil, deadline)
		} else {
			serr = ch.sendUp(header{kind: kFDsUp}, e.b, uniq, deadline)
		}
		if serr != nil {
			return nil, ch.fail(serr)
		}
		f, err := ch.recvDown(kFDsDown, deadline.Add(grace(timeout)), timeout)
		if err != nil {
			return nil, ch.fail(err)
		}
		d := dec{b: f.payload}
		at := 0
		for src := 0; src < world && d.err == nil; src++ {
			n := int(d.u32())
			if at+n > len(f.fds) {
				d.err = fmt.Errorf("%w: descriptor counts exceed the %d received", errProtocol, len(f.fds))
				break
			}
			if n > 0 {
				in[src] = f.fds[at : at+n : at+n]
			}
			at += n
		}
		if d.err != nil || at != len(f.fds) {
			f.closeFDs()
			return nil, ch.fail(core.Errorf(core.ErrPeer, "group %q: malformed %s from rank 0: %v", ch.cfg.Name, ch.opName(kFDsDown), d.err))
		}
		return in, nil
	}

	// Rank 0: collect, route, answer, keep copies of ours.
	ups, err := ch.gatherUp(kFDsUp, deadline, timeout)
	if err != nil {
		return nil, ch.fail(err)
	}
	defer func() {
		for _, f := range ups {
			if f != nil {
				f.closeFDs() // rank 0's own results are dups, made below
			}
		}
	}()
	// route[dst][src] are the descriptors src sends to dst (in rank 0's
	// table: out's for src 0, received ones otherwise).
	route := make([][][]int, world)
	for dst := range route {
		route[dst] = make([][]int, world)
		if dst != 0 && dst < len(out) {
			route[dst][0] = out[dst]
		}
	}
	for src := 1; src < world; src++ {
		f := ups[src]
		d := dec{b: f.payload}
		for dst := 0; dst < world && d.err == nil; dst++ {
			n := d.u32()
			for j := uint32(0); j < n && d.err == nil; j++ {
				i := d.u32()
				if d.err == nil && int(i) >= len(f.fds) {
					d.err = fmt.Errorf("%w: descriptor index %d of %d", errProtocol, i, len(f.fds))
				}
				if d.err == nil && dst != src {
					route[dst][src] = append(route[dst][src], f.fds[i])
				}
			}
		}
		if d.err != nil {
			return nil, ch.fail(core.Errorf(core.ErrPeer, "group %q: malformed %s from %s: %v", ch.cfg.Name, ch.opName(kFDsUp), ch.who(src), d.err))
		}
	}
	for dst := 1; dst < world; dst++ {
		total := 0
		for _, l := range route[dst] {
			total += len(l)
		}
		if total > maxFDsPerFrame {
			return nil, ch.fail(core.Errorf(core.ErrInvalidArgument, "group %q: %s: rank %d would receive %d descriptors, at most %d are allowed per exchange", ch.cfg.Name, ch.opName(kFDsUp), dst, total, maxFDsPerFrame))
		}
	}
	// Our own copies first, so that a failure leaves nothing half-sent.
	for src := 1; src < world; src++ {
		for _, fd := range route[0][src] {
			nfd, derr := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
			if derr != nil {
				for _, l := range in {
					closeAll(l)
				}
				return nil, ch.fail(core.Errorf(core.ErrBackend, "group %q: dup of a received descriptor: %v", ch.cfg.Name, derr))
			}
			in[src] = append(in[src], nfd)
		}
	}
	ch.scatter(kFDsDown, func(dst int) ([]byte, []int) {
		var e enc
		var fds []int
		for src := 0; src < world; src++ {
			e.u32(uint32(len(route[dst][src])))
			fds = append(fds, route[dst][src]...)
		}
		return e.b, fds
	}, timeout)
	return in, nil
}

// AllGatherFDs sends the same descriptors to every other rank and returns
// what each sent (see AllToAllFDs).
func (ch *Channel) AllGatherFDs(timeout time.Duration, fds []int) ([][]int, error) {
	out := make([][]int, ch.cfg.World)
	for r := range out {
		if r != ch.cfg.Rank {
			out[r] = fds
		}
	}
	return ch.AllToAllFDs(timeout, out)
}
