package ipc

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/internal/ranktest"
	"golang.org/x/sys/unix"
)

var sockDir = ranktest.SockDir

func wantCode(t *testing.T, err error, code core.Code, contains ...string) {
	t.Helper()
	if core.CodeOf(err) != code {
		t.Fatalf("got %v (code %v), want code %v", err, core.CodeOf(err), code)
	}
	for _, s := range contains {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not contain %q", err, s)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, ok := range []string{"a", "world", "tp-0.grp_1", strings.Repeat("x", 64)} {
		if err := ValidateName(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a b", "é", strings.Repeat("x", 65), "a\x00"} {
		if err := ValidateName(bad); core.CodeOf(err) != core.ErrInvalidArgument {
			t.Errorf("%q: got %v, want invalid argument", bad, err)
		}
	}
}

func TestDefaultTimeout(t *testing.T) {
	t.Cleanup(func() { core.ReloadSettings() })
	t.Setenv("SYMMEM_TIMEOUT_MS", "1234")
	core.ReloadSettings()
	if d := DefaultTimeout(); d != 1234*time.Millisecond {
		t.Fatal(d)
	}
	t.Setenv("SYMMEM_TIMEOUT_MS", "2s")
	if d := core.ReloadSettings().Duration("SYMMEM_TIMEOUT_MS", 0); d != 2*time.Second {
		t.Fatal(d)
	}
	// An unreadable value is reported, and the default stands meanwhile.
	t.Setenv("SYMMEM_TIMEOUT_MS", "nope")
	st := core.ReloadSettings()
	if d := DefaultTimeout(); d != DefaultTimeoutValue {
		t.Fatal(d)
	}
	if st.Err() == nil || !strings.Contains(st.Err().Error(), "SYMMEM_TIMEOUT_MS") {
		t.Fatalf("unreadable SYMMEM_TIMEOUT_MS not reported: %v", st.Err())
	}
	// Huge values saturate instead of wrapping to under a millisecond.
	for _, s := range []string{"18446744073709551615", "9223372036854775807", "9223372036854775"} {
		t.Setenv("SYMMEM_TIMEOUT_MS", s)
		core.ReloadSettings()
		if d := DefaultTimeout(); d < 290*365*24*time.Hour {
			t.Fatalf("SYMMEM_TIMEOUT_MS=%s gave %v", s, d)
		}
	}
}

func TestSocketDirChecks(t *testing.T) {
	base := t.TempDir()
	d := filepath.Join(base, "sock")
	t.Cleanup(func() { core.ReloadSettings() })
	t.Setenv("SYMMEM_SOCKET_DIR", d)
	core.ReloadSettings()
	got, err := SocketDir()
	if err != nil || got != d {
		t.Fatalf("%q %v", got, err)
	}
	st, _ := os.Stat(d)
	if st.Mode().Perm() != 0o700 {
		t.Fatalf("mode %v", st.Mode())
	}
	os.Chmod(d, 0o750)
	wantCode(t, PrepareDir(d), core.ErrPermission, "0750", "private subfolder such as "+core.Quote(fmt.Sprintf("%s/symmem-%d", d, os.Getuid())))
	if err := PrepareDir(d); strings.Contains(err.Error(), "chmod") {
		t.Fatalf("a shared folder such as /tmp must not be chmod-ed: %v", err)
	}
	os.Chmod(d, 0o700)
	// A symbolic link is refused even if it points to a good directory.
	l := filepath.Join(base, "link")
	os.Symlink(d, l)
	wantCode(t, PrepareDir(l), core.ErrPermission, "not a directory")
	// Another owner.
	var st2 unix.Stat_t
	unix.Lstat(d, &st2)
	wantCode(t, checkDir(d, &st2, st2.Uid+1), core.ErrPermission, "owned by uid")
	// Default: $TMPDIR/symmem-<uid>.
	t.Setenv("SYMMEM_SOCKET_DIR", "")
	t.Setenv("TMPDIR", base)
	core.ReloadSettings()
	got, err = SocketDir()
	if err != nil || got != filepath.Join(base, fmt.Sprintf("symmem-%d", os.Getuid())) {
		t.Fatalf("%q %v", got, err)
	}
}

func TestCheckPeerCred(t *testing.T) {
	me := uint32(os.Getuid())
	if err := checkPeerCred(&unix.Ucred{Pid: 1, Uid: me}, me, "peer"); err != nil {
		t.Fatal(err)
	}
	wantCode(t, checkPeerCred(&unix.Ucred{Pid: 42, Uid: me + 1}, me, "peer"), core.ErrPermission, "another user", "pid 42")
	wantCode(t, checkPeerCred(nil, me, "peer"), core.ErrPermission)
}

func TestConfigErrors(t *testing.T) {
	dir := sockDir(t)
	for _, c := range []Config{
		{Name: "a/b", World: 2, Dir: dir},
		{Name: "g", World: 0, Dir: dir},
		{Name: "g", World: 2, Rank: 2, Dir: dir},
		{Name: "g", World: 2, Rank: -1, Dir: dir},
		{Name: strings.Repeat("n", 64), World: 2, Dir: "/tmp/" + strings.Repeat("d", 60)},
	} {
		if _, err := Open(c); core.CodeOf(err) != core.ErrInvalidArgument {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// openAll opens world members in goroutines of this process.
func openAll(t *testing.T, cfgs []Config) ([]*Channel, []error) {
	chs := make([]*Channel, len(cfgs))
	errs := make([]error, len(cfgs))
	var wg sync.WaitGroup
	for i := range cfgs {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			chs[i], errs[i] = Open(cfgs[i])
		}(i)
	}
	wg.Wait()
	return chs, errs
}

func cfgs(name, dir string, world int, timeout time.Duration) []Config {
	c := make([]Config, world)
	for r := range c {
		c[r] = Config{Name: name, Rank: r, World: world, Dir: dir, Timeout: timeout, Token: "test"}
	}
	return c
}

func closeChans(chs []*Channel) {
	for _, ch := range chs {
		if ch != nil {
			ch.Close()
		}
	}
}

// parallel runs f(rank) on every rank concurrently.
func parallel(world int, f func(r int) error) []error {
	errs := make([]error, world)
	var wg sync.WaitGroup
	for r := 0; r < world; r++ {
		wg.Add(1)
		go func(r int) { defer wg.Done(); errs[r] = f(r) }(r)
	}
	wg.Wait()
	return errs
}

func TestInProcessGatherAndOrder(t *testing.T) {
	dir := sockDir(t)
	chs, errs := openAll(t, cfgs("g", dir, 3, 5*time.Second))
	defer closeChans(chs)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "g.sock")); !os.IsNotExist(err) {
		t.Fatalf("the socket must be removed once the group is complete: %v", err)
	}
	errs = parallel(3, func(r int) error {
		got, err := chs[r].AllGather(0, []byte{byte(r)})
		if err == nil && (len(got) != 3 || got[2][0] != 2) {
			err = fmt.Errorf("bad result %v", got)
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Collective calls in different orders: rank 1 exchanges descriptors
	// while the others all-gather. Every rank fails with ErrMismatch.
	errs = parallel(3, func(r int) error {
		if r == 1 {
			_, err := chs[r].AllGatherFDs(0, nil)
			return err
		}
		_, err := chs[r].AllGather(0, nil)
		return err
	})
	for r, err := range errs {
		wantCode(t, err, core.ErrMismatch, "different orders")
		_ = r
	}
	// The channel stays failed.
	_, err := chs[0].AllGather(0, nil)
	wantCode(t, err, core.ErrMismatch)
}

func TestWorldOne(t *testing.T) {
	ch, err := Open(Config{Name: "solo", World: 1, Dir: sockDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	got, err := ch.AllGather(0, []byte("me"))
	if err != nil || len(got) != 1 || string(got[0]) != "me" {
		t.Fatal(got, err)
	}
	in, err := ch.AllGatherFDs(0, []int{0})
	if err != nil || len(in) != 1 || in[0] != nil {
		t.Fatal(in, err)
	}
}

// Two jobs with the same group name and different tokens: rank 1 of job B
// is refused by rank 0 of job A (and keeps trying); job A completes with
// its own rank 1; then job B's rank 0 can take the name and B completes.
func TestTwoJobsSameName(t *testing.T) {
	dir := sockDir(t)
	a := cfgs("same", dir, 2, 5*time.Second)
	b := cfgs("same", dir, 2, 5*time.Second)
	for i := range b {
		b[i].Token = "job-b"
	}
	var wg sync.WaitGroup
	var aCh, bCh [2]*Channel
	var aErr, bErr [2]error
	wg.Add(1)
	go func() { defer wg.Done(); aCh[0], aErr[0] = Open(a[0]) }()
	time.Sleep(50 * time.Millisecond)
	wg.Add(1)
	go func() { defer wg.Done(); bCh[1], bErr[1] = Open(b[1]) }() // refused by A's rank 0
	time.Sleep(200 * time.Millisecond)
	wg.Add(1)
	go func() { defer wg.Done(); aCh[1], aErr[1] = Open(a[1]) }()
	time.Sleep(100 * time.Millisecond)
	wg.Add(1)
	go func() { defer wg.Done(); bCh[0], bErr[0] = Open(b[0]) }()
	wg.Wait()
	defer closeChans(aCh[:])
	defer closeChans(bCh[:])
	for i := 0; i < 2; i++ {
		if aErr[i] != nil || bErr[i] != nil {
			t.Fatalf("rank %d: job A %v, job B %v", i, aErr[i], bErr[i])
		}
	}
	// Each job talks to its own members.
	errs := parallel(4, func(i int) error {
		ch := aCh[i%2]
		tag := "A"
		if i >= 2 {
			ch, tag = bCh[i%2], "B"
		}
		got, err := ch.AllGather(0, []byte(tag))
		if err == nil && (string(got[0]) != tag || string(got[1]) != tag) {
			err = fmt.Errorf("job %s got %q", tag, got)
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// A rank of the wrong job gives up with ErrMismatch and the reason.
func TestWrongTokenRefused(t *testing.T) {
	dir := sockDir(t)
	c := cfgs("tok", dir, 2, 700*time.Millisecond)
	c[1].Token = "other"
	_, errs := openAll(t, c)
	wantCode(t, errs[1], core.ErrMismatch, "job token")
	wantCode(t, errs[0], core.ErrTimeout, "rank(s) 1", "refused", "job token")
	// The refusals of every retry appear once, with their count.
	if n := strings.Count(errs[0].Error(), "job token"); n != 1 {
		t.Fatalf("the refusal is repeated %d times: %v", n, errs[0])
	}
	// World size disagreement in one job: known at first contact, so every
	// rank fails at once (not at the timeout) with MISMATCH naming both.
	c = cfgs("wsz", dir, 2, 20*time.Second)
	c[1].World = 3
	start := time.Now()
	_, errs = openAll(t, c)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a world-size mismatch took %v to report", d)
	}
	pid := fmt.Sprintf("pid %d", os.Getpid())
	wantCode(t, errs[1], core.ErrMismatch, "world size 3", "has 2", "rank 1 ("+pid, "rank 0 ("+pid)
	wantCode(t, errs[0], core.ErrMismatch, "world size 3", "has 2", "rank 1 ("+pid, "rank 0 ("+pid)
}

// A second process claiming a rank that a member holds is told the rank is
// taken, at once, naming both pids; the group completes without it.
func TestDuplicateRankRefused(t *testing.T) {
	dir := sockDir(t)
	c := cfgs("dup", dir, 3, 20*time.Second)
	var chs [3]*Channel
	var errs [4]error
	var wg sync.WaitGroup
	for _, r := range []int{0, 1} {
		wg.Add(1)
		go func(r int) { defer wg.Done(); chs[r], errs[r] = Open(c[r]) }(r)
	}
	// Wait until rank 1 has joined, then a duplicate of it arrives.
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	_, errs[3] = Open(c[1])
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the duplicate waited %v", d)
	}
	wantCode(t, errs[3], core.ErrMismatch, "rank 1 is taken", fmt.Sprintf("rank 1 (pid %d) holds it", os.Getpid()))
	chs[2], errs[2] = Open(c[2])
	wg.Wait()
	defer closeChans(chs[:])
	for r := 0; r < 3; r++ {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
	}
}

// Both processes started as rank 0 (a forgotten RANK variable): each is
// told at once that two processes claim rank 0, naming both pids, rather
// than waiting for a rank that never comes.
func TestEveryProcessRank0(t *testing.T) {
	start := time.Now()
	res := runRanks(t, "join", "allzero", 2, sockDir(t), []rankSpec{{Rank: 0}, {Rank: 0}}, "SYMMEM_IPC_TIMEOUT_MS=20000")
	for i, r := range res {
		t.Logf("process %d: code %d: %s", i, r.Code, r.Msg)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v (the timeout is 20 s)", d)
	}
	for i, r := range res {
		if core.Code(r.Code) != core.ErrMismatch || !regexp.MustCompile(`two processes claim rank 0: pid \d+ and pid \d+`).MatchString(r.Msg) {
			t.Fatalf("process %d: code %d: %s\n%s", i, r.Code, r.Msg, r.Out)
		}
	}
}

// Group names come and go without leaving files: the directory holds one
// lock file, whatever the number of names used.
func TestNoFilePerGroupName(t *testing.T) {
	dir := sockDir(t)
	for i := 0; i < 20; i++ {
		chs, errs := openAll(t, cfgs(fmt.Sprintf("name-%d", i), dir, 2, 5*time.Second))
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		closeChans(chs)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != dirLockName {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("the socket directory holds %v", names)
	}
}

func TestDedupe(t *testing.T) {
	if got := dedupe([]string{"a", "b", "a", "a", "c"}); got != "a (3 times); b; c" {
		t.Fatal(got)
	}
}

// Rank 0 out of descriptors while receiving the others' descriptors: it
// says so (EMFILE, its own rank and pid) and every other rank is told that
// rank 0 failed and why; nobody blames a healthy peer.
func TestProcessesRank0OutOfDescriptors(t *testing.T) {
	res := runRanks(t, "fd-starved", "starved", 3, sockDir(t), allRanks(3), "SYMMEM_IPC_TIMEOUT_MS=10000")
	t.Log(res[1].Msg)
	for _, r := range res {
		if core.Code(r.Code) != core.ErrBackend || !strings.Contains(r.Msg, "rank 0 (pid") || !strings.Contains(r.Msg, "ran out of file descriptors") ||
			!strings.Contains(r.Msg, "EMFILE") || strings.Contains(r.Msg, "broke the protocol") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
}

// A stale socket file from a crashed run is replaced.
func TestStaleSocket(t *testing.T) {
	dir := sockDir(t)
	if err := PrepareDir(dir); err != nil {
		t.Fatal(err)
	}
	fd, _ := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: filepath.Join(dir, "stale.sock")}); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd) // bound, never listened: connect is refused
	chs, errs := openAll(t, cfgs("stale", dir, 2, 3*time.Second))
	defer closeChans(chs)
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

func TestFuncExchange(t *testing.T) {
	const world = 4
	// An in-process all-gather of equal-sized records: each call joins the
	// current round, the last arrival completes it.
	type round struct {
		recs [][]byte
		n    int
		done chan struct{}
	}
	var mu sync.Mutex
	var cur *round
	fn := func(r int) func(send, recv []byte) error {
		return func(send, recv []byte) error {
			mu.Lock()
			if cur == nil {
				cur = &round{recs: make([][]byte, world), done: make(chan struct{})}
			}
			rd := cur
			rd.recs[r] = append([]byte(nil), send...)
			if rd.n++; rd.n == world {
				cur = nil
				close(rd.done)
			}
			mu.Unlock()
			<-rd.done
			for q := 0; q < world; q++ {
				if len(rd.recs[q]) != len(send) {
					return fmt.Errorf("size mismatch")
				}
				copy(recv[q*len(send):], rd.recs[q])
			}
			return nil
		}
	}
	errs := parallel(world, func(r int) error {
		ex := &FuncExchange{Rank: r, World: world, Fn: fn(r)}
		got, err := ex.AllGather(0, []byte(strings.Repeat("z", r*3)))
		if err != nil {
			return err
		}
		for q := 0; q < world; q++ {
			if string(got[q]) != strings.Repeat("z", q*3) {
				return fmt.Errorf("rank %d: record %d is %q", r, q, got[q])
			}
		}
		return nil
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// A callback that does not gather is caught.
	ex := &FuncExchange{Rank: 0, World: 2, Fn: func(send, recv []byte) error { return nil }}
	_, err := ex.AllGather(0, []byte("a"))
	wantCode(t, err, core.ErrPeer, "garbage")
	ex.Fn = func(send, recv []byte) error { return fmt.Errorf("MPI said no") }
	_, err = ex.AllGather(0, []byte("a"))
	wantCode(t, err, core.ErrPeer, "MPI said no")
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// 1000 create/exchange/close cycles leave no descriptor behind.
func TestNoFDLeak(t *testing.T) {
	dir := sockDir(t)
	cycles := 1000
	if testing.Short() {
		cycles = 100
	}
	// Warm up (lazy runtime descriptors: epoll, pipes).
	chs, _ := openAll(t, cfgs("leak", dir, 2, 5*time.Second))
	closeChans(chs)
	before := countFDs(t)
	for i := 0; i < cycles; i++ {
		chs, errs := openAll(t, cfgs("leak", dir, 2, 5*time.Second))
		for _, err := range errs {
			if err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
		if i%10 == 0 {
			errs = parallel(2, func(r int) error {
				fd, err := newMemfd("x")
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				in, err := chs[r].AllGatherFDs(0, []int{fd})
				for _, l := range in {
					closeAll(l)
				}
				return err
			})
			for _, err := range errs {
				if err != nil {
					t.Fatalf("cycle %d: %v", i, err)
				}
			}
		}
		closeChans(chs)
	}
	if after := countFDs(t); after != before {
		t.Fatalf("%d descriptors open before %d cycles, %d after", before, cycles, after)
	}
}

// ---------------------------------------------------------------------------
// Real processes

func checkAllOK(t *testing.T, res []rankResult) {
	t.Helper()
	for _, r := range res {
		if r.Code != 0 || r.Exit != 0 {
			t.Fatalf("rank %d: code %d exit %d: %s\noutput:\n%s", r.Rank, r.Code, r.Exit, r.Msg, r.Out)
		}
	}
}

func TestProcessesGather(t *testing.T) {
	for _, world := range []int{2, 4, 8} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			res := runRanks(t, "gather", "gather", world, sockDir(t), allRanks(world))
			checkAllOK(t, res)
		})
	}
}

func TestProcessesFDs(t *testing.T) {
	for _, world := range []int{2, 4, 8} {
		t.Run(fmt.Sprint(world), func(t *testing.T) {
			res := runRanks(t, "fds", "fds", world, sockDir(t), allRanks(world))
			checkAllOK(t, res)
		})
	}
}

// Ranks 1 and 3 of 4 never start: every rank that did fails with
// ErrTimeout naming them.
func TestProcessesTimeoutNamesMissing(t *testing.T) {
	specs := []rankSpec{{Rank: 0}, {Rank: 2}}
	start := time.Now()
	res := runRanks(t, "join", "late", 4, sockDir(t), specs, "SYMMEM_IPC_TIMEOUT_MS=1000")
	if d := time.Since(start); d > 20*time.Second {
		t.Fatalf("took %v", d)
	}
	for _, r := range res {
		if core.Code(r.Code) != core.ErrTimeout || !strings.Contains(r.Msg, "rank(s) 1, 3 ") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
	// Rank 0 itself missing: the others name it.
	res = runRanks(t, "join", "norank0", 2, sockDir(t), []rankSpec{{Rank: 1}}, "SYMMEM_IPC_TIMEOUT_MS=500")
	if core.Code(res[0].Code) != core.ErrTimeout || !strings.Contains(res[0].Msg, "rank 0 never") {
		t.Fatalf("code %d %q", res[0].Code, res[0].Msg)
	}
}

// A rank that joins but never reaches the all-gather: every rank fails with
// ErrTimeout naming it, the late rank included (it finds rank 0's verdict).
func TestProcessesGatherTimeout(t *testing.T) {
	res := runRanks(t, "stall", "stall", 4, sockDir(t), allRanks(4), "SYMMEM_IPC_TIMEOUT_MS=800", "SYMMEM_IPC_EXIT=3")
	for _, r := range res {
		if core.Code(r.Code) != core.ErrTimeout || !strings.Contains(r.Msg, "rank(s) 3 never arrived") {
			t.Fatalf("rank %d: code %d %q\n%s", r.Rank, r.Code, r.Msg, r.Out)
		}
	}
}

// A rank that exits after joining makes every other rank fail with ErrPeer
// naming it, well before the timeout.
func TestProcessesRankExitsEarly(t *testing.T) {
	for _, exit := range []int{2, 0} {
		t.Run(fmt.Sprint("rank", exit), func(t *testing.T) {
			start := time.Now()
			res := runRanks(t, "exit-early", "early", 4, sockDir(t), allRanks(4),
				"SYMMEM_IPC_TIMEOUT_MS=60000", fmt.Sprintf("SYMMEM_IPC_EXIT=%d", exit))
			if d := time.Since(start); d > 30*time.Second {
				t.Fatalf("took %v: the dead rank was not noticed", d)
			}
			for _, r := range res {
				if r.Rank == exit {
					if r.Exit != 3 {
						t.Fatalf("rank %d exit %d", r.Rank, r.Exit)
					}
					continue
				}
				want := fmt.Sprintf("rank %d (pid", exit)
				if core.Code(r.Code) != core.ErrPeer || !strings.Contains(r.Msg, want) {
					t.Fatalf("rank %d: code %d %q, want ErrPeer naming %q\n%s", r.Rank, r.Code, r.Msg, want, r.Out)
				}
			}
		})
	}
}

// A rank 0 of another uid (nobody) is refused by a connecting rank of ours,
// and rank 0 refuses us: both sides check SO_PEERCRED. Needs root.
func TestProcessesOtherUIDRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to run a rank as uid 65534")
	}
	// The nobody process must be able to execute the test binary and
	// create its socket directory: copy both to a world-readable place.
	base, err := os.MkdirTemp("", "syu")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	os.Chmod(base, 0o755)
	bin := filepath.Join(base, "ipc.test")
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Skipf("cannot copy the test binary: %v", err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "s") // nobody's private directory
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Skipf("chown: %v", err)
	}
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	// Rank 0 starts first so that it owns the directory.
	type out struct{ res []rankResult }
	done := make(chan out, 1)
	go func() {
		done <- out{runRanks(t, "join", "cred", 2, dir, []rankSpec{{Rank: 0, Cred: nobody, Bin: bin}}, "SYMMEM_IPC_TIMEOUT_MS=2500", "HOME=/")}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "cred.sock")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			r := <-done
			t.Skipf("the uid 65534 rank did not start listening: %+v", r.res)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Open refuses nobody's directory outright.
	_, err = Open(Config{Name: "cred", Rank: 1, World: 2, Dir: dir, Timeout: time.Second})
	wantCode(t, err, core.ErrPermission, "owned by uid 65534")
	// Past that check (as if the directory were shared), our rank 1 (root)
	// reaches the socket, since root bypasses directory modes, and its
	// SO_PEERCRED check refuses rank 0.
	ch := &Channel{cfg: Config{Name: "cred", Rank: 1, World: 2, Dir: dir, Timeout: time.Second, Token: JobToken()},
		uid: uint32(os.Getuid()), conns: make([]*conn, 2), pids: make([]int32, 2)}
	err = ch.openMember(time.Now(), time.Now().Add(time.Second))
	ch.closeConns()
	wantCode(t, err, core.ErrPermission, "uid 65534", "another user")
	// Rank 0's own check: it refused our connection, and says so when it
	// times out.
	r := (<-done).res[0]
	if core.Code(r.Code) != core.ErrTimeout || !strings.Contains(r.Msg, "refused") || !strings.Contains(r.Msg, "uid 0") {
		t.Fatalf("rank 0 (uid 65534): code %d %q\n%s", r.Code, r.Msg, r.Out)
	}
}

// Note [Progress while waiting]: a rank that waits longer than
// SYMMEM_WAIT_REPORT_S prints lines to stderr naming the group, what it waits
// for and who has not arrived.
func TestProcessesProgressLinesNameMissingRanks(t *testing.T) {
	// Rank 2 never comes: rank 0 waits for its connection, rank 1 for the
	// welcome.
	res := runRanks(t, "join", "slow", 3, sockDir(t), []rankSpec{{Rank: 0}, {Rank: 1}},
		"SYMMEM_IPC_TIMEOUT_MS=1200", "SYMMEM_WAIT_REPORT_S=0.3")
	for _, r := range res {
		if core.Code(r.Code) != core.ErrTimeout {
			t.Fatalf("rank %d: code %d %q", r.Rank, r.Code, r.Msg)
		}
	}
	want0 := `symmem: group "slow" rank 0: waiting 0 s for connection: rank(s) 2 not arrived yet`
	if n := strings.Count(res[0].Out, "for connection: rank(s) 2 not arrived yet"); n < 2 || !strings.Contains(res[0].Out, want0) {
		t.Fatalf("rank 0 printed %d progress lines, want >= 2 like %q:\n%s", n, want0, res[0].Out)
	}
	if !strings.Contains(res[1].Out, `symmem: group "slow" rank 1: waiting`) || !strings.Contains(res[1].Out, "for connection: rank 0's welcome") {
		t.Fatalf("rank 1 printed no progress line:\n%s", res[1].Out)
	}
	// Rank 2 joins but never reaches the all-gather: rank 0 names it.
	res = runRanks(t, "stall", "stall2", 3, sockDir(t), allRanks(3), "SYMMEM_IPC_TIMEOUT_MS=600",
		"SYMMEM_IPC_EXIT=2", "SYMMEM_WAIT_REPORT_S=0.2")
	if !strings.Contains(res[0].Out, `rank 0: waiting 0 s for all-gather #1: rank(s) 2 not arrived yet`) {
		t.Fatalf("rank 0 did not name rank 2 while waiting in the all-gather:\n%s", res[0].Out)
	}
	// Off: SYMMEM_WAIT_REPORT_S=0 prints nothing.
	res = runRanks(t, "join", "quiet", 2, sockDir(t), []rankSpec{{Rank: 0}},
		"SYMMEM_IPC_TIMEOUT_MS=500", "SYMMEM_WAIT_REPORT_S=0")
	if strings.Contains(res[0].Out, "symmem: group") {
		t.Fatalf("SYMMEM_WAIT_REPORT_S=0 must print nothing:\n%s", res[0].Out)
	}
}
