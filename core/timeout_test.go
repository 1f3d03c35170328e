package core

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestMillisSaturates(t *testing.T) {
	require.Equal(t, time.Duration(0), Millis(0))
	require.Equal(t, time.Duration(0), Millis(-5))
	require.Equal(t, 1500*time.Millisecond, Millis(1500))
	limit := int64(Forever / time.Millisecond)
	require.Equal(t, time.Duration(limit)*time.Millisecond, Millis(limit))
	for _, ms := range []int64{limit + 1, math.MaxInt64 - 1, math.MaxInt64} {
		require.Equal(t, Forever, Millis(ms), "%d ms", ms)
	}
	// A deadline that far away is still in the future (no wrap to the past).
	require.True(t, time.Now().Add(Millis(math.MaxInt64)).After(time.Now().Add(24*time.Hour)))
}

func TestParseMillis(t *testing.T) {
	for s, want := range map[string]time.Duration{
		"1":                        time.Millisecond,
		" 20000\n":                 20 * time.Second,
		"9223372036854775807":      Forever,
		"18446744073709551615":     Forever, // UINT64_MAX
		"18446744073709551614":     Forever,
		"999999999999999999999999": Forever, // beyond uint64
	} {
		d, err := ParseMillis(s)
		require.NoError(t, err, s)
		require.Equal(t, want, d, s)
	}
	for _, s := range []string{"", "0", "-1", "1.5", "ten", "0x10"} {
		_, err := ParseMillis(s)
		require.Equal(t, ErrInvalidArgument, CodeOf(err), s)
	}
}

// TestNapSleepsAtLeastItsDuration: below and above a millisecond (the two
// ways Nap sleeps), never less than asked; zero and negative return.
func TestNapSleepsAtLeastItsDuration(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, 30 * time.Microsecond, 900 * time.Microsecond, 2 * time.Millisecond} {
		t0 := time.Now()
		Nap(d)
		if got := time.Since(t0); got < d {
			t.Errorf("Nap(%v) returned after %v", d, got)
		}
	}
}
