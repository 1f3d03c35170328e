package host

import (
	"bufio"
	"bytes"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
)

// Note [Memory of a container]
//
// In a container the machine's RAM is not what this process may use: the
// memory cgroup's limit is (cgroup v2 memory.max, v1 memory.limit_in_bytes).
// A device size taken from sysinfo would let symmem_alloc(2 GiB) in a 512 MiB
// cgroup fallocate its way into the OOM killer instead of returning
// OUT_OF_MEMORY. So the host backend's device is the smaller of the RAM and
// the tightest limit on the way from this process's cgroup to the root of
// each hierarchy that applies (/proc/self/cgroup names the cgroups,
// /proc/self/mountinfo where their hierarchies are mounted). What is free is
// likewise capped by limit - usage.
//
// The limit alone is not enough: fallocate of a memfd past a cgroup v1
// limit summons the OOM killer rather than failing with ENOMEM (seen on
// this project's CI kernel), so Create also refuses a segment that does not
// fit in limit - usage - cgroupHeadroom.
//
// cgroupFS says where those files are, so that a test can point it at a tree
// of its own.
type cgroupFS struct {
	// root prefixes every path read (""  for the real file system).
	root string
}

// cgroupLimit is the tightest memory limit of a cgroup of this process and
// that cgroup's usage (0, 0 when there is none or it cannot be read).
type cgroupLimit struct {
	limit uint64 // bytes; 0 = no limit
	usage uint64 // bytes in use in the cgroup whose limit that is
	file  string // the file that set the limit, for messages
}

// mount is one cgroup file system from mountinfo.
type mount struct {
	root  string // the hierarchy's path that is mounted (field 4)
	point string // where (field 5)
	v2    bool
	opts  string // super options (v1: the controllers)
}

// cgroupHeadroom is what Create leaves free in a limited cgroup for the
// rest of the process (the Go runtime, the caller's own allocations).
const cgroupHeadroom = 16 << 20

func (fs cgroupFS) read(p string) ([]byte, error) { return os.ReadFile(filepath.Join(fs.root, p)) }

func (fs cgroupFS) mounts() []mount {
	b, err := fs.read("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []mount
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// id parent maj:min root point opts [optional...] - fstype source superopts
		f := strings.Fields(sc.Text())
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+3 > len(f) {
			continue
		}
		switch f[sep+1] {
		case "cgroup2":
			out = append(out, mount{root: f[3], point: f[4], v2: true})
		case "cgroup":
			out = append(out, mount{root: f[3], point: f[4], opts: f[sep+3]})
		}
	}
	return out
}

// readBytes parses a limit file: a number, or "max" (no limit).
func (fs cgroupFS) readBytes(p string) (uint64, bool) {
	b, err := fs.read(p)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// limitDir is a cgroup directory whose memory limit applies to this
// process.
type limitDir struct {
	dir string
	v2  bool
}

// limitDirs lists this process's memory cgroups (v2 and v1, whichever are
// mounted) from the leaf up to each hierarchy's root: a parent's limit
// binds its children. Resolved once per backend (the files that hold the
// numbers are read at each use).
func (fs cgroupFS) limitDirs() []limitDir {
	b, err := fs.read("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	mounts := fs.mounts()
	var dirs []limitDir
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		// hierarchy-id:controllers:path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		v2 := parts[0] == "0" && parts[1] == ""
		if !v2 && !hasField(parts[1], "memory") {
			continue
		}
		for _, m := range mounts {
			if m.v2 != v2 || !v2 && !hasField(m.opts, "memory") {
				continue
			}
			rel, ok := strings.CutPrefix(parts[2], m.root)
			if !ok {
				continue
			}
			for p := path.Clean("/" + rel); ; p = path.Dir(p) {
				dirs = append(dirs, limitDir{path.Join(m.point, p), v2})
				if p == "/" {
					break
				}
			}
		}
	}
	return dirs
}

// limitOf returns the tightest limit among dirs and that cgroup's usage.
// Limits at or above 1<<62 (v1's "unlimited" is a page-rounded INT64_MAX)
// count as none.
func (fs cgroupFS) limitOf(dirs []limitDir) cgroupLimit {
	var best cgroupLimit
	for _, d := range dirs {
		limitFile, usageFile, inactiveKey := "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"
		if d.v2 {
			limitFile, usageFile, inactiveKey = "memory.max", "memory.current", "inactive_file"
		}
		lim, ok := fs.readBytes(path.Join(d.dir, limitFile))
		if !ok || lim == 0 || lim >= 1<<62 {
			continue
		}
		if best.limit == 0 || lim < best.limit {
			usage, _ := fs.readBytes(path.Join(d.dir, usageFile))
			// Inactive page cache is reclaimed before the OOM killer
			// runs: it does not count as used (as docker stats counts).
			usage -= min(usage, fs.statValue(path.Join(d.dir, "memory.stat"), inactiveKey))
			best = cgroupLimit{limit: lim, usage: usage, file: path.Join(d.dir, limitFile)}
		}
	}
	return best
}

// memoryLimit is limitOf(limitDirs()).
func (fs cgroupFS) memoryLimit() cgroupLimit { return fs.limitOf(fs.limitDirs()) }

// statValue is the value of key in a memory.stat file (0 if absent).
func (fs cgroupFS) statValue(p, key string) uint64 {
	b, err := fs.read(p)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func hasField(list, want string) bool {
	for _, f := range strings.Split(list, ",") {
		if f == want {
			return true
		}
	}
	return false
}
