package core

import (
	"math"
	"strconv"
	"strings"
	"time"
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
		return 0, Errorf(ErrInvalidArgument, "%q is not a count of milliseconds", s)
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
