package main

import (
	"os"
	"runtime"
	"strconv"
)

// Note [At least two Ps]
//
// Every symmem_* call that enters Go is a callback from C, and a callback
// must acquire one of the runtime's Ps (GOMAXPROCS of them) before it runs
// Go code. The runtime sizes GOMAXPROCS from the CPU affinity mask it finds
// at start-up, so a process pinned to one CPU before the library loads (a
// benchmark or launcher calling sched_setaffinity or taskset) gets a single
// P. Then a callback contends for that P with the runtime's own work (the
// GC's background workers, sysmon's retaking of Ps held across syscalls and
// C calls), and when it loses it sleeps on a futex and waits for a context
// switch on the one CPU: under such pinning one process in three ran as the
// global allocator at about twice the time per tensor (docs/speed.md,
// "GOMAXPROCS"). With two Ps a callback finds a free one. The OS still runs all
// threads on the one CPU; the second P only keeps a callback from queueing
// behind runtime work that is not running.
//
// So the library's init raises GOMAXPROCS to minProcs when it started lower,
// unless the user set GOMAXPROCS in the environment to a value the runtime
// honours, a positive integer (their value is kept, even 1; an empty or
// invalid value, which the runtime ignores, counts as unset). Setting it turns off the runtime's own later updates of
// GOMAXPROCS (from a changed affinity mask or cgroup limit); that is only
// done in the case changed here, where the value would otherwise be 1.
// Checked by TestAtLeastTwoProcsUnderOneCPU (procs_test.go).
const minProcs = 2

func init() { raiseProcs() }

// raiseProcs applies Note [At least two Ps] and returns the GOMAXPROCS in
// effect afterwards.
func raiseProcs() int {
	n := runtime.GOMAXPROCS(0)
	if userProcs, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); (err == nil && userProcs > 0) || n >= minProcs {
		return n
	}
	runtime.GOMAXPROCS(minProcs)
	return minProcs
}
