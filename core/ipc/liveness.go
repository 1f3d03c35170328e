package ipc

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/libsymmem/libsymmem/core"
)

// Note [Dead peers]
//
// Every wait of a group for a peer (the control page's all-gathers, the
// host backend's barriers, signal waits and collectives) checks whether the
// peer's process has exited, at least every LivenessCheckEvery, and fails
// with ErrPeer naming the rank, its pid and how it ended, instead of waiting
// out the timeout. A Liveness holds a pidfd per peer, taken when the group
// is made (pids come from SO_PEERCRED at the join), so pid reuse cannot fool
// it: a pidfd polls readable once its process has exited. A stopped process
// (SIGSTOP) has not exited: waits for it still end at the timeout. How it
// ended is read from /proc/<pid>/stat (exit_code) while the process is a
// zombie; once its parent has collected it, that is no longer known. On the
// cuda backend the waits are on the GPU: a goroutine per group sleeps in
// poll(2) on the pidfds and, when one becomes readable, writes the abort
// word of the rank's device region (Note [Pad partition] in
// core/pad.go), which the kernels' waits read.

// LivenessCheckEvery is how often the host backend's waits check their
// peer (the control page checks at every bounded sleep, shmCheckEvery).
const LivenessCheckEvery = shmCheckEvery

// Liveness watches the processes of a group's peers. Safe for concurrent
// use; Close releases the descriptors.
type Liveness struct {
	name string
	pids []int32
	mu   sync.Mutex
	// fds[r] is a pidfd of rank r (-1 for ourselves, or where pidfd_open is
	// not available: then kill(pid, 0) decides).
	fds []int
}

// NewLiveness opens a pidfd for every rank of pids but self; a rank whose
// process is already gone is an ErrPeer error.
func NewLiveness(name string, self int, pids []int32) (*Liveness, error) {
	l := &Liveness{name: name, pids: append([]int32(nil), pids...), fds: make([]int, len(pids))}
	for r := range l.fds {
		l.fds[r] = -1
		if r == self || pids[r] <= 0 {
			continue
		}
		fd, err := unix.PidfdOpen(int(pids[r]), 0)
		if err == unix.ESRCH {
			l.Close()
			return nil, core.Errorf(core.ErrPeer, "group %q: %s exited while the group was made", name, l.Who(r))
		}
		if err == nil {
			l.fds[r] = fd
		}
	}
	return l, nil
}

// Who names rank r with its pid.
func (l *Liveness) Who(r int) string {
	if r >= 0 && r < len(l.pids) && l.pids[r] > 0 {
		return fmt.Sprintf("rank %d (pid %d)", r, l.pids[r])
	}
	return fmt.Sprintf("rank %d", r)
}

// Gone reports whether rank r's process has exited.
func (l *Liveness) Gone(r int) bool {
	if l == nil || r < 0 || r >= len(l.pids) {
		return false
	}
	l.mu.Lock()
	fd := l.fds[r]
	if fd >= 0 {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(p, 0)
		l.mu.Unlock()
		return err == nil && n > 0
	}
	l.mu.Unlock()
	if l.pids[r] <= 0 {
		return false
	}
	return unix.Kill(int(l.pids[r]), 0) == unix.ESRCH
}

// Exited is the error of a wait whose peer r has exited: ErrPeer naming the
// rank, its pid and how it ended, during what.
func (l *Liveness) Exited(r int, what string) error {
	return core.Errorf(core.ErrPeer, "group %q: %s %s during %s", l.name, l.Who(r), ExitCause(l.pids[r]), what)
}

// ExitCause says how process pid ended, as far as /proc still knows: "was
// killed by signal 9 (killed)", "exited with status 3", or "exited (how is
// unknown: its parent has collected it)".
func ExitCause(pid int32) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(int(pid)) + "/stat")
	if err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			// Fields from the state on (field 3); exit_code is field 52.
			f := strings.Fields(s[i+1:])
			if len(f) >= 50 && f[0] == "Z" {
				if st, err := strconv.Atoi(f[49]); err == nil {
					ws := unix.WaitStatus(st)
					if ws.Signaled() {
						return fmt.Sprintf("was killed by signal %d (%v)", int(ws.Signal()), ws.Signal())
					}
					return fmt.Sprintf("exited with status %d", ws.ExitStatus())
				}
			}
		}
	}
	return "exited (how is unknown: its parent has already collected its status)"
}

// WaitAnyGone blocks until some watched rank's process exits, and returns
// it, or returns -1 once stop (an eventfd or a pipe's read end) is readable.
func (l *Liveness) WaitAnyGone(stop int) int {
	l.mu.Lock()
	fds := []unix.PollFd{{Fd: int32(stop), Events: unix.POLLIN}}
	ranks := []int{-1}
	for r, fd := range l.fds {
		if fd >= 0 {
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
			ranks = append(ranks, r)
		}
	}
	l.mu.Unlock()
	for {
		n, err := unix.Poll(fds, -1)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n <= 0 || fds[0].Revents != 0 {
			return -1
		}
		for i := 1; i < len(fds); i++ {
			if fds[i].Revents != 0 {
				return ranks[i]
			}
		}
	}
}

// Close releases the pidfds. Idempotent.
func (l *Liveness) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, fd := range l.fds {
		if fd >= 0 {
			unix.Close(fd)
			l.fds[i] = -1
		}
	}
}
