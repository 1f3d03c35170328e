package core

import (
	"math"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Note [Timeouts saturate]
//
// Timeouts arrive as milliseconds from C (int64_t), from SYMMEM_TIMEOUT_MS
// and from Python. time.Duration counts nanoseconds in an int64, so any
// count of milliseconds above 9.2e12 (292 years) would wrap when multiplied
// by 1e6: UINT64_MAX-ish values became waits of under a millisecond. Every
// conversion goes through Millis or ParseMillis, which saturate at Forever
// instead; a deadline of Forever from now is beyond any real wait (time.Time
// saturates on overflow too).

// Forever is the longest timeout: what any larger value saturates to.
const Forever = time.Duration(math.MaxInt64)

// Millis converts a count of milliseconds to a Duration, saturating at
// Forever. ms <= 0 gives 0 (which callers read as "the default").
func Millis(ms int64) time.Duration {
	if ms <= 0 {
		return 0
	}
	if ms > int64(Forever/time.Millisecond) {
		return Forever
	}
	return time.Duration(ms) * time.Millisecond
}

// ParseMillis parses a count of milliseconds written in decimal, of any
// size (values beyond uint64 saturate too), as Millis converts it. It fails
// on anything but digits, and on 0 (not a usable timeout).
func ParseMillis(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.ParseUint(s, 10, 64)
	if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
		return Forever, nil
	}
	if err != nil {
		return 0, Errorf(ErrInvalidArgument, "%s is not a count of milliseconds", Quote(s))
	}
	if v == 0 {
		return 0, Errorf(ErrInvalidArgument, "a timeout of 0 ms")
	}
	if v > math.MaxInt64 {
		return Forever, nil
	}
	return Millis(int64(v)), nil
}

// DefaultTimeoutValue is the timeout of every wait when neither the caller
// nor SYMMEM_TIMEOUT_MS says otherwise.
const DefaultTimeoutValue = 5 * time.Minute

// DefaultTimeout is SYMMEM_TIMEOUT_MS (read by core/settings.go, saturating) when it is
// a positive count of milliseconds, else DefaultTimeoutValue. The one reader
// of that variable: groups, signals and the cuda backend's synchronisation
// all take their default from here, and so does Python (it passes 0, "the
// library's default").
func DefaultTimeout() time.Duration {
	return Current().Duration("SYMMEM_TIMEOUT_MS", DefaultTimeoutValue)
}

// Note [Short sleeps]
//
// time.Sleep of less than a millisecond is not that short: when the
// runtime has nothing else to run, the sleeping goroutine's timer is
// waited for by the network poller, whose wait has millisecond resolution
// here. Measured on the 2-CPU CI machine: time.Sleep(20 µs) took 0.93 ms
// (median; 50 µs: 1.09 ms), a nanosleep of 20 µs 0.10 ms. Every retry loop
// of the library that backs off from microseconds (a joining rank's
// connect, the host backend's signal and barrier waits) slept a millisecond
// per step instead: the connect phase of group creation was 1.2-1.5 ms in
// about half the groups, on the GPUs too. Nap sleeps the calling thread
// with nanosleep below a millisecond, and with time.Sleep from there on.
//
// A nanosleep is a system call during which the thread keeps its P (the
// runtime's right to run Go code) until sysmon takes it. Whether threads
// napping on every P starve others was checked rather than assumed:
// GOMAXPROCS=2, four C threads in host-backend signal waits (napping), a
// fifth making 2000 symmem_alloc/symmem_free pairs through Go
// (SYMMEM_THREAD_CACHE=0): 0.8-1.2 ms for all of them, the slowest pair
// 0.13 ms; and goroutines and timers ran while two goroutines napped on
// the two Ps.

// Nap sleeps for d, as precisely as the kernel allows (Note [Short sleeps]).
func Nap(d time.Duration) {
	if d <= 0 {
		return
	}
	if d >= time.Millisecond {
		time.Sleep(d)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Nanosleep(&ts, nil) // EINTR: a shorter nap, which every caller tolerates
}
