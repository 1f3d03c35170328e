package ipc

// Note [Shared-memory control page]
//
// A rendezvous on a buffer whose segments were already exchanged needs one
// all-gather of a ~100-byte record. Through the sockets that is a gather to
// rank 0 and a scatter back: two hops, a poll on rank 0 and 2*(world-1)
// socket writes and reads, 70 µs at 2 ranks and 142 µs at 4 on H200 hosts.
// The ranks of a group are on one machine (group creation checks it), so a
// page of shared memory does the same with stores and loads:
//
//   - rank 0 creates the page (a memfd) when the exchange is made and passes
//     it to every rank over the group's channel (descriptors keep using the
//     sockets; only records move to the page);
//   - each rank owns two record slots (by round parity) and a published
//     round number. Round n: write the record into slot n%2, publish n, wait
//     until every rank has published >= n, read every rank's slot n%2.
//     Two slots suffice: a rank writes slot n%2 again only in round n+2,
//     which needs every rank to have published n+1, which a rank does only
//     after it finished reading round n;
//   - the rank that completes a round (or aborts one) bumps the futex word
//     and wakes the sleepers; the others only store their round number;
//   - waiting spins for a short while (a warm rendezvous's ranks arrive
//     within microseconds of each other), yielding the CPU every few
//     checks (on an oversubscribed machine a pure spin held the CPU that
//     the awaited rank needed: 209 µs against 66 µs without spinning, on 2
//     CPUs shared by ~17 runnable threads), then sleeps on a futex (the page
//     is MAP_SHARED, so a process-shared futex) woken by publishers that see
//     a sleeper; every sleep is bounded so that the deadline and dead peers
//     (a pidfd per peer, taken at creation, so pid reuse cannot fool it) are
//     checked at least every shmCheckEvery;
//   - the first rank that fails a round (timeout, dead peer) writes its
//     verdict in the page's abort area; every rank waiting, and every rank
//     that arrives later, returns that verdict, so all fail with the same
//     message naming the same ranks (Note [Deadlines] of the sockets);
//   - a record longer than a slot is marked as such; every rank sees the
//     mark in the same round and then all-gathers the records through the
//     sockets, so sizes never make the ranks disagree.
//
// The page is trusted as far as the channel is: only processes admitted to
// the group (same uid, checked with SO_PEERCRED) receive its descriptor.

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/unmanaged"
	"golang.org/x/sys/unix"
)

const (
	shmMagic = 0x4d485353 // "SSHM"
	// shmHeader: magic, world, slot, gen (futex word), sleepers, abort
	// owner, abort ready, abort code, then the abort message.
	shmHeader     = 64
	shmAbortMsg   = 1024
	shmRankHeader = 64 // published round (u64) and padding: one cache line
	// shmCheckEvery bounds every futex sleep: deadlines and dead peers are
	// checked at least this often.
	shmCheckEvery = 10 * time.Millisecond
	// shmMaxWorld bounds the groups that get a page (beyond it the sockets
	// carry the records): the page grows with world*slot.
	shmMaxWorld = 1024
)

// shmSlotSize is the record capacity per rank and round: room for the
// rendezvous record (which grows by 8 bytes per rank) and the member record.
func shmSlotSize(world int) int {
	return (1024 + 16*world + 63) &^ 63
}

// ShmExchange all-gathers records through a shared-memory page (Note
// [Shared-memory control page]); records that do not fit, and nothing else,
// go through the channel. Safe for concurrent use; collective calls run one
// at a time and every rank makes them in the same order.
type ShmExchange struct {
	ch    *Channel
	name  string
	rank  int
	world int
	slot  int
	pids  []int32
	// live watches the peers' processes (Note [Dead peers]).
	live *Liveness
	spin time.Duration
	// cancelled is set by Cancel; genWord is the address of the page's
	// futex word, for Cancel's wake-up (a system call on an address is
	// harmless even after the page is unmapped).
	cancelled atomic.Bool
	genWord   uintptr

	mu sync.Mutex // serialises collective calls; guards the fields below
	// page is the mapping (nil once closed); size its length.
	page []byte
	// round counts this rank's all-gathers; every rank counts the same.
	round uint64
	// broken is the first failure; once set every call returns it.
	broken error
}

var _ Exchange = (*ShmExchange)(nil)

// NewShmExchange makes the group's control page and maps it on every rank.
// Collective over ch: it passes rank 0's page with ch.AllToAllFDs and
// agrees on the outcome with ch.AllGather, so every rank gets an exchange
// or every rank gets an error.
func NewShmExchange(ch *Channel) (*ShmExchange, error) {
	world, me := ch.World(), ch.Rank()
	x := &ShmExchange{ch: ch, name: ch.Name(), rank: me, world: world, slot: shmSlotSize(world), pids: ch.Pids()}
	x.spin = shmSpin(world, x.pids)
	if world > shmMaxWorld {
		return nil, core.Errorf(core.ErrInvalidArgument, "group %q: a control page for %d ranks: at most %d", x.name, world, shmMaxWorld)
	}
	size := x.pageSize()
	if world == 1 {
		x.page = make([]byte, size) // no peers: private memory does
		initHeader(x.page, world, x.slot)
		x.genWord = uintptr(unsafe.Pointer(x.gen()))
		return x, nil
	}
	var localErr error
	fd := -1
	if ch.cfg.ControlPage {
		// It came with the welcome (made by rank 0 at the join).
		fd, localErr = ch.takeControlPage()
	} else {
		if me == 0 {
			fd, localErr = makeControlPage(x.name, world)
		}
		out := make([][]int, world)
		if fd >= 0 {
			for r := 1; r < world; r++ {
				out[r] = []int{fd}
			}
		}
		in, err := ch.AllToAllFDs(0, out)
		if err != nil {
			if fd >= 0 {
				unix.Close(fd)
			}
			return nil, err
		}
		if me != 0 {
			if len(in[0]) == 1 {
				fd, in[0] = in[0][0], nil
			} else {
				localErr = core.Errorf(core.ErrPeer, "group %q: rank 0 sent %d descriptors for the control page, 1 was expected (it could not make it)", x.name, len(in[0]))
			}
			for _, l := range in {
				closeAll(l)
			}
		}
	}
	if fd >= 0 {
		if localErr == nil {
			x.page, localErr = mapPage(fd, size)
		}
		unix.Close(fd) // the mapping stays
	}
	if localErr == nil {
		localErr = x.checkHeader()
	}
	if localErr == nil {
		localErr = x.openPidfds()
	}
	// Every rank learns every rank's outcome.
	st := []byte{0}
	if localErr != nil {
		st = []byte(fmt.Sprintf("%d:%v", core.CodeOf(localErr), localErr))
	}
	all, err := ch.AllGather(0, st)
	if err == nil {
		for r, b := range all {
			if len(b) == 1 && b[0] == 0 {
				continue
			}
			code := core.ErrPeer
			msg := string(b)
			if i := indexByte(msg, ':'); i > 0 {
				if c, perr := strconv.Atoi(msg[:i]); perr == nil {
					code, msg = core.Code(c), msg[i+1:]
				}
			}
			if r == me {
				err = localErr
			} else {
				err = core.Errorf(code, "group %q: rank %d could not set up the control page: %s", x.name, r, msg)
			}
			break
		}
	}
	if err != nil {
		x.release()
		return nil, err
	}
	x.genWord = uintptr(unsafe.Pointer(x.gen()))
	return x, nil
}

func indexByte(s string, c byte) int {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return i
		}
	}
	return -1
}

// shmSpin is how long a waiter spins before it sleeps: SYMMEM_SHM_SPIN_US
// (0 sleeps at once), else 50 µs where the group's ranks may run on at
// least as many CPUs as there are ranks, and 0 where they may not (a
// spinning rank would then hold the CPU that the rank it waits for needs).
// The CPUs are the union of the ranks' affinity masks (pids, ours
// included): ranks pinned one CPU each, as benchmarks and launchers pin
// them, spin; ranks sharing one CPU do not. This process's own mask alone
// said "one CPU, two ranks: sleep" for the pinned ranks of
// bench/symm_bench.py, whose every warm rendezvous then paid a futex
// wake-up.
func shmSpin(world int, pids []int32) time.Duration {
	if d := core.Current().Duration("SYMMEM_SHM_SPIN_US", -1); d >= 0 {
		return d
	}
	if groupCPUs(pids) < world {
		return 0
	}
	return 50 * time.Microsecond
}

// groupCPUs counts the CPUs that the processes pids (and this one) may run
// on; a mask it cannot read counts as this process's.
func groupCPUs(pids []int32) int {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil {
		return runtime.NumCPU()
	}
	for _, pid := range pids {
		var set unix.CPUSet
		if pid <= 0 || unix.SchedGetaffinity(int(pid), &set) != nil {
			continue
		}
		for i := range all {
			all[i] |= set[i]
		}
	}
	return all.Count()
}

func (x *ShmExchange) rankStride() int { return shmRankHeader + 2*(8+x.slot) }

func (x *ShmExchange) pageSize() int { return controlPageSize(x.world, x.slot) }

func controlPageSize(world, slot int) int {
	return shmHeader + shmAbortMsg + world*(shmRankHeader+2*(8+slot))
}

// makeControlPage creates a group's control page of world ranks (rank 0
// does), with its header written and its size sealed; the caller owns the
// descriptor.
func makeControlPage(name string, world int) (int, error) {
	slot := shmSlotSize(world)
	size := controlPageSize(world, slot)
	fd, err := unix.MemfdCreate("symmem-control", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, core.Errorf(core.ErrBackend, "group %q: memfd_create for the control page: %s", name, core.DescribeErrno(err))
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return -1, core.Errorf(core.ErrOutOfMemory, "group %q: a control page of %d bytes: %v", name, size, err)
	}
	if err := core.SealSize(fd); err != nil { // Note [Sealed memfds]
		unix.Close(fd)
		return -1, err
	}
	p, err := mapPage(fd, size)
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	initHeader(p, world, slot)
	unix.Munmap(p)
	return fd, nil
}

func mapPage(fd, size int) ([]byte, error) {
	got, err := core.PeerMemfdSize(fd)
	if err == nil && got != uint64(size) {
		err = core.Errorf(core.ErrPeer, "the control page has %d bytes, %d were expected", got, size)
	}
	if err != nil {
		return nil, core.Errorf(core.CodeOf(err), "the control page: %v", err)
	}
	p, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, core.Errorf(core.ErrOutOfMemory, "mmap of the control page (%d bytes): %v", size, err)
	}
	// A forked child must not share the group's protocol state (Note [Fork]
	// in core/host).
	if err := unix.Madvise(p, unix.MADV_DONTFORK); err != nil {
		unix.Munmap(p)
		return nil, core.Errorf(core.ErrBackend, "madvise(MADV_DONTFORK) of the control page: %v", err)
	}
	return p, nil
}

func initHeader(page []byte, world, slot int) {
	binary.LittleEndian.PutUint32(page[0:], shmMagic)
	binary.LittleEndian.PutUint32(page[4:], uint32(world))
	binary.LittleEndian.PutUint32(page[8:], uint32(slot))
}

func (x *ShmExchange) checkHeader() error {
	m, w, s := binary.LittleEndian.Uint32(x.page[0:]), binary.LittleEndian.Uint32(x.page[4:]), binary.LittleEndian.Uint32(x.page[8:])
	if m != shmMagic || int(w) != x.world || int(s) != x.slot {
		return core.Errorf(core.ErrPeer, "group %q: the control page from rank 0 says magic %#x, world %d, slot %d; expected %#x, %d, %d",
			x.name, m, w, s, shmMagic, x.world, x.slot)
	}
	return nil
}

func (x *ShmExchange) openPidfds() (err error) {
	x.live, err = NewLiveness(x.name, x.rank, x.pids)
	return err
}

func (x *ShmExchange) who(r int) string {
	if r >= 0 && r < len(x.pids) && x.pids[r] > 0 {
		return fmt.Sprintf("rank %d (pid %d)", r, x.pids[r])
	}
	return fmt.Sprintf("rank %d", r)
}

// Words of the page (all naturally aligned; the mapping is page-aligned).
func (x *ShmExchange) u32(off int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&x.page[off]))
}
func (x *ShmExchange) gen() *atomic.Uint32        { return x.u32(12) }
func (x *ShmExchange) sleepers() *atomic.Uint32   { return x.u32(16) }
func (x *ShmExchange) abortOwner() *atomic.Uint32 { return x.u32(20) }
func (x *ShmExchange) abortReady() *atomic.Uint32 { return x.u32(24) }
func (x *ShmExchange) rankOff(r int) int          { return shmHeader + shmAbortMsg + r*x.rankStride() }
func (x *ShmExchange) published(r int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&x.page[x.rankOff(r)]))
}

// slotOf is rank r's slot for a round: a length word (math.MaxUint32 marks
// a record too long for the slot), a reserved word, then the bytes.
func (x *ShmExchange) slotOf(r int, round uint64) []byte {
	off := x.rankOff(r) + shmRankHeader + int(round%2)*(8+x.slot)
	return x.page[off : off+8+x.slot]
}

var _ ReusingExchange = (*ShmExchange)(nil)

// AllGather contributes rec and returns every rank's record (copies).
func (x *ShmExchange) AllGather(timeout time.Duration, rec []byte) ([][]byte, error) {
	return x.AllGatherInto(timeout, rec, nil)
}

// AllGatherInto is AllGather copying the records into into's buffers where
// into has one per rank (ReusingExchange).
func (x *ShmExchange) AllGatherInto(timeout time.Duration, rec []byte, into [][]byte) ([][]byte, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.broken != nil {
		return nil, x.broken
	}
	if x.page == nil {
		return nil, core.Errorf(core.ErrInvalidState, "group %q: the control page is closed", x.name)
	}
	if timeout <= 0 {
		timeout = x.ch.Timeout()
	}
	x.round++
	n := x.round
	if err := x.abortErr(); err != nil { // a verdict from a failed round
		x.broken = err
		return nil, err
	}
	s := x.slotOf(x.rank, n)
	if len(rec) <= x.slot {
		binary.LittleEndian.PutUint32(s[0:], uint32(len(rec)))
		copy(s[8:], rec)
	} else {
		binary.LittleEndian.PutUint32(s[0:], math.MaxUint32)
	}
	x.publish(n)
	if err := x.waitAll(n, time.Now().Add(timeout), timeout); err != nil {
		x.broken = err
		return nil, err
	}
	out := into
	if len(out) != x.world {
		out = make([][]byte, x.world)
	}
	long := false
	for r := range out {
		s := x.slotOf(r, n)
		l := binary.LittleEndian.Uint32(s[0:])
		if l == math.MaxUint32 {
			long = true
			continue
		}
		if int(l) > x.slot {
			err := core.Errorf(core.ErrPeer, "group %q: %s wrote a record of %d bytes into a slot of %d", x.name, x.who(r), l, x.slot)
			x.broken = x.abort(err)
			return nil, x.broken
		}
		out[r] = append(out[r][:0], s[8:8+l]...)
	}
	if long {
		// Every rank saw the same marks: all take the sockets together.
		all, err := x.ch.AllGather(timeout, rec)
		if err != nil {
			x.broken = err
		}
		return all, err
	}
	return out, nil
}

// publish makes round n visible; the rank that completes the round (sees
// every rank arrived after its own store) wakes the sleepers, once: waking
// them at every arrival made each sleeper run world-1 times per round, a
// thundering herd that cost more than the round on an oversubscribed
// machine. Two ranks storing at once may both see the round complete and
// both wake: harmless.
func (x *ShmExchange) publish(n uint64) {
	x.published(x.rank).Store(n)
	if !x.arrived(n) {
		return
	}
	x.gen().Add(1)
	if x.sleepers().Load() != 0 {
		futexWake(x.gen())
	}
}

// arrived reports whether every rank has published round n, and if not the
// ranks that have not.
func (x *ShmExchange) arrived(n uint64) bool {
	for r := 0; r < x.world; r++ {
		if x.published(r).Load() < n {
			return false
		}
	}
	return true
}

func (x *ShmExchange) missing(n uint64) []int {
	var m []int
	for r := 0; r < x.world; r++ {
		if x.published(r).Load() < n {
			m = append(m, r)
		}
	}
	return m
}

// waitAll waits until every rank has published round n: spin, then futex
// sleeps of at most shmCheckEvery with checks for the deadline, a verdict
// and dead peers between them.
func (x *ShmExchange) waitAll(n uint64, deadline time.Time, timeout time.Duration) error {
	if x.arrived(n) {
		return nil
	}
	mark := core.InterruptMark()
	spinUntil := time.Now().Add(x.spin)
	for i := 0; ; i++ {
		if x.arrived(n) {
			return nil
		}
		if i&15 == 15 {
			// Give the CPU away now and then: on a machine with more
			// runnable threads than CPUs the rank we wait for may need it.
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			if x.cancelled.Load() || !time.Now().Before(spinUntil) {
				break
			}
		}
	}
	for {
		// A round that every rank reached succeeds, whatever verdict the
		// page holds: a rank that leaves right after the round it
		// completed (Close's verdict; the member agreement's mismatches
		// close every rank right after the round that showed them) must
		// not fail the peers still waiting in that round. The verdict is
		// read before arrival, not after: a verdict written by a rank that
		// completed round n was stored after every rank's publication of
		// n, so a waiter that sees it then sees round n complete. Read the
		// other way round, the leaving rank's peer could see round n
		// incomplete, lose the CPU while the last rank arrives and the
		// others finish the round and close, then see the verdict, and
		// report that a peer left instead of the round's outcome.
		verdict := x.abortErr()
		if x.arrived(n) {
			return nil
		}
		if x.cancelled.Load() {
			x.abort(core.Errorf(core.ErrPeer, "group %q: %s left the group (destroyed or closed) during all-gather #%d", x.name, x.who(x.rank), n))
			return core.Errorf(core.ErrInvalidState, "group %q: rank %d left the group (destroyed or closed on another thread) during all-gather #%d", x.name, x.rank, n)
		}
		if verdict != nil {
			return verdict
		}
		if core.InterruptedSince(mark) { // Note [Interrupts] in core
			x.abort(core.Errorf(core.ErrPeer, "group %q: %s left the group (a signal interrupted it) during all-gather #%d", x.name, x.who(x.rank), n))
			return core.InterruptedErr(x.name, x.rank, fmt.Sprintf("all-gather #%d (control page)", n))
		}
		for _, r := range x.missing(n) {
			if x.live.Gone(r) {
				// Arrival is read again after the exit, for the same
				// reason: r may have published n, then exited, after
				// missing read it.
				if x.arrived(n) {
					return nil
				}
				return x.abort(x.live.Exited(r, fmt.Sprintf("all-gather #%d (control page)", n)))
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			m := x.missing(n)
			if len(m) == 0 {
				return nil
			}
			return x.abort(core.Errorf(core.ErrTimeout, "group %q: all-gather #%d (control page) timed out after %v: rank(s) %s never arrived (%d of %d did)",
				x.name, n, timeout, rankList(m), x.world-len(m), x.world))
		}
		if left > shmCheckEvery {
			left = shmCheckEvery
		}
		// Sleep unless something changed since we looked (the sleeper
		// count is raised before gen is read and the round checked; the
		// completing publisher stores its round, then bumps gen, then reads
		// the count: no lost wake-up).
		x.sleepers().Add(1)
		g := x.gen().Load()
		if !x.arrived(n) && x.abortReady().Load() == 0 && !x.cancelled.Load() {
			futexWait(x.gen(), g, left)
		}
		x.sleepers().Add(^uint32(0))
	}
}

// abort records err as the group's verdict unless another rank's came
// first, wakes every rank, and returns the verdict.
func (x *ShmExchange) abort(err error) error {
	if x.abortOwner().CompareAndSwap(0, uint32(x.rank+1)) {
		msg := err.Error()
		if len(msg) > shmAbortMsg {
			msg = msg[:shmAbortMsg]
		}
		binary.LittleEndian.PutUint32(x.page[28:], uint32(core.CodeOf(err)))
		binary.LittleEndian.PutUint32(x.page[32:], uint32(len(msg)))
		copy(x.page[shmHeader:], msg)
		x.abortReady().Store(1)
		x.gen().Add(1)
		futexWake(x.gen())
		return err
	}
	// Another rank is writing its verdict: wait for it (briefly).
	for i := 0; i < 1000 && x.abortReady().Load() == 0; i++ {
		core.Nap(10 * time.Microsecond)
	}
	if e := x.abortErr(); e != nil {
		return e
	}
	return err
}

// abortErr is the verdict in the page, or nil.
func (x *ShmExchange) abortErr() error {
	if x.abortReady().Load() == 0 {
		return nil
	}
	code := core.Code(binary.LittleEndian.Uint32(x.page[28:]))
	l := int(binary.LittleEndian.Uint32(x.page[32:]))
	if l > shmAbortMsg {
		l = shmAbortMsg
	}
	return &core.Error{Code: code, Msg: string(x.page[shmHeader : shmHeader+l])}
}

// Cancel makes an all-gather in flight on another thread return at once
// with ErrInvalidState (and its peers with ErrPeer naming this rank), and
// every later one fail. For Group.Destroy. Safe at any time.
func (x *ShmExchange) Cancel() {
	x.cancelled.Store(true)
	if x.genWord != 0 {
		futexWake((*atomic.Uint32)(unmanaged.Pointer(x.genWord)))
	}
}

// Close leaves the group: it cancels an all-gather in flight, marks the page
// so that every peer's collective from now on fails with ErrPeer naming this
// rank (as a closed socket does), and unmaps it. Not collective. Idempotent.
func (x *ShmExchange) Close() error {
	x.Cancel()
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.page != nil && x.world > 1 && x.abortReady().Load() == 0 {
		x.abort(core.Errorf(core.ErrPeer, "group %q: %s left the group (destroyed or closed)", x.name, x.who(x.rank)))
	}
	x.release()
	if x.broken == nil {
		x.broken = core.Errorf(core.ErrInvalidState, "group %q: the control page is closed", x.name)
	}
	return nil
}

func (x *ShmExchange) release() {
	if x.page != nil && x.world > 1 {
		unix.Munmap(x.page)
	}
	x.page = nil
	x.live.Close()
}

// FUTEX_WAIT and FUTEX_WAKE of linux/futex.h (x/sys/unix has the syscall
// number, not the operations); without FUTEX_PRIVATE_FLAG: the word is
// shared between processes.
const (
	futexWaitOp = 0
	futexWakeOp = 1
)

// futexWait sleeps while *w == val, at most d (a process-shared futex).
func futexWait(w *atomic.Uint32, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on w.
func futexWake(w *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWakeOp, uintptr(math.MaxInt32), 0, 0, 0)
}
