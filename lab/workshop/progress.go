package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress tells the learner what a lab is doing while it runs: a step,
// and how far along it is. On a terminal the count redraws in place; in a
// log it is printed at most every half second.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	tty     bool
	step    string
	last    time.Time
	pending bool   // a redrawn line is open
	unshown string // the latest status, when it was not printed
}

func newProgress(w io.Writer, tty bool) *progress { return &progress{w: w, tty: tty} }

// Step announces what the lab does next.
func (p *progress) Step(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLine()
	p.step = fmt.Sprintf(format, args...)
	fmt.Fprintf(p.w, "  · %s\n", p.step)
	p.last = time.Time{}
}

// Count shows how far the current step is, as done of total (total 0: no total).
func (p *progress) Count(done, total int64, unit string) {
	p.Status("%s", countText(done, total, unit))
}

// Status shows a free-form progress line for the current step.
func (p *progress) Status(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[K      %s", msg)
		p.pending = true
		return
	}
	if time.Since(p.last) < 500*time.Millisecond {
		p.unshown = msg
		return
	}
	p.last, p.unshown = time.Now(), ""
	fmt.Fprintf(p.w, "      %s\n", msg)
}

// Done closes the progress display.
func (p *progress) Done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.endLine()
}

func (p *progress) endLine() {
	if p.unshown != "" {
		fmt.Fprintf(p.w, "      %s\n", p.unshown)
		p.unshown = ""
	}
	if p.pending {
		fmt.Fprintln(p.w)
		p.pending = false
	}
}

func countText(done, total int64, unit string) string {
	if total > 0 {
		return fmt.Sprintf("%d/%d %s (%d%%)", done, total, unit, done*100/total)
	}
	return fmt.Sprintf("%d %s", done, unit)
}
