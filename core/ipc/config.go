// Package ipc is how the processes of a group find each other and talk:
// a Unix stream socket per group (rank 0 listens, the others connect),
// small all-gathered records, and file descriptors passed with SCM_RIGHTS.
//
// Note [Star topology]
//
// Every rank other than 0 has exactly one connection, to rank 0; rank 0 has
// world-1. Every collective (record all-gather, descriptor all-to-all) is a
// gather to rank 0 followed by a scatter from rank 0. We chose this over a
// full mesh (rank 0 could hand every pair a socketpair) because:
//   - one place decides every outcome: rank 0 sees who arrived, who died and
//     when the deadline passed, and tells everyone the same verdict, so every
//     rank fails with the same message naming the same ranks;
//   - one connection per rank to check (SO_PEERCRED, group name, job token)
//     and one descriptor per rank held for the group's lifetime;
//   - descriptors travel rarely (once per new peer segment, the mappings are
//     cached above us), so the extra hop through rank 0 costs nothing that
//     matters, and each descriptor is sent once to rank 0, not world-1 times.
//
// Note [Deadlines]
//
// Rank 0 is the timekeeper. It waits up to the timeout for every rank and
// on expiry sends every connected rank an abort frame whose message names
// the ranks that never arrived. The other ranks wait for rank 0 a little
// longer (the grace) so that they receive that verdict instead of a vaguer
// one of their own; if rank 0 itself is the one missing, they give up after
// timeout+grace and say so. A connection that reaches EOF or a reset is a
// dead peer: rank 0 aborts the others naming that rank; a rank whose
// connection to rank 0 ends fails naming rank 0. A failed channel stays
// failed: every later call returns the first error.
package ipc

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/libsymmem/libsymmem/core"
	"golang.org/x/sys/unix"
)

// MaxNameLen is the longest group name.
const MaxNameLen = 64

// DefaultTimeoutValue is the timeout when neither the caller nor
// SYMMEM_TIMEOUT_MS says otherwise.
const DefaultTimeoutValue = core.DefaultTimeoutValue

// ValidateName checks a group name: 1..64 of letters, digits, '.', '_', '-',
// and not "." or ".." (it becomes a file name in the socket directory).
func ValidateName(name string) error { return core.CheckName("group name", name, MaxNameLen) }

// DefaultTimeout is core.DefaultTimeout: SYMMEM_TIMEOUT_MS or 5 minutes.
func DefaultTimeout() time.Duration { return core.DefaultTimeout() }

// JobToken identifies the job a rank belongs to, so that two jobs that use
// the same group name at the same time do not join each other's groups:
// SYMMEM_JOB_TOKEN, else the launcher's job identity (torchrun's
// TORCHELASTIC_RUN_ID, Slurm's job and step), else "". Ranks of one group
// must agree on it; rank 0 rejects a rank whose token differs.
func JobToken() string {
	if s := core.Current().Text("SYMMEM_JOB_TOKEN", ""); s != "" {
		return s
	}
	if s := os.Getenv("TORCHELASTIC_RUN_ID"); s != "" {
		return "torchelastic:" + s
	}
	if s := os.Getenv("SLURM_JOB_ID"); s != "" {
		return "slurm:" + s + "." + os.Getenv("SLURM_STEP_ID")
	}
	return ""
}

// SocketDir is the directory of rendezvous sockets: SYMMEM_SOCKET_DIR, else
// $TMPDIR/symmem-<uid> ($TMPDIR defaults to /tmp). It is created with mode
// 0700 if missing, and refused (ErrPermission) if it exists with another
// owner, with any group/other permission bit, or as something other than a
// directory.
func SocketDir() (string, error) {
	dir := core.Current().Text("SYMMEM_SOCKET_DIR", "")
	if dir == "" {
		tmp := os.Getenv("TMPDIR")
		if tmp == "" {
			tmp = "/tmp"
		}
		dir = filepath.Join(tmp, fmt.Sprintf("symmem-%d", os.Getuid()))
	}
	return dir, PrepareDir(dir)
}

// PrepareDir creates dir with mode 0700 if it does not exist (its parent must)
// and checks that it is a private directory of this user.
func PrepareDir(dir string) error {
	err := unix.Mkdir(dir, 0o700)
	if err != nil && err != unix.EEXIST {
		code := core.ErrBackend
		if err == unix.EACCES || err == unix.EPERM {
			code = core.ErrPermission
		}
		return core.Errorf(code, "cannot create the socket directory %s: %v", core.Quote(dir), err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return core.Errorf(core.ErrBackend, "cannot stat the socket directory %s: %v", core.Quote(dir), err)
	}
	return checkDir(dir, &st, uint32(os.Getuid()))
}

// checkDir refuses a socket directory that another user could write to or
// read: it must be a real directory (not a symbolic link), owned by uid, with
// no permission bit for group or others.
func checkDir(dir string, st *unix.Stat_t, uid uint32) error {
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return core.Errorf(core.ErrPermission, "the socket directory %s is not a directory (a symbolic link or file is refused)", core.Quote(dir))
	}
	// The way out is a private folder of our own inside it (made with mode
	// 0700), never opening up or closing down a shared folder such as /tmp.
	private := filepath.Join(dir, fmt.Sprintf("symmem-%d", uid))
	if st.Uid != uid {
		return core.Errorf(core.ErrPermission, "the socket directory %s is owned by uid %d, not by this process's uid %d; refusing to use it (set SYMMEM_SOCKET_DIR to a private subfolder such as %s, which is made with mode 0700)", core.Quote(dir), st.Uid, uid, core.Quote(private))
	}
	if st.Mode&0o077 != 0 {
		return core.Errorf(core.ErrPermission, "the socket directory %s has mode %04o: other users could reach it, so it is refused (set SYMMEM_SOCKET_DIR to a private subfolder such as %s, which is made with mode 0700)", core.Quote(dir), st.Mode&0o7777, core.Quote(private))
	}
	return nil
}

// Config describes this process's member of a group.
type Config struct {
	Name  string // the group's name (ValidateName)
	Rank  int    // this process's rank, in [0, World)
	World int    // the number of ranks, >= 1
	// Timeout bounds every wait; <= 0 means DefaultTimeout().
	Timeout time.Duration
	// Dir is the socket directory; "" means SocketDir().
	Dir string
	// Token is the job token; "" means JobToken(). All ranks must agree.
	Token string
	// ControlPage: rank 0 makes the group's shared-memory control page and
	// passes it with the welcome, for NewShmExchange (Note [Shared-memory
	// control page]). All ranks must agree.
	ControlPage bool
	// Socket is the socket's file name without ".sock"; "" means Name.
	// Groups that span machines name one socket per local team, so that
	// teams imitating machines on one host never meet (Note [Local teams]
	// in core/symm).
	Socket string
}

// maxSockPath is the longest path a sockaddr_un holds (108 with its NUL).
const maxSockPath = 107

func (c *Config) normalize() error {
	if err := ValidateName(c.Name); err != nil {
		return err
	}
	if c.World < 1 {
		return core.Errorf(core.ErrInvalidArgument, "group %q: world size %d must be at least 1", c.Name, c.World)
	}
	if c.World > maxWorld {
		return core.Errorf(core.ErrInvalidArgument, "group %q: world size %d is above the limit of %d", c.Name, c.World, maxWorld)
	}
	if c.Rank < 0 || c.Rank >= c.World {
		return core.Errorf(core.ErrInvalidArgument, "group %q: rank %d is out of range [0, %d)", c.Name, c.Rank, c.World)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout()
	}
	if c.Token == "" {
		c.Token = JobToken()
	}
	if len(c.Token) > maxToken {
		return core.Errorf(core.ErrInvalidArgument, "group %q: the job token has %d bytes, at most %d are allowed", c.Name, len(c.Token), maxToken)
	}
	if c.Dir == "" {
		d, err := SocketDir()
		if err != nil {
			return err
		}
		c.Dir = d
	} else if err := PrepareDir(c.Dir); err != nil {
		return err
	}
	if p := c.sockPath(); len(p) > maxSockPath {
		return core.Errorf(core.ErrInvalidArgument, "the socket path %s has %d bytes, a Unix socket path holds at most %d: use a shorter SYMMEM_SOCKET_DIR or group name", core.Quote(p), len(p), maxSockPath)
	}
	return nil
}

func (c *Config) sockPath() string {
	if c.Socket != "" {
		return filepath.Join(c.Dir, c.Socket+".sock")
	}
	return filepath.Join(c.Dir, c.Name+".sock")
}

// lockPath is the one lock file of the socket directory, shared by every
// group name (a file per name would stay behind for every name ever used).
func (c *Config) lockPath() string { return filepath.Join(c.Dir, dirLockName) }

// dirLockName is the socket directory's lock file. No group's socket can
// have this name: sockets end in ".sock".
const dirLockName = "symmem-dir.lock"

// grace is how much longer than rank 0 the other ranks wait for rank 0's
// verdict (Note [Deadlines]).
func grace(timeout time.Duration) time.Duration {
	g := timeout / 4
	if g < 200*time.Millisecond {
		g = 200 * time.Millisecond
	}
	if g > 3*time.Second {
		g = 3 * time.Second
	}
	return g
}
