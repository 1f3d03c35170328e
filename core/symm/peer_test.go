package symm

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/libsymmem/libsymmem/core/host"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lyingBackend is a peer that speaks the protocol but lies about its
// memory: its exports are memfds shorter than what it announces (0 bytes
// for signal pads, half the size for segments).
type lyingBackend struct {
	*host.Backend
	mu      sync.Mutex
	exports int
	lieFrom int // the first export that lies (0: the pad at group creation)
	// unsealed: the lie is the right size but not sealed against
	// shrinking (the peer could cut it after we mapped it).
	unsealed bool
}

func (b *lyingBackend) Export(m core.Memory) (int, error) {
	b.mu.Lock()
	n := b.exports
	b.exports++
	b.mu.Unlock()
	if n < b.lieFrom {
		return b.Backend.Export(m)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(m), &st); err != nil {
		return -1, err
	}
	short := int64(0)
	if b.unsealed {
		short = st.Size
	} else if n > 0 {
		short = st.Size / 2
	}
	fd, err := unix.MemfdCreate("liar", unix.MFD_CLOEXEC)
	if err != nil {
		return -1, err
	}
	return fd, unix.Ftruncate(fd, short)
}

// TestLyingPeerIsRefused: rank 0 maps nothing a same-uid peer announces
// bigger than it is (a short memfd would be SIGBUS at the first touch past
// its end); every rank fails with PEER naming the liar and its pid.
func TestLyingPeerIsRefused(t *testing.T) {
	for _, c := range []struct {
		name     string
		lieFrom  int
		unsealed bool
		what     string
	}{
		{"pad", 0, false, "signal pad arrived as memory of 0 bytes"},
		{"segment", 1, false, "segment at heap offset 0x0 arrived as memory of"},
		{"unsealed", 1, true, "segment at heap offset 0x0: the memory (2097152 bytes) is not sealed against shrinking"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := sockDir(t)
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for r := 0; r < 2; r++ {
				hb, err := host.New()
				require.NoError(t, err)
				var be core.Backend = hb
				if r == 1 {
					be = &lyingBackend{Backend: hb, lieFrom: c.lieFrom, unsealed: c.unsealed}
				}
				e := &rankEnv{rt: alloc.NewRuntime(be), rank: r, world: 2, name: "liar-" + c.name, dir: dir, timeout: 10 * time.Second}
				wg.Add(1)
				go func() {
					defer wg.Done()
					a, err := e.rt.Allocator(0)
					if err != nil {
						errs[e.rank] = err
						return
					}
					if c.lieFrom == 0 {
						_, g, err := join(e, a, 1<<20)
						if g != nil {
							g.Destroy()
						}
						errs[e.rank] = err
						return
					}
					errs[e.rank] = rendezvousOnly(e, a, 1<<20, 0)
				}()
			}
			wg.Wait()
			for r, err := range errs {
				require.Equal(t, core.ErrPeer, core.CodeOf(err), "rank %d: %v", r, err)
				require.Contains(t, err.Error(), fmt.Sprintf("rank 1 (pid %d)'s %s", os.Getpid(), c.what), "rank %d", r)
			}
		})
	}
}

func init() { moreScenarios["fd-starved-member"] = scFDStarvedMember }

// scFDStarvedMember: rank 1 has one descriptor to spare when the peers'
// segments arrive (its own export takes it), so the kernel drops what
// arrives (MSG_CTRUNC). Rank 1 must say it ran out, and every other rank
// must be told that rank 1 failed and why, at once, not time out.
func scFDStarvedMember(e *rankEnv, a *alloc.Allocator) error {
	buf, g, err := join(e, a, 1<<20)
	if err != nil {
		return err
	}
	defer g.Destroy()
	if e.rank == 1 {
		var saved unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_NOFILE, &saved)
		ents, _ := os.ReadDir("/proc/self/fd")
		top := 0
		for _, d := range ents {
			var fd int
			fmt.Sscan(d.Name(), &fd)
			top = max(top, fd+1)
		}
		for fd := 0; fd < top; fd++ { // fill the holes: exactly 1 spare
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				if nfd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
					defer unix.Close(nfd)
				}
			}
		}
		lim := saved
		lim.Cur = uint64(top + 1)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
		defer unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	}
	h, err := g.Rendezvous(buf)
	if err == nil {
		h.Release()
	}
	return err
}

func TestProcessesMemberOutOfDescriptors(t *testing.T) {
	start := time.Now()
	res := runProcs(t, "fd-starved-member", 3, 20*time.Second, 0)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v: the ranks waited for the timeout", d)
	}
	allFail(t, res, core.ErrBackend, "rank 1 (pid", "ran out of file descriptors", "EMFILE")
}

func init() { moreScenarios["fd-starved-identity"] = scFDStarvedIdentity }

// scFDStarvedIdentity: rank 0 has no descriptor to spare when the group is
// made (Note [Machine identity]): the identity was read when the library
// loaded, so nothing is mistaken for a machine mismatch; rank 0 fails with
// its own EMFILE and the others name rank 0.
func scFDStarvedIdentity(e *rankEnv, a *alloc.Allocator) error {
	if e.rank == 0 {
		if thisMachine.err != nil || thisMachine.bootID == "" {
			return fmt.Errorf("the identity read at load: %q, %v", thisMachine.bootID, thisMachine.err)
		}
		var saved unix.Rlimit
		unix.Getrlimit(unix.RLIMIT_NOFILE, &saved)
		ents, _ := os.ReadDir("/proc/self/fd")
		top := 0
		for _, d := range ents {
			var fd int
			fmt.Sscan(d.Name(), &fd)
			top = max(top, fd+1)
		}
		for fd := 0; fd < top; fd++ { // fill the holes: no spare at all
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
				if nfd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
					defer unix.Close(nfd)
				}
			}
		}
		lim := saved
		lim.Cur = uint64(top)
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			return err
		}
		defer unix.Setrlimit(unix.RLIMIT_NOFILE, &saved)
	}
	g, err := New(e.opts(e.name, e.rank, e.world))
	if err == nil {
		g.Destroy()
		return fmt.Errorf("rank %d: the group formed with rank 0 out of descriptors", e.rank)
	}
	if strings.Contains(err.Error(), "different machines") {
		return fmt.Errorf("rank %d: a descriptor shortage reported as a machine mismatch: %v", e.rank, err)
	}
	return err
}

func TestProcessesIdentityWithoutDescriptors(t *testing.T) {
	res := runProcs(t, "fd-starved-identity", 3, 3*time.Second, 0)
	for _, r := range res {
		want := core.ErrTimeout
		if r.Rank == 0 {
			want = core.ErrBackend
		}
		if core.Code(r.Code) != want {
			t.Fatalf("rank %d: code %d (%s), want %s: %s\n%s", r.Rank, r.Code, core.Code(r.Code), want, r.Msg, r.Out)
		}
		t.Logf("rank %d: %s", r.Rank, r.Msg)
		if r.Rank == 0 && !strings.Contains(r.Msg, "EMFILE") {
			t.Fatalf("rank 0's message lacks EMFILE: %s", r.Msg)
		}
	}
}
