package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// The Split patterns of the Llama-3 and Qwen2 tokenizer.json files (JSON-decoded), which
// the hand-written splitters below reproduce. Qwen2 (and Qwen2.5) splits digits one by one.
const (
	patternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	patternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// splitBehavior is HF's SplitDelimiterBehavior: what happens to the matches of a Split.
type splitBehavior int

const (
	splitIsolated           splitBehavior = iota // each match is its own piece
	splitRemoved                                 // matches are dropped
	splitMergedWithPrevious                      // a match joins the piece before it
	splitMergedWithNext                          // a match joins the piece after it
	splitContiguous                              // consecutive matches form one piece
)

var splitBehaviors = map[string]splitBehavior{
	"Isolated": splitIsolated, "Removed": splitRemoved, "MergedWithPrevious": splitMergedWithPrevious,
	"MergedWithNext": splitMergedWithNext, "Contiguous": splitContiguous,
}

// regexMatchTimeout bounds one regexp2 match; real pre-tokenizer patterns take microseconds.
const regexMatchTimeout = 2 * time.Second

// matcherKind selects how a Split finds its matches.
type matcherKind int

const (
	matchLlama3  matcherKind = iota // splitLlama3
	matchQwen2                      // splitQwen2
	matchLiteral                    // strings.Index of a non-empty literal
	matchRegex                      // regexp2 (backtracking, .NET syntax)
)

// splitStep is one HF Split pre-tokenizer.
type splitStep struct {
	kind     matcherKind
	literal  string
	re       *regexp2.Regexp
	pattern  string // for error messages
	behavior splitBehavior
	invert   bool
}

// span is a stretch of a piece, either a match of the pattern or the text between matches.
type span struct {
	start, end int
	match      bool
}

// newSplitStep builds a Split from its pattern ({"Regex": ...} or {"String": ...}).
func newSplitStep(regex, literal *string, behavior string, invert bool) (*splitStep, error) {
	b, ok := splitBehaviors[behavior]
	if !ok {
		return nil, fmt.Errorf("%w: tokenizer.json: Split behavior %q", ErrUnsupported, behavior)
	}
	st := &splitStep{behavior: b, invert: invert}
	switch {
	case regex != nil && literal != nil:
		return nil, fmt.Errorf("%w: tokenizer.json: Split pattern with both Regex and String", ErrMalformed)
	case regex != nil:
		st.pattern = *regex
		switch *regex {
		case patternLlama3:
			st.kind = matchLlama3
			return st, nil
		case patternQwen2:
			st.kind = matchQwen2
			return st, nil
		}
		// Oniguruma and .NET agree on the constructs these patterns use (lookaround, \p{..},
		// (?i:..)) except those onigOnly finds; anything else regexp2 cannot compile is
		// refused too rather than approximated. Oniguruma's ^ and $ match at line breaks.
		if what := onigOnly(*regex); what != "" {
			return nil, fmt.Errorf("%w: tokenizer.json: Split regex %q: %s means something else outside Oniguruma",
				ErrUnsupported, *regex, what)
		}
		re, err := regexp2.Compile(*regex, regexp2.Multiline)
		if err != nil {
			return nil, fmt.Errorf("%w: tokenizer.json: Split regex %q: %w", ErrUnsupported, *regex, err)
		}
		// A backtracking pattern can take exponential time on a crafted prompt: bound it, so
		// such a prompt is an encoding error (a 400) rather than a handler burning a core.
		re.MatchTimeout = regexMatchTimeout
		st.kind, st.re = matchRegex, re
	case literal != nil:
		st.pattern = *literal
		if *literal == "" {
			// HF compiles the escaped string as a regex; the empty one matches everywhere.
			st.kind, st.re = matchRegex, regexp2.MustCompile("")
			return st, nil
		}
		st.kind, st.literal = matchLiteral, *literal
	default:
		return nil, fmt.Errorf("%w: tokenizer.json: Split without a Regex or String pattern", ErrMalformed)
	}
	return st, nil
}

// onigOnly names the first construct of pattern that Oniguruma (HF's engine) and regexp2
// (.NET syntax) both accept but read differently, "" if none: nested classes and POSIX
// brackets ([a[b]], [[:alpha:]]), class intersection (&&), {,n}, \pL without braces,
// \X, and inline options other than i and x (Oniguruma's m is .NET's s).
func onigOnly(pattern string) string {
	inClass := false
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		next := byte(0)
		if i+1 < len(pattern) {
			next = pattern[i+1]
		}
		switch {
		case c == '\\':
			switch {
			case next == 'X':
				return `\X`
			case (next == 'p' || next == 'P') && (i+2 >= len(pattern) || pattern[i+2] != '{'):
				return `\p without braces`
			}
			i++
		case inClass:
			switch {
			case c == '[':
				return "a [ inside a character class"
			case c == '&' && next == '&':
				return "class intersection &&"
			case c == ']':
				inClass = false
			}
		case c == '[':
			inClass = true
			// A ] first in the class (after any ^) is a literal in both.
			if next == '^' {
				i++
			}
			if i+1 < len(pattern) && pattern[i+1] == ']' {
				i++
			}
		case c == '{' && next == ',':
			return "{,n}"
		case c == '(' && next == '?':
			j := i + 2
			for j < len(pattern) && (pattern[j] == '-' || pattern[j]|0x20 >= 'a' && pattern[j]|0x20 <= 'z') {
				j++
			}
			if j > i+2 && j < len(pattern) && (pattern[j] == ':' || pattern[j] == ')') {
				for _, o := range pattern[i+2 : j] {
					if o != 'i' && o != 'x' && o != '-' {
						return fmt.Sprintf("inline option %q", o)
					}
				}
			}
		}
	}
	return ""
}

// split appends the pieces of s to dst. spans is scratch space, returned for reuse.
func (st *splitStep) split(dst []string, s string, spans []span) ([]string, []span, error) {
	if st.behavior == splitIsolated && !st.invert {
		// Every character is in a match or between two, and both become pieces: no need
		// to remember which was which.
		switch st.kind {
		case matchLlama3:
			return splitLlama3(dst, s), spans, nil
		case matchQwen2:
			return splitQwen2(dst, s), spans, nil
		}
	}
	spans, err := st.spans(spans[:0], s)
	if err != nil {
		return dst, spans, err
	}
	return st.apply(dst, s, spans), spans, nil
}

// spans appends the matches of st in s and the stretches between them, in order, covering
// s (HF's Pattern::find_matches).
func (st *splitStep) spans(out []span, s string) ([]span, error) {
	prev := 0
	add := func(start, end int) {
		if start != prev {
			out = append(out, span{prev, start, false})
		}
		out = append(out, span{start, end, true})
		prev = end
	}
	switch st.kind {
	case matchLlama3, matchQwen2:
		// The hand-written splitters yield only matches (the patterns match every character).
		var buf [16]string
		pieces := buf[:0]
		if st.kind == matchLlama3 {
			pieces = splitLlama3(pieces, s)
		} else {
			pieces = splitQwen2(pieces, s)
		}
		for _, p := range pieces {
			add(prev, prev+len(p))
		}
	case matchLiteral:
		for i := 0; ; {
			k := strings.Index(s[i:], st.literal)
			if k < 0 {
				break
			}
			add(i+k, i+k+len(st.literal))
			i += k + len(st.literal)
		}
	case matchRegex:
		idx, err := st.re.FindAllStringIndex(s, -1)
		if err != nil {
			return out, fmt.Errorf("%w: Split regex %q: %w", ErrUnencodable, st.pattern, err)
		}
		for _, m := range idx {
			add(m[0], m[1])
		}
	}
	if prev != len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out, nil
}

// apply turns spans into pieces by HF's SplitDelimiterBehavior (NormalizedString::split),
// after flipping match and non-match when inverted; empty pieces are dropped as HF does.
func (st *splitStep) apply(dst []string, s string, spans []span) []string {
	if st.invert {
		for i := range spans {
			spans[i].match = !spans[i].match
		}
	}
	emit := func(a, b int) {
		if a < b {
			dst = append(dst, s[a:b])
		}
	}
	switch st.behavior {
	case splitIsolated:
		for _, sp := range spans {
			emit(sp.start, sp.end)
		}
	case splitRemoved:
		for _, sp := range spans {
			if !sp.match {
				emit(sp.start, sp.end)
			}
		}
	case splitContiguous, splitMergedWithPrevious:
		// A span extends the pending piece when it continues a run of matches
		// (Contiguous: or of non-matches), or, merging with the previous, when it is a
		// match after a non-match.
		start, end, have, prevMatch := 0, 0, false, false
		for _, sp := range spans {
			join := sp.match == prevMatch
			if st.behavior == splitMergedWithPrevious {
				join = sp.match && !prevMatch
			}
			if join && have {
				end = sp.end
			} else {
				if have {
					emit(start, end)
				}
				start, end, have = sp.start, sp.end, true
			}
			prevMatch = sp.match
		}
		if have {
			emit(start, end)
		}
	case splitMergedWithNext:
		// HF folds from the right: a match joins the piece after it when the span after it
		// is not a match.
		start := -1
		for i, sp := range spans {
			if start < 0 {
				start = sp.start
			}
			if sp.match && i+1 < len(spans) && !spans[i+1].match {
				continue
			}
			emit(start, sp.end)
			start = -1
		}
	}
	return dst
}

// asciiClass is classOf for ASCII bytes, so the splitters decode only non-ASCII runes.
var asciiClass = func() (t [utf8.RuneSelf]uint8) {
	for b := range t {
		t[b] = uint8(classOf(rune(b), 1))
	}
	return t
}()

// classAt returns the class and length of the character at s[i] (i < len(s)).
func classAt(s string, i int) (class, n int) {
	if b := s[i]; b < utf8.RuneSelf {
		return int(asciiClass[b]), 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classOf(r, n), n
}

// runEnd returns the end of the run of class c starting at i.
func runEnd(s string, i, c int) int {
	for i < len(s) {
		k, n := classAt(s, i)
		if k != c {
			break
		}
		i += n
	}
	return i
}

// splitLlama3 splits s like the Llama-3 pattern (patternLlama3), appending the pieces
// (substrings of s that concatenate back to it) to dst.
func splitLlama3(dst []string, s string) []string { return splitLlamaFamily(dst, s, 3) }

// splitQwen2 splits s like the Qwen2 pattern (patternQwen2): Llama-3's with single digits.
func splitQwen2(dst []string, s string) []string { return splitLlamaFamily(dst, s, 1) }

// splitLlamaFamily is the Llama-3 pattern with \p{N}{1,maxDigits}, by hand since Go's regexp
// has no lookahead. Each alternative is tried in the pattern's order; the first that
// matches at i wins, as in a backtracking engine. Invalid UTF-8 bytes count as "other"
// (regexp2 sees them as U+FFFD; Hugging Face never sees them, its input being a Rust str).
func splitLlamaFamily(dst []string, s string, maxDigits int) []string {
	for i := 0; i < len(s); {
		end := llamaPiece(s, i, maxDigits)
		dst = append(dst, s[i:end])
		i = end
	}
	return dst
}

// llamaPiece returns the end of the match of the Llama-3-family pattern at s[i].
func llamaPiece(s string, i, maxDigits int) int {
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if n := contractionFold(s[i+1:]); n > 0 {
			return i + 1 + n
		}
	}
	c0, n0 := classAt(s, i)
	switch c0 {
	case classLetter: // [^\r\n\p{L}\p{N}]?\p{L}+ without the optional part
		return runEnd(s, i+n0, classLetter)
	case classNumber: // \p{N}{1,maxDigits}
		end := i + n0
		for k := 1; k < maxDigits && end < len(s); k++ {
			c, n := classAt(s, end)
			if c != classNumber {
				break
			}
			end += n
		}
		return end
	case classOther:
		if i+n0 < len(s) {
			if c1, n1 := classAt(s, i+n0); c1 == classLetter { // [^\r\n\p{L}\p{N}]\p{L}+
				return runEnd(s, i+n0+n1, classLetter)
			}
		}
		return newlineRunEnd(s, runEnd(s, i+n0, classOther)) // [^\s\p{L}\p{N}]+[\r\n]*
	}
	// Whitespace.
	if s[i] != '\r' && s[i] != '\n' && i+n0 < len(s) {
		c1, n1 := classAt(s, i+n0)
		if c1 == classLetter { // [^\r\n\p{L}\p{N}]\p{L}+
			return runEnd(s, i+n0+n1, classLetter)
		}
		if s[i] == ' ' && c1 == classOther { // ' '[^\s\p{L}\p{N}]+[\r\n]*
			return newlineRunEnd(s, runEnd(s, i+n0+n1, classOther))
		}
	}
	end, lastNL, last := i, -1, 0
	for end < len(s) {
		c, n := classAt(s, end)
		if c != classSpace {
			break
		}
		if s[end] == '\r' || s[end] == '\n' {
			lastNL = end
		}
		end, last = end+n, n
	}
	switch {
	case lastNL >= 0: // \s*[\r\n]+ : \s* backs off to the last newline of the run
		return lastNL + 1
	case end == len(s) || end-last == i: // \s+(?!\S) at the end, else \s+ of one character
		return end
	}
	return end - last // \s+(?!\S) leaves the last space to the word after it
}

// newlineRunEnd returns the end of the run of '\r' and '\n' starting at i.
func newlineRunEnd(s string, i int) int {
	for i < len(s) && (s[i] == '\r' || s[i] == '\n') {
		i++
	}
	return i
}

// contractionFold returns the length of (?i:s|t|re|ve|m|ll|d) at the start of s (after the
// apostrophe), 0 if none. Case folding is Unicode's, as in Oniguruma and regexp2, so
// U+017F LATIN SMALL LETTER LONG S matches s too.
func contractionFold(s string) int {
	if len(s) == 0 {
		return 0
	}
	// b|0x20 is a lowercase ASCII letter only for that letter and its uppercase.
	switch s[0] | 0x20 {
	case 's', 't', 'm', 'd':
		return 1
	case 'r', 'v':
		if len(s) >= 2 && s[1]|0x20 == 'e' {
			return 2
		}
	case 'l':
		if len(s) >= 2 && s[1]|0x20 == 'l' {
			return 2
		}
	}
	if strings.HasPrefix(s, "\u017f") {
		return len("\u017f")
	}
	return 0
}
