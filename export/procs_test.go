package main

import (
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// procsChildEnv marks the test binary re-run as the child of
// TestAtLeastTwoProcsUnderOneCPU (TestMain).
const procsChildEnv = "SYMMEM_TEST_PROCS_CHILD"

// TestMain runs the child's half of TestAtLeastTwoProcsUnderOneCPU when the
// binary is started as that child: it prints how many CPUs its affinity mask
// allows and the GOMAXPROCS that the library's init left in effect, and
// exits without running the tests.
func TestMain(m *testing.M) {
	if os.Getenv(procsChildEnv) == "1" {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(0, &set); err != nil {
			os.Stdout.WriteString("sched_getaffinity: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("cpus=" + strconv.Itoa(set.Count()) + " procs=" + strconv.Itoa(runtime.GOMAXPROCS(0)) + "\n")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPinnedChild starts this test binary as the child of
// TestAtLeastTwoProcsUnderOneCPU with its affinity mask set to one CPU
// (inherited from the thread that forks it, as taskset or a launcher's
// sched_setaffinity would do), env added to the environment, and returns
// the child's "cpus=N procs=M" line.
func runPinnedChild(t *testing.T, env ...string) string {
	t.Helper()
	var out []byte
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread keeps the one-CPU mask: never unlocked, it exits with
		// this goroutine instead of going back to the scheduler.
		runtime.LockOSThread()
		var one unix.CPUSet
		var mine unix.CPUSet
		if runErr = unix.SchedGetaffinity(0, &mine); runErr != nil {
			return
		}
		for cpu := 0; cpu < 1024; cpu++ {
			if mine.IsSet(cpu) {
				one.Set(cpu)
				break
			}
		}
		if runErr = unix.SchedSetaffinity(0, &one); runErr != nil {
			return
		}
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(append(os.Environ(), procsChildEnv+"=1"), env...)
		out, runErr = cmd.CombinedOutput()
	}()
	<-done
	require.NoError(t, runErr, "%s", out)
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "cpus=") {
			return line
		}
	}
	t.Fatalf("the child printed no cpus= line:\n%s", out)
	return ""
}

// TestAtLeastTwoProcsUnderOneCPU checks Note [At least two Ps]: a process
// started on one CPU runs with GOMAXPROCS 2, and a GOMAXPROCS the user set
// is kept as it is.
func TestAtLeastTwoProcsUnderOneCPU(t *testing.T) {
	env := func(kv ...string) []string { return kv }
	// The parent's GOMAXPROCS (if any) must not leak into the default case.
	os.Unsetenv("GOMAXPROCS")
	require.Equal(t, "cpus=1 procs=2", runPinnedChild(t))
	require.Equal(t, "cpus=1 procs=1", runPinnedChild(t, env("GOMAXPROCS=1")...))
	require.Equal(t, "cpus=1 procs=3", runPinnedChild(t, env("GOMAXPROCS=3")...))
	// Values the runtime ignores are not the user's choice.
	require.Equal(t, "cpus=1 procs=2", runPinnedChild(t, env("GOMAXPROCS=")...))
	require.Equal(t, "cpus=1 procs=2", runPinnedChild(t, env("GOMAXPROCS=many")...))
}
