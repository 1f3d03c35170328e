package core

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Note [Progress while waiting]
//
// A rank that waits for its peers longer than SYMMEM_WAIT_REPORT_S (10 s by
// default; 0 turns it off) prints one line to stderr per interval, naming the
// group, what it waits for (connection, all-gather, descriptor exchange,
// signal) and which ranks have not arrived, so that a missing rank is seen
// long before the timeout. Waits make a WaitReport when they start, wake up
// for it (Wake) and call Tick in their loops; a nil *WaitReport (reporting
// off) does nothing.

// DefaultWaitReport is the interval when SYMMEM_WAIT_REPORT_S is unset.
const DefaultWaitReport = 10 * time.Second

var (
	waitOutMu sync.Mutex
	waitOut   io.Writer = os.Stderr
)

// SetWaitReportOutput sends progress lines to w (tests); it returns the
// previous writer.
func SetWaitReportOutput(w io.Writer) io.Writer {
	waitOutMu.Lock()
	defer waitOutMu.Unlock()
	old := waitOut
	waitOut = w
	return old
}

// WaitReport is the progress reporting of one wait.
type WaitReport struct {
	group    string
	rank     int
	what     string
	start    time.Time
	next     time.Time
	interval time.Duration
	deadline time.Time
}

// StartWait begins reporting a wait of rank in group for what, which gives
// up at deadline; nil when reporting is off.
func StartWait(group string, rank int, what string, deadline time.Time) *WaitReport {
	every := Current().Duration("SYMMEM_WAIT_REPORT_S", DefaultWaitReport)
	if every <= 0 {
		return nil
	}
	now := time.Now()
	return &WaitReport{group: group, rank: rank, what: what, start: now, next: now.Add(every), interval: every, deadline: deadline}
}

// Wake is the earlier of deadline and the next report: a wait polls until
// then, so that it can report on time.
func (w *WaitReport) Wake(deadline time.Time) time.Time {
	if w == nil || deadline.Before(w.next) {
		return deadline
	}
	return w.next
}

// Tick prints a line when one is due; missing says who has not arrived
// ("rank(s) 2, 3"), and is called only then.
func (w *WaitReport) Tick(missing func() string) {
	if w == nil {
		return
	}
	now := time.Now()
	if now.Before(w.next) {
		return
	}
	for !now.Before(w.next) {
		w.next = w.next.Add(w.interval)
	}
	// A wait may tick once more after its deadline: never "-0 s".
	left := max(w.deadline.Sub(now), 0)
	line := fmt.Sprintf("symmem: group %q rank %d: waiting %.0f s for %s: %s not arrived yet (gives up in %.0f s)\n",
		w.group, w.rank, now.Sub(w.start).Seconds(), w.what, missing(), left.Seconds())
	waitOutMu.Lock()
	io.WriteString(waitOut, line)
	waitOutMu.Unlock()
}
