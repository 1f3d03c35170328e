package symm

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/libsymmem/libsymmem/core"
)

// traceOn makes collective calls print how long each of their phases took
// (SYMMEM_TRACE=1), to stderr, one line per call: the way to see where a
// slow rendezvous spends its time on a given machine.
var traceOn = core.Current().Bool("SYMMEM_TRACE", false)

// phaseTrace collects the phases of one call; nil when tracing is off, and
// every method is a no-op on nil.
type phaseTrace struct {
	what        string
	start, last time.Time
	parts       []string
}

func startTrace(format string, args ...any) *phaseTrace {
	if !traceOn {
		return nil
	}
	now := time.Now()
	return &phaseTrace{what: fmt.Sprintf(format, args...), start: now, last: now}
}

// mark ends the phase that started at the previous mark.
func (t *phaseTrace) mark(phase string) {
	if t == nil {
		return
	}
	now := time.Now()
	t.parts = append(t.parts, fmt.Sprintf("%s=%dus", phase, now.Sub(t.last).Microseconds()))
	t.last = now
}

func (t *phaseTrace) done() {
	if t == nil {
		return
	}
	fmt.Fprintf(os.Stderr, "symmem trace: %s: %s total=%dus\n", t.what, strings.Join(t.parts, " "), time.Since(t.start).Microseconds())
}
