package main

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// The tasks are verifiable and prompt-conditional: the answer is a function of the prompt, a
// constant answer is right on about one prompt in ten at best, and the prompts are split once
// (with a fixed seed, the same for every run) into a training set and a held-out set the
// training never sees. Prompts and answers are digit strings over the byte-level vocabulary
// of the builtin presets; a completion is correct when it is the answer's digits followed by
// EOS.
//
//   - lastdigit (the demo): "347=" -> "7", the last digit of a 3-digit number (1000 prompts,
//     200 held out). The model has to attend to the token before "=", and map it to itself.
//   - succ: "37=" -> "38", the successor of a 2-digit number, 00..98 (99 prompts, 20 held
//     out): copy the tens digit (or add the carry after a 9) and add one to the units.
//
// Rewards: lastdigit is 1 for a correct completion and 0 otherwise (no partial credit, so no
// shortcut: "always 7" earns 0.1). succ, whose answers have two digits, gives a point per
// answer position holding the right digit and one for EOS after them, divided by their number;
// every point depends on the prompt.

// Task names.
const (
	TaskLastDigit = "lastdigit"
	TaskSucc      = "succ"
)

// problem is one prompt and the answer the verifier wants.
type problem struct {
	Text   string // the prompt as text, e.g. "347="
	Prompt []int  // BOS, then the text's bytes: what `rollout generate` sends for Text
	Answer []int  // the answer's tokens, without EOS
}

// task describes prompts and scores completions.
type task struct {
	Name           string
	bos, eos       int
	Train, HeldOut []problem
	partial        bool // per-position credit (succ)
}

// splitSeed fixes the train/held-out split of every run, whatever --seed says.
const splitSeed = 27

func newTask(name string, bos, eos int) (*task, error) {
	t := &task{Name: name, bos: bos, eos: eos}
	var all []problem
	heldOut := 0
	switch name {
	case TaskLastDigit:
		for n := range 1000 {
			s := fmt.Sprintf("%03d", n)
			all = append(all, t.problem(s+"=", s[2:]))
		}
		heldOut = 200
	case TaskSucc:
		for n := range 99 {
			all = append(all, t.problem(fmt.Sprintf("%02d=", n), fmt.Sprintf("%02d", n+1)))
		}
		heldOut, t.partial = 20, true
	default:
		return nil, fmt.Errorf("--task %q: want %s or %s", name, TaskLastDigit, TaskSucc)
	}
	r := rand.New(rand.NewPCG(splitSeed, 0))
	r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	t.HeldOut, t.Train = all[:heldOut], all[heldOut:]
	return t, nil
}

func (t *task) problem(text, answer string) problem {
	p := problem{Text: text, Prompt: []int{t.bos}}
	for _, b := range []byte(text) {
		p.Prompt = append(p.Prompt, int(b))
	}
	for _, b := range []byte(answer) {
		p.Answer = append(p.Answer, int(b))
	}
	return p
}

// maxTokens is the completion budget: the answer, EOS and one token more, so that a
// well-formed answer finishes with "stop" and an overlong one with "length".
func (t *task) maxTokens() int { return len(t.Train[0].Answer) + 2 }

// correct is the verifier: the answer, then EOS, and nothing else.
func (t *task) correct(p problem, completion []int) bool {
	return len(completion) == len(p.Answer)+1 && slices.Equal(completion[:len(p.Answer)], p.Answer) &&
		completion[len(p.Answer)] == t.eos
}

// reward scores a completion of p in [0, 1].
func (t *task) reward(p problem, completion []int) float64 {
	if !t.partial {
		if t.correct(p, completion) {
			return 1
		}
		return 0
	}
	pts := 0
	for i, a := range p.Answer {
		if i < len(completion) && completion[i] == a {
			pts++
		}
	}
	if len(completion) > len(p.Answer) && completion[len(p.Answer)] == t.eos {
		pts++
	}
	return float64(pts) / float64(len(p.Answer)+1)
}

// constantAccuracy is the held-out accuracy of the best constant policy: the one that always
// writes the most common held-out answer.
func (t *task) constantAccuracy() float64 {
	n := map[string]int{}
	best := 0
	for _, p := range t.HeldOut {
		k := fmt.Sprint(p.Answer)
		n[k]++
		best = max(best, n[k])
	}
	return float64(best) / float64(len(t.HeldOut))
}

// warmExample is a supervised example of the answer format only: a training prompt, then as
// many uniformly random digits as its answer has, then EOS. It teaches the shape of an answer
// (what a pretrained model would know), not which answer is right: its accuracy is chance.
func (t *task) warmExample(r *rand.Rand) (prompt, completion []int) {
	p := t.Train[r.IntN(len(t.Train))]
	for range p.Answer {
		completion = append(completion, '0'+r.IntN(10))
	}
	return p.Prompt, append(completion, t.eos)
}

// render shows a completion as text (bytes below 256, EOS as ⏎, other ids as ⟨id⟩).
func (t *task) render(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id == t.eos:
			b.WriteString("⏎")
		case id >= 32 && id < 127:
			b.WriteByte(byte(id))
		case id < 256:
			b.WriteByte('.')
		default:
			fmt.Fprintf(&b, "⟨%d⟩", id)
		}
	}
	return b.String()
}

// text returns the digits of ids (without EOS) as a string.
func text(ids []int) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}
