package doctest

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Block is one fenced block of a Markdown document.
type Block struct {
	// Line is the 1-based line of the opening fence.
	Line int
	// Lang is the fence's info string's first word ("sh", "text", ""...).
	Lang string
	// Skip is the reason of a `<!-- doctest: skip REASON -->` line right before the fence;
	// empty when there is none.
	Skip string
	// Body is the block's text, without the fences.
	Body string
}

// Kinds of block, as the test treats them.
const (
	KindRun     = "run"     // shell commands the test runs
	KindData    = "data"    // output, diagrams, wire shapes: never run
	KindSkipped = "skipped" // annotated as not runnable in CI
)

var skipLine = regexp.MustCompile(`^<!--\s*doctest:\s*skip\s+(.*\S)\s*-->$`)

// Kind classifies b, or says why it is neither runnable nor annotated.
func (b Block) Kind() (string, error) {
	if b.Skip != "" {
		return KindSkipped, nil
	}
	switch b.Lang {
	case "sh", "bash", "shell":
		return KindRun, nil
	case "text", "json":
		return KindData, nil
	case "":
		return "", fmt.Errorf("line %d: a fence without a language: say ```sh (run), ```text (output) or annotate it with <!-- doctest: skip REASON -->", b.Line)
	default:
		return "", fmt.Errorf("line %d: a ```%s block is not run: annotate it with <!-- doctest: skip REASON --> on the line before", b.Line, b.Lang)
	}
}

// Parse returns the fenced blocks of a Markdown document. An unclosed fence, or a skip
// annotation with no reason or not followed by a fence, is an error.
func Parse(doc string) ([]Block, error) {
	lines := strings.Split(doc, "\n")
	var out []Block
	prev := "" // the last non-blank line before the current one
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if strings.HasPrefix(line, "<!--") && strings.Contains(line, "doctest:") {
			if !skipLine.MatchString(line) {
				return nil, fmt.Errorf("line %d: malformed annotation %q: want <!-- doctest: skip REASON -->", i+1, line)
			}
			if i+1 >= len(lines) || !strings.HasPrefix(strings.TrimSpace(lines[i+1]), "```") {
				return nil, fmt.Errorf("line %d: a doctest annotation must be right before a fence", i+1)
			}
		}
		if !strings.HasPrefix(line, "```") {
			if line != "" {
				prev = line
			}
			continue
		}
		info := strings.Fields(strings.TrimPrefix(line, "```"))
		b := Block{Line: i + 1}
		if len(info) > 0 {
			b.Lang = info[0]
		}
		if m := skipLine.FindStringSubmatch(prev); m != nil && strings.TrimSpace(lines[i-1]) == prev {
			b.Skip = m[1]
		}
		var body []string
		closed := false
		for i++; i < len(lines); i++ {
			if strings.TrimSpace(lines[i]) == "```" {
				closed = true
				break
			}
			body = append(body, lines[i])
		}
		if !closed {
			return nil, fmt.Errorf("line %d: unclosed fence", b.Line)
		}
		b.Body = strings.Join(body, "\n")
		out = append(out, b)
		prev = ""
	}
	return out, nil
}

// Ports are the well-known ports the documents use: Redis, three servers, the weight store.
var Ports = []int{6379, 8000, 8001, 8002, 8100}

// Substitute replaces each port of ports that appears in text as a number of its own (a
// whole run of digits, not part of a longer number) with its mapping.
func Substitute(text string, ports map[int]int) string {
	return digits.ReplaceAllStringFunc(text, func(n string) string {
		if v, err := strconv.Atoi(n); err == nil {
			if to, ok := ports[v]; ok {
				return strconv.Itoa(to)
			}
		}
		return n
	})
}

var digits = regexp.MustCompile(`[0-9]+`)
