package ipc

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
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
