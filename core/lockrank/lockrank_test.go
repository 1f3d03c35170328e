package lockrank

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLocksInRankOrderPass(t *testing.T) {
	var outer Mutex[GroupCollective]
	var inner Mutex[PeerMappings]
	outer.Lock()
	inner.Lock()
	inner.Unlock()
	outer.Unlock()
	inner.Lock() // alone again, after the outer one went
	inner.Unlock()
}

func TestLockAgainstTheOrderFails(t *testing.T) {
	if !Checking {
		t.Skip("the order is checked in builds with the symmem_lockrank tag (the Go tests': make test)")
	}
	var allocator Mutex[Allocator]
	var windows Mutex[Windows]
	windows.Lock()
	defer windows.Unlock()
	var msg any
	func() {
		defer func() { msg = recover() }()
		allocator.Lock()
		allocator.Unlock()
	}()
	require.NotNil(t, msg, "an Allocator lock taken under a Windows lock")
	assert.Contains(t, msg, "taking a Allocator lock (rank 4) while holding a Windows lock (rank 5)")
}

func TestTwoLocksOfOneRankFail(t *testing.T) {
	if !Checking {
		t.Skip("the order is checked in builds with the symmem_lockrank tag (the Go tests': make test)")
	}
	var a, b Mutex[SignalCounts]
	a.Lock()
	defer a.Unlock()
	var msg any
	func() {
		defer func() { msg = recover() }()
		b.Lock()
	}()
	assert.Contains(t, msg, "while holding a SignalCounts lock")
}

func TestUnlockOnAnotherGoroutine(t *testing.T) {
	var m Mutex[PointerArrays]
	m.Lock()
	done := make(chan struct{})
	go func() { m.Unlock(); close(done) }()
	<-done
	m.Lock() // free again, and forgotten as held
	m.Unlock()
}
