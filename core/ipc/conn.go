package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// Wire format. Every message is a frame: a fixed 32-byte header, then plen
// bytes of payload. Descriptors ride as SCM_RIGHTS on the first sendmsg of a
// frame, so they arrive with its header. Integers are little-endian.
//
//	off size field
//	 0   4   magic  "SYMM"
//	 4   1   version (wireVersion)
//	 5   1   kind
//	 6   2   flags
//	 8   8   seq    the collective's sequence number (0 while joining)
//	16   4   rank   the sender's rank (rank 0's frames: the destination's)
//	20   4   nfds   descriptors attached
//	24   4   plen   payload bytes
//	28   4   code   a core.Code (reject and abort frames, flagError)
const (
	hdrSize     = 32
	wireMagic   = 0x4d4d5953 // "SYMM"
	wireVersion = 1

	// maxFDsPerFrame stays below the kernel's SCM_MAX_FD (253).
	maxFDsPerFrame = 250
	// maxPayload bounds what a peer can make us allocate.
	maxPayload = 64 << 20
	// maxWorld bounds the world size (the descriptor frames of rank 0 must
	// fit maxFDsPerFrame for the common case of one descriptor per peer).
	maxWorld = 4096
	maxToken = 1024
)

type kind uint8

const (
	kHello    kind = 1 + iota // rank -> 0: name, world, token, pid
	kWelcome                  // 0 -> rank: the group is complete; every rank's pid
	kReject                   // 0 -> rank: refused (code, message; flagRetry)
	kAbort                    // 0 -> rank: the collective failed (code, message)
	kGather                   // rank -> 0: a record
	kGathered                 // 0 -> rank: every rank's record
	kFDsUp                    // rank -> 0: descriptors and where each goes
	kFDsDown                  // 0 -> rank: descriptors from every rank
)

func (k kind) String() string {
	switch k {
	case kHello:
		return "hello"
	case kWelcome:
		return "welcome"
	case kReject:
		return "reject"
	case kAbort:
		return "abort"
	case kGather:
		return "all-gather"
	case kGathered:
		return "all-gather result"
	case kFDsUp:
		return "descriptor exchange"
	case kFDsDown:
		return "descriptor exchange result"
	}
	return fmt.Sprintf("kind %d", uint8(k))
}

const (
	flagRetry uint16 = 1 << iota // reject: the refusal may not hold later, try again
	flagError                    // gather/fds up: the sender failed locally; payload is the message
)

type header struct {
	kind  kind
	flags uint16
	seq   uint64
	rank  int32
	nfds  uint32
	plen  uint32
	code  core.Code
}

func (h *header) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], wireMagic)
	b[4] = wireVersion
	b[5] = byte(h.kind)
	binary.LittleEndian.PutUint16(b[6:], h.flags)
	binary.LittleEndian.PutUint64(b[8:], h.seq)
	binary.LittleEndian.PutUint32(b[16:], uint32(h.rank))
	binary.LittleEndian.PutUint32(b[20:], h.nfds)
	binary.LittleEndian.PutUint32(b[24:], h.plen)
	binary.LittleEndian.PutUint32(b[28:], uint32(h.code))
}

func (h *header) get(b []byte) error {
	if m := binary.LittleEndian.Uint32(b[0:]); m != wireMagic {
		return fmt.Errorf("%w: bad magic %#x (not a libsymmem peer)", errProtocol, m)
	}
	if v := b[4]; v != wireVersion {
		return fmt.Errorf("%w: wire version %d, this library speaks %d (mixed libsymmem versions)", errProtocol, v, wireVersion)
	}
	h.kind = kind(b[5])
	h.flags = binary.LittleEndian.Uint16(b[6:])
	h.seq = binary.LittleEndian.Uint64(b[8:])
	h.rank = int32(binary.LittleEndian.Uint32(b[16:]))
	h.nfds = binary.LittleEndian.Uint32(b[20:])
	h.plen = binary.LittleEndian.Uint32(b[24:])
	h.code = core.Code(binary.LittleEndian.Uint32(b[28:]))
	if h.nfds > maxFDsPerFrame {
		return fmt.Errorf("%w: %d descriptors in one frame", errProtocol, h.nfds)
	}
	if h.plen > maxPayload {
		return fmt.Errorf("%w: payload of %d bytes", errProtocol, h.plen)
	}
	return nil
}

type frame struct {
	header
	payload []byte
	// fds are owned by whoever holds the frame; closeFDs releases them.
	fds []int
}

func (f *frame) closeFDs() {
	closeAll(f.fds)
	f.fds = nil
}

var (
	// errDeadline is a wait that reached its deadline.
	errDeadline = errors.New("deadline passed")
	// errInterrupted is a wait that a signal ended (Note [Interrupts] in
	// core).
	errInterrupted = errors.New("interrupted by a signal")
	// errProtocol is a frame that breaks the wire format.
	errProtocol = errors.New("protocol error")
	// errNoFDs is descriptors lost on receipt because this process has no
	// descriptor left: a local shortage, not the sender's fault.
	errNoFDs = errors.New("out of file descriptors")
)

func closeAll(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// isPeerGone reports whether err means the other end closed or reset.
func isPeerGone(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET) || errors.Is(err, unix.EPIPE) || errors.Is(err, unix.ENOTCONN)
}

// conn is one end of a connected Unix stream socket, non-blocking; every
// operation takes a deadline and waits with poll(2).
type conn struct {
	fd   int
	rank int   // the peer's rank (-1 until it has introduced itself)
	pid  int32 // the peer's pid from SO_PEERCRED
	uid  uint32
}

func (c *conn) close() {
	if c != nil && c.fd >= 0 {
		unix.Close(c.fd)
		c.fd = -1
	}
}

// pollTimeout converts the time left before deadline to poll's milliseconds,
// rounding up so that we never spin on a sub-millisecond remainder.
func pollTimeout(deadline time.Time) int {
	d := time.Until(deadline)
	if d <= 0 {
		return 0
	}
	if core.InterruptsOn() && d > core.InterruptCheckEvery {
		d = core.InterruptCheckEvery // waits check for a signal in between
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond
	if ms > 1<<30 {
		ms = 1 << 30
	}
	return int(ms)
}

// waitFD waits until fd is ready for events or the deadline passes. It
// always polls at least once, so readiness at the deadline still counts.
func waitFD(fd int, events int16, deadline time.Time) error {
	return waitFDSince(fd, events, deadline, core.InterruptMark())
}

// waitFDSince is waitFD that also ends, with errInterrupted, once a signal
// came after mark (core.InterruptMark).
func waitFDSince(fd int, events int16, deadline time.Time, mark uint64) error {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}}
	for {
		n, err := unix.Poll(pfd, pollTimeout(deadline))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			return nil
		}
		if core.InterruptedSince(mark) {
			return errInterrupted
		}
		if !time.Now().Before(deadline) {
			return errDeadline
		}
	}
}

// send writes one frame, with fds attached to its first bytes.
func (c *conn) send(h header, payload []byte, fds []int, deadline time.Time) error {
	if len(fds) > maxFDsPerFrame {
		return core.Errorf(core.ErrInvalidArgument, "%d descriptors in one message, at most %d", len(fds), maxFDsPerFrame)
	}
	h.nfds = uint32(len(fds))
	h.plen = uint32(len(payload))
	buf := make([]byte, hdrSize+len(payload))
	h.put(buf)
	copy(buf[hdrSize:], payload)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	for len(buf) > 0 {
		n, err := unix.SendmsgN(c.fd, buf, oob, nil, unix.MSG_NOSIGNAL)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := waitFD(c.fd, unix.POLLOUT, deadline); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		}
		buf = buf[n:]
		oob = nil // the descriptors went with the first bytes
	}
	return nil
}

// oobSize holds the control message of a full frame's descriptors.
var oobSize = unix.CmsgSpace(maxFDsPerFrame * 4)

// readFull reads exactly len(p) bytes, collecting any descriptors that
// arrive into *fds (which the caller owns, even on error).
func (c *conn) readFull(p []byte, fds *[]int, deadline time.Time) error {
	oob := make([]byte, oobSize)
	got := 0
	for got < len(p) {
		n, oobn, flags, _, err := unix.Recvmsg(c.fd, p[got:], oob, unix.MSG_CMSG_CLOEXEC)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			if perr == nil {
				for i := range msgs {
					if msgs[i].Header.Level == unix.SOL_SOCKET && msgs[i].Header.Type == unix.SCM_RIGHTS {
						if r, err := unix.ParseUnixRights(&msgs[i]); err == nil {
							*fds = append(*fds, r...)
						}
					}
				}
			}
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if err := waitFD(c.fd, unix.POLLIN, deadline); err != nil {
				return err
			}
			continue
		case err != nil:
			return err
		}
		if flags&unix.MSG_CTRUNC != 0 {
			// The kernel drops descriptors it cannot install here: we are
			// out of descriptors, the sender did nothing wrong.
			return fmt.Errorf("%w: the kernel truncated the descriptors of a message (MSG_CTRUNC)", errNoFDs)
		}
		if n == 0 {
			return io.EOF
		}
		got += n
	}
	return nil
}

// recv reads one frame. On error no descriptor is left open.
func (c *conn) recv(deadline time.Time) (*frame, error) {
	f := &frame{}
	var hb [hdrSize]byte
	if err := c.readFull(hb[:], &f.fds, deadline); err != nil {
		f.closeFDs()
		return nil, err
	}
	if err := f.header.get(hb[:]); err != nil {
		f.closeFDs()
		return nil, err
	}
	if f.plen > 0 {
		f.payload = make([]byte, f.plen)
		if err := c.readFull(f.payload, &f.fds, deadline); err != nil {
			f.closeFDs()
			return nil, err
		}
	}
	if uint32(len(f.fds)) != f.nfds {
		n := len(f.fds)
		f.closeFDs()
		return nil, fmt.Errorf("%w: the %s frame announced %d descriptors, %d arrived", errProtocol, f.kind, f.nfds, n)
	}
	return f, nil
}

// peerCred returns the credentials of the process at the other end of fd,
// as the kernel recorded them at connect (or listen) time.
func peerCred(fd int) (*unix.Ucred, error) {
	return unix.GetsockoptUcred(fd, unix.SOL_SOCKET, unix.SO_PEERCRED)
}

// checkPeerCred refuses a peer that runs as another user: only processes
// of our own uid may share our memory. what says who the peer is meant to be.
func checkPeerCred(cred *unix.Ucred, wantUID uint32, what string) error {
	if cred == nil {
		return core.Errorf(core.ErrPermission, "%s: no peer credentials", what)
	}
	if cred.Uid != wantUID {
		return core.Errorf(core.ErrPermission, "%s runs as uid %d (pid %d), this process as uid %d: peers of another user are refused", what, cred.Uid, cred.Pid, wantUID)
	}
	return nil
}

// enc and dec are a tiny length-prefixed encoding for payloads.
type enc struct{ b []byte }

func (e *enc) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *enc) bytes(p []byte) {
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}

type dec struct {
	b   []byte
	err error
}

func (d *dec) u32() uint32 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 4 {
		d.err = fmt.Errorf("%w: short payload", errProtocol)
		return 0
	}
	v := binary.LittleEndian.Uint32(d.b)
	d.b = d.b[4:]
	return v
}

func (d *dec) bytes() []byte {
	n := d.u32()
	if d.err != nil {
		return nil
	}
	if uint32(len(d.b)) < n {
		d.err = fmt.Errorf("%w: short payload", errProtocol)
		return nil
	}
	p := d.b[:n:n]
	d.b = d.b[n:]
	return p
}
