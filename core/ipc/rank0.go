package ipc

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
)

// Rank 0's side of the join: it claims the group's socket (listen), then
// admits the others in rounds of named phases (Note [Rank 0's join]) and
// welcomes them.

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

// helloWait bounds how long rank 0 waits for a connected process to say
// who it is, so that a stray connection cannot stall the group.
const helloWait = 2 * time.Second

// Note [Rank 0's join]
//
// Rank 0 listens, then runs rounds until every rank has joined; each round
// is the same phases in the same order:
//
//  1. pollSet: one poll set of the listener, the accepted connections that
//     have not introduced themselves (pending), and the joined ranks (a
//     joined rank sends nothing more until welcomed: readable means it
//     closed);
//  2. rank0Claimed: other processes that claim rank 0 fail the join (once
//     every rank has, or rank0Grace after the first);
//  3. poll, bounded by the deadline (the timeout names the missing ranks
//     and the refused connections);
//  4. watchJoined: a joined rank whose connection ended fails the group;
//  5. readHellos: pending connections introduce themselves, and admit
//     makes each the connection of its rank or refuses it;
//  6. acceptNew: new connections are accepted and their credentials
//     checked, joining pending.
//
// Then stopListening frees the name and welcome sends every rank the pids
// and the control page. A failure at any phase closes what is pending,
// aborts the joined ranks (abortAll) and stops listening (finish).

// rootJoin is rank 0's state while the others join (openRoot), carried
// from phase to phase (Note [Rank 0's join]).
type rootJoin struct {
	ch       *Channel
	deadline time.Time
	rep      *core.WaitReport

	lfd       int    // the listening socket
	ino       uint64 // its inode, to unlink only our own socket file
	listening bool

	pending    []*conn   // accepted, not yet introduced
	notes      []string  // refused connections, for the timeout message
	joined     int       // ranks joined, rank 0 included
	rank0Since time.Time // when the first other process claimed rank 0

	// This round's poll set: the listener, then pending, then the joined
	// ranks (joinedRanks, in the order of their entries).
	pfds        []unix.PollFd
	joinedRanks []int
}

// openRoot is rank 0's side of Open (Note [Rank 0's join]).
func (ch *Channel) openRoot(deadline time.Time) (err error) {
	j := &rootJoin{ch: ch, deadline: deadline, joined: 1}
	if j.lfd, j.ino, err = ch.listen(deadline); err != nil {
		return err
	}
	j.listening = true
	defer j.finish(&err)
	j.rep = core.StartWait(ch.cfg.Name, 0, "connection", deadline)
	for j.joined < ch.cfg.World {
		if err := j.round(); err != nil {
			return err
		}
	}
	// Complete: nobody else may join, so free the name at once.
	j.stopListening()
	return ch.welcome()
}

// finish closes the connections still pending and, when the join failed
// (*err), aborts the joined ranks; then it stops listening.
func (j *rootJoin) finish(err *error) {
	for _, c := range j.pending {
		c.close()
	}
	if *err != nil {
		j.ch.abortAll(*err)
	}
	j.stopListening()
}

func (j *rootJoin) stopListening() {
	if j.listening {
		j.ch.unlisten(j.lfd, j.ino)
		j.listening = false
	}
}

// round is one turn of the join: the phases of Note [Rank 0's join]. Its
// error fails the join.
func (j *rootJoin) round() error {
	j.rep.Tick(func() string { return j.ch.missingConns() })
	j.pollSet()
	if err := j.rank0Claimed(); err != nil {
		return err
	}
	ready, err := j.poll()
	if err != nil || !ready {
		return err
	}
	if err := j.watchJoined(); err != nil {
		return err
	}
	if err := j.readHellos(); err != nil {
		return err
	}
	if j.pfds[0].Revents != 0 {
		return j.acceptNew()
	}
	return nil
}

// pollSet makes this round's poll set.
func (j *rootJoin) pollSet() {
	j.pfds = append(j.pfds[:0], unix.PollFd{Fd: int32(j.lfd), Events: unix.POLLIN})
	for _, c := range j.pending {
		j.pfds = append(j.pfds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLIN})
	}
	j.joinedRanks = j.joinedRanks[:0]
	for r, c := range j.ch.conns {
		if c != nil {
			j.pfds = append(j.pfds, unix.PollFd{Fd: int32(c.fd), Events: unix.POLLIN})
			j.joinedRanks = append(j.joinedRanks, r)
		}
	}
}

// rank0Claimed fails the join when other processes claim rank 0: once
// every rank has (everyone was started as rank 0) or shortly after the
// first.
func (j *rootJoin) rank0Claimed() error {
	ch := j.ch
	if k := len(ch.otherRank0s); k > 0 && (k >= ch.cfg.World-1 || !time.Now().Before(j.rank0Since.Add(rank0Grace))) {
		return core.Errorf(core.ErrMismatch, "%s", ch.rank0Claims())
	} else if k > 0 && j.rank0Since.IsZero() {
		j.rank0Since = time.Now()
	}
	return nil
}

// poll waits for the poll set until the next report, the end of the grace
// for rank 0's claims, or the deadline. ready is false when nothing is to
// be read (another round follows); past the deadline it is the timeout.
func (j *rootJoin) poll() (ready bool, err error) {
	ch := j.ch
	wake := j.rep.Wake(j.deadline)
	if !j.rank0Since.IsZero() && j.rank0Since.Add(rank0Grace).Before(wake) {
		wake = j.rank0Since.Add(rank0Grace)
	}
	n, perr := unix.Poll(j.pfds, pollTimeout(wake))
	if perr == unix.EINTR {
		return false, nil
	}
	if perr != nil {
		return false, core.Errorf(core.ErrBackend, "group %q: poll: %v", ch.cfg.Name, perr)
	}
	if n > 0 {
		return true, nil
	}
	if time.Now().Before(j.deadline) || len(ch.otherRank0s) > 0 {
		return false, nil
	}
	var missing []int
	for r := 1; r < ch.cfg.World; r++ {
		if ch.conns[r] == nil {
			missing = append(missing, r)
		}
	}
	msg := fmt.Sprintf("group %q: timed out after %v waiting for rank(s) %s to join (%d of %d ranks joined, socket %s)",
		ch.cfg.Name, ch.cfg.Timeout, rankList(missing), j.joined, ch.cfg.World, ch.cfg.sockPath())
	if len(j.notes) > 0 {
		msg += "; refused: " + dedupe(j.notes)
	}
	return false, &core.Error{Code: core.ErrTimeout, Msg: msg}
}

// watchJoined fails the group when a joined rank's connection became
// readable: it sends nothing before the welcome, so it went away.
func (j *rootJoin) watchJoined() error {
	ch := j.ch
	for i, r := range j.joinedRanks {
		if j.pfds[1+len(j.pending)+i].Revents == 0 {
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
	return nil
}

// readHellos reads the hello of each pending connection that has spoken
// and admits it, or refuses it (admit).
func (j *rootJoin) readHellos() error {
	var still []*conn
	for i, c := range j.pending {
		if j.pfds[1+i].Revents == 0 {
			still = append(still, c)
			continue
		}
		hd := j.deadline
		if t := time.Now().Add(helloWait); t.Before(hd) {
			hd = t
		}
		f, rerr := c.recv(hd)
		if rerr != nil {
			if !isPeerGone(rerr) {
				j.notes = append(j.notes, fmt.Sprintf("pid %d: %v", c.pid, rerr))
			}
			c.close()
			continue
		}
		ok, fatal := j.ch.admit(c, f, &j.notes)
		if fatal != nil {
			return fatal // finish closes every connection of this round
		}
		if ok {
			j.joined++
		}
	}
	j.pending = still
	return nil
}

// acceptNew accepts every waiting connection, checks its credentials and
// adds it to pending.
func (j *rootJoin) acceptNew() error {
	ch := j.ch
	for {
		nfd, _, aerr := unix.Accept4(j.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if aerr == unix.EINTR || aerr == unix.ECONNABORTED {
			continue
		}
		if aerr == unix.EAGAIN {
			return nil
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
			j.notes = append(j.notes, cerr.Error())
			c.close()
			continue
		}
		j.pending = append(j.pending, c)
	}
}

// welcome tells every rank that the group is complete: the pids of all
// ranks, and the control page when the group has one (it rides on the
// welcome: no round trip of its own).
func (ch *Channel) welcome() error {
	var e enc
	for _, p := range ch.pids {
		e.u32(uint32(p))
	}
	var page []int
	if ch.cfg.ControlPage {
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
