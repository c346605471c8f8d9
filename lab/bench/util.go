package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

func replaceAll(s string, m map[string]string) string {
	for k, v := range m {
		s = strings.ReplaceAll(s, k, v)
	}
	return s
}

// logf reports progress on stderr.
func logf(format string, args ...any) { fmt.Fprintf(progress, format+"\n", args...) }

// progress is where logf writes: stderr, or the test log.
var progress io.Writer = os.Stderr
