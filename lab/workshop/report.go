package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Report is what a lab prints when it is done: a title, sections of
// labelled values, and a verdict. Counts are kept by key as well, so the
// workshop's test checks the same numbers the learner reads.
type Report struct {
	Title   string
	lines   []line
	Counts  map[string]int64
	Texts   map[string]string
	verdict []string
}

type line struct {
	section string // a section heading, when set
	label   string
	value   string
	note    string
}

func newReport(title string) *Report {
	return &Report{Title: title, Counts: map[string]int64{}, Texts: map[string]string{}}
}

// Section starts a group of lines under a heading.
func (r *Report) Section(heading string) { r.lines = append(r.lines, line{section: heading}) }

// Count adds a labelled count, kept under key.
func (r *Report) Count(key, label string, n int64, note string) {
	r.Counts[key] = n
	r.lines = append(r.lines, line{label: label, value: fmt.Sprint(n), note: note})
}

// OutOf adds "n of total", kept under key (n) and key+".of" (total).
func (r *Report) OutOf(key, label string, n, total int64, note string) {
	r.Counts[key], r.Counts[key+".of"] = n, total
	r.lines = append(r.lines, line{label: label, value: fmt.Sprintf("%d of %d", n, total), note: note})
}

// Text adds a labelled value that is not a count, kept under key.
func (r *Report) Text(key, label, value, note string) {
	r.Texts[key] = value
	r.lines = append(r.lines, line{label: label, value: value, note: note})
}

// Duration adds a duration in seconds with one decimal, a fixed format so
// reports read the same from run to run, kept under key as text and in
// milliseconds as a count.
func (r *Report) Duration(key, label string, d time.Duration, note string) {
	r.Text(key, label, seconds(d), note)
	r.Counts[key] = d.Milliseconds()
}

// Verdict adds a closing sentence.
func (r *Report) Verdict(format string, args ...any) {
	r.verdict = append(r.verdict, fmt.Sprintf(format, args...))
}

func seconds(d time.Duration) string { return fmt.Sprintf("%.1fs", d.Seconds()) }

func kb(bytes int64) string { return fmt.Sprintf("%d kB", bytes/1024) }

// Write prints the report in a fixed layout.
func (r *Report) Write(w io.Writer) {
	width := 0
	for _, l := range r.lines {
		width = max(width, len(l.label))
	}
	valWidth := 0
	for _, l := range r.lines {
		if len(l.value) <= 12 {
			valWidth = max(valWidth, len(l.value))
		}
	}
	fmt.Fprintf(w, "%s\n", r.Title)
	for _, l := range r.lines {
		if l.section != "" {
			fmt.Fprintf(w, "\n  %s\n", l.section)
			continue
		}
		s := fmt.Sprintf("    %-*s  %*s", width, l.label, valWidth, l.value)
		if l.note != "" {
			s += "  " + l.note
		}
		fmt.Fprintln(w, strings.TrimRight(s, " "))
	}
	if len(r.verdict) > 0 {
		fmt.Fprintln(w)
		for _, v := range r.verdict {
			fmt.Fprintf(w, "  %s\n", v)
		}
	}
}

func (r *Report) String() string {
	var b strings.Builder
	r.Write(&b)
	return b.String()
}
