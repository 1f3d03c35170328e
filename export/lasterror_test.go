package main

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/libsymmem/libsymmem/core"
)

// Messages that list a value per rank may pass 1 KiB (symmem.h): the
// per-thread storage keeps them whole up to 64 KiB, and cuts a longer one at
// a word boundary with an ellipsis.
func TestLastErrorKeepsLongMessagesWhole(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for _, n := range []int{100, 3000, 40000} {
		long := strings.Repeat("rank 7 has 4096 bytes; ", n/23+1)
		setLastError("call", core.Errorf(core.ErrMismatch, "%s", long))
		code, msg := lastError()
		assert.Equal(t, core.ErrMismatch, code)
		assert.Equal(t, "call: "+long, msg, "%d bytes", len(long))
	}
	setLastError("call", core.Errorf(core.ErrMismatch, "%s", strings.Repeat("word ", 20000)))
	_, msg := lastError()
	assert.Less(t, len(msg), 64*1024)
	assert.True(t, strings.HasSuffix(msg, "…"), msg[len(msg)-20:])
	assert.False(t, strings.HasSuffix(strings.TrimSuffix(msg, "…"), "wor"), "cut at a word boundary")
}
