package host

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/libsymmem/libsymmem/core"
	"github.com/libsymmem/libsymmem/core/alloc"
	"github.com/stretchr/testify/require"
)

// fakeTree writes files under a temporary root: path -> content.
func fakeTree(t *testing.T, files map[string]string) cgroupFS {
	root := t.TempDir()
	for p, c := range files {
		full := filepath.Join(root, p)
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		require.NoError(t, os.WriteFile(full, []byte(c), 0o644))
	}
	return cgroupFS{root: root}
}

const (
	mountsV1 = "30 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" +
		"35 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n" +
		"36 30 0:32 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	mountsV2 = "40 23 0:40 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
	// A container's view: the hierarchy's /kube/pod1 is mounted at /sys/fs/cgroup.
	mountsV2NS = "40 23 0:40 /kube/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
)

func TestCgroupLimitFromInjectedTree(t *testing.T) {
	cases := []struct {
		name  string
		files map[string]string
		limit uint64
	}{
		{"v2 leaf", map[string]string{
			"/proc/self/mountinfo":                mountsV2,
			"/proc/self/cgroup":                   "0::/job/rank0\n",
			"/sys/fs/cgroup/job/rank0/memory.max": "536870912\n",
			"/sys/fs/cgroup/job/memory.max":       "max\n",
		}, 512 << 20},
		{"v2 parent binds", map[string]string{
			"/proc/self/mountinfo":                mountsV2,
			"/proc/self/cgroup":                   "0::/job/rank0\n",
			"/sys/fs/cgroup/job/rank0/memory.max": "max\n",
			"/sys/fs/cgroup/job/memory.max":       "268435456\n",
		}, 256 << 20},
		{"v2 namespaced mount", map[string]string{
			"/proc/self/mountinfo":            mountsV2NS,
			"/proc/self/cgroup":               "0::/kube/pod1/c\n",
			"/sys/fs/cgroup/c/memory.max":     "1073741824\n",
			"/sys/fs/cgroup/memory.max":       "2147483648\n",
			"/sys/fs/cgroup/other/memory.max": "1\n",
		}, 1 << 30},
		{"v1", map[string]string{
			"/proc/self/mountinfo": mountsV1,
			"/proc/self/cgroup":    "4:memory:/process_api/x\n3:cpu:/\n0::/\n",
			"/sys/fs/cgroup/memory/process_api/x/memory.limit_in_bytes": "536870912\n",
			"/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes":   "9223372036854771712\n",
			"/sys/fs/cgroup/memory/memory.limit_in_bytes":               "9223372036854771712\n",
		}, 512 << 20},
		{"v1 unlimited", map[string]string{
			"/proc/self/mountinfo":                          mountsV1,
			"/proc/self/cgroup":                             "4:memory:/a\n",
			"/sys/fs/cgroup/memory/a/memory.limit_in_bytes": "9223372036854771712\n",
		}, 0},
		{"no cgroup files", map[string]string{}, 0},
		{"garbage", map[string]string{
			"/proc/self/mountinfo":        mountsV2,
			"/proc/self/cgroup":           "0::/a\n",
			"/sys/fs/cgroup/a/memory.max": "lots\n",
		}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fs := fakeTree(t, c.files)
			require.Equal(t, c.limit, fs.memoryLimit().limit)
			b, err := newBackend(fs)
			require.NoError(t, err)
			_, total, err := b.MemoryInfo(0)
			require.NoError(t, err)
			if c.limit != 0 {
				require.Equal(t, c.limit, total, "the device is the cgroup's size")
				_, err = b.Create(0, uintptr(c.limit)+segSize)
				require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err))
				require.Contains(t, err.Error(), "cgroup")
				// Through the allocator, as symmem_alloc does.
				a, err := alloc.NewAllocator(b, 0)
				require.NoError(t, err)
				_, err = a.Alloc(uintptr(2*c.limit), 0)
				require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err), "%v", err)
			} else {
				require.Greater(t, total, uint64(0))
			}
		})
	}
}

// memoryCgroupParent finds a directory under which this process may create
// a memory cgroup: the v2 cgroup of this process (if its memory controller
// is enabled for children) or the v1 memory cgroup.
func memoryCgroupParent() (dir string, v2 bool, why string) {
	fs := cgroupFS{}
	b, err := fs.read("/proc/self/cgroup")
	if err != nil {
		return "", false, "no /proc/self/cgroup"
	}
	for _, m := range fs.mounts() {
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			lv2 := parts[0] == "0" && parts[1] == ""
			if lv2 != m.v2 || !lv2 && (!hasField(parts[1], "memory") || !hasField(m.opts, "memory")) {
				continue
			}
			rel, ok := strings.CutPrefix(parts[2], m.root)
			if !ok {
				continue
			}
			d := filepath.Join(m.point, rel)
			if lv2 {
				ctl, err := os.ReadFile(filepath.Join(d, "cgroup.subtree_control"))
				if err != nil || !hasField(strings.ReplaceAll(strings.TrimSpace(string(ctl)), " ", ","), "memory") {
					continue
				}
			}
			return d, lv2, ""
		}
	}
	return "", false, "no memory cgroup hierarchy this process can create a child in"
}

// TestRealCgroupLimit runs a child in a new 512 MiB memory cgroup, where a
// 2 GiB allocation must be OUT_OF_MEMORY, and so must filling the cgroup
// (never the OOM killer).
func TestRealCgroupLimit(t *testing.T) {
	if os.Getenv("SYMMEM_CGROUP_CHILD") != "" {
		t.Skip("parent side only")
	}
	parent, v2, why := memoryCgroupParent()
	if parent == "" {
		t.Skipf("no memory cgroup can be created here: %s", why)
	}
	dir := filepath.Join(parent, fmt.Sprintf("symmem-test-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a memory cgroup under %s: %v", parent, err)
	}
	defer os.Remove(dir)
	limitFile := "memory.limit_in_bytes"
	if v2 {
		limitFile = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte("536870912"), 0o644); err != nil {
		t.Skipf("cannot set %s in %s: %v", limitFile, dir, err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestInCgroupChild$", "-test.v")
	cmd.Env = append(os.Environ(), "SYMMEM_CGROUP_CHILD="+filepath.Join(dir, "cgroup.procs"))
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "--- PASS: TestInCgroupChild")
}

func TestInCgroupChild(t *testing.T) {
	procs := os.Getenv("SYMMEM_CGROUP_CHILD")
	if procs == "" {
		t.Skip("runs as the child of TestRealCgroupLimit")
	}
	require.NoError(t, os.WriteFile(procs, []byte(strconv.Itoa(os.Getpid())), 0o644))
	b, err := New()
	require.NoError(t, err)
	_, total, err := b.MemoryInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(512<<20), total)
	a, err := alloc.NewAllocator(b, 0)
	require.NoError(t, err)
	_, err = a.Alloc(2<<30, 0)
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err), "%v", err)
	// Fill the cgroup 64 MiB at a time: the last allocation fails with
	// OUT_OF_MEMORY (fallocate's ENOMEM), not a kill.
	var got int
	for i := 0; i < 16; i++ {
		if _, err = a.Alloc(64<<20, 0); err != nil {
			break
		}
		got++
	}
	require.Equal(t, core.ErrOutOfMemory, core.CodeOf(err), "after %d allocations of 64 MiB: %v", got, err)
	require.Greater(t, got, 2)
	require.NoError(t, a.Validate())
}
