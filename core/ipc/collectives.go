package ipc

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
)

// The channel's collectives: all-gather of records, all-to-all and
// all-gather of descriptors, up to rank 0 and down again (Note [Star
// topology]), one at a time, in the same order on every rank.

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
	for left > 0 {
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
func (ch *Channel) waitReadable(fd int, deadline time.Time, rep *core.WaitReport, missing func() string) {
	if rep == nil {
		return
	}
	for {
		err := waitFD(fd, unix.POLLIN, rep.Wake(deadline))
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
	if errors.Is(err, errDeadline) {
		return core.Errorf(core.ErrTimeout, "group %q: rank %d could not send its part of %s to rank 0 within the timeout (rank 0 is not reading)", ch.cfg.Name, ch.cfg.Rank, ch.opName(h.kind))
	}
	return core.Errorf(core.ErrPeer, "group %q: %s closed its connection before %s (%v): it exited or failed", ch.cfg.Name, ch.who(0), ch.opName(h.kind), err)
}

// recvDown is a rank's wait for rank 0's answer of kind k, or its abort.
func (ch *Channel) recvDown(k kind, deadline time.Time, timeout time.Duration) (*frame, error) {
	ch.waitReadable(ch.conns[0].fd, deadline, core.StartWait(ch.cfg.Name, ch.cfg.Rank, ch.opName(k), deadline),
		func() string { return "rank 0's answer (it waits for every rank's part): rank 0 or another rank" })
	f, err := ch.conns[0].recv(deadline)
	switch {
	case err == nil:
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
