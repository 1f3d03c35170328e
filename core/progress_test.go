package core

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A report due after the deadline says "gives up in 0 s", never a
// negative duration.
func TestWaitReportNoNegativeDuration(t *testing.T) {
	var out bytes.Buffer
	old := SetWaitReportOutput(&out)
	defer SetWaitReportOutput(old)
	now := time.Now()
	w := &WaitReport{group: "g", rank: 1, what: "signal 3 on channel 0", start: now.Add(-10 * time.Second),
		next: now.Add(-time.Second), interval: 10 * time.Second, deadline: now.Add(-400 * time.Millisecond)}
	w.Tick(func() string { return "rank 0" })
	line := out.String()
	if !strings.Contains(line, "gives up in 0 s") || strings.Contains(line, "-") {
		t.Fatalf("report after the deadline: %q", line)
	}
}
