package core

import (
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// With plenty of descriptors nothing is said; with the soft limit lowered
// to what is open, the shortage is named with the limit.
func TestDescriptorShortage(t *testing.T) {
	if s := DescriptorShortage(); s != "" {
		t.Fatalf("no shortage expected with the default limit, got %q", s)
	}
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	for _, extra := range []uint64{0, 3} {
		low := rl
		open, err := openDescriptors()
		if err != nil {
			t.Fatal(err)
		}
		low.Cur = uint64(open) + extra
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
			t.Fatal(err)
		}
		s := DescriptorShortage()
		unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
		if !strings.Contains(s, "file descriptors") || !strings.Contains(s, "ulimit -n") {
			t.Fatalf("%d spare descriptors: want the shortage named, got %q", extra, s)
		}
	}
}
