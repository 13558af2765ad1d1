package main

import (
	"fmt"
	"io"
	"os"

	"github.com/schollz/progressbar/v3"
)

// progress tells a person waiting on a long command what it is measuring and how far along
// it is, on stderr so --json output stays clean. On a terminal it is a bar whose description
// names the current step; elsewhere (CI logs, tests, pipes) one plain line per step.
type progress struct {
	w     io.Writer
	name  string
	total int
	n     int
	bar   *progressbar.ProgressBar
}

// isTerminal reports whether w is a character device (a terminal, not a file or a pipe).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// newProgress starts the progress of a command of total steps; name prefixes every line.
func newProgress(w io.Writer, name string, total int) *progress {
	p := &progress{w: w, name: name, total: total}
	if isTerminal(w) {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(20), progressbar.OptionShowElapsedTimeOnFinish(), progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription(name))
	}
	return p
}

// step says that the next step, what format describes, starts now; the previous one is done.
func (p *progress) step(format string, args ...any) {
	if p.n > 0 && p.bar != nil {
		_ = p.bar.Add(1)
	}
	p.n++
	what := fmt.Sprintf(format, args...)
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s: %s", p.name, what))
		return
	}
	fmt.Fprintf(p.w, "%s [%d/%d]: %s\n", p.name, p.n, p.total, what)
}

// done ends the progress: the bar is cleared so the results print on a clean screen.
func (p *progress) done() {
	if p.bar != nil {
		_ = p.bar.Finish()
	}
}
